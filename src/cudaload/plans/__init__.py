"""The Plan and its parts: pure data, below every policy, and their explanation as text.

- :mod:`~cudaload.plans.plan`: :class:`Plan` (``to_json`` / ``from_json``, ``explain``), its ``Placement``,
  ``MemoryEstimate`` and ``Parallelism``; :class:`ModelSummary` comes from :mod:`cudaload.model_info`.
- :mod:`~cudaload.plans.decision`: :class:`Decision` and :class:`Candidate`, what every policy returns.
- :mod:`~cudaload.plans.decode`, :mod:`~cudaload.plans.training`, :mod:`~cudaload.plans.serving`: the
  sections of a plan for each intent.
- :mod:`~cudaload.plans.verified_text`: the "verified after loading" block; :mod:`~cudaload.plans.explain`:
  ``explain(plan)``.

Importing this package imports neither torch nor transformers.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

# name -> module that defines it, imported on first use: a policy that imports ``plans.decision`` does not load
# the Plan, and ``plans.explain`` loads it only when called
_LAZY = {
    "INTENTS": "cudaload.plans.plan",
    "PLAN_SCHEMA_VERSION": "cudaload.plans.plan",
    "MemoryEstimate": "cudaload.plans.plan",
    "Parallelism": "cudaload.plans.plan",
    "Placement": "cudaload.plans.plan",
    "Plan": "cudaload.plans.plan",
    "Candidate": "cudaload.plans.decision",
    "Decision": "cudaload.plans.decision",
    "ModelSummary": "cudaload.model_info.summary",
}

__all__ = [
    "INTENTS",
    "PLAN_SCHEMA_VERSION",
    "Candidate",
    "Decision",
    "MemoryEstimate",
    "ModelSummary",
    "Parallelism",
    "Placement",
    "Plan",
]

if TYPE_CHECKING:
    from ..model_info.summary import ModelSummary
    from .decision import Candidate, Decision
    from .plan import INTENTS, PLAN_SCHEMA_VERSION, MemoryEstimate, Parallelism, Placement, Plan


def __getattr__(name: str) -> Any:
    mod = _LAZY.get(name)
    if mod is None:
        raise AttributeError(f"module 'cudaload.plans' has no attribute {name!r}")
    value = getattr(import_module(mod), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
