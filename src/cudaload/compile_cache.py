"""Where compiled decode artifacts persist between processes (issue 35): one file per key under
``<CUDALOAD_CACHE>/compile/``. The key (:func:`cudaload.policies.decode.decode_cache_key`) names the torch
build, the GPU, the model's shape, dtype, attention, the static cache's bucket and batch sizes, so another torch,
GPU or shape never reuses an artifact.

This module is the small, torch-free part (the paths, whether an artifact is there, its bytes read and written):
the planner asks :func:`present` to know whether a compile will be cold or warm; :mod:`cudaload.execute.decode`
hands :func:`load`'s bytes to ``torch.compiler.load_cache_artifacts`` and ``save_cache_artifacts``' bytes to
:func:`save`. A cache folder that cannot be read or written costs a compile, never the load: both warn and go on.
"""

from __future__ import annotations

import contextlib
import os
import re
import tempfile
import warnings
from collections.abc import Mapping
from pathlib import Path

from . import _env
from .errors import CudaloadWarning

#: the folder under cudaload's cache
SUBDIR = "compile"
_SAFE = re.compile(r"[^A-Za-z0-9._+-]")


def folder(env: Mapping[str, str] | None = None) -> Path:
    """``<CUDALOAD_CACHE>/compile`` (not created here)."""
    return Path(_env.cache_dir(env)) / SUBDIR


def path_for(key: str, env: Mapping[str, str] | None = None) -> Path:
    """The artifact file of ``key`` (characters outside ``[A-Za-z0-9._+-]`` become ``_``)."""
    if not key:
        raise ValueError("an empty compile-cache key")
    return folder(env) / (_SAFE.sub("_", key) + ".bin")


def present(key: str | None, env: Mapping[str, str] | None = None) -> bool:
    """Whether an artifact for ``key`` is on disk (a non-empty file)."""
    if not key:
        return False
    try:
        return path_for(key, env).stat().st_size > 0
    except OSError:
        return False


def _warn(what: str, path: Path, err: OSError) -> None:
    warnings.warn(
        f"the compile cache could not {what} {path}: {err.strerror or err}; the decode step is compiled "
        "from scratch (set CUDALOAD_CACHE to a writable folder to keep it between processes)",
        CudaloadWarning,
        stacklevel=3,
    )


def load(key: str | None, env: Mapping[str, str] | None = None) -> bytes | None:
    """The artifact bytes saved for ``key``; None when there are none (no key, no file, an empty file). A file that
    is there but cannot be read warns and gives None."""
    if not key:
        return None
    path = path_for(key, env)
    try:
        data = path.read_bytes()
    except (
        FileNotFoundError,
        NotADirectoryError,
    ):  # nothing saved (yet): no warning; save() says if it cannot
        return None
    except OSError as e:
        _warn("read", path, e)
        return None
    return data or None


def save(key: str, data: bytes, env: Mapping[str, str] | None = None) -> Path | None:
    """Write ``data`` as ``key``'s artifact, atomically: a temporary file in the same folder, flushed, then
    ``os.replace`` over the old one, so a reader (another process loading the same model) sees the old file or the
    new one, never a part. Creates the folder. Returns the path written, or None after a warning when the folder
    cannot be made or written (read-only, a file in its place, a full disk); a failed write leaves no temporary
    file behind."""
    if not isinstance(data, (bytes, bytearray)) or not data:
        raise ValueError(
            "compile_cache.save needs the non-empty bytes of torch.compiler.save_cache_artifacts()"
        )
    path = path_for(key, env)
    tmp: str | None = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        tmp = None
    except OSError as e:
        _warn("write", path, e)
        return None
    finally:
        if tmp is not None:
            with contextlib.suppress(OSError):  # it may not exist yet (mkstemp failed): nothing to remove
                os.unlink(tmp)
    return path
