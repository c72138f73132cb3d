"""Training's rungs inside each quantization method of the fit ladder: the optimizer (fp32 AdamW with fp32
master weights -> 8-bit AdamW -> paged 8-bit AdamW when bitsandbytes is usable -> Adafactor) and, for each,
gradient checkpointing off (faster) then on; and the optimizer and checkpointing decisions the plan states,
read back from the ladder's attempts."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from ..capabilities import Capabilities
from ..errors import InvalidChoiceError
from ..plans.decision import Candidate, Decision
from .memory import BNB_OPTIMIZERS, OPTIMIZERS, Breakdown, default_optimizer
from .placement import Fit
from .quant_methods import bnb_problems

#: ``optimizer=`` as the request hands it on (cudaload.request: case and spaces dropped, None read as "auto"):
#: "auto" (the intent's ladder) or one of :data:`cudaload.policies.memory.OPTIMIZERS`
RequestedOptimizer = Literal[
    "auto", "adamw_torch_fused", "adamw_torch", "adamw_8bit", "paged_adamw_8bit", "adafactor", "sgd"
]

#: one attempt of the fit ladder: (method, optimizer, checkpointing, fit), in the order tried
Tried = tuple[str, str | None, bool | None, Fit]

#: why each optimizer is where it is on the ladder
_OPT_WHY = {
    "adamw_torch_fused": "AdamW with fp32 states (Trainer's default optim on torch >= 2.8), fused kernel",
    "adamw_torch": "AdamW with fp32 states (foreach; the step copies the second moments)",
    "adamw_8bit": "bitsandbytes 8-bit AdamW: ~2 bytes/param of states on half-precision weights",
    "paged_adamw_8bit": "bitsandbytes paged 8-bit AdamW: states in CUDA managed memory, paged to the host "
    "under pressure (slower steps when they are)",
    "adafactor": "Adafactor: factored second moments (one row and one column vector per matrix)",
    "sgd": "SGD without momentum: no states",
}


def training_ladder(
    intent: str,
    caps: Capabilities,
    *,
    optimizer: RequestedOptimizer = "auto",
    gradient_checkpointing: bool | None = None,
) -> tuple[list[str | None], list[bool | None], dict[str, list[str]]]:
    """(optimizers to try in order, checkpointing settings in order, reasons for optimizers not tried)."""
    if intent == "inference":
        return [None], [None], {}
    req = optimizer
    bnb = bnb_problems(caps)
    skipped: dict[str, list[str]] = {}
    on_gpu = bool(caps.gpus)
    if req != "auto":
        if req in BNB_OPTIMIZERS and bnb:
            raise InvalidChoiceError(
                f"optimizer={req} needs bitsandbytes, which cannot run here",
                reasons=bnb,
                fix="install a bitsandbytes build for this GPU, or use optimizer='adamw_torch_fused' / 'adafactor'",
            )
        opts: list[str | None] = [req]
    elif intent == "training":
        first = default_optimizer(intent, on_gpu)
        opts = [first]
        for o in ("adamw_8bit", "paged_adamw_8bit"):
            if bnb:
                skipped[o] = list(bnb)
            else:
                opts.append(o)
        opts.append("adafactor")
        skipped["sgd"] = ["not chosen automatically: plain SGD rarely fine-tunes a transformer well"]
    else:
        # adapters are a few million parameters: their optimizer states rarely decide the fit. QLoRA, run where
        # memory is short, keeps the QLoRA paper's paged 8-bit AdamW as the rung after fused AdamW (a 70B's
        # r=16 adapters hold 1.6 GiB of fp32 states)
        first = default_optimizer(intent, on_gpu)
        if first in BNB_OPTIMIZERS and bnb:
            first = "adamw_torch_fused" if on_gpu else "adamw_torch"
        opts = [first]
        if intent == "qlora" and not bnb and first != "paged_adamw_8bit":
            opts.append("paged_adamw_8bit")
    if gradient_checkpointing is not None:
        gcs: list[bool | None] = [gradient_checkpointing]
    else:
        # QLoRA too: load_model runs peft's k-bit preparation (where the plan casts to fp32) with the plan's
        # checkpointing, not its default of on
        gcs = [False, True]
    return opts, gcs, skipped


def training_decisions(
    tried: Sequence[Tried],
    method: str | None,
    chosen: tuple[str | None, bool | None],
    opts: Sequence[str | None],
    gcs: Sequence[bool | None],
    skipped: dict[str, list[str]],
    optimizer: str,
    gradient_checkpointing: bool | None,
    bd: Breakdown,
) -> tuple[Decision, Decision]:
    """The optimizer and gradient-checkpointing decisions, from the ladder's attempts for the chosen method."""
    mine = [t for t in tried if t[0] == method]
    return (
        _optimizer_decision(mine, chosen[0], opts, skipped, optimizer, bd),
        _checkpointing_decision(mine, chosen, gcs, gradient_checkpointing),
    )


def _optimizer_decision(
    mine: Sequence[Tried],
    chosen: str | None,
    opts: Sequence[str | None],
    skipped: dict[str, list[str]],
    optimizer: str,
    bd: Breakdown,
) -> Decision:
    opt_c: list[Candidate] = []
    for o in OPTIMIZERS:
        why = [_OPT_WHY[o]]
        if o == chosen:
            ok = True
            why.append("fits" + (" (requested)" if optimizer != "auto" else ""))
        elif o in skipped:
            ok = False
            why.extend(skipped[o])
        elif o in opts:
            fails = [f for (_, oo, _, f) in mine if oo == o and not f.ok]
            ok = False
            if fails:
                why.append("does not fit: " + "; ".join(fails[-1].reasons))
            else:
                why.append(f"not needed: {chosen} fits")
        else:
            ok = False
            why.append("not requested" if optimizer != "auto" else "not on this intent's ladder")
        opt_c.append(Candidate(o, ok, tuple(why)))
    opt_reasons = [r for c in opt_c if c.ok for r in c.reasons]
    host = [n for n in bd.notes if n.startswith("optimizer:")]
    return Decision(chosen, (*opt_reasons, *host), tuple(opt_c), explicit=optimizer != "auto")


def _checkpointing_decision(
    mine: Sequence[Tried],
    chosen: tuple[str | None, bool | None],
    gcs: Sequence[bool | None],
    gradient_checkpointing: bool | None,
) -> Decision:
    gc_c: list[Candidate] = []
    for name, val in (("off", False), ("on", True)):
        if val == chosen[1]:
            why = ["requested" if gradient_checkpointing is not None else "fits"]
            if val and gradient_checkpointing is None:
                why.append(
                    "without it the activations of every layer do not fit (each layer's input is kept "
                    "and the layer recomputed in backward: ~1/3 more compute)"
                )
            gc_c.append(Candidate(name, True, tuple(why)))
        elif val in gcs:
            fails = [f for (_, o, g, f) in mine if g is val and o == chosen[0] and not f.ok]
            why = ["does not fit: " + "; ".join(fails[-1].reasons)] if fails else ["not needed: fits without"]
            gc_c.append(Candidate(name, False, tuple(why)))
        else:
            gc_c.append(Candidate(name, False, ("not requested",)))
    return Decision(
        "on" if chosen[1] else "off",
        next(c.reasons for c in gc_c if c.ok),
        tuple(gc_c),
        explicit=gradient_checkpointing is not None,
    )
