"""Where compiled decode artifacts persist between processes (issue 35): one file per key under
``<CUDALOAD_CACHE>/compile/``. The key (:func:`cudaload.policies.decode.decode_cache_key`) names the torch
build, the GPU, the model's shape, dtype, attention, the static cache's bucket and batch sizes, so another torch,
GPU or shape never reuses an artifact.

This module is the small, torch-free part (the paths and whether an artifact is there): the planner asks
:func:`present` to know whether a compile will be cold or warm. Saving and loading the artifacts (torch's
``torch.compiler.save_cache_artifacts`` / ``load_cache_artifacts``) is :mod:`cudaload.execute.decode`'s.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

from . import _env

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
