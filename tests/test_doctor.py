"""Doctor verdicts over recorded snapshots (tests/fixtures) and profiles."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from cudaload.capabilities import Capabilities
from cudaload.commands.doctor import diagnose
from cudaload.profiles import hardware

FIX = Path(__file__).parent / "fixtures"


def load(name: str) -> Capabilities:
    return Capabilities.from_json((FIX / name).read_text())


def status(report: object, code: str) -> list[str]:
    return [v.status for v in report.by_code(code)]  # type: ignore[attr-defined]


def test_t4_with_flash_attn_installed() -> None:
    r = diagnose(load("t4_flash_attn.json"))
    assert status(r, "flash_attention_2") == ["warn"]  # installed, but sm75: would fail at run time
    assert status(r, "bf16") == ["info"] and status(r, "bitsandbytes") == ["ok"]
    assert r.ok and "fix:" in r.render()


def test_mixed_gpus_without_device_order() -> None:
    caps = load("mixed_4090_3090.json")
    assert [g.name for g in caps.gpus] == ["NVIDIA GeForce RTX 4090", "NVIDIA GeForce RTX 3090"]
    r = diagnose(caps)
    (v,) = r.by_code("device-order")
    assert v.status == "warn" and v.fix == "export CUDA_DEVICE_ORDER=PCI_BUS_ID"


def test_kernels_out_of_range() -> None:
    r = diagnose(load("kernels_out_of_range.json"))
    (v,) = r.by_code("kernels-out-of-range")
    assert v.status == "warn" and ">=0.18.2" in v.message and v.fix and ">=0.18.2" in v.fix
    assert status(r, "flash_attention_3") == ["info"]  # Hopper, package missing


def test_mig_box() -> None:
    r = diagnose(load("mig_a100.json"))
    assert status(r, "mig-multiple") == ["warn"]
    assert sum(v.code == "gpu" and "MIG" in v.message for v in r.verdicts) == 2


def test_broken_things_fail() -> None:
    h100 = hardware("H100-SXM")
    caps = Capabilities.from_dict(
        {
            **h100.to_dict(),
            "packages": [
                {
                    "name": "bitsandbytes",
                    "installed": True,
                    "version": "0.45.0",
                    "usable": False,
                    "reason": "libbitsandbytes_cuda124.so does not load",
                },
                {
                    "name": "flash-attn",
                    "installed": True,
                    "version": "2.7.4",
                    "usable": False,
                    "reason": "undefined symbol",
                },
            ],
            "findings": [
                {
                    "code": "cvd-unmatched",
                    "message": "'7' matches no GPU",
                    "fix": "use nvidia-smi -L",
                    "severity": "error",
                }
            ],
        }
    )
    r = diagnose(caps)
    assert not r.ok
    assert status(r, "bitsandbytes") == ["fail"] and status(r, "flash_attention_2") == ["fail"]
    assert status(r, "cvd-unmatched") == ["fail"] and "BROKEN" in r.render()


def test_profiles_are_healthy() -> None:
    for name in ("H200", "A100-80GB", "RTX-5090"):
        assert diagnose(hardware(name)).ok
    r = diagnose(hardware("H200").with_packages(installed=["flash-attn-4"]))
    assert status(r, "flash_attention_4") == ["ok"]


def test_cli_exit_status(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    caps = load("mig_a100.json").to_dict()
    caps["findings"].append({"code": "cvd-duplicate", "message": "dup", "fix": "once", "severity": "error"})
    bad.write_text(Capabilities.from_dict(caps).to_json())

    def run(p: Path) -> subprocess.CompletedProcess[str]:
        cmd = [sys.executable, "-m", "cudaload", "doctor", "--hardware", str(p)]
        return subprocess.run(cmd, capture_output=True, text=True)

    assert run(FIX / "mig_a100.json").returncode == 0
    assert run(bad).returncode == 1


@pytest.mark.skipif(not (FIX / "h200.json").exists(), reason="tests/fixtures/h200.json not recorded yet")
def test_recorded_h200() -> None:
    caps = load("h200.json")
    g = caps.gpus[0]
    assert g.compute_capability == (9, 0) and g.architecture == "Hopper" and g.bf16_native and g.fp8
    assert "H200" in g.name and g.total_memory > 140 * 10**9
    assert status(diagnose(caps), "bf16") == ["ok"]
