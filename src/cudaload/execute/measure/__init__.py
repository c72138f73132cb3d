"""Measuring on this GPU: ``cudaload tune`` and ``load_model(tune=True)``.

- :func:`tune` (:mod:`~cudaload.execute.measure.tune`): load the model once per usable attention backend, time
  them on the declared work and store the result in this machine's tune cache (:mod:`cudaload.tuning`'s store);
  :func:`measured_or_tune` for ``tune=True``; :func:`add_tune_parser` / :func:`run_tune` for the command.
- :mod:`~cudaload.execute.measure.backends`: the timing code ``tune`` and benchmarks/bench_generate.py share.

The lookups the planner reads (cache, priors) stay in :mod:`cudaload.tuning`. Importing this package imports
neither torch nor transformers (``tune`` does, when called).
"""

from __future__ import annotations

from .tune import DEFAULT_BUDGET_S, TuneResult, add_tune_parser, measured_or_tune, run_tune, tune

__all__ = ["DEFAULT_BUDGET_S", "TuneResult", "add_tune_parser", "measured_or_tune", "run_tune", "tune"]
