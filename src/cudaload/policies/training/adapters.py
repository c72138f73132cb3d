"""The adapters' own settings: LoRA dropout, QLoRA's k-bit preparation of the quantized base, and whether PEFT's
LoRA layers copy each adapted input to fp32 under autocast."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ...plans.decision import Candidate, Decision
from ..memory import LORA_DROPOUT


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
