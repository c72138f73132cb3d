"""cudaload.execute.runtime.gpu_start: which GPU is certain before planning, and the thread's report (issue 14)."""

from __future__ import annotations

import dataclasses

import pytest

from cudaload.capabilities import Distributed
from cudaload.execute.runtime import gpu_start
from cudaload.profiles import hardware


def test_the_gpu_is_started_only_when_it_is_certain_before_planning() -> None:
    one = dataclasses.replace(hardware("2xH200"), gpus=hardware("2xH200").gpus[:1])
    two = hardware("2xH200")
    assert gpu_start.target_gpu(one, None) == 0
    assert gpu_start.target_gpu(two, None) is None  # placement picks among them later
    assert gpu_start.target_gpu(two, "auto") is None
    assert gpu_start.target_gpu(two, "cuda:1") == 1
    assert gpu_start.target_gpu(two, 1) == 1
    assert gpu_start.target_gpu(two, {"": 1}) == 1
    assert gpu_start.target_gpu(two, {"model.layers.0": 0, "lm_head": 1}) is None
    assert gpu_start.target_gpu(two, "cuda:7") is None  # not visible: the plan's own error says so
    assert gpu_start.target_gpu(two, "cpu") is None
    assert gpu_start.target_gpu(one, True) is None
    assert gpu_start.target_gpu(one, {"": "cuda:0"}) == 0
    assert gpu_start.target_gpu(one, {"": "cpu"}) is None
    # a value that is not a GPU number or "cuda:N" (a torch.device, "disk") is not "no device_map": the one GPU
    # of this machine is not started for a load that may never touch it
    assert gpu_start.target_gpu(one, {"": object()}) is None
    assert gpu_start.target_gpu(one, {"": False}) is None
    ranked = dataclasses.replace(
        two, distributed=Distributed(local_rank=1, rank=3, world_size=4, local_world_size=2)
    )
    assert gpu_start.target_gpu(ranked, None) == 1  # cuda:LOCAL_RANK, never the global rank
    assert gpu_start.target_gpu(ranked, "cpu") is None  # gloo ranks on their CPUs: no context on cuda:1
    assert gpu_start.target_gpu(dataclasses.replace(two, gpus=()), None) is None


def test_no_thread_where_cuda_is_already_initialised() -> None:
    """A process that already made its CUDA context has nothing to hide; a thread would only add a cuBLAS
    workspace (32 MiB on the H200) that the process keeps."""
    one = dataclasses.replace(hardware("2xH200"), gpus=hardware("2xH200").gpus[:1])
    assert gpu_start.target_gpu(one, None) == 0
    assert gpu_start.start(dataclasses.replace(one, cuda_initialized=True), None) is None


def test_a_failed_start_is_reported_not_raised() -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("checks the failure report on a machine without CUDA")
    s = gpu_start.GpuStart(0, bf16=True)
    got = s.join()
    assert got["device"] == "cuda:0" and got["seconds"] is not None
    assert got["error"] and ("CUDA" in got["error"] or "cuda" in got["error"])


def test_load_model_on_the_cpu_starts_no_gpu(tiny_model) -> None:  # type: ignore[no-untyped-def]
    import cudaload

    m = cudaload.load_model(tiny_model("qwen3"))
    assert m.cudaload_plan.verified["gpu_start"] is None
    assert "CUDA context" not in m.cudaload_plan.explain()


def test_the_switch_turns_it_off() -> None:
    one = dataclasses.replace(hardware("2xH200"), gpus=hardware("2xH200").gpus[:1])
    import os

    old = os.environ.get("CUDALOAD_GPU_START")
    try:
        os.environ["CUDALOAD_GPU_START"] = "0"
        assert gpu_start.start(one, None) is None
        os.environ["CUDALOAD_GPU_START"] = "maybe"
        from cudaload.errors import ConfigurationError

        with pytest.raises(ConfigurationError, match="CUDALOAD_GPU_START"):
            gpu_start.start(one, None)
    finally:
        if old is None:
            os.environ.pop("CUDALOAD_GPU_START", None)
        else:
            os.environ["CUDALOAD_GPU_START"] = old


@pytest.mark.gpu
def test_load_model_on_one_gpu_makes_the_context_while_importing(tiny_model) -> None:  # type: ignore[no-untyped-def]
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs an NVIDIA GPU (runs on the H200 device machine)")
    import json
    import subprocess
    import sys

    # a fresh process, as a user's script is: this one has used CUDA already (other tests), where no thread starts
    code = (
        "import json, sys, cudaload, torch\n"
        "caps = cudaload.detect()\n"  # taken before CUDA is initialised: stale by the second load
        "m = cudaload.load_model(sys.argv[1], device_map='cuda:0')\n"
        "print(json.dumps({'gs': m.cudaload_plan.verified['gpu_start'], 'dev': next(m.parameters()).device.type,"
        " 'explained': 'CUDA context and cuBLAS on cuda:0' in m.cudaload_plan.explain()}))\n"
        # CUDA initialised now, though the snapshot passed says it is not: no second thread
        "m2 = cudaload.load_model(sys.argv[1], device_map='cuda:0', hardware=caps)\n"
        "print(json.dumps({'second': m2.cudaload_plan.verified['gpu_start']}))\n"
    )
    p = subprocess.run(
        [sys.executable, "-c", code, str(tiny_model("qwen3"))], capture_output=True, text=True, timeout=300
    )
    assert p.returncode == 0, p.stderr[-2000:]
    first, second = (json.loads(line) for line in p.stdout.strip().splitlines()[-2:])
    gs = first["gs"]
    assert gs["device"] == "cuda:0" and gs["error"] is None and gs["seconds"] > 0
    assert first["dev"] == "cuda" and first["explained"]
    assert second["second"] is None


def test_starting_the_gpu_in_a_fresh_process_under_torchrun_does_not_abort_it() -> None:
    """load_model under torchrun imports torch.distributed (the ranks' exchange) right after the thread starts.
    When the thread was the first to import torch, the two imports met in torch's own circular import and the
    process aborted ("terminate called after throwing an instance of 'python_error'", exit -6)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    pytest.importorskip("torch")
    src = Path(__file__).resolve().parents[1] / "src"
    code = (
        "import dataclasses, sys\n"
        "from cudaload.execute.runtime import gpu_start\n"
        "from cudaload.capabilities import Distributed\n"
        "from cudaload.profiles import hardware\n"
        "h = hardware('2xH200')\n"
        "caps = dataclasses.replace(h, distributed=Distributed(local_rank=1, rank=1, world_size=2, "
        "local_world_size=2))\n"
        "assert 'torch' not in sys.modules\n"
        "s = gpu_start.start(caps, None)\n"
        "import torch.distributed\n"
        "print(s.join()['device'])\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        env={**{k: v for k, v in os.environ.items() if k != "CUDALOAD_GPU_START"}, "PYTHONPATH": str(src)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "cuda:1"
