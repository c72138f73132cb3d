"""dtype: bf16 where the GPU does it natively (sm80+), fp16 on older GPUs, fp32 on the CPU.

The checkpoint's own dtype wins where it is at least as good: an fp16 checkpoint stays fp16 (no conversion,
no precision lost), a bf16 checkpoint on a pre-Ampere GPU becomes fp16 (bf16 is only emulated there, and
``torch.cuda.is_bf16_supported()`` would say yes anyway). Models known to overflow fp16 get a warning and
the fp32 alternative instead of silent NaNs.
"""

from __future__ import annotations

from ..capabilities import Capabilities
from ..dtypes import DTYPES, dtype_bytes, normalize_dtype
from ..errors import InvalidChoiceError
from ..plans.decision import Candidate, Decision

# names, spellings and sizes live in cudaload.dtypes (model_info reads them too); still importable from here
__all__ = ["DTYPES", "choose_dtype", "dtype_bytes", "fp16_overflow_warning", "normalize_dtype"]


def fp16_overflow_warning(model_type: str) -> str:
    return (
        f"{model_type} is known to overflow in float16 (activations beyond 65504 turn into inf/NaN); "
        "float32 is the safe alternative (twice the memory), or a GPU with native bf16 (sm80+)"
    )


def choose_dtype(
    caps: Capabilities,
    *,
    checkpoint_dtype: str | None,
    model_type: str,
    intent: str = "inference",
    requested: str = "auto",
    fp16_overflow: bool = False,
) -> Decision:
    """The compute/load dtype. ``requested`` "auto" or a dtype name (honoured, or InvalidChoiceError)."""
    cands = _candidates(caps, model_type=model_type, intent=intent, fp16_overflow=fp16_overflow)
    by = {c.name: c for c in cands}

    if requested != "auto":
        name = normalize_dtype(requested)
        c = by[name]
        if not c.ok:
            raise InvalidChoiceError(
                f"dtype={name} cannot be used on this machine",
                reasons=c.reasons,
                fix="use dtype='auto' or 'float16' (or 'float32')",
            )
        return Decision(
            name, (f"requested explicitly ({requested})", *c.reasons), tuple(cands), explicit=True
        )

    gpus = caps.gpus
    ck = checkpoint_dtype if checkpoint_dtype in DTYPES else None
    slow = [g for g in gpus if not g.bf16_native]
    reasons: list[str]
    if not gpus:
        choice, reasons = "float32", ["no GPU: float32 is the CPU's fast, exact dtype"]
    elif ck == "float16":
        choice, reasons = (
            "float16",
            ["the checkpoint is stored in float16: kept as is (no conversion, no precision lost)"],
        )
    elif not slow:
        choice = "bfloat16"
        reasons = [f"bf16 is native on {gpus[0].name} (sm{gpus[0].sm}): fp32's range at half the memory"]
        if ck == "float32":
            reasons.append("the checkpoint is float32; bf16 halves memory with the same exponent range")
    else:
        choice = "float16"
        reasons = [
            f"{slow[0].name} (sm{slow[0].sm}) has no native bf16: float16 is the fast half-precision type"
        ]
        if ck == "bfloat16":
            reasons.append("the checkpoint is bfloat16; values outside fp16's range would overflow")
    if choice == "float16" and fp16_overflow:
        reasons.append("WARNING: " + fp16_overflow_warning(model_type))
    return Decision(choice, tuple(reasons), tuple(cands))


def _candidates(caps: Capabilities, *, model_type: str, intent: str, fp16_overflow: bool) -> list[Candidate]:
    """bfloat16, float16 and float32, each with whether it can run here and what it costs."""
    gpus = caps.gpus
    slow = [g for g in gpus if not g.bf16_native]
    cands: list[Candidate] = []
    # bfloat16
    if not gpus:
        cands.append(Candidate("bfloat16", True, ("CPU: bf16 works but runs slower than fp32 on most CPUs",)))
    elif slow:
        g = slow[0]
        cands.append(
            Candidate(
                "bfloat16",
                False,
                (
                    f"{g.name} (sm{g.sm}) has no native bf16: torch emulates it "
                    "(is_bf16_supported() says True) at a "
                    "fraction of the speed, and flash kernels refuse it",
                ),
            )
        )
    else:
        cands.append(Candidate("bfloat16", True, (f"native on {gpus[0].name} (sm{gpus[0].sm} >= sm80)",)))
    # float16
    f16: list[str] = []
    if not gpus:
        f16.append("CPU: fp16 matmuls are slow or unsupported on many CPUs")
    else:
        f16.append("half precision: native on every CUDA GPU cudaload supports")
    if fp16_overflow:
        f16.append(fp16_overflow_warning(model_type))
    if intent != "inference" and gpus:
        f16.append("training in fp16 needs loss scaling (GradScaler / fp16=True)")
    cands.append(Candidate("float16", True, tuple(f16)))
    # float32
    cands.append(
        Candidate(
            "float32",
            True,
            ("full precision: twice the memory of bf16/fp16" + ("; the CPU default" if not gpus else ""),),
        )
    )
    return cands
