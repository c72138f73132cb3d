"""TrainingArguments keywords that fit a Plan."""

from __future__ import annotations

from typing import Any

from .errors import ConfigurationError
from .plans import Plan


def training_arguments(plan: Plan) -> dict[str, Any]:
    """Keywords for ``transformers.TrainingArguments`` matching the plan's dtype, hardware and intent.

    >>> args = TrainingArguments(output_dir="out", **cudaload.training_arguments(model.cudaload_plan))
    """
    if plan.intent == "inference":
        raise ConfigurationError(
            "this plan is for inference", fix="plan or load with intent='training', 'lora' or 'qlora'"
        )
    gpus = plan.hardware.get("gpus", [])
    on_gpu = any(d.startswith("cuda") for d in plan.placement.devices)
    ampere = on_gpu and all(tuple(g["compute_capability"]) >= (8, 0) for g in gpus) and bool(gpus)
    args: dict[str, Any] = {
        "bf16": plan.dtype.choice == "bfloat16",
        "fp16": plan.dtype.choice == "float16",
        # TF32 matmuls are free speed on Ampere and later and harmless for fine-tuning
        "tf32": ampere if on_gpu else None,
        "per_device_train_batch_size": plan.batch_size,
        # activations dominate long-sequence training; k-bit training is prepared with checkpointing already
        "gradient_checkpointing": plan.intent in ("training", "qlora") or plan.seq_len >= 4096,
    }
    if plan.intent == "qlora":
        # paged 8-bit AdamW keeps optimizer spikes out of OOM territory, the QLoRA paper's recipe
        args["optim"] = "paged_adamw_8bit"
    elif on_gpu:
        args["optim"] = "adamw_torch_fused"
    else:
        args["optim"] = "adamw_torch"
    if args["gradient_checkpointing"]:
        args["gradient_checkpointing_kwargs"] = {"use_reentrant": False}
    if plan.intent in ("lora", "qlora"):
        # adapters leave most parameters frozen; DDP must not wait for their gradients
        args["ddp_find_unused_parameters"] = False
    if args["tf32"] is None:
        del args["tf32"]
    return args
