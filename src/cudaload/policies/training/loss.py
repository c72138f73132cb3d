"""The loss: transformers' (fp32 logits over the vocabulary), or Liger's fused linear cross-entropy where only it
makes the step fit without checkpointing (measured slower where memory was not short)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from ...capabilities import Capabilities
from ...errors import InvalidChoiceError
from ...model_info import ModelInfo
from ...plans.decision import Candidate, Decision
from .ladder import EVERY, OFF, Attempt, checkpointed

#: ``loss=`` as the request hands it on (cudaload.request: case and spaces dropped, None read as "auto"): "auto"
#: or one of :data:`cudaload.plans.training.LOSSES`
RequestedLoss = Literal["auto", "transformers", "liger"]


def liger_problems(caps: Capabilities, info: ModelInfo) -> list[str]:
    """Why Liger's fused linear cross-entropy cannot run here (empty when it can)."""
    bad: list[str] = []
    if not caps.gpus:
        bad.append("Liger's kernels are Triton kernels: they need a CUDA GPU")
    pkg = caps.package("liger-kernel")
    if not pkg.installed:
        bad.append("liger-kernel is not installed")
    elif not pkg.usable:
        bad.append(f"liger-kernel is installed but unusable: {pkg.reason or 'probe failed'}")
    if not info.can_generate:
        bad.append("the fused loss replaces a causal LM's output head and loss; this model has none")
    return bad


def loss_request(loss: RequestedLoss, caps: Capabilities, info: ModelInfo) -> tuple[str, list[str]]:
    """The loss asked for, and why Liger cannot run here; an explicit Liger that cannot is refused."""
    req = loss
    bad = liger_problems(caps, info)
    if req == "liger" and bad:
        raise InvalidChoiceError(
            "loss='liger' cannot be used here",
            reasons=bad,
            fix="pip install liger-kernel (needs a CUDA GPU and triton), or use loss='auto'",
        )
    return req, bad


def loss_decision(
    req: str,
    fused: bool,
    liger_bad: Sequence[str],
    tried: Sequence[Attempt],
    gc_on: bool,
    gc: int = OFF,
) -> Decision:
    std_why = "transformers' loss: the logits of every token over the vocabulary, cast to fp32"
    slower = (
        "Liger's fused linear cross-entropy never holds all the logits; Liger with all its kernels trained slower "
        "on the H200 where memory was not short (8B LoRA, packed, flash_attention_4: 5,786 vs 8,808 tokens/s; "
        "/work/shared/device/README.md, 2026-12-03), and the fused loss alone is not measured, so it is used only "
        "where it alone avoids checkpointing"
    )
    liger_c = Candidate("liger", not liger_bad, (slower, *liger_bad))
    std_c = Candidate("transformers", True, (std_why,))
    if req != "auto":
        return Decision(
            "liger" if fused else "transformers", ("requested explicitly",), (std_c, liger_c), explicit=True
        )
    if fused and gc > EVERY:
        why = (
            f"only the fused loss lets the step fit with {checkpointed(gc)} checkpointed, not every layer (transformers' "
            "loss does not fit so)"
        )
        return Decision("liger", (why, slower), (std_c, liger_c))
    if fused:
        why = "only the fused loss lets the step fit without gradient checkpointing (which recomputes every layer)"
        return Decision("liger", (why, slower), (std_c, liger_c))
    reasons = [std_why]
    if not liger_bad:
        reasons.append("the fused loss is kept for when memory is short: " + slower)
    if gc_on and not liger_bad:
        reasons.append("even the fused loss does not avoid checkpointing here")
    return Decision("transformers", tuple(reasons), (std_c, liger_c))
