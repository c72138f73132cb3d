"""Cold loads without root: evict a checkpoint's files from the page cache, and check that they left it.

``/proc/sys/vm/drop_caches`` needs root and a writable /proc/sys (the H200 machine's is read-only). Dropping
*one file's* clean pages needs neither: ``fsync`` (dirty pages cannot be dropped) then
``posix_fadvise(POSIX_FADV_DONTNEED)``. Whether it worked is measured, not assumed: ``resident_fraction``
asks the kernel (``mincore`` on a mapping of the file) how many of its pages are still in memory, and a
benchmark reports the figure next to every cold number.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src"
if SRC.is_dir() and str(SRC) not in sys.path:
    sys.path.insert(0, str(SRC))

# mincore on a mapping of each file, where the kernel tells the truth about it (re-exported for benchmarks)
from cudaload.execute.runtime.prefetch import resident_fraction  # noqa: E402

__all__ = ["evict", "files_of", "resident_fraction"]


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
