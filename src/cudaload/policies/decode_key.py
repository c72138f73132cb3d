"""The persistent compile cache's key for a compiled decode step (:mod:`cudaload.compile_cache`), and the
compile settings it hashes: what a declared plan, a per-call compile and ``cudaload precompile --decode`` agree on
so that one's artifact serves the others. Pure."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

from ..capabilities import Capabilities
from ..model_info import ModelSummary
from .sdpa_dispatch import COMPILED_STEP_REVISION
from .sdpa_dispatch import NAMES as SDPA_VARIANTS

__all__ = ["COMPILE_CONFIG", "cache_key_from", "decode_cache_key", "decode_key_base"]

#: transformers' CompileConfig keywords: ``fullgraph`` False is CompileConfig's default (transformers 5.17
#: generation/configuration_utils.py:1659) and what generate() forces with flash attention anyway
#: (generation/utils.py:2300-2308, flash attention breaks the graph); True would turn any graph break of a
#: model's code into an error, and the measured 6.0-6.3 ms/token were with the default. ``dynamic`` False: the
#: static cache fixes every shape, so one graph per bucket and batch. ``mode`` reduce-overhead: CUDA graphs,
#: where the decode step's time goes on a GPU this fast (CompileConfig's default, configuration_utils.py:1662).
#: No inductor options: gpt-fast's ``coordinate_descent_tuning`` (M=1 matmuls as tuned Triton reductions) gave
#: 0-8% a token on the H100 against a cold compile of more than 155 s instead of 70
#: (benchmarks/results/2026-12-07-s19/README.md), which a 3,000-token call does not pay back
COMPILE_CONFIG: Mapping[str, Any] = {"fullgraph": False, "dynamic": False, "mode": "reduce-overhead"}


def decode_cache_key(
    caps: Capabilities,
    model: ModelSummary,
    *,
    dtype: str,
    attention: str,
    max_cache_len: int,
    batch: int,
) -> str:
    """The persistent compile cache's key (:mod:`cudaload.compile_cache`): a readable prefix (model type, layers,
    dtype, attention, bucket, batch, GPU) and a hash of everything a compiled graph depends on: torch, its CUDA,
    transformers, the GPU's name and compute capability, the model's shape, dtype, attention, bucket and batch.
    Another torch, GPU or shape never reuses an artifact."""
    parts, label = decode_key_base(caps, model, dtype=dtype, attention=attention)
    return cache_key_from(parts, label, max_cache_len=max_cache_len, batch=batch)


def decode_key_base(
    caps: Capabilities, model: ModelSummary, *, dtype: str, attention: str
) -> tuple[dict[str, Any], tuple[str, str]]:
    """What :func:`decode_cache_key` hashes that does not depend on the call (everything but the bucket and the
    batch), as plain JSON values, and the readable prefix's two halves: what a per-call plan keeps
    (:class:`cudaload.plans.decode.PerCallDecode`) to name each call's artifact with the key a declared plan or
    ``cudaload precompile --decode`` gives the same bucket and batch."""
    gpu = caps.gpus[0] if caps.gpus else None
    parts: dict[str, Any] = {
        "torch": caps.torch_version,
        "cuda": caps.torch_cuda_version,
        "transformers": caps.transformers_version,
        "gpu": gpu.name if gpu else None,
        "cc": list(gpu.compute_capability) if gpu else None,
        "model": [
            model.type,
            model.architecture,
            model.params,  # differs with the MLP's width and the experts, which the graph's shapes follow
            model.layers,
            model.hidden_size,
            model.num_heads,
            model.num_kv_heads,
            model.head_dim,
            model.vocab_size,
            model.sliding_window,
            model.is_moe,
        ],
        "dtype": dtype,
        "attention": attention,
        # cudaload's own attention code inside the compiled step (transformers' is covered by its version)
        "attention_code": COMPILED_STEP_REVISION if attention in SDPA_VARIANTS else None,
    }
    sm = f"sm{gpu.sm}" if gpu else "cpu"
    short = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}.get(dtype, dtype)
    return parts, (f"{model.type}-L{model.layers}-{short}-{attention}", sm)


def cache_key_from(parts: Mapping[str, Any], label: Sequence[str], *, max_cache_len: int, batch: int) -> str:
    """:func:`decode_cache_key` from :func:`decode_key_base`'s parts and label (a JSON round trip of them gives
    the same key: every value is a string, a number, None, a bool or a list)."""
    full = {
        **parts,
        "max_cache_len": max_cache_len,
        "batch": batch,
        "compile": sorted(COMPILE_CONFIG.items()),
    }
    digest = hashlib.sha256(repr(sorted(full.items())).encode()).hexdigest()[:16]
    head, sm = label
    return f"{head}-c{max_cache_len}-b{batch}-{sm}-{digest}"
