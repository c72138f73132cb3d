"""The plan a load follows: made after transformers has imported (the Hub's answer collected then), again with
measured timings for ``tune=True``, agreed on by torchrun ranks, and what must happen before the model is built
(FA4's compile cache turned on, cudaload's sdpa variants registered)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from ..capabilities import Capabilities
from ..plans.plan import Plan
from ..policies.attention.names import TORCH_VARLEN
from ..policies.sdpa_dispatch import NAMES as SDPA_VARIANTS
from ..request import Request
from .from_pretrained import resolve_auto_class
from .phases import Phases
from .ranks import rank_error
from .tune_on_load import tuned_plan

logger = logging.getLogger("cudaload.execute")


@dataclass
class Planned:
    """The plan a load follows and what planning it found: the machine as planned for (``caps``), the auto
    class, the ranks' note for ``verified``, FA4's compile-cache note."""

    plan: Plan
    caps: Capabilities
    auto_class: str
    ranks_note: str | None
    fa4_cache_note: str | None

    @property
    def is_main(self) -> bool:
        return self.caps.distributed.rank in (None, 0)


def plan_for_load(
    req: Request, caps: Capabilities, hub: Any, rendezvous: Any, ranks_note: str | None, phases: Phases
) -> Planned:
    from ..planner import plan_request

    try:  # from here to the plans' exchange, a rank that raises tells the others (they would wait for it)
        # timed apart because users ask where the seconds go: transformers is a lazy module, so name what the
        # plan and the load use (the config machinery and modeling_utils, which imports most of it)
        from transformers import AutoConfig, PreTrainedModel  # noqa: F401

        phases.mark("import_transformers")
        if hub is not None:
            from ..detection import with_hub_answer

            caps = with_hub_answer(caps, hub)
            phases.mark("hub_probe")
        plan = plan_request(req, caps)
        if req.tune:
            plan = tuned_plan(req, plan, caps)
        auto_class = resolve_auto_class(req.model_class, req.task, plan)
    except Exception as e:
        if rendezvous is not None:  # the other ranks stop with this rank's reason instead of waiting
            rendezvous.tell("plans", rank_error(e))
        raise
    if rendezvous is not None:
        ranks_note = _compare_plans(rendezvous, plan, ranks_note)
    phases.mark("plan")
    planned = Planned(plan, caps, auto_class, ranks_note, _before_building(plan))
    logger.log(logging.INFO if planned.is_main else logging.DEBUG, "cudaload plan:\n%s", plan.explain())
    return planned


def _compare_plans(rendezvous: Any, plan: Plan, ranks_note: str | None) -> str | None:
    from ..policies.ranks import check_same, decisions

    published = rendezvous.exchange("plans", {"decisions": decisions(plan)})
    if published is None:
        return f"{ranks_note}; the ranks' plans were not compared (a rank did not publish in time)"
    unchecked = check_same(published)
    return f"{ranks_note}; {unchecked}" if unchecked else ranks_note


def _before_building(plan: Plan) -> str | None:
    """What must happen before the model is built; returns FA4's compile-cache note (None without FA4)."""
    note = None
    if plan.attention.choice in ("flash_attention_4", "kernels-community/flash-attn4"):
        # FA4 JIT-compiles its kernels in every new process (~3 s on the H200) unless its persistent cache is
        # on; cudaload turns it on under its own cache directory where the user has not set it (the variables
        # are read once, when flash_attn.cute is first imported: so before the load imports it)
        from .runtime.fa4_cache import enable_fa4_compile_cache

        note = enable_fa4_compile_cache().note
    if any(c.ok and c.name in SDPA_VARIANTS for c in plan.attention.candidates):
        # cudaload's sdpa variants are transformers attention functions: registered before the model is built
        # (and for a runtime fallback to one of them)
        from .runtime.sdpa_decode import register as _register_sdpa_variants

        _register_sdpa_variants()
    if any(c.ok and c.name == TORCH_VARLEN for c in plan.attention.candidates):
        # cudaload_varlen (torch's own varlen flash kernels) is a transformers attention function too
        from .varlen_attention import register as _register_torch_varlen

        _register_torch_varlen()
    return note
