"""The plan's LoRA adapters: the LoraConfig and the peft wrap (k-bit preparation for quantized bases)."""

from __future__ import annotations

from typing import Any

from ..errors import DependencyError
from ..plans import Plan


def _lora_config(plan: Plan) -> Any:
    """The plan's LoraConfig (one for the whole-model and the sharded path alike)."""
    try:
        from peft import LoraConfig
    except ImportError as e:
        raise DependencyError(
            f"intent {plan.intent!r} needs peft", reasons=[str(e)], fix="pip install 'cudaload[peft]'"
        ) from None
    return LoraConfig(**(plan.peft or {"target_modules": "all-linear"}))


def _wrap_peft(model: Any, plan: Plan) -> Any:
    config = _lora_config(plan)
    from peft import get_peft_model, prepare_model_for_kbit_training

    if plan.quantization.choice in ("nf4", "int8"):
        # casts norms to fp32 and enables input grads so checkpointed k-bit layers train stably
        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=True)
    return get_peft_model(model, config)
