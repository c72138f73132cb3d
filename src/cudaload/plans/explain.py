"""``explain(plan)``: the plan as text a person reads, kept for callers that import it; the text is
``Plan.explain()`` (each section renders itself: ``Decision.explain_lines``, ``TrainingPlan.explain_lines``,
:mod:`cudaload.plans.verified_text`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the type only: nothing at run time (plans.py imports nothing of this module)
    from .plan import Plan


def explain(plan: Plan) -> str:
    return plan.explain()
