"""The attention backend tried on the loaded model: a one-step forward, the runtime fallback down the valid
candidates, and the check that an sdpa variant's cuDNN dispatch holds on this GPU."""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any

from .. import probes
from ..capabilities import Capabilities
from ..decision import Decision
from ..errors import LoadError
from ..plans import Plan
from ..policies.sdpa_dispatch import NAMES as SDPA_VARIANTS

# the package's one logger, named as it was before the split (logging configuration refers to it)
logger = logging.getLogger("cudaload.execute")


def _next_attention(plan: Plan, failed: str) -> str | None:
    names = [c.name for c in plan.attention.candidates if c.ok]
    if failed in names:
        names = names[names.index(failed) + 1 :]
    return names[0] if names else None


def _probe_and_fallback(
    model: Any, plan: Plan, caps: Capabilities, *, warmup: bool
) -> tuple[Plan, list[dict[str, str]]]:
    """Run a one-step forward on the chosen backend; step down the valid candidates when it fails."""
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
    if fallbacks:
        att = plan.attention
        plan = replace(
            plan,
            attention=Decision(
                choice=current,
                candidates=att.candidates,
                explicit=att.explicit,
                reasons=(
                    *att.reasons,
                    *(f"runtime fallback: {f['from']} -> {f['to']}: {f['reason']}" for f in fallbacks),
                ),
            ),
        )
    return plan, fallbacks


def _confirm_sdpa_variant(model: Any, plan: Plan) -> tuple[Plan, dict[str, Any] | None]:
    """A variant chosen automatically is kept only where torch really sends decode steps to cuDNN on this GPU
    (the policy predicted it from the snapshot); elsewhere the model takes plain sdpa, which then runs the same
    kernels without the per-call switch."""
    att = plan.attention
    if att.choice not in SDPA_VARIANTS:
        return plan, None
    from ..sdpa_decode import confirm

    keep, seen, why = confirm(model)
    if keep or att.explicit:
        return plan, {"backend": seen, "kept": True, "why": why}
    model.set_attn_implementation("sdpa")
    plan = replace(
        plan,
        attention=replace(
            att, choice="sdpa", reasons=(*att.reasons, f"checked on the GPU: {why}; sdpa kept")
        ),
    )
    return plan, {"backend": seen, "kept": False, "why": why}
