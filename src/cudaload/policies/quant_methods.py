"""Which quantization methods an intent may use, whether bitsandbytes can run them here, and the
``BitsAndBytesConfig`` each one loads with: the rungs :func:`cudaload.policies.quantization.fit` walks.

Full fine-tuning never quantizes; QLoRA is nf4 with double quantisation and an explicit half-precision compute
dtype (never BitsAndBytesConfig's fp4 / fp32 defaults).
"""

from __future__ import annotations

from typing import Any, Literal

from ..capabilities import Capabilities
from ..detection.support import bitsandbytes_support

METHODS = ("none", "int8", "nf4")
#: ``quantization=`` as the request hands it on (cudaload.request: case and spaces dropped, "no" / "off" read
#: as "none", None as "auto"): "auto" (only when nothing else fits) or one of :data:`METHODS`
RequestedQuantization = Literal["auto", "none", "int8", "nf4"]


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


def methods_for(intent: str, requested: RequestedQuantization) -> list[str]:
    """The methods the fit ladder tries for ``intent``, in order, given the ``quantization`` asked for: a name as
    :class:`cudaload.request.Request` normalised it, which also refused the ones the intent cannot use."""
    if requested != "auto":
        return [requested]
    if intent == "qlora":
        return ["nf4"]
    if intent in ("training", "lora"):
        return ["none"]
    return ["none", "int8", "nf4"]
