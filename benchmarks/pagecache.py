"""Cold loads without root: evict a checkpoint's files from the page cache, and check that they left it.

``/proc/sys/vm/drop_caches`` needs root and a writable /proc/sys (the H200 machine's is read-only). Dropping
*one file's* clean pages needs neither: ``fsync`` (dirty pages cannot be dropped) then
``posix_fadvise(POSIX_FADV_DONTNEED)``. Whether it worked is measured, not assumed: ``resident_fraction``
asks the kernel (``mincore`` on a mapping of the file) how many of its pages are still in memory, and a
benchmark reports the figure next to every cold number.
"""

from __future__ import annotations

import ctypes
import mmap
import os
from collections.abc import Iterable
from pathlib import Path


def files_of(path: str | os.PathLike[str]) -> list[Path]:
    """The safetensors files of a checkpoint directory."""
    return sorted(Path(path).glob("*.safetensors"))


def evict(files: Iterable[str | os.PathLike[str]]) -> tuple[bool, str]:
    """Drop ``files`` (only them: the interpreter's own files stay cached, as they would be for a user loading
    a model that is not in memory) from the page cache: (done, how or why not)."""
    files = list(files)
    if hasattr(os, "posix_fadvise"):
        try:
            for f in files:
                fd = os.open(f, os.O_RDONLY)
                try:
                    os.fsync(fd)
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                finally:
                    os.close(fd)
            return True, "fsync + posix_fadvise(DONTNEED)"
        except OSError as e:
            why = f"fadvise failed: {e}"
    else:
        why = "no posix_fadvise on this platform"
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w", encoding="ascii") as fh:
            fh.write("3\n")
        return True, "drop_caches"
    except OSError as e:
        return False, f"{why}; drop_caches: {e}"


def resident_fraction(files: Iterable[str | os.PathLike[str]]) -> float | None:
    """Fraction of the files' pages in the page cache (0.0 = fully cold), or None where it cannot be asked."""
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
        return None
    page = mmap.PAGESIZE
    resident = total = 0
    for f in files:
        size = os.path.getsize(f)
        if size == 0:
            continue
        fd = os.open(f, os.O_RDONLY)
        try:
            addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
            if addr in (None, ctypes.c_void_p(-1).value):
                return None
            try:
                n = (size + page - 1) // page
                vec = (ctypes.c_ubyte * n)()
                if libc.mincore(addr, size, vec) != 0:
                    return None
                raw = bytes(vec)
                resident += n - raw.count(0)
                total += n
            finally:
                libc.munmap(addr, size)
        finally:
            os.close(fd)
    return resident / total if total else None
