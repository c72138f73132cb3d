"""The fit ladder: native dtype on one GPU, split over the visible GPUs, int8, nf4, offload (when allowed),
else :class:`DoesNotFitError` saying what would fit. Per intent: full fine-tuning never quantizes; QLoRA is
nf4 with double quantisation and an explicit half-precision compute dtype (never BitsAndBytesConfig's fp4 /
fp32 defaults).

Training adds rungs inside each method: the optimizer (fp32 AdamW with fp32 master weights -> 8-bit AdamW ->
paged 8-bit AdamW when bitsandbytes is usable -> Adafactor) and, for each, gradient checkpointing off (faster)
then on. Every suggestion in a :class:`DoesNotFitError` is one of :func:`suggestions`, each checked by planning
it (tests/test_memory_suggestions.py follows every one).

Where each part lives: the methods an intent may use, bitsandbytes' problems and its config in
:mod:`.quant_methods`; the optimizer and checkpointing rungs and their decisions in :mod:`.optimizer_ladder`;
the suggestions and the error's fix text in :mod:`.fit_suggestions`. Their names are re-exported here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from ..capabilities import Capabilities
from ..errors import DoesNotFitError, InvalidChoiceError
from ..model_info import ModelInfo
from ..plans.decision import Candidate, Decision
from ..plans.training import StepShape
from ..units import param_count
from .decode_facts import QuantDecodeCost
from .fit_suggestions import MAX_SUGGESTED_GPUS, Suggestion, render_suggestions, replicate_gpus, suggestions
from .memory import Breakdown, GiB, MemoryShape, breakdown_of
from .optimizer_ladder import RequestedOptimizer, Tried, training_decisions, training_ladder
from .placement import Fit, place
from .quant_methods import METHODS, RequestedQuantization, bnb_problems, methods_for, quantization_config

__all__ = [
    "DECODE_HEAVY_S",
    "MAX_SUGGESTED_GPUS",
    "METHODS",
    "FitResult",
    "RequestedQuantization",
    "Suggestion",
    "bnb_problems",
    "fit",
    "quantization_config",
    "render_suggestions",
    "replicate_gpus",
    "suggestions",
    "training_ladder",
]

#: inference where int8 and nf4 both fit: int8 (8-bit weights, the more accurate) unless the declared decode
#: work would spend more than this many seconds longer with it than with nf4 (int8 decodes ~2x slower than nf4 on
#: the H200, :mod:`cudaload.policies.decode_facts`); a minute is past what a slightly less accurate model costs a
#: job that generates that much
DECODE_HEAVY_S = 60.0


@dataclass(frozen=True)
class FitResult:
    decision: Decision
    fit: Fit
    breakdown: Breakdown
    quantization_config: dict[str, Any] | None
    optimizer: Decision | None = None  # training intents: the optimizer (TrainingArguments optim name)
    gradient_checkpointing: Decision | None = None  # training intents: "on" / "off"


@dataclass(frozen=True)
class _Ladder:
    """What every rung is estimated and placed with: the model, the machine, the configuration (each rung sets
    its quantization, optimizer and checkpointing) and where the weights may go."""

    info: ModelInfo
    caps: Capabilities
    shape: MemoryShape
    device_map: Any
    max_memory: Mapping[Any, Any] | None

    def attempt(
        self, method: str | None, offload: bool, opt: str | None, gc: bool | None
    ) -> tuple[Breakdown, Fit]:
        bd = breakdown_of(
            self.info, replace(self.shape, quantization=method, optimizer=opt, gradient_checkpointing=gc)
        )
        caps = self.caps
        if bd.host_bytes and caps.host_memory and bd.host_bytes > caps.host_memory:
            # paged optimizer states evicted to the host must fit there
            return bd, Fit(
                False,
                reasons=(
                    f"{opt}: {bd.host_bytes / GiB:.2f} GiB of paged states exceed the host's "
                    f"{caps.host_memory / GiB:.2f} GiB",
                ),
            )
        return bd, place(
            caps, bd, device_map=self.device_map, max_memory=self.max_memory, allow_offload=offload
        )


@dataclass
class _Walk:
    """What the walk down the rungs found: every method's reasons, every attempt, the (optimizer,
    checkpointing) of the rung that fits (the ladder's last until one does), and that rung's fit."""

    chosen: tuple[str | None, bool | None]
    cands: dict[str, list[str]] = field(default_factory=lambda: {m: [] for m in METHODS})
    tried: list[Tried] = field(default_factory=list)
    ok_name: str | None = None
    result: Fit | None = None
    bd_ok: Breakdown | None = None

    def take(self, name: str, f: Fit, bd: Breakdown) -> None:
        self.ok_name, self.result, self.bd_ok = name, f, bd


def fit(
    info: ModelInfo,
    caps: Capabilities,
    *,
    dtype: str,
    intent: str,
    seq_len: int,
    batch_size: int,
    attn: str = "sdpa",
    quantization: RequestedQuantization = "auto",
    device_map: Any = None,
    max_memory: Mapping[Any, Any] | None = None,
    allow_offload: bool = False,
    optimizer: RequestedOptimizer = "auto",
    gradient_checkpointing: bool | None = None,
    step: StepShape | None = None,
    decode_cost: QuantDecodeCost | None = None,
) -> FitResult:
    """The fit ladder for one configuration. ``step``: a training step's shape (None: padded ``batch_size`` x
    ``seq_len`` with the plan's defaults; see :func:`cudaload.policies.memory.breakdown`). ``decode_cost``
    (inference): each quantized rung's measured decode speed, stated in its reasons; where int8 and nf4 both fit,
    a declared decode-heavy work takes nf4 (:data:`DECODE_HEAVY_S`)."""
    methods = methods_for(intent, quantization)
    opts, gcs, opt_skipped = training_ladder(
        intent, caps, optimizer=optimizer, gradient_checkpointing=gradient_checkpointing
    )
    explicit = quantization != "auto"
    bnb = bnb_problems(caps)
    shape = MemoryShape(dtype, None, intent, seq_len, batch_size, attn, step=step)
    lad = _Ladder(info, caps, shape, device_map, max_memory)
    w = _Walk((opts[-1], gcs[-1]))
    for m in METHODS:
        _try_method(lad, w, m, methods, opts, gcs, explicit=explicit, bnb=bnb)
    usable = [m for m in methods if m == "none" or not bnb]
    if w.result is None and allow_offload and usable:
        method = None if "none" in usable else usable[-1]
        bd, f = lad.attempt(method, True, opts[-1], gcs[-1])
        if f.ok:
            w.chosen = (opts[-1], gcs[-1])
            w.take(method or "none", f, bd)
            w.cands[method or "none"].append("fits with CPU/disk offload (allowed)")
    rel = dict(decode_cost.relative) if decode_cost is not None and intent == "inference" else {}
    if rel and not explicit and w.ok_name == "int8" and "nf4" in methods and {"int8", "nf4"} <= set(rel):
        assert decode_cost is not None
        _int8_or_nf4_rung(lad, w, decode_cost, opts[-1], gcs[-1])
    for m, r in rel.items():
        if m in w.cands:
            w.cands[m].append(
                f"decodes in ~{r:.1f}x the unquantized model's time per token ({decode_cost.source if decode_cost else ''})"
            )
    candidates = tuple(Candidate(m, m == w.ok_name, tuple(w.cands[m])) for m in METHODS)
    if w.result is None or w.bd_ok is None:
        raise _does_not_fit(
            lad,
            w,
            candidates,
            usable,
            allow_offload=allow_offload,
            last=(opts[-1], gcs[-1]),
            optimizer=optimizer,
        )
    choice = None if w.ok_name == "none" else w.ok_name
    reasons = [c for c in w.cands[w.ok_name or "none"]]
    if choice and not explicit:
        reasons.insert(0, "the unquantized model does not fit: " + "; ".join(w.cands["none"]))
    if explicit:
        reasons.insert(0, f"requested explicitly ({quantization})")
    dec = Decision(choice, tuple(reasons), candidates, explicit=explicit)
    opt_dec = gc_dec = None
    if intent != "inference":
        opt_dec, gc_dec = training_decisions(
            w.tried, w.ok_name, w.chosen, opts, gcs, opt_skipped, optimizer, gradient_checkpointing, w.bd_ok
        )
    return FitResult(dec, w.result, w.bd_ok, quantization_config(choice, dtype), opt_dec, gc_dec)


def _try_method(
    lad: _Ladder,
    w: _Walk,
    m: str,
    methods: list[str],
    opts: list[str | None],
    gcs: list[bool | None],
    *,
    explicit: bool,
    bnb: list[str],
) -> None:
    """One method's rungs (each optimizer, with checkpointing off then on), or why it is not tried."""
    intent = lad.shape.intent
    if m not in methods:
        w.cands[m].append(
            {
                "training": "full fine-tuning trains every weight: no quantization",
                "qlora": "QLoRA is defined as an nf4 base",
                "lora": "LoRA keeps the base in the compute dtype (intent qlora quantizes it)",
            }.get(intent, "not requested")
            if not explicit
            else "not requested"
        )
        return
    if w.ok_name is not None:
        w.cands[m].append(f"not needed: {'the unquantized model' if w.ok_name == 'none' else w.ok_name} fits")
        return
    method = None if m == "none" else m
    if method and bnb:
        w.cands[m].extend(bnb)
        if explicit:
            raise InvalidChoiceError(
                f"quantization={m} cannot be used here",
                reasons=bnb,
                fix="install a bitsandbytes build for this GPU, or use quantization='none'",
            )
        return
    f = Fit(False)
    for opt in opts:
        for gc in gcs:
            bd, f = lad.attempt(method, False, opt, gc)
            w.tried.append((m, opt, gc, f))
            if f.ok:
                break
        if f.ok:
            w.chosen = (opt, gc)
            break
    if f.ok:
        w.take(m, f, bd)
        assert f.placement is not None
        w.cands[m].append(f"fits: {f.placement.reasons[0]}")
    else:
        w.cands[m].extend(f.reasons)
        # what the method leaves unquantized decides MoE fits: say it where the method is rejected
        w.cands[m].extend(n for n in bd.notes if "MoE expert" in n)


def _int8_or_nf4_rung(
    lad: _Ladder, w: _Walk, cost: QuantDecodeCost, opt: str | None, gc: bool | None
) -> None:
    """int8 fits: whether nf4 fits too, and which of them the declared decode work takes."""
    bd4, f4 = lad.attempt("nf4", False, opt, gc)
    if f4.ok and f4.placement is not None:
        heavy, why = _int8_or_nf4(cost)
        fits4 = f"fits: {f4.placement.reasons[0]}"
        if heavy:
            w.take("nf4", f4, bd4)
            w.cands["nf4"] = [fits4, why]
            w.cands["int8"].append("not chosen: " + why)
        else:
            w.cands["nf4"] = [fits4.replace("fits:", "fits too:", 1), "not chosen: " + why]
            w.cands["int8"].append(why)


def _does_not_fit(
    lad: _Ladder,
    w: _Walk,
    candidates: tuple[Candidate, ...],
    usable: list[str],
    *,
    allow_offload: bool,
    last: tuple[str | None, bool | None],
    optimizer: str,
) -> DoesNotFitError:
    """The refusal: every method's reasons, and the suggestions checked to fit."""
    info, caps, s = lad.info, lad.caps, lad.shape
    sugg = suggestions(
        info,
        caps,
        dtype=s.dtype,
        intent=s.intent,
        seq_len=s.seq_len,
        batch_size=s.batch_size,
        attn=s.attn,
        methods=usable,
        max_memory=lad.max_memory,
        allow_offload=allow_offload,
        optimizer=last[0],
        gradient_checkpointing=last[1],
        optimizer_requested=optimizer,
        step=s.step,
    )
    return DoesNotFitError(
        f"{info.summary.name} ({param_count(info.summary.params)} params, intent {s.intent}, "
        f"seq_len {s.seq_len} x batch {s.batch_size}) does not fit this machine",
        reasons=[f"{c.name}: {'; '.join(c.reasons)}" for c in candidates],
        fix=render_suggestions(
            sugg,
            caps,
            lad.max_memory,
            methods=usable,
            # the least any rung lacked: what a max_memory cap must grow by (issue 41: "raise max_memory"
            # without an amount led back to the same error)
            shortfall=min((t[3].shortfall for t in w.tried if t[3].shortfall > 0), default=0),
        ),
        suggestions=sugg,
    )


def _int8_or_nf4(cost: QuantDecodeCost) -> tuple[bool, str]:
    """Whether the declared decode work takes nf4 over int8 (both fit), and why either way."""
    r8, r4 = cost.relative["int8"], cost.relative["nf4"]
    if cost.steps is None:
        return False, (
            f"int8 kept: its 8-bit weights are closer to the model's than nf4's 4-bit ones; nf4 decodes ~{r8 / r4:.1f}x "
            "faster, and a declared decode-heavy job (new_tokens=, generate_calls=) takes it"
        )
    if cost.ms_per_token is None:
        return False, "int8 kept (the more accurate): decode speed is not measured on this GPU"
    extra = cost.steps * cost.ms_per_token * (r8 - r4) / 1000
    if extra > DECODE_HEAVY_S:
        return True, (
            f"the declared {cost.steps:,} decode steps take ~{extra:.0f} s longer with int8 than with nf4 "
            f"(~{cost.ms_per_token * r8:.0f} against ~{cost.ms_per_token * r4:.0f} ms per step): over "
            f"{DECODE_HEAVY_S:.0f} s, so nf4's speed over int8's accuracy (8-bit weights, kept where the difference "
            "is less)"
        )
    return False, (
        f"int8 kept: the more accurate (8-bit against nf4's 4-bit weights), and the declared {cost.steps:,} decode "
        f"steps take only ~{extra:.0f} s longer with it (nf4 is taken past {DECODE_HEAVY_S:.0f} s)"
    )
