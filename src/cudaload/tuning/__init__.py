"""Measured attention choices: time every usable backend on this GPU, cache the result, ship priors.

- :func:`lookup` (pure): timings for a model's attention signature and a declared work, from this machine's
  cache (:class:`TimingCache`), else from the priors cudaload ships (measured on the H200), else None.
- :func:`tune`: measure them here (``cudaload tune``; :func:`add_tune_parser` / :func:`run_tune` for the CLI).
- :func:`enable_fa4_compile_cache`: FA4's persistent JIT cache under cudaload's cache directory, called right
  before a model is loaded with FA4.
- :mod:`cudaload.tuning.measure`: the timing code ``tune`` and benchmarks/bench_generate.py share.

Importing this package imports neither torch nor transformers (``tune`` does, when called).
"""

from __future__ import annotations

from .fa4 import FA4CacheState, enable_fa4_compile_cache
from .signature import AttentionSignature, Work, WorkBucket, as_work, bucket, signature
from .store import CACHE_VERSION, Entry, TimingCache, gpu_id, package_versions
from .timings import (
    MAX_DISTANCE,
    Timings,
    load_decode_facts,
    load_priors,
    load_sdpa_facts,
    load_training_facts,
    lookup,
    priors_from_bench,
)
from .tune import DEFAULT_BUDGET_S, TuneResult, add_tune_parser, measured_or_tune, run_tune, tune

__all__ = [
    "CACHE_VERSION",
    "DEFAULT_BUDGET_S",
    "MAX_DISTANCE",
    "AttentionSignature",
    "Entry",
    "FA4CacheState",
    "TimingCache",
    "Timings",
    "TuneResult",
    "Work",
    "WorkBucket",
    "add_tune_parser",
    "as_work",
    "bucket",
    "enable_fa4_compile_cache",
    "gpu_id",
    "load_decode_facts",
    "load_priors",
    "load_sdpa_facts",
    "load_training_facts",
    "lookup",
    "measured_or_tune",
    "package_versions",
    "priors_from_bench",
    "run_tune",
    "signature",
    "tune",
]
