"""The loss: transformers' (fp32 logits over the vocabulary), or a fused loss that never holds all the logits
where only it makes the step fit (or fit without checkpointing): Liger's fused linear cross-entropy where
liger-kernel runs (measured slower where memory was not short), else cudaload's own chunked loss (torch only)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from ...capabilities import Capabilities
from ...errors import InvalidChoiceError
from ...model_info import ModelInfo
from ...plans.decision import Candidate, Decision
from ..memory.constants import CHUNK_MIN_ROWS as CHUNK_MIN_ROWS
from ..memory.constants import chunk_rows as chunk_rows
from .ladder import EVERY, OFF, Attempt, checkpointed

#: ``loss=`` as the request hands it on (cudaload.request: case and spaces dropped, None read as "auto"): "auto"
#: or one of :data:`cudaload.plans.training.LOSSES`
RequestedLoss = Literal["auto", "transformers", "liger", "cudaload_chunked"]


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


def chunked_problems(info: ModelInfo) -> list[str]:
    """Why cudaload's chunked loss cannot replace this model's (empty when it can): it computes the output head
    and transformers' causal-LM loss itself, so the model must have that head and loss, untransformed."""
    bad: list[str] = []
    if not info.can_generate:
        bad.append("the chunked loss replaces a causal LM's output head and loss; this model has none")
    if info.summary.is_moe:
        # transformers 5.17 models/qwen3_moe/modeling_qwen3_moe.py:667-674: the forward adds
        # router_aux_loss_coef x the load-balancing loss to the head's loss
        bad.append(
            "a mixture-of-experts model's loss adds its router's auxiliary loss (its forward returns "
            "MoeCausalLMOutputWithPast), which the chunked loss does not compute"
        )
    if info.remote_code:
        bad.append(
            "the model's code comes from its repository: its forward is not transformers' own to replace"
        )
    if info.head_transform:
        bad.append(
            f"the config transforms the head's logits before the loss ({info.head_transform}), which the chunked "
            "loss does not compute"
        )
    return bad


def loss_request(
    loss: RequestedLoss, caps: Capabilities, info: ModelInfo, chunked_blocker: str | None = None
) -> tuple[str, str | None, list[str], list[str]]:
    """The loss asked for; the fused loss the ladder may take (``"liger"``, ``"cudaload_chunked"`` or None: none
    can run here); why Liger cannot run here; why cudaload's chunked loss cannot (``chunked_blocker``: a reason
    the planner found outside the model, such as a parallelism that shards the head). An explicit loss that
    cannot run is refused."""
    liger_bad = liger_problems(caps, info)
    chunked_bad = chunked_problems(info) + ([chunked_blocker] if chunked_blocker else [])
    if loss == "liger" and liger_bad:
        raise InvalidChoiceError(
            "loss='liger' cannot be used here",
            reasons=liger_bad,
            fix="pip install liger-kernel (needs a CUDA GPU and triton), or use loss='auto'",
        )
    if loss == "cudaload_chunked" and chunked_bad:
        raise InvalidChoiceError(
            "loss='cudaload_chunked' cannot be used here",
            reasons=chunked_bad,
            fix="use loss='auto' (transformers' loss)",
        )
    if loss == "transformers":
        fused = None
    elif loss == "liger" or (loss == "auto" and not liger_bad):
        fused = "liger"
    elif not chunked_bad:
        fused = "cudaload_chunked"
    else:
        fused = None
    return loss, fused, liger_bad, chunked_bad


def loss_decision(
    req: str,
    fused: bool,
    liger_bad: Sequence[str],
    tried: Sequence[Attempt],
    gc_on: bool,
    gc: int = OFF,
    chunked_bad: Sequence[str] = ("not offered",),
) -> Decision:
    """The loss: transformers' unless the fit ladder took a fused one (``fused``): Liger's where it can run, else
    cudaload's chunked loss. Every candidate is listed with its reasons."""
    std_why = "transformers' loss: the logits of every token over the vocabulary, cast to fp32"
    slower = (
        "Liger's fused linear cross-entropy never holds all the logits; Liger with all its kernels trained slower "
        "on the H200 where memory was not short (8B LoRA, packed, flash_attention_4: 5,786 vs 8,808 tokens/s; "
        "/work/shared/device/README.md, 2026-12-03), and the fused loss alone is not measured, so it is used only "
        "where it alone avoids checkpointing or lets the step fit"
    )
    chunked_why = (
        "cudaload's chunked loss (torch only, no package) takes the head and the loss a chunk of rows at a time "
        "and keeps the gradient of the hidden states, never the logits; on an H100 it trained as fast (8B LoRA, "
        "chat lengths, eager layers: 7,335 vs 6,830 tokens/s, one run each; benchmarks/results/2026-12-07-h100/"
        "gpu10) and its plans held at their boundary (gpu9), but one run is not a speed-up to plan on, so it is "
        "used only where memory is short"
    )
    liger_c = Candidate("liger", not liger_bad, (slower, *liger_bad))
    chunked_ok = not chunked_bad
    chunked_reasons: tuple[str, ...] = (chunked_why, *chunked_bad)
    if not liger_bad and chunked_ok:
        chunked_reasons = (*chunked_reasons, "Liger's fused loss is installed and taken first")
    chunked_c = Candidate("cudaload_chunked", chunked_ok, chunked_reasons)
    std_c = Candidate("transformers", True, (std_why,))
    cands = (std_c, liger_c, chunked_c)
    which = "liger" if (req == "liger" or (req == "auto" and not liger_bad)) else "cudaload_chunked"
    if req != "auto":
        return Decision(which if fused else "transformers", ("requested explicitly",), cands, explicit=True)
    why_fused = slower if which == "liger" else chunked_why
    if fused and gc > EVERY:
        why = (
            f"only a fused loss lets the step fit with {checkpointed(gc)} checkpointed, not every layer (transformers' "
            "loss does not fit so)"
        )
        return Decision(which, (why, why_fused), cands)
    if fused and gc == EVERY:
        why = "only a fused loss lets the step fit, even with every layer checkpointed (transformers' loss does not)"
        return Decision(which, (why, why_fused), cands)
    if fused:
        why = "only a fused loss lets the step fit without gradient checkpointing (which recomputes every layer)"
        return Decision(which, (why, why_fused), cands)
    reasons = [std_why]
    if not liger_bad:
        reasons.append("a fused loss is kept for when memory is short: " + slower)
    elif chunked_ok:
        reasons.append("a fused loss is kept for when memory is short: " + chunked_why)
    if gc_on and (not liger_bad or chunked_ok):
        reasons.append("even a fused loss does not avoid checkpointing here")
    return Decision("transformers", tuple(reasons), cands)
