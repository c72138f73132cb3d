"""intent="serving": the serving section settled against the memory free after loading and attached to the
loaded model (transformers' ContinuousBatchingConfig)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ..plans.plan import Plan


def attach_serving(model: Any, plan: Plan, verified: dict[str, Any]) -> Plan:
    """intent="serving": the plan's cache settled against the memory free after loading (measured here, passed to
    the pure policy), then transformers' own ``ContinuousBatchingConfig`` at ``model.cudaload_cb_config`` for
    ``generate_batch`` / ``continuous_batching_context_manager``. At the manager's start transformers switches the
    model's attention to its paged form (5.17 continuous_api.py:651-683) and back at stop, so the model keeps its
    planned attention unless the serving plan pages another one (paged|sdpa for paged|eager's memory, or for a flash
    form transformers cannot run paged, e.g. flash-attn-4 before 5.19): then it takes that one here."""
    from dataclasses import fields

    import torch
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    from ..policies.serving import settle

    section = plan.serving
    assert section is not None
    # transformers pages the model's current attention at the manager's start (continuous_api.py:651-683): where
    # the serving policy pages sdpa or eager instead of the loaded one (paged|eager's scores do not fit; an
    # explicit flash_attention_4 that transformers < 5.19 cannot run paged), the model takes it so that it does
    base = (section.attention.choice or "").removeprefix("paged|")
    current = getattr(model.config, "_attn_implementation", None)
    if base in ("sdpa", "eager") and current is not None and current != base:
        model.set_attn_implementation(base)
        verified["serving_attention"] = base
    device = getattr(model, "device", None)
    if device is not None and device.type == "cuda" and torch.cuda.is_available():
        free, _ = torch.cuda.mem_get_info(device)
        section = settle(section, int(free), longest_request=plan.seq_len)
    names = [f.name for f in fields(ContinuousBatchingConfig)]
    kwargs = section.continuous_batching_config(names)
    model.cudaload_cb_config = ContinuousBatchingConfig(**kwargs)
    verified["serving"] = {"continuous_batching_config": kwargs, "num_blocks": section.num_blocks}
    return replace(plan, serving=section)
