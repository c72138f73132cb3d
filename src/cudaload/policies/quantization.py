"""The fit ladder: native dtype on one GPU, split over the visible GPUs, int8, nf4, offload (when allowed),
else :class:`DoesNotFitError` saying what would fit. Per intent: full fine-tuning never quantizes; QLoRA is
nf4 with double quantisation and an explicit half-precision compute dtype (never BitsAndBytesConfig's fp4 /
fp32 defaults).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..capabilities import Capabilities
from ..decision import Candidate, Decision
from ..detection.support import bitsandbytes_support
from ..errors import DoesNotFitError, InvalidChoiceError
from .memory import CUDA_CONTEXT_BYTES, Breakdown, GiB, breakdown
from .placement import Fit, budgets, place

METHODS = ("none", "int8", "nf4")


@dataclass(frozen=True)
class FitResult:
    decision: Decision
    fit: Fit
    breakdown: Breakdown
    quantization_config: dict[str, Any] | None


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
            out.append("bitsandbytes is not assumed on a profile (--assume-installed bitsandbytes to plan with it)")
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
    info: Any,
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
) -> FitResult:
    methods = _methods(intent, quantization)
    explicit = (quantization or "auto") != "auto"
    bnb = bnb_problems(caps)
    cands: dict[str, list[str]] = {m: [] for m in METHODS}
    ok_name: str | None = None
    result: Fit | None = None
    bd_ok: Breakdown | None = None

    def attempt(method: str | None, offload: bool) -> tuple[Breakdown, Fit]:
        bd = breakdown(
            info,
            dtype=dtype,
            quantization=method,
            intent=intent,
            seq_len=seq_len,
            batch_size=batch_size,
            attn=attn,
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
        bd, f = attempt(method, offload=False)
        if f.ok:
            ok_name, result, bd_ok = m, f, bd
            assert f.placement is not None
            cands[m].append(f"fits: {f.placement.reasons[0]}")
        else:
            cands[m].extend(f.reasons)
    usable = [m for m in methods if m == "none" or not bnb]
    if result is None and allow_offload and usable:
        method = None if "none" in usable else usable[-1]
        bd, f = attempt(method, offload=True)
        if f.ok:
            ok_name, result, bd_ok = method or "none", f, bd
            cands[ok_name].append("fits with CPU/disk offload (allowed)")
    candidates = tuple(Candidate(m, m == ok_name, tuple(cands[m])) for m in METHODS)
    if result is None or bd_ok is None:
        raise DoesNotFitError(
            f"{info.summary.name} ({info.summary.params / 1e9:.2f} B params, intent {intent}, "
            f"seq_len {seq_len} x batch {batch_size}) does not fit this machine",
            reasons=[f"{c.name}: {'; '.join(c.reasons)}" for c in candidates],
            fix=what_would_fit(
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
            ),
        )
    choice = None if ok_name == "none" else ok_name
    reasons = [c for c in cands[ok_name or "none"]]
    if choice and not explicit:
        reasons.insert(0, "the unquantized model does not fit: " + "; ".join(cands["none"]))
    if explicit:
        reasons.insert(0, f"requested explicitly ({quantization})")
    dec = Decision(choice, tuple(reasons), candidates, explicit=explicit)
    return FitResult(dec, result, bd_ok, quantization_config(choice, dtype))


def what_would_fit(
    info: Any,
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
) -> str:
    """One line of alternatives, each checked against the same estimate."""
    tips: list[str] = []
    best = methods[-1] if methods else "none"
    q = None if best == "none" else best

    def estimate_with(**kw: Any) -> Breakdown:
        args: dict[str, Any] = {
            "dtype": dtype,
            "quantization": q,
            "intent": intent,
            "seq_len": seq_len,
            "batch_size": batch_size,
            "attn": attn,
        }
        args.update(kw)
        return breakdown(info, **args)

    def fits(**kw: Any) -> bool:
        return place(caps, estimate_with(**kw), max_memory=max_memory).ok

    if caps.gpus:
        lo, hi = 0, seq_len
        while hi - lo > 1:  # the longest sequence that fits, by bisection (each probe is arithmetic)
            mid = (lo + hi) // 2
            if fits(seq_len=mid):
                lo = mid
            else:
                hi = mid
        if lo >= 128:
            tips.append(f"seq_len <= {lo} fits{'' if q is None else f' with {q}'}")
        if batch_size > 1 and fits(batch_size=1):
            tips.append("batch_size=1 fits")
        bd = estimate_with()
        per_gpu = max(budgets(caps, max_memory).get(f"cuda:{caps.gpus[0].index}", 0), 1)
        need_gpus = 1
        while need_gpus < 1024:
            room = (
                need_gpus * (per_gpu - CUDA_CONTEXT_BYTES - bd.every_device) - bd.first_bytes - bd.last_bytes
            )
            if room >= bd.layers * bd.layer_bytes:
                break
            need_gpus += 1
        if need_gpus > len(caps.gpus) and need_gpus < 1024:
            tips.append(f"{need_gpus} GPUs like {caps.gpus[0].name} ({per_gpu / GiB:.0f} GiB each)")
        if (
            intent in ("training", "lora")
            and "nf4" not in methods
            and fits(quantization="nf4", intent="qlora")
            and not bnb_problems(caps)
        ):
            tips.append("intent='qlora' (nf4 base + LoRA) fits")
    if not allow_offload:
        tips.append("allow_offload=True (CPU/disk offload, slow)")
    return "try: " + "; or ".join(tips) if tips else "use a machine with more GPU memory"
