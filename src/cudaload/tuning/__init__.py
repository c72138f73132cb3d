"""Measured attention choices: time every usable backend on this GPU, cache the result, ship priors.

- :func:`lookup` (pure): timings for a model's attention signature and a declared work, from this machine's
  cache (:class:`TimingCache`), else from the priors cudaload ships (measured on the H200), else None.
- :class:`TimingCache` (``store``): this machine's tune cache; ``signature``: the attention signature and the
  work bucket a measurement is filed under; ``timings``: the lookups, and the priors (``priors.json``).
- Measuring them here (``cudaload tune``, ``load_model(tune=True)``) is :mod:`cudaload.execute.measure`: it
  loads models, so it sits beside the code that runs them.

Importing this package imports neither torch nor transformers.
"""

from __future__ import annotations

from .signature import AttentionSignature, Work, WorkBucket, as_work, bucket, signature
from .store import CACHE_VERSION, Entry, TimingCache, gpu_id, package_versions
from .timings import (
    MAX_DISTANCE,
    Timings,
    load_decode_facts,
    load_layer_compile_facts,
    load_priors,
    load_sdpa_facts,
    load_training_facts,
    lookup,
    priors_from_bench,
)

__all__ = [
    "CACHE_VERSION",
    "MAX_DISTANCE",
    "AttentionSignature",
    "Entry",
    "TimingCache",
    "Timings",
    "Work",
    "WorkBucket",
    "as_work",
    "bucket",
    "gpu_id",
    "load_decode_facts",
    "load_layer_compile_facts",
    "load_priors",
    "load_sdpa_facts",
    "load_training_facts",
    "lookup",
    "package_versions",
    "priors_from_bench",
    "signature",
]
