"""``load_model(tune=True)``: the plan made again with this GPU's measured attention timings."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..capabilities import Capabilities
from ..errors import ConfigurationError
from ..plans import Plan


def _tuned_plan(
    model: Any, plan: Plan, caps: Capabilities, plan_kwargs: Mapping[str, Any], budget_s: float | None
) -> Plan:
    """``load_model(tune=True)``: the plan again, with this GPU's measured attention timings for the work."""
    from ..model_info import model_info
    from ..planner import plan as make_plan
    from ..tuning import DEFAULT_BUDGET_S, Work, measured_or_tune

    if plan_kwargs.get("batch_size") is None or plan_kwargs.get("seq_len") is None:
        raise ConfigurationError(
            "tune=True needs the work to measure", fix="pass batch_size= and seq_len= (and new_tokens=)"
        )
    if plan.intent != "inference" or plan_kwargs.get("attn", "auto") != "auto" or not caps.gpus:
        return plan  # nothing to measure: training, an explicit backend, or no GPU
    work = Work.from_total(
        int(plan_kwargs["batch_size"]),
        int(plan_kwargs["seq_len"]),
        plan_kwargs.get("new_tokens"),
        bool(plan_kwargs.get("padded")),
    )
    info = model_info(model, model_class=plan_kwargs.get("model_class"), revision=plan_kwargs.get("revision"))
    path = plan.model.local_path or plan.model.name
    timings = measured_or_tune(
        path, caps, info, plan.dtype.choice or "float32", work, budget_s=budget_s or DEFAULT_BUDGET_S
    )
    return make_plan(model, **{**plan_kwargs, "timings": timings})
