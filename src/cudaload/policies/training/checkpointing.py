"""Activation checkpointing as the step ladder decides it: ``off`` where some bound fits without it, else
*partial* (only every n-th decoder layer, transformers' ``every_n_layers``) before every layer; where partial
cannot run, and why offload is not planned."""

from __future__ import annotations

from collections.abc import Sequence

from ...capabilities import Capabilities
from ...detection.versions import version_tuple
from ...model_info import ModelInfo
from ...plans.decision import Candidate, Decision
from .ladder import EVERY, OFF, Attempt

#: the first transformers whose ``gradient_checkpointing_enable`` takes ``every_n_layers`` (and ``offload``):
#: 5.17 modeling_utils.py:3106-3108, also 5.22 :3109 and 5.24's ``activation_checkpointing_enable`` :3119; Trainer
#: pops both from ``gradient_checkpointing_kwargs`` (5.17 trainer.py:1465-1472, 5.22 :1504-1511, 5.24 :1507-1527)
PARTIAL_CHECKPOINTING_SINCE = (5, 17)


def partial_problems(caps: Capabilities, info: ModelInfo) -> list[str]:
    """Why checkpointing only every n-th layer cannot be planned here (empty when it can)."""
    bad: list[str] = []
    v = version_tuple(caps.transformers_version)
    if v is not None and v[:2] < PARTIAL_CHECKPOINTING_SINCE:
        bad.append(
            f"transformers {caps.transformers_version} has no gradient_checkpointing_enable(every_n_layers=) "
            "(5.17 and later)"
        )
    if info.remote_code:
        bad.append(
            "remote code: every_n_layers counts only transformers' GradientCheckpointingLayer decoder layers, "
            "which a model of its own need not use"
        )
    if info.summary.layers < 2:
        bad.append("one decoder layer: nothing lies between checkpointing it and not")
    return bad


#: why offload is not planned (transformers' ``gradient_checkpointing_enable(offload=True)``)
OFFLOAD_WHY = (
    "transformers' offload=True holds the checkpointed layers' inputs in pinned host memory (torch's save_on_cpu, "
    "5.17 modeling_utils.py:3134-3141) with a device-to-host copy in the forward and back in the backward, on the "
    "compute stream; not planned: neither those copies' cost nor the pinned host memory is measured or modelled "
    "here"
)


def checkpointing_decision(
    gc: int,
    chosen: int,
    tried: Sequence[Attempt],
    bounds: Sequence[int],
    partial_bad: Sequence[str],
    layers: int,
    version_known: bool = True,
) -> Decision:
    """Gradient checkpointing as the step ladder decided it (the fit ladder's own decision saw one bound):
    ``off``, ``partial`` (every n-th layer: the plan's ``training.step.checkpoint_every``) or ``on``."""
    full_cost = "each layer's input kept and every layer recomputed in backward: about 1/3 more compute"
    offload = Candidate("offload", False, (OFFLOAD_WHY,))
    if gc == OFF:
        why = f"fits without it at {chosen:,} tokens a step: every layer's activations kept, none recomputed"
        return Decision(
            "off",
            (why,),
            (
                Candidate("off", True, (why,)),
                Candidate("partial", True, ("not needed: recomputes some layers", *partial_bad)),
                offload,
                Candidate("on", True, (f"not needed: {full_cost}",)),
            ),
        )
    offs = [o for _, _, g, o in tried if g == OFF]
    smallest = min(bounds)
    no_off = f"no step bound down to {smallest:,} tokens fits without it" + (f" ({offs[-1]})" if offs else "")
    off_c = Candidate("off", False, tuple(offs[-1:]) or ("does not fit",))
    parts = [(g, o) for b, _, g, o in tried if g > EVERY]
    if gc > EVERY:
        c = -(-layers // gc)
        idx = ", ".join(str(i) for i in range(0, layers, gc)[:4]) + (", ..." if c > 4 else "")
        why = (
            f"{no_off}; checkpointing every {gc} layers (transformers' every_n_layers={gc}: {c} of {layers} "
            f"decoder layers, {idx}) fits at {chosen:,} tokens a step, the other {layers - c} keep their "
            f"activations; the recompute is {c} layers' forward, ~1/(3n) = {1 / (3 * gc):.0%} of a step by the FLOP "
            "count (a forward is ~1/3 of a step's FLOPs), not measured"
        )
        if not version_known:
            why += "; every_n_layers is in transformers 5.17 and later, cudaload's floor (no version recorded here)"
        more = [o for g, o in parts if g == gc + 1]
        why_not_more = (f"every {gc + 1} layers: {more[-1]}",) if more else ()
        return Decision(
            "partial",
            (why, *why_not_more),
            (
                off_c,
                Candidate("partial", True, (why, *why_not_more)),
                offload,
                Candidate("on", True, (f"fits too, but recomputes every layer: {full_cost}",)),
            ),
        )
    if partial_bad:
        partial_c = Candidate("partial", False, tuple(partial_bad))
    elif parts:
        partial_c = Candidate(
            "partial", False, (f"every 2 layers, the most a partial form checkpoints: {parts[-1][1]}",)
        )
    else:
        partial_c = Candidate("partial", False, ("not tried",))
    why = (
        f"{no_off}; nor with every 2nd layer checkpointed; {full_cost}" if parts else f"{no_off}; {full_cost}"
    )
    return Decision("on", (why,), (off_c, partial_c, offload, Candidate("on", True, (why,))))
