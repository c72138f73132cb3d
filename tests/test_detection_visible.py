"""CUDA_VISIBLE_DEVICES / CUDA_DEVICE_ORDER emulation over fake NVML device lists (pure)."""

from __future__ import annotations

import pytest

from cudaload.detection import assemble
from cudaload.detection.visible import MigInstance, NvmlDevice, resolve

G = 2**30


def dev(
    i: int, name: str = "NVIDIA H100 80GB HBM3", cc: tuple[int, int] = (9, 0), gib: float = 80, **kw: object
) -> NvmlDevice:
    return NvmlDevice(
        i,
        name,
        f"GPU-{i}{i}{i}{i}abcd-0000-1111-2222-33333333333{i}",
        f"00000000:{0x10 + i:02X}:00.0",
        cc,
        int(gib * G),
        **kw,
    )  # type: ignore[arg-type]


FOUR = [dev(i) for i in range(4)]


def idx(visible: str | None, devices: list[NvmlDevice] = FOUR, order: str | None = None) -> list[int]:
    return [s.device.nvml_index for s in resolve(devices, visible, order).selected]


@pytest.mark.parametrize(
    ("cvd", "expected"),
    [
        (None, [0, 1, 2, 3]),
        ("", []),
        ("-1", []),
        ("2", [2]),
        ("3,1", [3, 1]),
        (" 1 , 2 ", [1, 2]),
        ("1,7,2", [1]),  # an index past the last GPU ends the list
        ("1,-1,2", [1]),  # so does a negative one
        ("1,GPU-0000", [1]),  # a list's form is set by its first entry
        ("1gpu,2", [1, 2]),  # strtoul leniency
        ("1,1", []),  # a repeated device empties the set
        ("abc", []),
    ],
)
def test_index_forms(cvd: str | None, expected: list[int]) -> None:
    assert idx(cvd) == expected


def test_uuid_forms_full_prefix_ambiguous_duplicate() -> None:
    assert idx(FOUR[2].uuid) == [2]
    assert idx("GPU-2222,GPU-0000") == [2, 0]  # unique prefixes
    amb = [dev(0), NvmlDevice(1, "x", "GPU-0000ffff", "00000000:20:00.0", (9, 0), G)]
    v = resolve(amb, "GPU-0000", None)
    assert v.selected == () and v.ambiguous == "GPU-0000" and v.unmatched == ("GPU-0000",)
    v = resolve(FOUR, "GPU-1111,GPU-9999,GPU-2222", None)
    assert [s.device.nvml_index for s in v.selected] == [1] and v.unmatched == ("GPU-9999", "GPU-2222")
    assert resolve(FOUR, "GPU-1111,GPU-1111", None).duplicate == "GPU-1111"
    assert idx("GPU-1111,0") == [1]


def test_findings_for_bad_entries() -> None:
    codes = lambda cvd: [f.code for f in assemble(FOUR, {"CUDA_VISIBLE_DEVICES": cvd}).findings]  # noqa: E731
    assert "cvd-unmatched" in codes("0,9")
    assert "cvd-duplicate" in codes("0,0")
    assert "cvd-hides-all" in codes("-1")
    assert "cvd-malformed" in codes("1gpu")
    assert codes("0,1") == []
    caps = assemble(FOUR, {"CUDA_VISIBLE_DEVICES": "0,9"})
    assert len(caps.gpus) == 1 and any(f.severity == "error" for f in caps.findings)


def test_mixed_gpus_fastest_first_vs_pci_order() -> None:
    mixed = [dev(0, "NVIDIA GeForce RTX 3090", (8, 6), 24), dev(1, "NVIDIA GeForce RTX 4090", (8, 9), 24)]
    assert idx(None, mixed) == [1, 0]  # FASTEST_FIRST: the 4090 becomes cuda:0
    assert idx(None, mixed, "PCI_BUS_ID") == [0, 1]
    assert idx("0", mixed) == [1]  # indices refer to CUDA's order, not nvidia-smi's
    caps = assemble(mixed, {})
    assert [f.code for f in caps.findings] == ["device-order"]
    assert "CUDA_DEVICE_ORDER=PCI_BUS_ID" in caps.findings[0].fix
    assert (caps.gpus[0].index, caps.gpus[0].nvml_index) == (0, 1)
    assert assemble(mixed, {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}).findings == ()
    # identical GPUs: fastest-first is PCI order, nothing to warn about
    assert idx(None) == [0, 1, 2, 3] and assemble(FOUR, {}).findings == ()


def test_mig_instances() -> None:
    migs = tuple(
        MigInstance(f"MIG-{k}aaa-bbbb", gi, 0, "NVIDIA A100 MIG 3g.40gb", 40 * G)
        for k, gi in ((1, 1), (2, 2))
    )
    a100 = [
        dev(0, "NVIDIA A100-SXM4-80GB", (8, 0), 80, mig_enabled=True, mig_instances=migs),
        dev(1, "NVIDIA A100-SXM4-80GB", (8, 0)),
    ]
    caps = assemble(a100, {})
    assert [g.mig for g in caps.gpus] == [True, True, False]
    assert caps.gpus[0].mig_parent_uuid == a100[0].uuid and caps.gpus[0].total_memory == 40 * G
    assert "mig-multiple" in [f.code for f in caps.findings]
    one = assemble(a100, {"CUDA_VISIBLE_DEVICES": "MIG-2aaa"})
    assert [g.uuid for g in one.gpus] == ["MIG-2aaa-bbbb"] and one.findings == ()
    legacy = assemble(a100, {"CUDA_VISIBLE_DEVICES": f"MIG-{a100[0].uuid}/1/0"})
    assert [g.uuid for g in legacy.gpus] == ["MIG-1aaa-bbbb"]
    assert [f.code for f in assemble(a100, {"CUDA_VISIBLE_DEVICES": "MIG-9"}).findings] == ["cvd-unmatched"]


def test_unified_memory_and_local_rank() -> None:
    gh = [dev(0, "NVIDIA GH200 480GB", (9, 0), 95.6, unified_memory=True)]
    caps = assemble(gh, {"LOCAL_RANK": "3", "WORLD_SIZE": "4"})
    assert caps.gpus[0].unified_memory and caps.distributed.world_size == 4
    assert "local-rank" in [f.code for f in caps.findings]
