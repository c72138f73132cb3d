"""Read a checkpoint into the page cache while Python is still importing (issue 14).

A fresh process spends ~3 s importing torch and 7-8 s importing transformers and the model's module before
any load starts (H200, ``shared/device/README.md``); a cold 16 GB checkpoint takes ~11 s to read at the disk's
1.5 GB/s. Done one after the other, the user waits for the sum. ``load_model()`` knows the checkpoint path
before it imports anything heavy, so it starts a :class:`Prefetch` first: background threads read the files
(``preadv`` into one reused buffer, skipping ranges ``mincore`` says are resident), so that by the time the
loader reads, the bytes are in the page cache. With a warm cache every page is found present and nothing is
copied.

Reading rather than advising: advice (``posix_fadvise(POSIX_FADV_WILLNEED)``, no copy) takes 24.81 s to the
first forward on the H200 against 14.20 s for reading and 23.58 s for plain ``from_pretrained`` (8B bf16, cold
page cache, fresh processes, interleaved; benchmarks/results/2026-12-01-h200/README.md): the kernel throttles the
readahead it queues, and the loader's own reads then wait behind it. Threads that read keep the disk busy at its
rate (issue 29).

Safety: never more than half the memory the kernel reports available is asked for (beyond that the
prefetch would evict its own pages before they are used); the threads are daemons that stop at the first
error, hold no Python objects of the load, and finish on their own. Nothing here imports torch.
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ...request.prefetch_modes import DEFAULT_MODE as DEFAULT_MODE  # read as prefetch.DEFAULT_MODE
from ...request.prefetch_modes import MODES, REMOVED_MODES

#: Size of one read range: small enough that a stop request is honoured quickly, large enough that the
#: kernel builds long sequential reads.
CHUNK_BYTES = 256 << 20
#: Fraction of MemAvailable a prefetch may ask the page cache to hold.
MAX_AVAILABLE_FRACTION = 0.5


def checkpoint_files(
    path: str | os.PathLike[str], subfolder: str = "", variant: str | None = None
) -> list[str]:
    """The ``.safetensors`` files a load of ``path`` reads, largest first ([] for a Hub id or no files).

    transformers' names: ``model.safetensors`` or ``model-00001-of-00004.safetensors``, with a variant
    ``model.fp16.safetensors`` / ``model.fp16-00001-of-00002.safetensors``; other files in the folder (another
    variant, an adapter) are not read by the load, so they are not prefetched either."""
    root = Path(path) / subfolder if subfolder else Path(path)
    if not root.is_dir():
        return []
    stem = re.escape(f"model.{variant}" if variant else "model")
    pattern = re.compile(rf"{stem}(-\d+-of-\d+)?\.safetensors")
    files = [p for p in root.glob("*.safetensors") if p.is_file() and pattern.fullmatch(p.name)]
    return [str(p) for p in sorted(files, key=lambda p: p.stat().st_size, reverse=True)]


def available_bytes() -> int | None:
    """MemAvailable from /proc/meminfo, or None where it cannot be read (not Linux)."""
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


_LOW_BIT = bytes(i & 1 for i in range(256))


def _mincore_tells(fd: int) -> bool:
    """Whether ``mincore`` reports the page cache of this file to this process. Linux (since 5.0) reports every
    page of a file mapping as resident unless the caller owns the file or may open it for writing (mm/mincore.c,
    ``can_do_mincore``: ``inode_owner_or_capable(...) || file_permission(vma->vm_file, MAY_WRITE) == 0``, else
    ``memset(vec, 1, pages)``), so a checkpoint in a shared, read-only model folder would look warm when cold.
    A capability the kernel would also accept (CAP_FOWNER without ownership) is not looked for: the range is
    then read, as without mincore."""
    try:
        if os.fstat(fd).st_uid == os.geteuid():
            return True
        effective = os.access in os.supports_effective_ids  # the kernel checks the effective ids
        return os.access(f"/proc/self/fd/{fd}", os.W_OK, effective_ids=effective)
    except (OSError, ValueError, NotImplementedError):
        return False


class _Residency:
    """Whether a file range is already in the page cache: ``mincore`` on a mapping of the file (mapping reads
    nothing). A warm checkpoint is then not copied again by the ``read`` mode, which would cost a core and
    memory bandwidth while the imports run. None (unknown) where libc's mmap/mincore cannot be called, or where
    the kernel would not tell the truth (:func:`_mincore_tells`)."""

    def __init__(self, fd: int, size: int) -> None:
        import ctypes
        import mmap

        self.addr: int | None = None
        self.size = size
        self.page = mmap.PAGESIZE
        if not _mincore_tells(fd):
            return
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.mmap.restype = ctypes.c_void_p
            libc.mmap.argtypes = [
                ctypes.c_void_p,
                ctypes.c_size_t,
                ctypes.c_int,
                ctypes.c_int,
                ctypes.c_int,
                ctypes.c_long,
            ]
            libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
            libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
        except (OSError, AttributeError):
            return
        addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0) if size else None
        if addr in (None, ctypes.c_void_p(-1).value):
            return
        self.libc, self.ctypes, self.addr = libc, ctypes, addr

    def resident_pages(self, off: int, n: int) -> tuple[int, int] | None:
        """(pages in the page cache, pages) of the range, or None where it cannot be asked."""
        if self.addr is None or n <= 0:
            return None
        start = off - off % self.page  # mincore wants a page-aligned address
        pages = (off + n - start + self.page - 1) // self.page
        vec = (self.ctypes.c_ubyte * pages)()
        if self.libc.mincore(self.ctypes.c_void_p(self.addr + start), off + n - start, vec) != 0:
            return None
        # bit 0 of each byte: the page is resident (the other bits are reserved)
        return pages - bytes(vec).translate(_LOW_BIT).count(0), pages

    def resident(self, off: int, n: int) -> bool | None:
        got = self.resident_pages(off, n)
        return None if got is None else got[0] == got[1]

    def close(self) -> None:
        if self.addr is not None:
            self.libc.munmap(self.ctypes.c_void_p(self.addr), self.size)
            self.addr = None


def resident_fraction(files: Iterable[str | os.PathLike[str]]) -> float | None:
    """Fraction of the files' pages in the page cache (0.0 = cold), or None where the kernel cannot or would not
    say (see :class:`_Residency`). Benchmarks report it beside every cold number."""
    resident = total = 0
    for f in files:
        size = os.path.getsize(f)
        if size == 0:
            continue
        fd = os.open(f, os.O_RDONLY)
        try:
            res = _Residency(fd, size)
            try:
                got = res.resident_pages(0, size)
            finally:
                res.close()
        finally:
            os.close(fd)
        if got is None:
            return None
        resident += got[0]
        total += got[1]
    return resident / total if total else None


@dataclass
class Prefetch:
    """Background read-ahead of ``files``. ``start()`` returns at once; ``summary()`` says what it did."""

    files: Sequence[str]
    mode: str = DEFAULT_MODE
    threads: int = 4
    limit_bytes: int | None = None
    started_at: float = 0.0
    done_at: float | None = None
    #: bytes of the files now in the page cache: read by the threads, or found there already
    covered_bytes: int = 0
    #: of covered_bytes, what was in the page cache already and was not copied
    resident_bytes: int = 0
    error: str | None = None
    _stop: threading.Event = field(default_factory=threading.Event, repr=False)
    _workers: list[threading.Thread] = field(default_factory=list, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            why = f" ({REMOVED_MODES[self.mode]})" if self.mode in REMOVED_MODES else ""
            raise ValueError(f"prefetch mode {self.mode!r}{why}: use one of {', '.join(MODES)}")

    def _ranges(self) -> list[tuple[str, int, int]]:
        budget = self.limit_bytes
        avail = available_bytes()
        if avail is not None:
            cap = int(avail * MAX_AVAILABLE_FRACTION)
            budget = cap if budget is None else min(budget, cap)
        out: list[tuple[str, int, int]] = []
        for f in self.files:
            try:
                size = os.path.getsize(f)
            except OSError:
                continue
            for off in range(0, size, CHUNK_BYTES):
                n = min(CHUNK_BYTES, size - off)
                if budget is not None:
                    if budget <= 0:
                        return out
                    n = min(n, budget)
                    budget -= n
                out.append((f, off, n))
        return out

    def start(self) -> Prefetch:
        if self.mode == "off" or not self.files or not hasattr(os, "preadv"):
            self.done_at = self.started_at = time.perf_counter()
            return self
        self.started_at = time.perf_counter()
        work = self._ranges()
        # interleave: thread i takes ranges i, i+n, ... so every file advances from its start together
        n = max(1, min(self.threads, len(work)))
        remaining = [n]
        for i in range(n):
            t = threading.Thread(
                target=self._run, args=(work[i::n], remaining), name=f"cudaload-prefetch-{i}", daemon=True
            )
            self._workers.append(t)
            t.start()
        return self

    def _run(self, work: list[tuple[str, int, int]], remaining: list[int]) -> None:
        fds: dict[str, int] = {}
        maps: dict[str, _Residency] = {}
        buf = bytearray(16 << 20)
        try:
            for f, off, n in work:
                if self._stop.is_set():
                    break
                fd = fds.get(f)
                if fd is None:
                    fd = fds[f] = os.open(f, os.O_RDONLY)
                if f not in maps:
                    maps[f] = _Residency(fd, os.fstat(fd).st_size)
                if maps[f].resident(off, n):
                    with self._lock:
                        self.resident_bytes += n
                else:
                    view = memoryview(buf)
                    pos = 0
                    while pos < n and not self._stop.is_set():
                        got = os.preadv(fd, [view[: min(len(buf), n - pos)]], off + pos)
                        if got <= 0:
                            break
                        pos += got
                with self._lock:
                    self.covered_bytes += n
        except OSError as e:  # a prefetch is advice: it never fails the load
            with self._lock:
                self.error = f"{type(e).__name__}: {e}"
        finally:
            for m in maps.values():
                m.close()
            for fd in fds.values():
                os.close(fd)
            with self._lock:
                remaining[0] -= 1
                if remaining[0] == 0:
                    self.done_at = time.perf_counter()

    def stop(self) -> None:
        """Ask the threads to stop after their current chunk (they are daemons either way)."""
        self._stop.set()

    def summary(self) -> dict[str, object]:
        with self._lock:
            return {
                "mode": self.mode,
                "files": len(self.files),
                "bytes": self.covered_bytes,
                "resident_bytes": self.resident_bytes,
                "seconds": None if self.done_at is None else round(self.done_at - self.started_at, 4),
                "error": self.error,
            }


def start(
    path: str | os.PathLike[str],
    *,
    subfolder: str = "",
    variant: str | None = None,
    mode: str = DEFAULT_MODE,
    threads: int = 4,
) -> Prefetch | None:
    """Start prefetching the checkpoint at ``path`` (a local directory); None when there is nothing to read."""
    files = checkpoint_files(path, subfolder, variant)
    if not files or mode == "off":
        return None
    return Prefetch(files, mode=mode, threads=threads).start()
