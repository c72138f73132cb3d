"""The attention backend tried on the loaded model: a one-step forward, the runtime fallback along the plan's
``attention_fallbacks``, and the check that an sdpa variant's cuDNN dispatch holds on this GPU. Neither rewrites
the plan: a load whose model runs another backend than planned makes a new plan for it (:func:`replanned`),
which says why."""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any

from ..capabilities import Capabilities
from ..errors import LoadError
from ..plans.plan import Plan
from ..policies.sdpa_dispatch import NAMES as SDPA_VARIANTS
from ..request import Request
from .runtime import probes

# the package's one logger, named as it was before the split (logging configuration refers to it)
logger = logging.getLogger("cudaload.execute")


def _next_attention(plan: Plan, failed: str) -> str | None:
    """The backend after ``failed`` in the plan's order: its choice, then ``attention_fallbacks`` (a plan saved
    before that field existed: the valid candidates in their order)."""
    order = (
        [plan.attention.choice, *plan.attention_fallbacks]
        if plan.attention_fallbacks
        else [c.name for c in plan.attention.candidates if c.ok]
    )
    names = [n for n in order if n]
    if failed in names:
        names = names[names.index(failed) + 1 :]
    return names[0] if names else None


def probe_and_fallback(
    model: Any, plan: Plan, caps: Capabilities, *, warmup: bool
) -> tuple[str | None, list[dict[str, str]]]:
    """Run a one-step forward on the chosen backend; step down the plan's fallbacks when it fails. Returns the
    backend the model now runs and the fallbacks taken."""
    fallbacks: list[dict[str, str]] = []
    current = plan.attention.choice
    while current is not None:
        ok, reason = probes.attention_works(model, current, caps, force=warmup)
        if ok:
            break
        if plan.attention.explicit:
            raise LoadError(
                f"attention backend {current!r} fails on this machine",
                reasons=[reason],
                fix="choose another backend with attn=..., or attn='auto' to let cudaload fall back",
            )
        nxt = _next_attention(plan, current)
        if nxt is None:
            raise LoadError(
                "no attention backend works on this machine",
                reasons=[reason],
                fix="report this: even sdpa failed a one-step forward",
            )
        logger.warning("attention %s failed its probe (%s); falling back to %s", current, reason, nxt)
        fallbacks.append({"from": current, "to": nxt, "reason": reason})
        model.set_attn_implementation(nxt)
        current = nxt
    return current, fallbacks


def confirm_sdpa_variant(model: Any, plan: Plan) -> tuple[bool, dict[str, Any] | None]:
    """A variant chosen automatically is kept only where torch really sends decode steps to cuDNN on this GPU
    (the policy predicted it from the snapshot); elsewhere the model takes plain sdpa, which then runs the same
    kernels without the per-call switch. Returns whether the plan's attention stands, and what was seen."""
    att = plan.attention
    if att.choice not in SDPA_VARIANTS:
        return True, None
    from .runtime.sdpa_decode import confirm

    keep, seen, why = confirm(model)
    if keep or att.explicit:
        return True, {"backend": seen, "kept": True, "why": why}
    model.set_attn_implementation("sdpa")
    return False, {"backend": seen, "kept": False, "why": why}


def replanned(req: Request, caps: Capabilities, plan: Plan, attn: str, why: list[str]) -> Plan:
    """The plan made again for the backend the model now runs (every section that depends on it -- serving's
    paged attention, a packed training step's boundaries and bound, the memory -- planned for it), with the
    loaded quantization and placement pinned; where those no longer fit, its DoesNotFitError says so. Its
    attention decision says why the load left the first plan's choice, and keeps the first plan's remaining
    order."""
    from ..planner import plan_request
    from ..request.options import quantization_name

    # what is already loaded stays as it is: the quantization and where the weights went are pinned, and only
    # what depends on the backend is planned again
    pinned = replace(
        req,
        quantization=quantization_name(plan.quantization.choice or "none"),
        device_map=plan.placement.device_map,
    )
    again = plan_request(pinned, caps, attn=attn)
    att = replace(again.attention, explicit=False, reasons=(*why, *again.attention.reasons))
    rest = [n for n in (plan.attention.choice, *plan.attention_fallbacks) if n]
    left = tuple(rest[rest.index(attn) + 1 :]) if attn in rest else ()
    return replace(again, attention=att, attention_fallbacks=left)
