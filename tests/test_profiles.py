"""Named hardware profiles: facts, composition, snapshot files, errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cudaload.capabilities import Capabilities
from cudaload.errors import ConfigurationError
from cudaload.profiles import describe, hardware, names

MiB = 2**20

# (profile, compute capability, nvidia-smi MiB, bf16, fp8, unified)
FACTS = [
    ("T4", (7, 5), 15360, False, False, False),
    ("V100-16GB", (7, 0), 16160, False, False, False),
    ("V100-32GB", (7, 0), 32510, False, False, False),
    ("A10G", (8, 6), 23028, True, False, False),
    ("L4", (8, 9), 23034, True, True, False),
    ("A100-40GB", (8, 0), 40960, True, False, False),
    ("A100-80GB", (8, 0), 81920, True, False, False),
    ("RTX-3090", (8, 6), 24576, True, False, False),
    ("RTX-4090", (8, 9), 24564, True, True, False),
    ("RTX-5090", (12, 0), 32607, True, True, False),
    ("L40S", (8, 9), 46068, True, True, False),
    ("H100-PCIe", (9, 0), 81559, True, True, False),
    ("H100-SXM", (9, 0), 81559, True, True, False),
    ("H200", (9, 0), 143771, True, True, False),
    ("B200", (10, 0), 183359, True, True, False),
    ("GH200", (9, 0), 97871, True, True, True),
    ("GB10", (12, 1), 122572, True, True, True),
]


@pytest.mark.parametrize(("name", "cc", "mib", "bf16", "fp8", "unified"), FACTS)
def test_profile_facts(
    name: str, cc: tuple[int, int], mib: int, bf16: bool, fp8: bool, unified: bool
) -> None:
    caps = hardware(name.lower())
    (g,) = caps.gpus
    assert caps.source == f"profile:{name}"
    assert (g.compute_capability, g.total_memory, g.bf16_native, g.fp8, g.unified_memory) == (
        cc,
        mib * MiB,
        bf16,
        fp8,
        unified,
    )
    assert g.free_memory is not None and 0.9 * g.total_memory < g.free_memory < g.total_memory
    assert not [p for p in caps.packages if not p.assumed]  # nothing observed, nothing optional
    assert not caps.usable("flash-attn") and not caps.usable("bitsandbytes") and not caps.usable("kernels")
    assert caps.torch_version is None and caps.transformers_version is None
    assert Capabilities.from_json(caps.to_json()) == caps


def test_all_required_profiles_listed() -> None:
    assert [f[0] for f in FACTS] == names()
    table = describe()
    assert all(n in table for n in names()) and "8xH100-80GB" in table


def test_architectures() -> None:
    assert hardware("H200").gpus[0].architecture == "Hopper"
    assert hardware("B200").gpus[0].architecture == "Blackwell"
    assert hardware("GB10").cpu_arch == hardware("GH200").cpu_arch == "aarch64"


def test_composed() -> None:
    caps = hardware("8xH100-80GB")
    assert caps.source == "profile:8xH100-SXM" and [g.index for g in caps.gpus] == list(range(8))
    assert {g.total_memory for g in caps.gpus} == {81559 * MiB}
    assert len(hardware("2xA100-40GB").gpus) == 2
    with pytest.raises(ConfigurationError):
        hardware("0xT4")


def test_unknown_name_lists_close_names() -> None:
    with pytest.raises(ConfigurationError) as e:
        hardware("H10")
    assert "H100" in str(e.value) and e.value.fix


def test_snapshot_file(tmp_path: Path) -> None:
    path = tmp_path / "box.json"
    with_pkgs = hardware("L4").with_packages(installed=["flash-attn"])
    path.write_text(with_pkgs.to_json())
    assert hardware(path) == with_pkgs  # a saved profile stays the profile
    from cudaload.detection import detect

    rec = tmp_path / "rec.json"
    rec.write_text(detect(env={"HF_HUB_OFFLINE": "1"}).to_json())
    assert hardware(str(rec)).source == f"file:{rec}"
    with pytest.raises(ConfigurationError):
        hardware(tmp_path / "missing.json")


def test_a_model_config_is_not_a_machine(tmp_path: Path) -> None:
    """A model's config.json passed as hardware was planned as a machine with no GPU; now it is refused."""
    cfg = tmp_path / "config.json"
    cfg.write_text(
        json.dumps({"model_type": "llama", "hidden_size": 4096, "architectures": ["LlamaForCausalLM"]})
    )
    with pytest.raises(ConfigurationError) as e:
        hardware(cfg)
    assert "config.json" in e.value.message and "cudaload env --json" in (e.value.fix or "")
    (tmp_path / "list.json").write_text("[1, 2]")
    with pytest.raises(ConfigurationError, match="not a machine snapshot"):
        hardware(tmp_path / "list.json")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ConfigurationError, match="cannot be read"):
        hardware(tmp_path / "bad.json")


@pytest.mark.parametrize(
    "gpus",
    [
        [{"index": 0, "name": "NVIDIA H200"}],  # no compute_capability: KeyError
        5,  # TypeError
        ["H200"],  # AttributeError
    ],
)
def test_a_damaged_snapshot_is_a_configuration_error(tmp_path: Path, gpus: object) -> None:
    path = tmp_path / "box.json"
    data = json.loads(hardware("H200").to_json())
    data["gpus"] = gpus
    path.write_text(json.dumps(data))
    with pytest.raises(ConfigurationError, match="damaged") as e:
        hardware(path)
    assert "record it again" in (e.value.fix or "")
