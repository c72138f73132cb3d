"""The training section of a plan: the step as the decisions shape it (:func:`base_step`), then the step bound,
the loss and checkpointing walked through the fit ladder (:func:`plan_step`), or, where no single process fits,
the step the parallelism decision sized each rank with (:func:`plan_for_ranks`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from ...capabilities import Capabilities
from ...model_info import ModelInfo
from ...plans.decision import Candidate, Decision
from ...plans.training import StepShape, TrainingPlan
from .bounds import bounds_to_try, fmt_tokens, tokens_decision
from .checkpointing import checkpointing_decision, partial_problems
from .ladder import FitProbe, shape_at, walk
from .layout import boundaries_for, sequences_decision
from .loss import RequestedLoss, loss_decision, loss_request

if TYPE_CHECKING:
    from ..quantization import FitResult


@dataclass(frozen=True)
class StepChoice:
    """What :func:`plan_step` chose: the step, the fit result for it, and the training section of the plan."""

    step: StepShape
    fit: FitResult
    plan: TrainingPlan


def base_step(
    layout: Decision,
    batch_size: int,
    seq_len: int,
    lora_dropout: Decision | None,
    kbit_upcast: Decision | None,
    lora_r: int = 16,
    adapter_cast: Decision | None = None,
) -> StepShape:
    """The step of ``batch_size`` sequences of ``seq_len`` tokens as the decisions shape it (layout, dropout,
    QLoRA's cast, LoRA's rank); the ladder varies its tokens and loss."""
    return StepShape(
        tokens=batch_size * seq_len,
        sequences=batch_size,
        longest=seq_len,
        packed=layout.choice == "packed",
        lora_dropout=float(lora_dropout.choice) if lora_dropout is not None and lora_dropout.choice else 0.0,
        kbit_upcast=kbit_upcast is not None and kbit_upcast.choice == "fp32",
        lora_r=lora_r,
        cast_outside_autocast=adapter_cast is not None and adapter_cast.choice == "outside-autocast",
    )


def plan_step(
    fit: FitProbe,
    *,
    info: ModelInfo,
    caps: Capabilities,
    layout: Decision,
    attn: str,
    base: StepShape,
    tokens_per_step: int | None,
    loss: RequestedLoss,
    gradient_checkpointing: bool | None,
    lora_dropout: Decision | None,
    kbit_upcast: Decision | None,
    assumed: Sequence[str] = (),
    sequences_declared: bool = True,
    adapter_cast: Decision | None = None,
    chunked_blocker: str | None = None,
) -> StepChoice:
    """The step bound, the loss and (through ``fit``) checkpointing and the optimizer, cheapest first.

    Tried in order, each probed by ``fit``: the largest bound with checkpointing as the fit ladder decides; if
    that needs checkpointing, smaller bounds without it (the same optimizer), then a fused loss (Liger's, else cudaload's chunked one) without
    it; then the same bounds and losses with every n-th layer checkpointed (the largest n that fits; not where
    :func:`partial_problems` says so); else the bounds with every layer checkpointed. An explicit ``tokens_per_step``, ``loss`` or
    ``gradient_checkpointing`` narrows the ladder to it. Where ``batch_size`` was assumed
    (``sequences_declared=False``), the ladder goes down to one longest sequence a step. ``chunked_blocker``: why
    cudaload's chunked loss cannot run with what the planner decided outside the step (None: nothing)."""
    req_loss, fused_kind, liger_bad, chunked_bad = loss_request(loss, caps, info, chunked_blocker)
    # the memory model prices the allocator's slack by which fused loss the ladder would take
    base = replace(base, chunked_loss=fused_kind == "cudaload_chunked")
    bounds = bounds_to_try(base, tokens_per_step, sequences_declared)
    if fused_kind is None:
        losses = [False]
    else:
        losses = [True] if req_loss in ("liger", "cudaload_chunked") else [False, True]
    partial_bad = partial_problems(caps, info)
    layers = max(info.summary.layers, 1)
    t, fused, gc, result, tried = walk(
        fit,
        base,
        bounds,
        losses,
        gradient_checkpointing,
        last_is_the_callers=not sequences_declared,
        partial_layers=0 if partial_bad else layers,
    )
    step = shape_at(base, t, fused, gc)
    gc_on = result.gradient_checkpointing is not None and result.gradient_checkpointing.choice == "on"
    if gradient_checkpointing is None and result.gradient_checkpointing is not None:
        result = replace(
            result,
            gradient_checkpointing=checkpointing_decision(
                gc, t, tried, bounds, partial_bad, layers, version_known=caps.transformers_version is not None
            ),
        )
    tp = TrainingPlan(
        layout=layout,
        tokens_per_step=tokens_decision(
            bounds, tried, t, fused, base, tokens_per_step, filled=base.packed and not sequences_declared
        ),
        loss=loss_decision(req_loss, fused, liger_bad, tried, gc_on, gc, chunked_bad=chunked_bad),
        step=step,
        boundaries=boundaries_for(attn) if base.packed else None,
        lora_dropout=lora_dropout,
        kbit_upcast=kbit_upcast,
        adapter_cast=adapter_cast,
        assumed=tuple(assumed),
        notes=_notes(step, base.packed, None if not sequences_declared else base.sequences),
        group_by_length=not base.packed and step.sequences > 1,
        sequences_per_step=sequences_decision(base.packed, sequences_declared, step.sequences, step.tokens),
    )
    return StepChoice(step, result, tp)


def plan_for_ranks(
    step: StepShape,
    *,
    layout: Decision,
    attn: str,
    lora_dropout: Decision | None,
    kbit_upcast: Decision | None,
    assumed: Sequence[str] = (),
    adapter_cast: Decision | None = None,
) -> TrainingPlan:
    """The training section where no single process fits and the parallelism decision sizes each rank: the step
    it sized the ranks with (the training ladder's smallest bound), transformers' loss."""
    why = (
        f"no single process fits a step; each rank of the parallelism below runs steps of at most {step.tokens:,} "
        "tokens, what its per-GPU memory was sized for"
    )
    std = "transformers' loss: the logits of every token over the vocabulary, cast to fp32"
    return TrainingPlan(
        layout=layout,
        tokens_per_step=Decision(
            fmt_tokens(step.tokens), (why,), (Candidate(fmt_tokens(step.tokens), True, (why,)),)
        ),
        loss=Decision("transformers", (std,), (Candidate("transformers", True, (std,)),)),
        step=step,
        boundaries=boundaries_for(attn) if step.packed else None,
        group_by_length=not step.packed and step.sequences > 1,
        lora_dropout=lora_dropout,
        kbit_upcast=kbit_upcast,
        adapter_cast=adapter_cast,
        assumed=tuple(assumed),
        notes=_notes(step, step.packed, step.sequences),
    )


def _notes(step: StepShape, packed: bool, batch_size: int | None) -> tuple[str, ...]:
    """The packed layout's note; ``batch_size`` None: the steps are filled (as many sequences as fit)."""
    if not packed:
        return ()
    holds = f"up to {batch_size} sequences and" if batch_size is not None else "as many sequences as fit"
    return (
        "TrainingArguments' per_device_train_batch_size is 1: each item of the packed data set "
        f"(cudaload.training_setup) is one step of {holds} {step.tokens:,} tokens",
    )
