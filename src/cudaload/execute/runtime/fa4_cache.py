"""FlashAttention-4's persistent compile cache, on by default under cudaload's cache directory.

Why: FA4 compiles its kernels with CuTe DSL at the first call of each kernel configuration, ~3 s in every
new process on the H200, and keeps them only in memory unless ``FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1``
(flash-attn-4 4.0.0b36 flash_attn/cute/cache_utils.py:33-34; off by default, line 34's ``"0"``). With it on,
the second process loaded the compiled kernels in 0.55 s instead of paying 3.6 s
(measured: /work/shared/device/README.md). Without ``FLASH_ATTENTION_CUTE_DSL_CACHE_DIR`` the cache lives in
``/tmp/$USER/flash_attention_cute_dsl_cache`` (cache_utils.py:37-47), which a reboot or a tmp cleaner
empties; cudaload's cache directory persists. Stale kernels are not a risk: FA4 namespaces the cache by a
fingerprint of its own sources, the Python minor version and the cutlass / tvm_ffi versions
(cache_utils.py ``_compute_source_fingerprint`` and ``get_jit_cache``, lines 293-311).

Both variables are read once, when ``flash_attn.cute.cache_utils`` is imported (module-level ``os.getenv``),
so :func:`enable_fa4_compile_cache` must run before FA4 is first imported: execute calls it right before it
loads a model with ``flash_attention_4``. Nothing happens at ``import cudaload``, and a variable the user set
(``0`` included) is never overridden.
"""

from __future__ import annotations

import os
import sys
from collections.abc import MutableMapping
from dataclasses import dataclass

from ... import _env

#: the module whose import reads the variables (flash-attn-4 4.0.0b36 flash_attn/cute/cache_utils.py)
FA4_CACHE_MODULE = "flash_attn.cute.cache_utils"


@dataclass(frozen=True)
class FA4CacheState:
    """What :func:`enable_fa4_compile_cache` did and why, for the plan's notes."""

    enabled: bool  # the persistent cache will be on in this process
    directory: str | None
    set_by_cudaload: tuple[str, ...]  # the variables cudaload set (empty: the user's choice stood)
    note: str


def enable_fa4_compile_cache(env: MutableMapping[str, str] | None = None) -> FA4CacheState:
    """Turn FA4's persistent compile cache on under ``<cudaload cache>/fa4`` unless the user chose otherwise.

    ``env`` defaults to ``os.environ`` (the process FA4 will read); tests pass a dict. Sets
    ``FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1`` only when it is unset, and ``FLASH_ATTENTION_CUTE_DSL_CACHE_DIR``
    only when it is unset and the cache ends up enabled. When FA4 was already imported in this process the
    variables can no longer change anything, and the note says so.
    """
    target: MutableMapping[str, str] = os.environ if env is None else env
    user_enabled, user_dir = _env.fa4_compile_cache(target)
    if env is None and FA4_CACHE_MODULE in sys.modules:
        # FA4 read its settings at that import; changing them now would only mislead
        on = user_enabled == "1"
        return FA4CacheState(
            on,
            user_dir if on else None,
            (),
            "flash_attn.cute was imported before cudaload could configure its compile cache: left as it was",
        )
    did: list[str] = []
    if user_enabled is None:
        target[_env.FA4_CACHE_ENABLED] = "1"
        did.append(_env.FA4_CACHE_ENABLED)
    enabled = target[_env.FA4_CACHE_ENABLED] == "1"  # FA4's own test (cache_utils.py:34)
    directory = user_dir
    if enabled and user_dir is None:
        directory = os.path.join(_env.cache_dir(target), "fa4")
        target[_env.FA4_CACHE_DIR] = directory
        did.append(_env.FA4_CACHE_DIR)
    if not enabled:
        note = (
            f"FA4 compile cache off: {_env.FA4_CACHE_ENABLED}={target[_env.FA4_CACHE_ENABLED]} was set by you"
        )
    elif did:
        note = f"FA4 compile cache on in {directory} (set by cudaload: {', '.join(did)})"
    else:
        note = f"FA4 compile cache on in {directory or 'its default directory'} (your settings)"
    return FA4CacheState(enabled, directory, tuple(did), note)
