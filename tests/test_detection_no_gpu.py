"""CUDA_VISIBLE_DEVICES on a machine without an NVIDIA GPU (issue 34): explained, never a fix to run nvidia-smi
there, and the CPU path works; a CUDA_DEVICE_ORDER CUDA would ignore is reported."""

from __future__ import annotations

import dataclasses
import io
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from cudaload.capabilities import Capabilities, Finding
from cudaload.detection import GPU_SELECTION, assemble
from cudaload.detection.visible import NvmlDevice

G = 80 * 2**30
ONE = [NvmlDevice(0, "NVIDIA H100 80GB HBM3", "GPU-0000", "00000000:10:00.0", (9, 0), G)]


def test_no_gpu_and_a_gpu_named_is_explained_not_sent_to_nvidia_smi() -> None:
    caps = assemble(
        (), {"CUDA_VISIBLE_DEVICES": "0"}, nvml_error="NVML unavailable: NVML Shared Library Not Found"
    )
    (f,) = caps.findings
    assert f.code == "cvd-no-gpu" and f.severity == "error"
    assert "no NVIDIA GPU" in f.message and "load on the CPU" in f.message
    assert "unset CUDA_VISIBLE_DEVICES" in f.fix and "nvidia-smi" not in f.fix
    assert "no NVIDIA driver" in f.fix  # NVML's library is missing: nothing to list, say so
    assert f.code in GPU_SELECTION


def test_with_a_gpu_an_unmatched_entry_is_still_refused_with_nvidia_smi() -> None:
    (f,) = assemble(ONE, {"CUDA_VISIBLE_DEVICES": "3"}).findings
    assert f.code == "cvd-unmatched" and "nvidia-smi -L" in f.fix
    # hiding every GPU on purpose is no problem where there is none
    assert assemble((), {"CUDA_VISIBLE_DEVICES": "-1"}).findings == ()
    assert assemble((), {"CUDA_VISIBLE_DEVICES": ""}).findings == ()


def test_a_device_order_cuda_ignores_is_reported() -> None:
    (f,) = assemble(ONE, {"CUDA_DEVICE_ORDER": "pci"}).findings
    assert f.code == "device-order-invalid" and "CUDA_DEVICE_ORDER=PCI_BUS_ID" in f.fix
    assert assemble(ONE, {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}).findings == ()


def test_load_model_runs_on_the_cpu_and_says_why(tiny_model: Callable[..., Path]) -> None:
    import cudaload

    caps = assemble((), {"CUDA_VISIBLE_DEVICES": "0"}, nvml_error="NVML unavailable")
    caps = dataclasses.replace(caps, host_memory=16 * 2**30)
    model = cudaload.load_model(str(tiny_model("qwen3")), hardware=caps)
    plan = model.cudaload_plan
    assert plan.placement.devices == ("cpu",)
    assert any(w.startswith("cvd-no-gpu: ") and "unset CUDA_VISIBLE_DEVICES" in w for w in plan.warnings)


def _demo(monkeypatch: pytest.MonkeyPatch, caps: Capabilities, cpu: bool) -> str:
    import cudaload.detection as detection
    from cudaload.commands.demo import run

    monkeypatch.setattr(detection, "detect", lambda **kw: caps)
    out = io.StringIO()
    assert run("qwen3", max_new_tokens=2, cpu=cpu, out=out) == 0
    return out.getvalue()


def test_demo_cpu_runs_whatever_the_gpu_selection_says(monkeypatch: pytest.MonkeyPatch) -> None:
    # a GPU machine whose CUDA_VISIBLE_DEVICES names a GPU it does not have: load_model refuses to guess which
    # GPU was meant, but `cudaload demo --cpu` asked for none
    bad = Finding(
        "cvd-unmatched", "CUDA_VISIBLE_DEVICES='7': '7' matches no GPU", "use nvidia-smi -L", "error"
    )
    caps = dataclasses.replace(assemble(ONE, {}), findings=(bad,), host_memory=16 * 2**30)
    text = _demo(monkeypatch, caps, cpu=True)
    assert "--cpu given: running on the CPU although a GPU is present." in text
    assert "not in the way of a CPU run: CUDA_VISIBLE_DEVICES='7'" in text
    assert "Generated 2 tokens" in text and "on cpu" in text


def test_demo_without_a_gpu_explains_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    caps: Any = assemble((), {"CUDA_VISIBLE_DEVICES": "0"}, nvml_error="NVML unavailable")
    text = _demo(monkeypatch, dataclasses.replace(caps, host_memory=16 * 2**30), cpu=False)
    assert "No usable NVIDIA GPU found" in text and "fix: unset CUDA_VISIBLE_DEVICES" in text
    assert "Generated 2 tokens" in text
