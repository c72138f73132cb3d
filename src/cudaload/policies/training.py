"""Training decisions: how each optimizer step is laid out and computed, for speed as well as fit.

* **batch layout** (:func:`choose_layout`): ``packed`` -- a step's sequences concatenated into one row,
  position ids restarting at each sequence, so no padding is computed -- where the attention keeps the
  sequences apart without materialising scores over the whole row (flash attention's varlen kernels, told the
  boundaries once per step; sdpa or flex_attention with transformers' block-diagonal mask); else ``padded``,
  grouped by length where the batch holds several sequences.
* **tokens per step** (:func:`plan_step`): at most ``batch_size`` sequences and at most ``tokens_per_step``
  real tokens a step. The bound is what memory is planned for, so a step of long sequences never runs out of
  memory; it is the largest that fits without gradient checkpointing, down to what typical instruction data
  puts in ``batch_size`` sequences, before the fused loss and then checkpointing are tried.
* **activation checkpointing**: off where some bound fits without it; else *partial* (only every n-th decoder
  layer checkpointed, transformers' ``every_n_layers``; the largest n that fits, the least recompute) before
  checkpointing every layer (:func:`partial_problems` says where partial cannot run).
* **the loss**: transformers' (fp32 logits over the vocabulary), or Liger's fused linear cross-entropy where
  only it makes the step fit without checkpointing (measured slower where memory was not short).
* **LoRA dropout** (:func:`choose_lora_dropout`) and **QLoRA's k-bit preparation** (:func:`choose_kbit_upcast`).

Each is a :class:`~cudaload.decision.Decision` with its candidates, like every other policy; the fits are
probed through a function the planner passes in (pure arithmetic: :func:`cudaload.policies.quantization.fit`).
Measured training throughput (:class:`TrainingFacts`, shipped in the priors file) ranks the attention
backends for training in :mod:`cudaload.policies.attention.choice`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from ..capabilities import Capabilities
from ..decision import Candidate, Decision
from ..detection.versions import version_tuple
from ..errors import ConfigurationError, DoesNotFitError, InvalidChoiceError
from ..model_info import ModelInfo
from ..training_plan import LAYOUTS, LOSSES, StepShape, TrainingPlan
from .attention.names import VARLEN
from .memory import LORA_DROPOUT, sdpa_math
from .training_facts import TrainingFacts, training_facts_for

__all__ = [
    "DEFAULT_SEQUENCES",
    "StepChoice",
    "TrainingFacts",
    "base_step",
    "boundaries_for",
    "choose_adapter_cast",
    "choose_kbit_upcast",
    "choose_layout",
    "choose_lora_dropout",
    "liger_problems",
    "packing_blockers",
    "packing_costs",
    "partial_problems",
    "plan_for_ranks",
    "plan_step",
    "step_bounds",
    "training_facts_for",
]

#: Trainer's default ``per_device_train_batch_size`` (transformers 5.17 training_args.py, the field's
#: default): the sequences a step holds when the caller declares none
DEFAULT_SEQUENCES = 8
#: The smallest step bound tried before the fused loss or checkpointing, as a fraction of ``batch_size x
#: seq_len``: instruction data's sequences average about a quarter of the longest (benchmarks/bench_train.py's
#: log-normal lengths: median 420 capped at 2048 averaged 579, 0.28 of it; median 200, 301, 0.15), so
#: ``batch_size`` sequences rarely need more, and a step that would is split in two.
TYPICAL_FILL = 0.25
#: step bounds are multiples of this (a whole number of 256-token tiles)
ALIGN = 256
#: the bounds tried, as fractions of ``batch_size x seq_len``, largest first
_FRACTIONS = (1.0, 0.75, 0.5, 0.375, TYPICAL_FILL)
#: the first transformers whose ``gradient_checkpointing_enable`` takes ``every_n_layers`` (and ``offload``):
#: 5.17 modeling_utils.py:3106-3108, also 5.22 :3109 and 5.24's ``activation_checkpointing_enable`` :3119; Trainer
#: pops both from ``gradient_checkpointing_kwargs`` (5.17 trainer.py:1465-1472, 5.22 :1504-1511, 5.24 :1507-1527)
PARTIAL_CHECKPOINTING_SINCE = (5, 17)


def packing_blockers(info: ModelInfo) -> list[str]:
    """Why packed steps would train this model wrongly (empty: they would not)."""
    bad: list[str] = []
    s = info.summary
    if s.is_encoder or not info.can_generate or info.auto_class != "AutoModelForCausalLM":
        bad.append(
            "packing concatenates causal-LM sequences; this model is not trained as a causal LM "
            f"({info.auto_class}), whose inputs are read whole"
        )
    if info.remote_code:
        bad.append("remote code: its attention is not transformers' own, which keeps packed sequences apart")
    if info.attention_classes is not None:
        bad.append(
            "legacy attention classes (the model's *_ATTENTION_CLASSES): no block-diagonal mask from position ids"
        )
    return bad


def packing_costs(info: ModelInfo, attn: str, act_bytes: int) -> list[str]:
    """Why packed steps would be slow with this attention: scores materialised over the whole row."""
    if attn == "eager":
        return [
            "eager attention over a packed row computes every token against every other token of the row "
            "(tokens^2 scores per head and layer), not per sequence"
        ]
    if attn == "sdpa" and sdpa_math(info, act_bytes):
        return ["sdpa runs its math kernel here (fp32 with grouped kv heads): tokens^2 scores over the row"]
    return []


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


def boundaries_for(attn: str) -> str:
    """How a packed step tells ``attn`` where its sequences start (:data:`cudaload.training_plan.BOUNDARIES`)."""
    return "cu_seq_lens" if attn in VARLEN else "position_ids"


def choose_layout(info: ModelInfo, attn: str, act_bytes: int, requested: str = "auto") -> Decision:
    """``packed`` where the model is a causal LM and the attention keeps packed sequences apart without scores
    over the whole row, else ``padded``. An explicit ``packed`` is honoured where it trains correctly (its
    cost said), refused with :class:`InvalidChoiceError` where it would not."""
    req = (requested or "auto").strip().lower()
    if req not in ("auto", *LAYOUTS):
        raise ConfigurationError(
            f"unknown batch_layout {requested!r}", fix=f"use 'auto' or one of {', '.join(LAYOUTS)}"
        )
    bad = packing_blockers(info)
    costs = packing_costs(info, attn, act_bytes)
    how = (
        f"{attn}'s varlen kernels take the sequence boundaries (cu_seq_lens), computed once per step by the "
        "collator"
        if attn in VARLEN
        else f"transformers builds a block-diagonal mask for {attn} from the restarting position ids "
        "(masking_utils.find_packed_sequence_indices)"
    )
    packed_why = (
        f"no padding is computed: each step's sequences are concatenated into one row; {how}. On the H200, "
        "packed steps as planned here trained 3.1-3.4x the tokens/s of the padded, checkpointed recipe (8B LoRA, "
        "flash_attention_4; 2.3-2.4x with sdpa; benchmarks/results/2026-12-03-h200)"
    )
    padded_why = (
        "each sequence padded to the batch's longest (attention mask); padding tokens are computed too"
    )
    cands = (
        Candidate("packed", not bad and not costs, (packed_why, *bad, *costs)),
        Candidate("padded", True, (padded_why,)),
    )
    if req == "packed":
        if bad:
            raise InvalidChoiceError(
                "batch_layout='packed' cannot be used here",
                reasons=bad,
                fix="use batch_layout='auto' (padded here)",
            )
        return Decision("packed", ("requested explicitly", packed_why, *costs), cands, explicit=True)
    if req == "padded":
        return Decision("padded", ("requested explicitly", padded_why), cands, explicit=True)
    if bad or costs:
        return Decision("padded", (f"packing is not right here: {'; '.join(bad + costs)}",), cands)
    return Decision("packed", (packed_why,), cands)


def choose_lora_dropout(intent: str, lora: Mapping[str, Any] | None) -> Decision | None:
    """LoRA dropout: PEFT's own default (0) unless the caller set one. None for other intents."""
    if intent not in ("lora", "qlora"):
        return None
    given = (lora or {}).get("lora_dropout")
    zero_why = (
        "PEFT's own default (LoraConfig.lora_dropout = 0.0): no dropout copy of every adapted layer's input is "
        "made or kept for backward"
    )
    if given is not None:
        v = str(float(given))  # as given: the choice is read back with float()
        return Decision(
            v,
            ("requested explicitly (lora={'lora_dropout': ...})",),
            (Candidate(v, True, ("requested",)), Candidate(str(LORA_DROPOUT), True, (zero_why,))),
            explicit=True,
        )
    return Decision(
        str(LORA_DROPOUT),
        (zero_why, "pass lora={'lora_dropout': 0.05} for a regularising dropout (slower, more memory)"),
        (Candidate(str(LORA_DROPOUT), True, (zero_why,)),),
    )


def choose_kbit_upcast(intent: str, dtype: str, quantization: str | None) -> Decision | None:
    """QLoRA's preparation of the quantized base: keep the non-4-bit parameters in the compute dtype (bf16), or
    peft's ``prepare_model_for_kbit_training`` cast of all of them to fp32 (fp16 compute). None otherwise."""
    if intent != "qlora" or quantization is None:
        return None
    fp32_why = (
        "peft's prepare_model_for_kbit_training: embeddings, norms and the output head cast to fp32 (peft 0.21 "
        "utils/other.py:204-209), so the residual stream, every activation and the logits are fp32: twice the "
        "activation memory, and sdpa's fused kernels do not take fp32 with grouped kv heads"
    )
    bf16_why = (
        "the non-4-bit parameters stay bf16, the precision cudaload's bf16 LoRA trains in: bf16 has fp32's "
        "range, the RMSNorms compute in fp32 inside (hidden_states.to(torch.float32)) and the loss upcasts the "
        "logits (loss/loss_utils.py ``logits.float()``); the adapters are fp32 either way"
    )
    if dtype == "bfloat16":
        return Decision(
            "bf16", (bf16_why,), (Candidate("bf16", True, (bf16_why,)), Candidate("fp32", True, (fp32_why,)))
        )
    why16 = f"{dtype} compute: fp16's narrow range is why peft casts the rest to fp32"
    return Decision(
        "fp32",
        (why16, fp32_why),
        (Candidate("fp32", True, (fp32_why,)), Candidate("bf16", False, (f"the compute dtype is {dtype}",))),
    )


def choose_adapter_cast(intent: str, dtype: str, kbit_upcast: Decision | None) -> Decision | None:
    """Whether PEFT's LoRA layers copy each adapted input to the adapters' fp32 under autocast. None where there
    are no adapters, or none in a lower precision than fp32.

    PEFT casts every adapted layer's input to the adapter's dtype (fp32, ``autocast_adapter_dtype``) before the
    adapter (peft 0.21 tuners/lora/layer.py:1100). Under bf16/fp16 autocast (Trainer's ``bf16=True``) autocast
    casts that copy straight back for the matmul, so the copy computes nothing: the result is the same to the
    bit and costs two passes over each input and a kept copy per adapter. PEFT's own bitsandbytes layers skip
    it under autocast (peft 0.21 tuners/lora/bnb.py:543-546, ``requires_conversion = not
    torch.is_autocast_enabled()``); cudaload applies that rule to the plain LoRA layers it wraps, through
    their ``cast_input_dtype_enabled`` switch (the one ``peft.helpers.disable_input_dtype_casting`` sets)."""
    if intent not in ("lora", "qlora") or dtype not in ("bfloat16", "float16"):
        return None
    peft_why = (
        "PEFT's default: each adapted layer's input copied to fp32 before its adapter, then cast back to "
        f"{dtype} by autocast for the matmul (peft 0.21 tuners/lora/layer.py:1100)"
    )
    skip_why = (
        "under autocast the adapters read the layer's own input: the same result to the bit (autocast casts "
        "the fp32 copy straight back), without two passes over every adapted input and a kept copy per adapter; "
        "outside autocast PEFT's cast stays (the rule of PEFT's own bitsandbytes layers, peft 0.21 "
        "tuners/lora/bnb.py:543-546)"
    )
    if intent == "qlora" and kbit_upcast is not None and kbit_upcast.choice == "fp32":
        why = "the stream is fp32 (k-bit preparation): the cast is a no-op"
        return Decision("peft", (why,), (Candidate("peft", True, (why,)),))
    return Decision(
        "outside-autocast",
        (skip_why,),
        (Candidate("outside-autocast", True, (skip_why,)), Candidate("peft", True, (peft_why, "slower"))),
    )


def step_bounds(batch_size: int, seq_len: int, requested: int | None) -> list[int]:
    """The tokens-per-step bounds to try, largest first: ``batch_size x seq_len`` down to what typical data puts
    in ``batch_size`` sequences (:data:`TYPICAL_FILL`), never below one longest sequence."""
    if requested is not None:
        return [requested]
    full = batch_size * seq_len
    out: list[int] = [full]
    for f in _FRACTIONS[1:]:
        # rounded down to whole tiles, never below one longest sequence nor above the full step
        t = min(max(seq_len, int(full * f) // ALIGN * ALIGN), full)
        if t not in out:
            out.append(t)
    return out


#: the fit probe the planner passes in: (step, gradient_checkpointing) -> a fit result (raises DoesNotFitError);
#: with checkpointing on, ``step.checkpoint_every`` says which layers
FitProbe = Callable[[StepShape, "bool | None"], Any]
#: a rung's checkpointing in the ladder's attempts: 0 off, 1 every layer, n >= 2 every n-th layer
OFF, EVERY = 0, 1


@dataclass(frozen=True)
class StepChoice:
    """What :func:`plan_step` chose: the step, the fit result for it, and the training section of the plan."""

    step: StepShape
    fit: Any
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
    loss: str,
    gradient_checkpointing: bool | None,
    lora_dropout: Decision | None,
    kbit_upcast: Decision | None,
    assumed: Sequence[str] = (),
    sequences_declared: bool = True,
    adapter_cast: Decision | None = None,
) -> StepChoice:
    """The step bound, the loss and (through ``fit``) checkpointing and the optimizer, cheapest first.

    Tried in order, each probed by ``fit``: the largest bound with checkpointing as the fit ladder decides; if
    that needs checkpointing, smaller bounds without it (the same optimizer), then Liger's fused loss without
    it; then the same bounds and losses with every n-th layer checkpointed (the largest n that fits; not where
    :func:`partial_problems` says so); else the bounds with every layer checkpointed. An explicit ``tokens_per_step``, ``loss`` or
    ``gradient_checkpointing`` narrows the ladder to it. Where ``batch_size`` was assumed
    (``sequences_declared=False``), the ladder goes down to one longest sequence a step."""
    req_loss, liger_bad = _loss_request(loss, caps, info)
    bounds = _bounds(base, tokens_per_step, sequences_declared)
    if req_loss == "transformers" or liger_bad:
        losses = [False]
    else:
        losses = [True] if req_loss == "liger" else [False, True]
    partial_bad = partial_problems(caps, info)
    layers = max(info.summary.layers, 1)
    t, fused, gc, result, tried = _walk(
        fit,
        base,
        bounds,
        losses,
        gradient_checkpointing,
        last_is_the_callers=not sequences_declared,
        partial_layers=0 if partial_bad else layers,
    )
    step = _shape(base, t, fused, gc)
    gc_on = result.gradient_checkpointing is not None and result.gradient_checkpointing.choice == "on"
    if gradient_checkpointing is None and result.gradient_checkpointing is not None:
        result = replace(
            result,
            gradient_checkpointing=_checkpointing_decision(
                gc, t, tried, bounds, partial_bad, layers, version_known=caps.transformers_version is not None
            ),
        )
    tp = TrainingPlan(
        layout=layout,
        tokens_per_step=_tokens_decision(bounds, tried, t, fused, base, tokens_per_step),
        loss=_loss_decision(req_loss, fused, liger_bad, tried, gc_on, gc),
        step=step,
        boundaries=boundaries_for(attn) if base.packed else None,
        lora_dropout=lora_dropout,
        kbit_upcast=kbit_upcast,
        adapter_cast=adapter_cast,
        assumed=tuple(assumed),
        notes=_notes(step, base.packed, base.sequences),
        group_by_length=not base.packed and step.sequences > 1,
    )
    return StepChoice(step, result, tp)


def _loss_request(loss: str, caps: Capabilities, info: ModelInfo) -> tuple[str, list[str]]:
    """The loss asked for, and why Liger cannot run here; an explicit Liger that cannot is refused."""
    req = (loss or "auto").strip().lower()
    if req not in ("auto", *LOSSES):
        raise ConfigurationError(f"unknown loss {loss!r}", fix=f"use 'auto' or one of {', '.join(LOSSES)}")
    bad = liger_problems(caps, info)
    if req == "liger" and bad:
        raise InvalidChoiceError(
            "loss='liger' cannot be used here",
            reasons=bad,
            fix="pip install liger-kernel (needs a CUDA GPU and triton), or use loss='auto'",
        )
    return req, bad


def _bounds(base: StepShape, tokens_per_step: int | None, sequences_declared: bool) -> list[int]:
    """The bounds to try: a packed step's (:func:`step_bounds`; an assumed batch down to one sequence), a
    padded step's one size. An explicit bound the step cannot hold or reach is refused."""
    seq, full = base.longest, base.tokens
    if not base.packed:
        # a padded step is batch x seq_len; an assumed batch may hold fewer sequences (halving down to one)
        if sequences_declared:
            return [full]
        out, b = [], base.sequences
        while b >= 1:
            out.append(b * seq)
            b //= 2
        return out
    if tokens_per_step is not None and tokens_per_step < seq:
        raise ConfigurationError(
            f"tokens_per_step={tokens_per_step} is shorter than seq_len={seq}: the longest sequence must fit "
            "in one step",
            fix=f"pass tokens_per_step >= {seq}, or a shorter seq_len",
        )
    if tokens_per_step is not None and tokens_per_step > full:
        raise ConfigurationError(
            f"tokens_per_step={tokens_per_step} cannot be reached: a step holds at most batch_size={base.sequences} "
            f"sequences of at most seq_len={seq} tokens ({full:,})",
            fix=f"pass tokens_per_step <= {full}, or a larger batch_size (sequences a step)",
        )
    bounds = step_bounds(base.sequences, seq, tokens_per_step)
    if tokens_per_step is None and not sequences_declared and bounds[-1] > seq:
        # the sequences a step holds were assumed, not declared: fewer of them is still the caller's plan
        bounds.append(seq)
    return bounds


def _shape(base: StepShape, tokens: int, fused: bool, gc: int = OFF) -> StepShape:
    every = gc if gc > EVERY else 1
    if not base.packed:  # a padded step of fewer sequences
        return replace(
            base,
            tokens=tokens,
            sequences=max(1, tokens // base.longest),
            fused_loss=fused,
            checkpoint_every=every,
        )
    return replace(
        base, tokens=tokens, longest=min(base.longest, tokens), fused_loss=fused, checkpoint_every=every
    )


Attempt = tuple[int, bool, int, str]  # (bound, fused loss, checkpointing: OFF / EVERY / n, outcome)


def _walk(
    fit: FitProbe,
    base: StepShape,
    bounds: list[int],
    losses: list[bool],
    gradient_checkpointing: bool | None,
    last_is_the_callers: bool = False,
    partial_layers: int = 0,
) -> tuple[int, bool, int, Any, list[Attempt]]:
    """The first (bound, fused loss, checkpointing) that fits, in the ladder's order: without checkpointing
    every loss and bound, then every n-th layer checkpointed (where ``partial_layers``, the model's decoder
    layers, is set: at each loss and bound the largest n that fits), then every layer. Returns it (checkpointing
    as OFF, EVERY or n) with the fit result and every attempt's outcome. When nothing fits, raises the largest
    bound's own error (its suggestions are for the caller's whole step), or where the step's sequences were
    assumed (``last_is_the_callers``) the smallest bound's, the step the caller would get."""
    tried: list[Attempt] = []
    # the fit ladder's optimizer for the largest bound (with checkpointing if it needs it): smaller bounds are
    # tried without checkpointing (or with it partial) only with that optimizer, so a full fine-tune does not
    # trade fp32 AdamW for an 8-bit one to skip checkpointing (the fit ladder's own order: optimizer first, then
    # checkpointing)
    r0_err: DoesNotFitError | None = None
    try:
        r0 = fit(_shape(base, bounds[0], losses[0]), gradient_checkpointing)
    except DoesNotFitError as e:
        r0, r0_err = None, e
    opt0 = r0.optimizer.choice if r0 is not None and r0.optimizer is not None else None

    def probe(t: int, fused: bool, gc: int) -> Any:
        """The fit at one rung, or None (its outcome recorded either way)."""
        try:
            r = fit(_shape(base, t, fused, gc), gc != OFF)
        except DoesNotFitError as e:
            tried.append((t, fused, gc, _short(e)))
            return None
        if gc != EVERY and opt0 is not None and r.optimizer is not None and r.optimizer.choice != opt0:
            tried.append((t, fused, gc, f"fits only with {r.optimizer.choice} in place of {opt0}"))
            return None
        tried.append((t, fused, gc, "fits"))
        return r

    rungs = [gc for gc in (False, True) if gradient_checkpointing in (None, gc)]
    for gc in rungs:
        if gc and gradient_checkpointing is None and partial_layers > 1:
            # partial: the bound with the least recompute (largest n), the larger bound where n ties -- as the
            # rungs without checkpointing, a smaller bound before more recompute (typical data rarely fills the
            # larger one); transformers' loss before the fused one
            for fused in losses:
                best: tuple[int, int, Any] | None = None  # (n, bound, fit)
                for t in bounds:
                    found = _largest_every(probe, t, fused, partial_layers, above=best[0] if best else 1)
                    if found is not None and (best is None or found[0] > best[0]):
                        best = (found[0], t, found[1])
                    if best is not None and best[0] >= partial_layers:
                        break  # one layer checkpointed: no smaller bound recomputes less
                if best is not None:
                    return best[1], fused, best[0], best[2], tried
        for fused in losses:
            for t in bounds:
                r = probe(t, fused, EVERY if gc else OFF)
                if r is not None:
                    return t, fused, EVERY if gc else OFF, r, tried
    if r0_err is not None and not last_is_the_callers:
        raise r0_err
    # the smallest step the ladder went down to: its error's suggestions are for the step the caller would get
    fit(_shape(base, bounds[-1], losses[-1]), gradient_checkpointing)
    raise DoesNotFitError(
        "no step bound fits", reasons=[o for *_, o in tried], fix="declare a shorter seq_len"
    )


def _largest_every(
    probe: Callable[[int, bool, int], Any], t: int, fused: bool, layers: int, above: int = 1
) -> tuple[int, Any] | None:
    """The largest n (``above`` < n <= layers, n >= 2) for which checkpointing every n-th layer fits at bound
    ``t``, with its fit: the fewest layers recomputed. Memory only grows with n (fewer layers checkpointed), so
    the smallest n is tried first (none fits if it does not) and the rest by bisection. Of the n that checkpoint
    as many layers, the smallest (the checkpointed layers evenly spread)."""
    first = max(2, above + 1)
    if first > layers:
        return None
    r = probe(t, fused, first)
    if r is None:
        return None
    lo, hi, best = first, layers, r
    while lo < hi:
        mid = (lo + hi + 1) // 2
        got = probe(t, fused, mid)
        if got is None:
            hi = mid - 1
        else:
            lo, best = mid, got
    even = -(-layers // -(-layers // lo))  # the smallest n checkpointing ceil(layers / lo) layers
    if even != lo:
        got = probe(t, fused, even)
        if got is not None:  # the same layers' count, the same bytes: fits as lo did
            return even, got
    return lo, best


def _short(e: DoesNotFitError) -> str:
    """A fit failure in one line: the first device's need against its budget, else the message."""
    need = next((r.split(": does not fit: ", 1)[-1] for r in e.reasons if "needs" in r), None)
    return f"does not fit ({need})" if need else f"does not fit: {e.message}"


def _every(n: int) -> str:
    return "every layer" if n == EVERY else f"every {n} layers"


#: why offload is not planned (transformers' ``gradient_checkpointing_enable(offload=True)``)
OFFLOAD_WHY = (
    "transformers' offload=True holds the checkpointed layers' inputs in pinned host memory (torch's save_on_cpu, "
    "5.17 modeling_utils.py:3134-3141) with a device-to-host copy in the forward and back in the backward, on the "
    "compute stream; not planned: neither those copies' cost nor the pinned host memory is measured or modelled "
    "here"
)


def _checkpointing_decision(
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
            _fmt_t(step.tokens), (why,), (Candidate(_fmt_t(step.tokens), True, (why,)),)
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


def _attempt(fused: bool, gc: int, outcome: str) -> str:
    how = "without checkpointing" if gc == OFF else f"checkpointing {_every(gc)}"
    return f"{'fused loss, ' if fused else ''}{how}: {outcome}"


def _condensed(rows: Sequence[Attempt]) -> list[Attempt]:
    """A bound's attempts as a candidate states them: every partial bisection reduced, per loss, to the largest
    n that fitted and the smallest that did not above it (or the first that did not)."""
    out: list[Attempt] = []
    for r in rows:
        _, fused, gc, _ = r
        if gc <= EVERY:
            out.append(r)
            continue
        if any(x[1] == fused and x[2] > EVERY for x in out):
            continue  # this loss's partial rows are in already
        mine = [x for x in rows if x[1] == fused and x[2] > EVERY]
        fits = [x for x in mine if x[3] == "fits"]
        top = max((x[2] for x in fits), default=0)
        fails = [x for x in mine if x[3] != "fits" and x[2] > top]
        if fits:
            out.append(next(x for x in fits if x[2] == top))
        if fails:
            out.append(min(fails, key=lambda x: x[2]))
    return out


def _fmt_t(t: int) -> str:
    return f"{t:,}"


def _tokens_decision(
    bounds: Sequence[int],
    tried: Sequence[Attempt],
    chosen: int,
    fused: bool,
    base: StepShape,
    requested: int | None,
) -> Decision:
    cands: list[Candidate] = []
    for b in bounds:
        rows = _condensed([x for x in tried if x[0] == b])
        if rows:
            cands.append(Candidate(_fmt_t(b), b == chosen, tuple(_attempt(f, gc, o) for _, f, gc, o in rows)))
        else:  # below the chosen one: it would fit too (less of everything), but holds fewer tokens
            cands.append(Candidate(_fmt_t(b), True, (f"fits, but a step of {chosen:,} tokens does too",)))
    batch_size, seq_len = base.sequences, base.longest
    if not base.packed:
        pad = f"padded: every step computes {chosen // seq_len} x {seq_len} tokens, padding included"
        if requested is not None:
            pad += f"; tokens_per_step={requested} applies to packed steps only"
        return Decision(_fmt_t(chosen), (pad,), tuple(cands))
    if requested is not None:
        return Decision(_fmt_t(chosen), ("requested explicitly",), tuple(cands), explicit=True)
    reasons = [
        f"at most {batch_size} sequences and {chosen:,} real tokens a step; memory is planned for the bound, so "
        "no step of long sequences runs out of it"
    ]
    full = base.tokens
    if chosen < full:
        why_full = next((_attempt(f, gc, o) for t, f, gc, o in reversed(tried) if t == full), "larger")
        reasons.append(
            f"{batch_size} x {seq_len} = {full:,} tokens: {why_full}; typical instruction data averages about a "
            f"quarter of its longest sequence, so {batch_size} sequences rarely hold more than {chosen:,} tokens "
            "(a step that would is split in two)"
        )
    return Decision(_fmt_t(chosen), tuple(reasons), tuple(cands))


def _loss_decision(
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
            f"only the fused loss lets the step fit with {_every(gc)} checkpointed, not every layer (transformers' "
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


def _notes(step: StepShape, packed: bool, batch_size: int) -> tuple[str, ...]:
    if not packed:
        return ()
    return (
        "TrainingArguments' per_device_train_batch_size is 1: each item of the packed data set "
        f"(cudaload.training_setup) is one step of up to {batch_size} sequences and {step.tokens:,} tokens",
    )
