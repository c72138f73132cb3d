"""Move checkpoint bytes into already-allocated tensors: reader threads, pinned staging buffers, async copies.

The unit of work is a :class:`Piece`: a byte range of one file that lands in one destination tensor at an
element offset. Large tensors are split into several pieces (so one 1.2 GB embedding is read by many threads);
small tensors of the same file are packed into one :class:`Chunk` (so hundreds of norm weights cost one read).

GPU destination: each reader thread takes a free pinned buffer from a fixed pool, waits until the buffer's
previous host-to-device copy has finished (a CUDA event), fills it with ``os.preadv`` (the GIL is released,
so the threads really read in parallel), enqueues the copies on a side stream and returns the buffer. Bytes of
the same dtype go straight into the parameter's storage; bytes of another dtype go into a piece-sized scratch
on the GPU and are converted there (``copy_`` between dtypes on one device), so the CPU never converts and the
GPU holds at most a piece of scratch beyond the model. Host memory used = the pool, whatever the checkpoint's
size.

CPU destination: no pinned memory and no copies; bytes of the parameter's own dtype are read straight into its
storage, others through a per-thread buffer and one ``copy_``.
"""

from __future__ import annotations

import mmap
import os
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..errors import CheckpointError, ConfigurationError, LoadError
from .reader import TensorInfo

if TYPE_CHECKING:
    import torch

#: Staging buffer size. Measured on the H200 host (benchmarks/results/2026-11-29-h200/sweep.md, 16.4 GB, warm):
#: pinning costs ~6 ms per 16 MiB buffer and blocks cudaMalloc while it runs, so the pool must stay small;
#: with 8 readers, 16 MiB buffers read+copy at 28.7 GB/s (0.57 s), 64 MiB ones no faster once pinning counts.
DEFAULT_BUFFER_BYTES = 16 << 20
#: Offsets of pieces inside a staging buffer are rounded up to this, so a piece can be viewed as any dtype.
_ALIGN = 64
#: Linux's IOV_MAX is 1024; stay well below it.
_MAX_IOV = 512


def default_threads() -> int:
    # Page-cache reads saturate at ~8 threads on the H200 host: 8 x 16 MiB moved 16.4 GB in 0.57 s, 16 threads
    # no faster (0.63 s) and each extra reader adds a pinned buffer. Never more readers than cores.
    return max(2, min(8, os.cpu_count() or 2))


def io_settings(threads: int | None, buffer_bytes: int | None) -> tuple[int, int]:
    """A loader's reader threads and staging-buffer bytes: the defaults for None (or 0), checked."""
    threads = threads or default_threads()
    buffer_bytes = buffer_bytes or DEFAULT_BUFFER_BYTES
    if threads < 1 or buffer_bytes < 1 << 16:
        raise ConfigurationError(
            f"threads={threads}, buffer_bytes={buffer_bytes} out of range",
            fix="use threads >= 1 and buffer_bytes >= 64 KiB",
        )
    return threads, buffer_bytes


@dataclass(frozen=True)
class Piece:
    """``nbytes`` bytes at ``file_offset`` of ``file`` -> tensor ``target``, from element ``elem_start``."""

    target: int
    file: str
    file_offset: int
    nbytes: int
    elem_start: int
    itemsize: int


@dataclass
class Chunk:
    """Pieces of one file read together into one staging buffer; ``offsets[i]`` is piece i's place in it."""

    file: str
    pieces: list[Piece] = field(default_factory=list)
    offsets: list[int] = field(default_factory=list)
    used: int = 0


@dataclass(frozen=True)
class Target:
    """A destination: a contiguous tensor (already on its device) and the dtype its checkpoint bytes have."""

    name: str
    tensor: torch.Tensor
    src_dtype: torch.dtype


def _round_up(n: int, a: int) -> int:
    return (n + a - 1) // a * a


def split_pieces(index: int, info: TensorInfo, max_bytes: int) -> list[Piece]:
    """Split one tensor's bytes into pieces of at most ``max_bytes``, each a whole number of elements."""
    if info.nbytes == 0:
        return []
    step = max(info.itemsize, max_bytes // info.itemsize * info.itemsize)
    out = []
    for off in range(0, info.nbytes, step):
        n = min(step, info.nbytes - off)
        out.append(Piece(index, info.file, info.start + off, n, off // info.itemsize, info.itemsize))
    return out


def pack_chunks(pieces: Iterable[Piece], buffer_bytes: int) -> list[Chunk]:
    """Pack pieces (in file order) into chunks that fit one staging buffer each. Pieces keep their order, so
    neighbours in a file end up in one chunk and are read with a single ``preadv``."""
    chunks: list[Chunk] = []
    cur: Chunk | None = None
    for p in pieces:
        at = _round_up(cur.used, _ALIGN) if cur is not None else 0
        if cur is None or cur.file != p.file or at + p.nbytes > buffer_bytes:
            cur = Chunk(p.file)
            chunks.append(cur)
            at = 0
        cur.pieces.append(p)
        cur.offsets.append(at)
        cur.used = at + p.nbytes
    # biggest first: the long reads start early and the small ones fill the gaps at the end
    chunks.sort(key=lambda c: -c.used)
    return chunks


def _preadv_full(fd: int, file: str, views: Sequence[memoryview], offset: int) -> None:
    """Read exactly ``sum(len(v))`` bytes at ``offset`` into ``views`` (short reads are retried)."""
    pending = [v for v in views if len(v)]
    while pending:
        got = os.preadv(fd, pending[:_MAX_IOV], offset)
        if got <= 0:
            raise CheckpointError(
                f"{file} ended at byte {offset} while reading tensor data (the file is truncated or changed "
                "while loading)",
                fix="re-download or re-save the checkpoint",
            )
        offset += got
        while got and pending:
            if got >= len(pending[0]):
                got -= len(pending[0])
                pending.pop(0)
            else:
                pending[0] = pending[0][got:]
                got = 0


def read_chunk(fd: int, chunk: Chunk, buf: memoryview) -> None:
    """Fill ``buf`` with the chunk's pieces; file-contiguous pieces share one ``preadv``."""
    run: list[memoryview] = []
    run_start = run_end = -1
    for p, at in zip(chunk.pieces, chunk.offsets, strict=False):
        if run and p.file_offset != run_end:
            _preadv_full(fd, chunk.file, run, run_start)
            run = []
        if not run:
            run_start = run_end = p.file_offset
        run.append(buf[at : at + p.nbytes])
        run_end += p.nbytes
    if run:
        _preadv_full(fd, chunk.file, run, run_start)


class _Files:
    """One read-only descriptor per file, shared by all threads (``preadv`` carries its own offset)."""

    def __init__(self, files: Iterable[str]) -> None:
        self.fds: dict[str, int] = {}
        try:
            for f in files:
                self.fds[f] = os.open(f, os.O_RDONLY)
        except OSError as e:
            self.close()
            raise CheckpointError(
                f"cannot open {e.filename}: {e.strerror}", fix="check the file and its permissions"
            ) from e

    def close(self) -> None:
        for fd in self.fds.values():
            os.close(fd)
        self.fds.clear()


def _host_view(t: torch.Tensor) -> memoryview:
    """A writable memoryview of a contiguous CPU tensor's bytes (what ``preadv`` fills)."""
    return memoryview(_byte_view(t).numpy())  # type: ignore[arg-type]


def _byte_view(t: torch.Tensor) -> torch.Tensor:
    """The flat uint8 view of a contiguous tensor's storage."""
    import torch

    return t.reshape(-1).view(torch.uint8)


def _run_parallel(
    work: Callable[[Any], None],
    items: Sequence[Any],
    threads: int,
    stop: threading.Event | None = None,
) -> None:
    """Run ``work`` over ``items`` on ``threads`` threads; the first error stops the rest and is raised.
    ``stop``: once set, the items not started yet are skipped."""
    if not items:
        return
    failed = threading.Event()

    def guarded(item: Any) -> None:
        if not failed.is_set() and not (stop is not None and stop.is_set()):
            try:
                work(item)
            except BaseException:
                failed.set()
                raise

    with ThreadPoolExecutor(max_workers=min(threads, len(items)), thread_name_prefix="cudaload-read") as pool:
        futures = [pool.submit(guarded, it) for it in items]
        errors = [f.exception() for f in futures]
    for e in errors:
        if e is not None:
            raise e


def fill_cpu(
    targets: Sequence[Target],
    infos: Sequence[TensorInfo],
    *,
    threads: int,
    buffer_bytes: int,
    stop: threading.Event | None = None,
) -> None:
    """Fill CPU tensors: same-dtype pieces are read straight into the tensor's storage. ``stop``: as for
    :func:`fill_cuda`."""
    import torch

    pieces = [p for i, info in enumerate(infos) for p in split_pieces(i, info, buffer_bytes)]
    files = _Files({p.file for p in pieces})
    local = threading.local()

    def work(p: Piece) -> None:
        t = targets[p.target]
        fd = files.fds[p.file]
        n_elem = p.nbytes // p.itemsize
        dst = t.tensor.reshape(-1)[p.elem_start : p.elem_start + n_elem]
        if t.src_dtype == t.tensor.dtype:
            _preadv_full(fd, p.file, [_host_view(dst)], p.file_offset)
            return
        buf = getattr(local, "buf", None)
        if buf is None or buf.numel() < p.nbytes:
            buf = local.buf = torch.empty(max(p.nbytes, min(buffer_bytes, 1 << 26)), dtype=torch.uint8)
        staged = buf[: p.nbytes]
        _preadv_full(fd, p.file, [_host_view(staged)], p.file_offset)
        dst.copy_(staged.view(t.src_dtype))

    try:
        _run_parallel(work, pieces, threads, stop)
    finally:
        files.close()


@dataclass
class _Slot:
    host: torch.Tensor
    view: memoryview
    done: Any  # torch.cuda.Event: the last copies out of ``host`` have finished


def pool_size(total_bytes: int, threads: int, buffer_bytes: int) -> int:
    """Staging buffers for a load of ``total_bytes``: two more than the readers (a buffer whose copies are
    still in flight must not stall a reader), never more than the checkpoint needs."""
    return max(1, min(threads + 2, -(-total_bytes // buffer_bytes)))


class PinnedPool:
    """``count`` page-locked host buffers of ``nbytes`` each, pinned by a background thread.

    Pinning is the fixed cost of a load (it faults in and locks every page: ~0.3 s for 1.1 GiB on the H200
    host). Created when a load starts, the pool pins while the model skeleton is built and its GPU storage
    allocated; readers take buffers as they become ready.

    ``register=True`` pins memory cudaload owns with ``cudaHostRegister`` and unregisters it in
    :meth:`close`, so nothing stays pinned after the load; torch's own pinned allocator (``register=False``,
    the fallback where cudart lacks the call) keeps freed pinned blocks cached for the life of the process.
    """

    def __init__(
        self, count: int, nbytes: int, *, register: bool = True, device: torch.device | None = None
    ) -> None:
        if count < 1 or nbytes < 1:
            raise ConfigurationError(
                f"a staging pool needs buffers (count={count}, nbytes={nbytes})", fix="use positive sizes"
            )
        self.count, self.nbytes = count, nbytes
        self.device = device  # the load's GPU: registering on another would start a CUDA context there
        self.register = register and _can_register()
        self.pin_seconds = 0.0
        self._cond = threading.Condition()
        self._free: list[_Slot] = []
        self._made = 0
        self._finished = False
        self._closed = False
        self._error: BaseException | None = None
        self._registered: list[int] = []
        self._keep: list[torch.Tensor] = []
        self._thread = threading.Thread(target=self._pin_all, name="cudaload-pin", daemon=True)
        self._thread.start()

    def _pin_one(self) -> _Slot:
        import torch

        if self.register:
            # Whole pages only: torch aligns CPU memory to 64 bytes, so two buffers could share a page, and a
            # page cannot be registered twice. Over-allocate one page and register the page-aligned middle.
            page = mmap.PAGESIZE
            span = _round_up(self.nbytes, page)
            raw = torch.empty(span + page, dtype=torch.uint8)
            skip = -raw.data_ptr() % page
            host = raw[skip : skip + self.nbytes]
            err = int(torch.cuda.cudart().cudaHostRegister(raw.data_ptr() + skip, span, 1))  # portable
            if err != 0:
                raise LoadError(
                    f"cudaHostRegister of {span} bytes failed (cudaError {err})",
                    fix="free host memory or raise the locked-memory limit (ulimit -l)",
                )
            self._registered.append(raw.data_ptr() + skip)
        else:
            host = torch.empty(self.nbytes, dtype=torch.uint8, pin_memory=True)
        self._keep.append(host)  # a view keeps its whole allocation alive until close()
        return _Slot(host, _host_view(host), torch.cuda.Event())  # type: ignore[no-untyped-call]

    def _pin_all(self) -> None:
        import torch

        t0 = time.perf_counter()
        try:
            if self.device is not None and self.device.type == "cuda":
                torch.cuda.set_device(self.device)  # this thread's current device, not GPU 0
            for _ in range(self.count):
                if self._closed:
                    break
                slot = self._pin_one()
                with self._cond:
                    self._free.append(slot)
                    self._made += 1
                    self._cond.notify()
        except BaseException as e:  # a pool with fewer buffers still works; none at all raises in get()
            self._error = e
        finally:
            self.pin_seconds = time.perf_counter() - t0
            with self._cond:
                self._finished = True
                self._cond.notify_all()

    def get(self) -> _Slot:
        with self._cond:
            while not self._free:
                if self._finished and self._made == 0:
                    err = self._error
                    raise LoadError(
                        f"could not pin a {self.nbytes}-byte staging buffer: {err}",
                        fix="free host memory, or load with from_pretrained",
                    ) from err
                self._cond.wait()
            return self._free.pop()

    def put(self, slot: _Slot) -> None:
        with self._cond:
            self._free.append(slot)
            self._cond.notify()

    def close(self) -> None:
        """Stop pinning and release every buffer. The caller has synchronised the copies out of them."""
        import torch

        self._closed = True
        self._thread.join()
        for ptr in self._registered:
            torch.cuda.cudart().cudaHostUnregister(ptr)
        self._registered.clear()
        self._free.clear()
        self._keep.clear()


def _can_register() -> bool:
    import torch

    try:
        return hasattr(torch.cuda.cudart(), "cudaHostRegister")
    except Exception:  # no CUDA runtime bindings in this build
        return False


def fill_cuda(
    targets: Sequence[Target],
    infos: Sequence[TensorInfo],
    *,
    device: torch.device,
    threads: int,
    buffer_bytes: int,
    pool: PinnedPool | None = None,
    stop: threading.Event | None = None,
) -> dict[str, float]:
    """Fill tensors on one CUDA device through a pool of pinned buffers and a side stream.

    ``pool`` is a :class:`PinnedPool` started earlier (so its pinning overlapped other work); it is closed
    here. ``stop``: once set, chunks not started yet are not read (the tensors are then partly filled: the
    caller that stops must not use them). Returns timings: ``pin_s`` (the pool's pinning, however much of
    it overlapped), ``wait_s`` (time the first reader waited for a buffer)."""
    import torch

    files: _Files | None = None
    stream = None
    first_wait: list[float] = []
    try:
        pieces = [p for i, info in enumerate(infos) for p in split_pieces(i, info, buffer_bytes)]
        chunks = pack_chunks(pieces, buffer_bytes)
        if pool is None:
            total = sum(c.used for c in chunks)
            pool = PinnedPool(pool_size(total, threads, buffer_bytes), buffer_bytes, device=device)
        elif pool.nbytes < buffer_bytes:
            raise ConfigurationError(
                f"staging buffers of {pool.nbytes} bytes cannot hold {buffer_bytes}-byte chunks",
                fix="build the pool with the load's buffer_bytes",
            )
        if not chunks:
            return {"pin_s": 0.0, "wait_s": 0.0}
        threads = min(threads, pool.count, len(chunks))
        files = _Files({c.file for c in chunks})
        stream = torch.cuda.Stream(device=device)  # type: ignore[no-untyped-call]

        def work(chunk: Chunk) -> None:
            asked = time.perf_counter()
            slot = pool.get()
            if not first_wait:
                first_wait.append(time.perf_counter() - asked)
            try:
                slot.done.synchronize()  # the buffer's previous copies have left it
                assert files is not None
                read_chunk(files.fds[chunk.file], chunk, slot.view)
                with torch.cuda.device(device), torch.cuda.stream(stream):
                    for p, at in zip(chunk.pieces, chunk.offsets, strict=False):
                        t = targets[p.target]
                        src = slot.host[at : at + p.nbytes]
                        n_elem = p.nbytes // p.itemsize
                        dst = t.tensor.reshape(-1)[p.elem_start : p.elem_start + n_elem]
                        if t.src_dtype == t.tensor.dtype:
                            _byte_view(dst).copy_(src, non_blocking=True)
                        else:
                            # convert on the GPU: a scratch of this piece's size, freed as soon as it is used
                            # (the caching allocator hands it to the next piece on this stream)
                            scratch = torch.empty(p.nbytes, dtype=torch.uint8, device=device)
                            scratch.copy_(src, non_blocking=True)
                            dst.copy_(scratch.view(t.src_dtype))
                            del scratch
                    slot.done.record(stream)
            finally:
                pool.put(slot)

        _run_parallel(work, chunks, threads, stop)
        stream.synchronize()
    finally:
        # every copy must be finished before the pinned buffers are unregistered or go back to torch's cache
        if stream is not None:
            stream.synchronize()
        if files is not None:
            files.close()
        if pool is not None:
            pool.close()
    torch.cuda.current_stream(device).wait_stream(stream)
    return {"pin_s": round(pool.pin_seconds, 4), "wait_s": round(first_wait[0] if first_wait else 0.0, 4)}
