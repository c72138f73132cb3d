"""What a load starts before it plans: the checkpoint's files read into the page cache on threads, and the CUDA
context made on the GPU the load will use while transformers imports (cudaload.execute.runtime.prefetch, cudaload.execute.runtime.gpu_start);
stopped, and their threads joined, when the call is refused, so nothing of it outlives the error."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..capabilities import Capabilities
from ..request import Request

if TYPE_CHECKING:
    from .runtime.gpu_start import GpuStart
    from .runtime.prefetch import Prefetch


class Started:
    """The threads one load_model() call started ahead of the load."""

    def __init__(self, req: Request) -> None:
        self.prefetch: Prefetch | None = None
        self.gpu: GpuStart | None = None
        self._gpu_summary: dict[str, Any] | None = None
        if req.prefetch:
            from .runtime import prefetch as _prefetch

            fp = req.from_pretrained_kwargs
            self.prefetch = _prefetch.start(
                req.model,
                mode=_prefetch.DEFAULT_MODE if req.prefetch is True else str(req.prefetch),
                subfolder=str(fp.get("subfolder") or ""),
                variant=fp.get("variant"),
            )
        self._gpu_wanted = bool(req.prefetch) and req.prefetch != "off"

    def start_gpu(self, req: Request, caps: Capabilities) -> None:
        """The CUDA context and cuBLAS on the GPU the load will use, made while transformers imports."""
        if self._gpu_wanted:
            from .runtime import gpu_start as _gpu_start

            self.gpu = _gpu_start.start(caps, req.device_map)

    def gpu_summary(self) -> dict[str, Any] | None:
        """What the GPU start did (joined once; later calls return the same)."""
        if self.gpu is not None:
            self._gpu_summary, self.gpu = self.gpu.join(), None
        return self._gpu_summary

    def stop_reading(self) -> None:
        """Nothing will read the checkpoint's pages now (a refusal, a failed load)."""
        if self.prefetch is not None:
            self.prefetch.stop()

    def abandon(self) -> None:
        """The call is refused before loading: no thread of it outlives the error."""
        self.stop_reading()
        if self.gpu is not None:
            self.gpu.join()  # short
            self.gpu = None

    def prefetch_summary(self) -> dict[str, object] | None:
        return self.prefetch.summary() if self.prefetch is not None else None
