"""Create the CUDA context and cuBLAS on the load's GPU while transformers is still importing (issue 14).

In a fresh process the first GPU work pays for the CUDA context and the first GEMM's set-up (cuBLAS handle and
workspace, lazily loaded kernels): 0.41-0.58 s on the H200 after transformers is imported, serially. Started on
a thread right after detection, the same work finishes inside the 6-7 s import and does not slow it: time from
process start until transformers is imported and one bf16 GEMM has run, fresh processes interleaved, is 0.41-0.58 s
after the import serially and 0.00 s threaded, the import itself unchanged (measured with
benchmarks/investigations/bench_init_overlap.py: benchmarks/results/2026-12-01-h200/README.md).

Started only in a process where CUDA is not initialised yet, and only when the GPU the model will load onto
is known before planning: cuda:LOCAL_RANK under torchrun,
the one GPU of a one-GPU process, or a ``device_map`` naming one GPU. The thread holds no objects of the load
and its failure is only reported (the load then meets the same error with its own message).
"""

from __future__ import annotations

import re
import threading
import time
from typing import Any

from ... import _env
from ...capabilities import Capabilities


def target_gpu(caps: Capabilities, device_map: Any) -> int | None:
    """torch's index of the GPU the load will use, when it is certain before planning; else None."""
    if not caps.gpus:
        return None
    if isinstance(device_map, str) and device_map.strip() == "cpu":
        # also under torchrun: placement takes device_map="cpu" before cuda:LOCAL_RANK
        # (cudaload/policies/placement.py:160, before :183)
        return None
    indices = {g.index for g in caps.gpus}
    d = caps.distributed
    if d.active:
        lr = d.local_rank if d.local_rank is not None else 0
        return lr if lr in indices else None
    if isinstance(device_map, int) and not isinstance(device_map, bool):
        return device_map if device_map in indices else None
    if isinstance(device_map, str):
        m = re.fullmatch(r"cuda(?::(\d+))?", device_map.strip())
        if m:
            i = int(m.group(1) or 0)
            return i if i in indices else None
        return None
    if isinstance(device_map, dict):
        values = set(device_map.values())
        if len(values) == 1:
            (v,) = values
            # one GPU named by number or "cuda:N"; anything else ("cpu", "disk", a torch.device) is not read as
            # "no device_map" (which on a one-GPU machine would start the GPU for a load that never uses it)
            if isinstance(v, (int, str)) and not isinstance(v, bool):
                return target_gpu(caps, v)
        return None
    if device_map is None and len(caps.gpus) == 1:
        return caps.gpus[0].index
    return None


class GpuStart:
    """The thread that initialises CUDA on one GPU and runs one small GEMM there."""

    def __init__(self, index: int, bf16: bool) -> None:
        self.index = index
        self.bf16 = bf16
        self.seconds: float | None = None
        self.error: str | None = None
        self._thread = threading.Thread(target=self._run, name="cudaload-gpu-start", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        t0 = time.perf_counter()
        try:
            import torch

            dev = torch.device("cuda", self.index)
            a = torch.ones(256, 256, device=dev, dtype=torch.bfloat16 if self.bf16 else torch.float16)
            (a @ a).sum().item()  # the handle, its workspace and a GEMM kernel loaded; .item() waits for it
            del a
        except Exception as e:  # reported, never raised: the load meets the same problem with its own error
            self.error = f"{type(e).__name__}: {e}"
        self.seconds = round(time.perf_counter() - t0, 4)

    def join(self) -> dict[str, Any]:
        """Wait for the thread (it is short) and say what it did."""
        self._thread.join()
        return {"device": f"cuda:{self.index}", "seconds": self.seconds, "error": self.error}


def start(caps: Capabilities, device_map: Any) -> GpuStart | None:
    if not _env.gpu_start_enabled():
        return None
    i = target_gpu(caps, device_map)
    if i is None:
        return None
    gpu = next(g for g in caps.gpus if g.index == i)
    # torch is imported here, on the calling thread, never first on the thread: torch's own import imports
    # torch.distributed.rpc (torch 2.13 _jit_internal.py:43-46), so a thread importing torch while the caller
    # imports torch.distributed (load_model under torchrun, cudaload.detection.ranks) deadlocks on the two
    # module locks, and Python's way out hands one of them a half-made torch: torch._C._c10d_init() then aborts
    # the process ("terminate called after throwing an instance of 'python_error'"). The caller needs torch
    # next anyway (torch.distributed, transformers): the thread still overlaps the rest of the imports, as in
    # the measured arrangement.
    import torch

    if caps.cuda_initialized or torch.cuda.is_initialized():
        # CUDA was initialised in this process before the call (a notebook's second load, a script that already
        # used the GPU): its context exists, so nothing is left to hide, and a new thread's first GEMM would
        # make a cuBLAS handle with a workspace of its own, 32 MiB on the H200 held for the process's life
        # (runs 25-26: test_gpu_load.py's failed-load and fallback tests found it left over). Asked of torch, not
        # only of the snapshot: a caller may pass one taken before its first load (hardware=caps)
        return None
    return GpuStart(i, gpu.bf16_native)
