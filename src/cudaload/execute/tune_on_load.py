"""``load_model(tune=True)``: the plan made again with this GPU's measured attention timings."""

from __future__ import annotations

from ..capabilities import Capabilities
from ..plans.plan import Plan
from ..request import Request


def tuned_plan(req: Request, plan: Plan, caps: Capabilities) -> Plan:
    """``load_model(tune=True)``: the plan again, with this GPU's measured attention timings for the work."""
    from ..model_info import model_info
    from ..planner import plan_request
    from ..planner.work import work_for
    from .measure import DEFAULT_BUDGET_S, measured_or_tune

    if plan.intent != "inference" or req.attn != "auto" or not caps.gpus:
        return plan  # nothing to measure: training, an explicit backend, or no GPU
    info = model_info(req.model, model_class=req.model_class, revision=req.revision)
    # the request refuses tune=True without the work (request/together.py): declared here
    work = work_for(req, info).timed()
    assert work is not None
    path = plan.model.local_path or plan.model.name
    timings = measured_or_tune(
        path, caps, info, plan.dtype.choice or "float32", work, budget_s=req.tune_budget_s or DEFAULT_BUDGET_S
    )
    return plan_request(req, caps, timings=timings)
