"""The fit ladder: native dtype on one GPU, split over the visible GPUs, int8, nf4, offload (when allowed),
else :class:`DoesNotFitError` saying what would fit. Per intent: full fine-tuning never quantizes; QLoRA is
nf4 with double quantisation and an explicit half-precision compute dtype (never BitsAndBytesConfig's fp4 /
fp32 defaults).

Training adds rungs inside each method: the optimizer (fp32 AdamW with fp32 master weights -> 8-bit AdamW ->
paged 8-bit AdamW when bitsandbytes is usable -> Adafactor) and, for each, gradient checkpointing off (faster)
then on. Every suggestion in a :class:`DoesNotFitError` is one of :func:`suggestions`, each checked by planning
it (tests/test_memory_suggestions.py follows every one).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from ..capabilities import Capabilities
from ..decision import Candidate, Decision
from ..detection.support import bitsandbytes_support
from ..errors import DoesNotFitError, InvalidChoiceError
from ..model_info import ModelInfo
from ..training_plan import StepShape
from ..units import param_count
from .attention.names import SHORT_DECODE_MAX_TOKENS
from .decode_facts import QuantDecodeCost
from .memory import BNB_OPTIMIZERS, OPTIMIZERS, Breakdown, GiB, breakdown, default_optimizer
from .placement import Fit, budgets, place

METHODS = ("none", "int8", "nf4")
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
    optimizer: str = "auto",
    gradient_checkpointing: bool | None = None,
) -> tuple[list[str | None], list[bool | None], dict[str, list[str]]]:
    """(optimizers to try in order, checkpointing settings in order, reasons for optimizers not tried)."""
    if intent == "inference":
        return [None], [None], {}
    req = (optimizer or "auto").strip().lower()
    if req != "auto" and req not in OPTIMIZERS:
        raise InvalidChoiceError(
            f"unknown optimizer {optimizer!r}", fix=f"use auto or one of {', '.join(OPTIMIZERS)}"
        )
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


def quantization_config(method: str | None, dtype: str) -> dict[str, Any] | None:
    """BitsAndBytesConfig keyword arguments, every default that matters spelled out."""
    if method == "nf4":
        return {
            "load_in_4bit": True,
            "bnb_4bit_quant_type": "nf4",  # the default is fp4
            "bnb_4bit_use_double_quant": True,
            "bnb_4bit_compute_dtype": dtype
            if dtype in ("bfloat16", "float16")
            else "bfloat16",  # default fp32
        }
    if method == "int8":
        return {"load_in_8bit": True, "llm_int8_threshold": 6.0}
    return None


def bnb_problems(caps: Capabilities) -> list[str]:
    """Why bitsandbytes cannot quantize here (empty when it can)."""
    if not caps.gpus:
        return ["no GPU: bitsandbytes quantization is planned for CUDA GPUs only"]
    out = []
    for g in caps.gpus:
        ok, why = bitsandbytes_support(g.compute_capability, caps.cpu_arch)
        if not ok:
            out.append(f"{g.name}: {why}")
            break
    pkg = caps.package("bitsandbytes")
    if not pkg.installed:
        if pkg.assumed:
            out.append("bitsandbytes is not installed (assumed missing)")
        elif caps.source.startswith("profile:"):
            # a profile describes hardware; what will be installed on it is the planner's to say
            out.append(
                "bitsandbytes is not assumed on a profile (--assume-installed bitsandbytes to plan with it)"
            )
        else:
            out.append("bitsandbytes is not installed (pip install 'cudaload[quant]')")
    elif not pkg.usable:
        out.append(
            f"bitsandbytes {pkg.version or ''} is installed but not usable: "
            f"{pkg.reason or 'it does not import'}"
        )
    return out


def _methods(intent: str, requested: str) -> list[str]:
    req = (requested or "auto").strip().lower()
    if req in ("none", "no", "off"):
        req = "none"
    if req not in ("auto", *METHODS):
        raise InvalidChoiceError(f"unknown quantization {requested!r}", fix="use auto, none, int8 or nf4")
    if intent == "training" and req in ("int8", "nf4"):
        raise InvalidChoiceError(
            f"quantization={req} with intent=training: quantized weights cannot be trained",
            fix="use intent='qlora' (frozen nf4 base + LoRA adapters), or quantization='none'",
        )
    if intent == "qlora" and req in ("none", "int8"):
        raise InvalidChoiceError(
            f"quantization={req} with intent=qlora: QLoRA is an nf4 base",
            fix="use quantization='auto' or 'nf4', or intent='lora'",
        )
    if req != "auto":
        return [req]
    if intent == "qlora":
        return ["nf4"]
    if intent in ("training", "lora"):
        return ["none"]
    return ["none", "int8", "nf4"]


def fit(
    info: ModelInfo,
    caps: Capabilities,
    *,
    dtype: str,
    intent: str,
    seq_len: int,
    batch_size: int,
    attn: str = "sdpa",
    quantization: str = "auto",
    device_map: Any = None,
    max_memory: Mapping[Any, Any] | None = None,
    allow_offload: bool = False,
    optimizer: str = "auto",
    gradient_checkpointing: bool | None = None,
    step: StepShape | None = None,
    decode_cost: QuantDecodeCost | None = None,
) -> FitResult:
    """The fit ladder for one configuration. ``step``: a training step's shape (None: padded ``batch_size`` x
    ``seq_len`` with the plan's defaults; see :func:`cudaload.policies.memory.breakdown`). ``decode_cost``
    (inference): each quantized rung's measured decode speed, stated in its reasons; where int8 and nf4 both fit,
    a declared decode-heavy work takes nf4 (:data:`DECODE_HEAVY_S`)."""
    methods = _methods(intent, quantization)
    opts, gcs, opt_skipped = training_ladder(
        intent, caps, optimizer=optimizer, gradient_checkpointing=gradient_checkpointing
    )
    #: (method, optimizer, checkpointing, fit) in the order tried
    tried: list[tuple[str, str | None, bool | None, Fit]] = []
    chosen: tuple[str | None, bool | None] = (opts[-1], gcs[-1])
    explicit = (quantization or "auto") != "auto"
    bnb = bnb_problems(caps)
    cands: dict[str, list[str]] = {m: [] for m in METHODS}
    ok_name: str | None = None
    result: Fit | None = None
    bd_ok: Breakdown | None = None

    def attempt(method: str | None, offload: bool, opt: str | None, gc: bool | None) -> tuple[Breakdown, Fit]:
        bd = breakdown(
            info,
            dtype=dtype,
            quantization=method,
            intent=intent,
            seq_len=seq_len,
            batch_size=batch_size,
            attn=attn,
            optimizer=opt,
            gradient_checkpointing=gc,
            step=step,
        )
        if bd.host_bytes and caps.host_memory and bd.host_bytes > caps.host_memory:
            # paged optimizer states evicted to the host must fit there
            return bd, Fit(
                False,
                reasons=(
                    f"{opt}: {bd.host_bytes / GiB:.2f} GiB of paged states exceed the host's "
                    f"{caps.host_memory / GiB:.2f} GiB",
                ),
            )
        return bd, place(caps, bd, device_map=device_map, max_memory=max_memory, allow_offload=offload)

    for m in METHODS:
        if m not in methods:
            cands[m].append(
                {
                    "training": "full fine-tuning trains every weight: no quantization",
                    "qlora": "QLoRA is defined as an nf4 base",
                    "lora": "LoRA keeps the base in the compute dtype (intent qlora quantizes it)",
                }.get(intent, "not requested")
                if not explicit
                else "not requested"
            )
            continue
        if ok_name is not None:
            cands[m].append(f"not needed: {'the unquantized model' if ok_name == 'none' else ok_name} fits")
            continue
        method = None if m == "none" else m
        if method and bnb:
            cands[m].extend(bnb)
            if explicit:
                raise InvalidChoiceError(
                    f"quantization={m} cannot be used here",
                    reasons=bnb,
                    fix="install a bitsandbytes build for this GPU, or use quantization='none'",
                )
            continue
        f = Fit(False)
        for opt in opts:
            for gc in gcs:
                bd, f = attempt(method, False, opt, gc)
                tried.append((m, opt, gc, f))
                if f.ok:
                    break
            if f.ok:
                chosen = (opt, gc)
                break
        if f.ok:
            ok_name, result, bd_ok = m, f, bd
            assert f.placement is not None
            cands[m].append(f"fits: {f.placement.reasons[0]}")
        else:
            cands[m].extend(f.reasons)
            # what the method leaves unquantized decides MoE fits: say it where the method is rejected
            cands[m].extend(n for n in bd.notes if "MoE expert" in n)
    usable = [m for m in methods if m == "none" or not bnb]
    if result is None and allow_offload and usable:
        method = None if "none" in usable else usable[-1]
        bd, f = attempt(method, True, opts[-1], gcs[-1])
        if f.ok:
            chosen = (opts[-1], gcs[-1])
            ok_name, result, bd_ok = method or "none", f, bd
            cands[ok_name].append("fits with CPU/disk offload (allowed)")
    rel = dict(decode_cost.relative) if decode_cost is not None and intent == "inference" else {}
    if rel and not explicit and ok_name == "int8" and "nf4" in methods and {"int8", "nf4"} <= set(rel):
        assert decode_cost is not None
        bd4, f4 = attempt("nf4", False, opts[-1], gcs[-1])
        if f4.ok and f4.placement is not None:
            heavy, why = _int8_or_nf4(decode_cost)
            fits4 = f"fits: {f4.placement.reasons[0]}"
            if heavy:
                ok_name, result, bd_ok = "nf4", f4, bd4
                cands["nf4"] = [fits4, why]
                cands["int8"].append("not chosen: " + why)
            else:
                cands["nf4"] = [fits4.replace("fits:", "fits too:", 1), "not chosen: " + why]
                cands["int8"].append(why)
    for m, r in rel.items():
        if m in cands:
            cands[m].append(
                f"decodes in ~{r:.1f}x the unquantized model's time per token ({decode_cost.source if decode_cost else ''})"
            )
    candidates = tuple(Candidate(m, m == ok_name, tuple(cands[m])) for m in METHODS)
    if result is None or bd_ok is None:
        sugg = suggestions(
            info,
            caps,
            dtype=dtype,
            intent=intent,
            seq_len=seq_len,
            batch_size=batch_size,
            attn=attn,
            methods=[m for m in methods if not (m != "none" and bnb)],
            max_memory=max_memory,
            allow_offload=allow_offload,
            optimizer=opts[-1],
            gradient_checkpointing=gcs[-1],
            optimizer_requested=optimizer,
            step=step,
        )
        raise DoesNotFitError(
            f"{info.summary.name} ({param_count(info.summary.params)} params, intent {intent}, "
            f"seq_len {seq_len} x batch {batch_size}) does not fit this machine",
            reasons=[f"{c.name}: {'; '.join(c.reasons)}" for c in candidates],
            fix=render_suggestions(
                sugg,
                caps,
                max_memory,
                methods=[m for m in methods if not (m != "none" and bnb)],
                # the least any rung lacked: what a max_memory cap must grow by (issue 41: "raise max_memory"
                # without an amount led back to the same error)
                shortfall=min((t[3].shortfall for t in tried if t[3].shortfall > 0), default=0),
            ),
            suggestions=sugg,
        )
    choice = None if ok_name == "none" else ok_name
    reasons = [c for c in cands[ok_name or "none"]]
    if choice and not explicit:
        reasons.insert(0, "the unquantized model does not fit: " + "; ".join(cands["none"]))
    if explicit:
        reasons.insert(0, f"requested explicitly ({quantization})")
    dec = Decision(choice, tuple(reasons), candidates, explicit=explicit)
    opt_dec = gc_dec = None
    if intent != "inference":
        opt_dec, gc_dec = _training_decisions(
            tried, ok_name, chosen, opts, gcs, opt_skipped, optimizer, gradient_checkpointing, bd_ok
        )
    return FitResult(dec, result, bd_ok, quantization_config(choice, dtype), opt_dec, gc_dec)


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


def _training_decisions(
    tried: list[tuple[str, str | None, bool | None, Fit]],
    method: str | None,
    chosen: tuple[str | None, bool | None],
    opts: list[str | None],
    gcs: list[bool | None],
    skipped: dict[str, list[str]],
    optimizer: str,
    gradient_checkpointing: bool | None,
    bd: Breakdown,
) -> tuple[Decision, Decision]:
    """The optimizer and gradient-checkpointing decisions, from the ladder's attempts for the chosen method."""
    mine = [t for t in tried if t[0] == method]
    opt_c: list[Candidate] = []
    for o in OPTIMIZERS:
        why = [_OPT_WHY[o]]
        if o == chosen[0]:
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
                why.append(f"not needed: {chosen[0]} fits")
        else:
            ok = False
            why.append("not requested" if optimizer != "auto" else "not on this intent's ladder")
        opt_c.append(Candidate(o, ok, tuple(why)))
    opt_reasons = [r for c in opt_c if c.ok for r in c.reasons]
    host = [n for n in bd.notes if n.startswith("optimizer:")]
    opt_dec = Decision(chosen[0], (*opt_reasons, *host), tuple(opt_c), explicit=optimizer != "auto")
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
    gc_dec = Decision(
        "on" if chosen[1] else "off",
        next(c.reasons for c in gc_c if c.ok),
        tuple(gc_c),
        explicit=gradient_checkpointing is not None,
    )
    return opt_dec, gc_dec


@dataclass(frozen=True)
class Suggestion:
    """One way to make the plan fit, already checked against the same estimate: ``kind`` is what to change
    (``seq_len``, ``batch_size``, ``gpus``, ``intent``, ``optimizer``, ``offload``), ``value`` its new value
    (``gpus``: how many GPUs like the first one), ``text`` what the error says."""

    kind: str
    value: Any
    text: str
    seq_len: int | None = None  # a GPU count that holds only with a shorter sequence says so


def replicate_gpus(caps: Capabilities, count: int) -> Capabilities:
    """``caps`` with ``count`` GPUs like its first one (what "N GPUs like X" means), numbered 0..count-1."""
    g0 = caps.gpus[0]
    gpus = tuple(replace(g0, index=i, nvml_index=i) for i in range(count))
    src = caps.source
    if src.startswith("profile:"):
        label = src.removeprefix("profile:")
        label = label.split("x", 1)[1] if label[:1].isdigit() and "x" in label else label
        src = f"profile:{count}x{label}" if count > 1 else f"profile:{label}"
    return replace(caps, gpus=gpus, source=src)


def suggestions(
    info: ModelInfo,
    caps: Capabilities,
    *,
    dtype: str,
    intent: str,
    seq_len: int,
    batch_size: int,
    attn: str,
    methods: list[str],
    max_memory: Mapping[Any, Any] | None,
    allow_offload: bool,
    optimizer: str | None = None,
    gradient_checkpointing: bool | None = None,
    optimizer_requested: str = "auto",
    step: StepShape | None = None,
) -> list[Suggestion]:
    """Alternatives that fit, each probed with the ladder's last (smallest) rung: the last quantization
    method, ``optimizer`` and ``gradient_checkpointing`` as the ladder would end. A GPU count is found by
    placing the model on that many copies of the first GPU, so the per-GPU context and activations and the
    whole-layer granularity of a split are in the arithmetic (a count that only adds up in bytes is not
    enough). A packed training ``step`` is shortened by its tokens per step, where a padded one is by
    ``seq_len``."""
    packed = step is not None and step.packed
    out: list[Suggestion] = []
    if not methods:
        # nothing this intent allows can run here (qlora without a usable bitsandbytes): only another intent
        if intent == "qlora" and caps.gpus:
            bd = breakdown(
                info,
                dtype=dtype,
                quantization=None,
                intent="lora",
                seq_len=seq_len,
                batch_size=batch_size,
                attn=attn,
                gradient_checkpointing=True,
                step=step,
            )
            if place(caps, bd, max_memory=max_memory).ok:
                out.append(
                    Suggestion("intent", "lora", "intent='lora' (bf16 base + LoRA, no bitsandbytes) fits")
                )
        return out
    best = methods[-1]
    q = None if best == "none" else best

    def estimate_with(**kw: Any) -> Breakdown:
        args: dict[str, Any] = {
            "dtype": dtype,
            "quantization": q,
            "intent": intent,
            "seq_len": seq_len,
            "batch_size": batch_size,
            "attn": attn,
            "optimizer": optimizer,
            "gradient_checkpointing": gradient_checkpointing,
            "step": step,
        }
        args.update(kw)
        if step is not None and "seq_len" in kw:
            # a shorter sequence: a packed step holds fewer tokens, a padded one is batch x that
            n = int(kw["seq_len"])
            args["step"] = (
                replace(step, tokens=n, longest=min(step.longest, n))
                if step.packed
                else replace(step, tokens=step.sequences * n, longest=n)
            )
        if step is not None and "batch_size" in kw and not step.packed:
            b = int(kw["batch_size"])
            args["step"] = replace(args["step"], tokens=b * args["step"].longest, sequences=b)
        if (
            args["intent"] == "inference"
            and args["batch_size"] == 1
            and args["seq_len"] <= SHORT_DECODE_MAX_TOKENS
            and caps.gpus
            and caps.gpus[0].compute_capability >= (8, 0)
        ):
            # a plan declaring one short sequence may pick eager (policies/attention/choice.py _short_decode,
            # unless cudaload_sdpa is the default there): its seq_len^2 scores are assumed, the larger of the
            # two, so a shorter-sequence suggestion fits whichever is chosen
            args["attn"] = "eager"
        return breakdown(info, **args)

    def fits(c: Capabilities = caps, **kw: Any) -> bool:
        return place(c, estimate_with(**kw), max_memory=max_memory).ok

    if caps.gpus:
        top = step.tokens if step is not None and packed else seq_len
        lo, hi = 0, top
        while hi - lo > 1:  # the longest sequence that fits, by bisection (each probe is arithmetic)
            mid = (lo + hi) // 2
            if fits(seq_len=mid):
                lo = mid
            else:
                hi = mid
        if lo >= 128 and packed and step is not None and lo >= step.longest:
            out.append(
                Suggestion(
                    "tokens_per_step", lo, f"tokens_per_step={lo}{'' if q is None else f' with {q}'} fits"
                )
            )
        elif lo >= 128 and packed:
            # a step must hold the longest sequence: shorter sequences, and steps of that many tokens
            out.append(
                Suggestion(
                    "seq_len",
                    lo,
                    f"seq_len <= {lo} with tokens_per_step={lo}{'' if q is None else f' with {q}'} fits",
                )
            )
        elif lo >= 128:
            out.append(Suggestion("seq_len", lo, f"seq_len <= {lo} fits{'' if q is None else f' with {q}'}"))
        if batch_size > 1 and not packed and fits(batch_size=1):
            out.append(Suggestion("batch_size", 1, "batch_size=1 fits"))
        explicit_map = max_memory is not None and any(
            str(k).strip() not in ("cpu", "disk") for k in max_memory
        )
        if not explicit_map:
            per_gpu = budgets(caps, None).get(f"cuda:{caps.gpus[0].index}", 0)

            def gpus_for(s: int) -> int | None:
                # smallest count that places: the model's bytes bound it below; then place() decides
                bd = estimate_with(seq_len=s)
                room = max(per_gpu - bd.every_device, 1)
                n = max(len(caps.gpus) + 1, int(bd.model_bytes // room))
                while n <= MAX_SUGGESTED_GPUS and not fits(replicate_gpus(caps, n), seq_len=s):
                    n += 1
                return n if n <= MAX_SUGGESTED_GPUS else None

            name = f"{caps.gpus[0].name} ({per_gpu / GiB:.0f} GiB each)"
            s = seq_len
            n = gpus_for(s)
            while n is None and s > 512:
                # every GPU of a split runs its share of the sequence's activations: shorter, then more GPUs
                s = max(s // 2, 512)
                n = gpus_for(s)
            if n is not None:
                text = f"{n} GPUs like {name}" + ("" if s == seq_len else f" with seq_len <= {s}")
                out.append(Suggestion("gpus", n, text, seq_len=None if s == seq_len else s))
        if (
            intent in ("training", "lora")
            and "nf4" not in methods
            and not bnb_problems(caps)
            and fits(
                quantization="nf4", intent="qlora", optimizer="paged_adamw_8bit", gradient_checkpointing=True
            )
        ):
            out.append(Suggestion("intent", "qlora", "intent='qlora' (nf4 base + LoRA) fits"))
        if intent == "training" and optimizer_requested not in ("auto", "", None):
            for o in ("adamw_8bit", "paged_adamw_8bit", "adafactor"):
                if o == optimizer_requested or (o in BNB_OPTIMIZERS and bnb_problems(caps)):
                    continue
                if fits(
                    optimizer=o,
                    gradient_checkpointing=True if gradient_checkpointing is None else gradient_checkpointing,
                ):
                    out.append(Suggestion("optimizer", o, f"optimizer='{o}' fits"))
                    break
    if not allow_offload and place(caps, estimate_with(), max_memory=max_memory, allow_offload=True).ok:
        # only when the host's memory is known (a profile without it cannot offload)
        out.append(Suggestion("offload", True, "allow_offload=True (CPU/disk offload, slow)"))
    return out


#: what a suggestion may ask for at most (profiles compose up to 64 GPUs)
MAX_SUGGESTED_GPUS = 64


def render_suggestions(
    sugg: list[Suggestion],
    caps: Capabilities | None = None,
    max_memory: Mapping[Any, Any] | None = None,
    *,
    methods: list[str] | None = None,
    shortfall: int = 0,
) -> str:
    """The fix a DoesNotFitError gives: the suggestions that were checked to fit, else what the situation
    needs (no usable method here, a max_memory cap that is the limit, no GPU) before "more GPU memory".
    ``shortfall``: the bytes the closest rung lacked, which a single GPU cap is raised by."""
    tips = [t.text for t in sugg]
    if tips:
        return "try: " + "; or ".join(tips)
    if methods is not None and not methods:
        # nothing the intent allows can run here (QLoRA without a usable bitsandbytes): memory is not the issue
        return (
            "intent='qlora' needs bitsandbytes' 4-bit kernels on a CUDA GPU: use intent='lora' (a bf16 base) here, "
            "or a machine with a GPU and bitsandbytes (pip install 'cudaload[quant]')"
        )
    capped = {str(k): v for k, v in (max_memory or {}).items() if str(k).strip() not in ("cpu", "disk")}
    if capped:
        text = f"raise max_memory ({', '.join(f'{k}: {v}' for k, v in capped.items())} is what caps the GPU here)"
        if shortfall > 0 and len(capped) == 1:
            from .placement import parse_size

            key, value = next(
                (k, v) for k, v in (max_memory or {}).items() if str(k).strip() not in ("cpu", "disk")
            )
            # rounded up to a tenth of a GiB: the cap that covers what the closest rung lacked
            need = -(-(parse_size(value) + shortfall) * 10 // GiB) / 10
            dev = next(iter(capped)).strip()
            whole = (
                budgets(caps, None).get(dev if dev.startswith("cuda") else f"cuda:{dev}") if caps else None
            )
            if whole is None or need * GiB <= whole:
                text += f" to at least {need:.1f}GiB: max_memory={{{key!r}: '{need:.1f}GiB'}}"
            else:  # no cap this GPU allows is enough
                text += f"; it needs {need:.1f} GiB and the whole GPU has {whole / GiB:.1f}: use a machine with more"
        return text
    if caps is not None and not caps.gpus:
        return "no GPU is visible here: plan for one with hardware='H100' (cudaload profiles), or load on a machine with a GPU"
    return "use a machine with more GPU memory"
