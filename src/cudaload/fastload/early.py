"""Copy a checkpoint's tensors to the GPU while transformers is still importing (issue 14).

In a fresh process ``load_model()`` spends 7-11 s importing transformers and the model's module before the
plan exists; the fast path's copy (16.4 GB at ~28 GB/s on the H200, ``load.fill`` 0.59 s for the 8B shape) then
runs after it. The copy needs neither transformers nor the plan: only the GPU and the checkpoint's bytes. When
both are certain before planning, :class:`EarlyUpload` reads the files on background threads into one GPU
tensor per checkpoint tensor (the fast path's own reader, :func:`cudaload.fastload.staging.fill_cuda`: pinned
buffers, ``preadv`` with the GIL released, copies on a side stream). When the plan then takes the fast path
onto that GPU, :func:`cudaload.fastload.materialize.allocate` uses those tensors as the parameters' storage (no
second copy, no extra memory); any other plan discards them before it loads.

What is uploaded is exactly what the fast path would copy: a tensor of the checkpoint's own dtype, filled with
its bytes; it is used only where the model wants that dtype and shape from the same byte range of the same file
(compared again when the load reads the headers), so the loaded model is the fast path's, bit for bit.

**Off unless ``CUDALOAD_EARLY_UPLOAD=1``**, because measured end to end it did not pay. On the H200
(benchmarks/results/2026-12-01-h200 runs 19 and 20: Qwen3-8B bf16, warm page cache, fresh processes, 12 pairs
interleaved with the same defaults minus the upload) the load phase fell from 0.73-0.92 s to 0.10-0.20 s in every
pair (the upload was complete before the plan was), but the phase before it (importing torch and transformers,
which the upload overlaps) ran a median 1.3 s longer (9 of 12 pairs longer) and the time to the first forward a
median 0.6 s longer (8 of 12). The upload itself took 2.1-3.3 s on its threads for what the load copies in 0.6 s
alone. Run 21 took the upload apart beside a main thread running bytecode: its reads from the page cache (4 threads
x 64 MiB ``preadv``) slowed the main thread 1.82x while they ran, the pinned pool 1.32x, GPU allocations and
copies 1.02-1.06x; whether through the GIL's hand-over after every read or memory bandwidth is not yet
separated. Until a variant measures faster end to end, the default is the order that measured better.

Pure part: :func:`upload_blockers` says why an upload does not start (tested over profiles). It starts only
where the plan will almost surely take the fast path on that GPU in the checkpoint's dtype, so that the copy is
rarely wasted: one GPU known before planning (not under torchrun, where the plan may shard the weights), no
quantization asked, no keyword only ``from_pretrained`` honours, a bf16/fp16 checkpoint of at least the fast
path's minimum size that fits in half the GPU's free memory.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .reader import TensorInfo, read_file_header

if TYPE_CHECKING:
    import torch

    from ..capabilities import Capabilities

#: Largest upload, as a fraction of the GPU's free memory at detection. The uploaded tensors are the model's
#: weights when the plan takes the fast path, so this only bounds what a plan that goes another way (a split, a
#: quantization chosen to fit, a training plan that needs the room) holds until it discards them: never more
#: than half the GPU.
MAX_FREE_FRACTION = 0.5
#: Checkpoint dtypes uploaded: the half-precision dtypes a plan keeps as they are on a GPU that computes in
#: them (a float32 checkpoint is cast to the plan's dtype: uploading it would copy twice the bytes for nothing).
UPLOAD_DTYPES = frozenset({"BF16", "F16"})
#: Readers and staging buffer size of an early upload. Fewer and larger than the load's own (8 x 16 MiB): the
#: upload runs while the main thread imports, and every chunk and piece takes the GIL a few times, each time
#: waiting up to the interpreter's switch interval (5 ms) behind the import and interrupting it. On the H200
#: (benchmarks/results/2026-12-01-h200 run 19) 8 x 16 MiB took 2.1-3.0 s during the import for what the load copies
#: in 0.64 s alone; the import has 7 s or more to hide it in, so the upload can afford to be slower and take the
#: GIL about a third as often. Run 20 (4 x 64 MiB): 2.8-3.3 s, and the imports no less slowed.
THREADS = 4
BUFFER_BYTES = 64 << 20


def _identity(file: str) -> tuple[str, int, int]:
    st = os.stat(file)
    return os.path.realpath(file), st.st_size, st.st_mtime_ns


def upload_blockers(
    caps: Capabilities,
    device_map: Any,
    *,
    dtype_bytes: Mapping[str, int],
    intent: str,
    quantization: str,
    dtype: str,
    fast: bool | None,
    from_pretrained_kwargs: Mapping[str, Any],
) -> tuple[int | None, list[str]]:
    """(torch's index of the GPU, why an early upload does not start: empty when it does).

    ``dtype_bytes``: the checkpoint's bytes per safetensors dtype (its headers)."""
    from ..gpu_start import target_gpu
    from ..policies.load_path import FAST_MIN_BYTES, fast_kwargs_blockers

    why: list[str] = []
    index = target_gpu(caps, device_map)
    if index is None:
        why.append("the GPU the model loads onto is not certain before planning")
    if caps.distributed.active:
        why.append("under torchrun the plan may shard the weights (FSDP2) instead of loading them whole")
    if fast is False:
        why.append("fast=False")
    if quantization not in ("auto", "none") or intent == "qlora":
        why.append(f"quantization {'qlora' if intent == 'qlora' else quantization} is applied while loading")
    why.extend(fast_kwargs_blockers(from_pretrained_kwargs))
    total = sum(dtype_bytes.values())
    floating = {d: n for d, n in dtype_bytes.items() if d.startswith(("F", "BF"))}
    main = max(floating, key=lambda d: floating[d]) if floating else None
    if main not in UPLOAD_DTYPES:
        why.append(f"checkpoint dtype {main}: only bf16/fp16 checkpoints keep their dtype in the plan")
    want = {"BF16": "bfloat16", "F16": "float16"}.get(main or "")
    if dtype != "auto" and want is not None and dtype != want:
        why.append(f"dtype={dtype!r} differs from the checkpoint's {want}")
    gpu = next((g for g in caps.gpus if g.index == index), None)
    if gpu is not None:
        if main == "BF16" and not gpu.bf16_native:
            why.append(f"{gpu.name} does not compute in bf16 natively: the plan casts the weights")
        free = gpu.free_memory if gpu.free_memory is not None else gpu.total_memory
        if total > MAX_FREE_FRACTION * free:
            why.append(
                f"checkpoint of {total / 2**30:.1f} GiB is more than {MAX_FREE_FRACTION:.0%} of the GPU's "
                f"{free / 2**30:.1f} GiB free"
            )
    if fast is None and total < FAST_MIN_BYTES:
        why.append(f"checkpoint of {total / 1e9:.2f} GB: the plan loads it with from_pretrained (by size)")
    return index, why


@dataclass(frozen=True)
class _Uploaded:
    info: TensorInfo
    identity: tuple[str, int, int]
    tensor: torch.Tensor


class Preloaded:
    """The uploaded tensors, handed to one load: :meth:`pop` gives a tensor for a checkpoint tensor it matches
    exactly (same file, byte range, dtype and shape, wanted in that dtype on that device), at most once."""

    def __init__(self, items: Sequence[_Uploaded], device: torch.device) -> None:
        self.device = device
        self._items = {(u.identity[0], u.info.start): u for u in items}
        self._ids: dict[str, tuple[str, int, int] | None] = {}
        self.used_bytes = 0
        self.used = 0

    def _identity(self, file: str) -> tuple[str, int, int] | None:
        if file not in self._ids:
            try:
                self._ids[file] = _identity(file)
            except OSError:
                self._ids[file] = None
        return self._ids[file]

    def pop(self, info: TensorInfo, dtype: torch.dtype, device: torch.device) -> torch.Tensor | None:
        ident = self._identity(info.file)
        if ident is None or device != self.device:
            return None
        u = self._items.get((ident[0], info.start))
        if u is None or u.identity != ident or u.info.end != info.end:
            return None
        if u.info.dtype != info.dtype or u.info.shape != info.shape or u.tensor.dtype != dtype:
            return None
        del self._items[(ident[0], info.start)]
        self.used += 1
        self.used_bytes += info.nbytes
        return u.tensor

    def release(self) -> int:
        """Drop every tensor not handed out; returns their bytes."""
        left = sum(u.info.nbytes for u in self._items.values())
        self._items.clear()
        return left


class EarlyUpload:
    """Background upload of ``infos`` (tensors of ``files``) into new tensors on ``device``."""

    def __init__(
        self,
        infos: Sequence[TensorInfo],
        device: str,
        *,
        threads: int | None = None,
        buffer_bytes: int | None = None,
    ) -> None:
        self.infos = list(infos)
        self.device_name = device
        self.threads = threads
        self.buffer_bytes = buffer_bytes
        self.bytes = sum(i.nbytes for i in self.infos)
        self.seconds: float | None = None
        self.wait_s: float | None = None
        self.error: str | None = None
        self.outcome = "uploading"
        self._stop = threading.Event()
        self._items: list[_Uploaded] | None = None
        self._device: Any = None
        self._thread = threading.Thread(target=self._run, name="cudaload-early-upload", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        t0 = time.perf_counter()
        try:
            import torch

            from . import staging
            from .materialize import torch_dtype

            dev = torch.device(self.device_name)
            if dev.type == "cuda":
                torch.cuda.set_device(dev)  # this thread's current device, not GPU 0
            ids = {f: _identity(f) for f in {i.file for i in self.infos}}
            tensors = [torch.empty(i.shape, dtype=torch_dtype(i.dtype), device=dev) for i in self.infos]
            targets = [staging.Target(i.name, t, t.dtype) for i, t in zip(self.infos, tensors, strict=True)]
            threads = self.threads or min(THREADS, staging.default_threads())
            buffer_bytes = self.buffer_bytes or BUFFER_BYTES
            if dev.type == "cuda":
                staging.fill_cuda(
                    targets,
                    self.infos,
                    device=dev,
                    threads=threads,
                    buffer_bytes=buffer_bytes,
                    stop=self._stop,
                )
            else:
                staging.fill_cpu(
                    targets, self.infos, threads=threads, buffer_bytes=buffer_bytes, stop=self._stop
                )
            if not self._stop.is_set():
                # unchanged while it was read: a file rewritten meanwhile is read again by the load
                same = all(_identity(f) == v for f, v in ids.items())
                if same:
                    self._items = [
                        _Uploaded(i, ids[i.file], t) for i, t in zip(self.infos, tensors, strict=True)
                    ]
                    self._device = dev
                    self.outcome = "uploaded"
                else:
                    self.outcome = "discarded: a checkpoint file changed while it was read"
            else:
                self.outcome = "stopped"
            del tensors, targets
        except Exception as e:  # reported, never raised: the load then reads the files itself
            self.error = f"{type(e).__name__}: {e}"
            self.outcome = "failed"
        self.seconds = round(time.perf_counter() - t0, 4)

    def take(self) -> Preloaded | None:
        """Wait for the upload and hand its tensors over (once); None when it did not complete."""
        t0 = time.perf_counter()
        self._thread.join()
        self.wait_s = round(time.perf_counter() - t0, 4)
        items, self._items = self._items, None
        if items is None:
            return None
        self.outcome = "handed to the load"
        return Preloaded(items, self._device)

    def discard(self, why: str) -> None:
        """Stop reading, wait for the threads and free what was uploaded (the plan does not use it)."""
        self._stop.set()
        self._thread.join()
        self._items = None
        if self.outcome != "failed":
            self.outcome = f"discarded: {why}"
        _empty_cache(self.device_name)  # what the thread allocated goes back to the driver

    def summary(self) -> dict[str, Any]:
        return {
            "device": self.device_name,
            "tensors": len(self.infos),
            "bytes": self.bytes,
            "seconds": self.seconds,
            "load_waited_s": self.wait_s,
            "outcome": self.outcome,
            "error": self.error,
        }


def _empty_cache(device: str) -> None:
    if device.startswith("cuda"):
        import torch

        torch.cuda.empty_cache()


def start(
    caps: Capabilities,
    files: Sequence[str],
    *,
    device_map: Any,
    intent: str,
    quantization: str,
    dtype: str,
    fast: bool | None,
    from_pretrained_kwargs: Mapping[str, Any],
) -> tuple[EarlyUpload | None, str | None]:
    """Start the upload of ``files`` (the checkpoint's safetensors files) when :func:`upload_blockers` finds
    nothing against it: (the upload, None) or (None, why not). A header that cannot be read starts nothing:
    the load reads it again and reports it."""
    from .. import _env

    if not _env.early_upload_enabled():
        return None, "off (CUDALOAD_EARLY_UPLOAD=1 turns it on; measured no faster end to end on the H200)"
    if not files:
        return None, "no local safetensors files"
    infos: list[TensorInfo] = []
    try:
        for f in files:
            found, _ = read_file_header(f)
            infos.extend(sorted(found.values(), key=lambda i: i.start))
    except Exception as e:  # the load's own header check reports it with its full message
        return None, f"headers not read ({type(e).__name__})"
    by_dtype: dict[str, int] = {}
    for i in infos:
        by_dtype[i.dtype] = by_dtype.get(i.dtype, 0) + i.nbytes
    index, why = upload_blockers(
        caps,
        device_map,
        dtype_bytes=by_dtype,
        intent=intent,
        quantization=quantization,
        dtype=dtype,
        fast=fast,
        from_pretrained_kwargs=from_pretrained_kwargs,
    )
    if why:
        return None, "; ".join(why)
    # torch on the calling thread first, never first on the thread (cudaload.gpu_start.start says why)
    import torch  # noqa: F401

    return EarlyUpload([i for i in infos if i.dtype in UPLOAD_DTYPES], f"cuda:{index}"), None
