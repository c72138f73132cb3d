"""TrainingArguments keywords that fit a Plan.

:func:`training_arguments` merges small, independent pieces (precision, optimizer, memory); each is a function
of the plan alone, so other pieces (distributed settings) compose the same way.
"""

from __future__ import annotations

from typing import Any

from .detection.versions import version_tuple
from .errors import ConfigurationError
from .plans import Plan

#: transformers renamed TrainingArguments.gradient_checkpointing to activation_checkpointing in 5.23 (the old
#: name is a deprecated alias there: transformers 5.23.0 training_args.py:313 and :929 "Deprecated alias of
#: `activation_checkpointing`"; in 5.22.2 activation_checkpointing is only an fsdp_config key)
ACTIVATION_CHECKPOINTING_SINCE = (5, 23)


def _on_gpu(plan: Plan) -> bool:
    return any(d.startswith("cuda") for d in plan.placement.devices)


def precision_arguments(plan: Plan) -> dict[str, Any]:
    """bf16 / fp16 from the plan's dtype; TF32 matmuls on Ampere and later."""
    gpus = plan.hardware.get("gpus", [])
    on_gpu = _on_gpu(plan)
    args: dict[str, Any] = {
        "bf16": plan.dtype.choice == "bfloat16",
        "fp16": plan.dtype.choice == "float16",
    }
    if on_gpu:
        # TF32 matmuls are free speed on Ampere and later and harmless for fine-tuning
        args["tf32"] = bool(gpus) and all(tuple(g["compute_capability"]) >= (8, 0) for g in gpus)
    return args


def optimizer_arguments(plan: Plan) -> dict[str, Any]:
    """``optim``: the plan's optimizer decision (TrainingArguments' names), or the intent's default for plans
    made before optimizers were planned."""
    if plan.optimizer is not None and plan.optimizer.choice:
        return {"optim": plan.optimizer.choice}
    if plan.intent == "qlora":
        # paged 8-bit AdamW keeps optimizer spikes out of OOM territory, the QLoRA paper's recipe
        return {"optim": "paged_adamw_8bit"}
    return {"optim": "adamw_torch_fused" if _on_gpu(plan) else "adamw_torch"}


def memory_arguments(plan: Plan) -> dict[str, Any]:
    """Batch size and gradient checkpointing as planned (the memory estimate assumed exactly these)."""
    if plan.gradient_checkpointing is not None:
        gc = plan.gradient_checkpointing.choice == "on"
    else:  # plans made before checkpointing was planned
        gc = plan.intent in ("training", "qlora") or plan.seq_len >= 4096
    new = (version_tuple(plan.hardware.get("transformers")) or (0,)) >= ACTIVATION_CHECKPOINTING_SINCE
    name = "activation_checkpointing" if new else "gradient_checkpointing"
    args: dict[str, Any] = {"per_device_train_batch_size": plan.batch_size, name: gc}
    if gc:
        # non-reentrant checkpointing: no inputs need requires_grad, and it is what the estimate measured
        args[f"{name}_kwargs"] = {"use_reentrant": False}
    if plan.intent in ("lora", "qlora"):
        # adapters leave most parameters frozen; DDP must not wait for their gradients
        args["ddp_find_unused_parameters"] = False
    return args


def training_arguments(plan: Plan) -> dict[str, Any]:
    """Keywords for ``transformers.TrainingArguments`` matching the plan's dtype, hardware and intent.

    >>> args = TrainingArguments(output_dir="out", **cudaload.training_arguments(model.cudaload_plan))

    Several GPUs: the parallelism's settings (FSDP2 / DDP / DeepSpeed, and the optimizer and checkpointing
    each rank was planned with) are merged in when the plan is for the ranks -- made under torchrun, or for a
    profile. A process planned on this machine outside torchrun runs the plan's own placement (one GPU or a
    layer split); its parallelism only says how to launch N processes, whose own plans then carry them.

    Args:
        plan: a plan for intent ``"training"``, ``"lora"`` or ``"qlora"``, from :func:`cudaload.plan` or a
            loaded model's ``model.cudaload_plan``.

    Returns:
        A dict of ``TrainingArguments`` keywords: ``bf16`` / ``fp16`` (and ``tf32`` on a GPU), ``optim``,
        ``per_device_train_batch_size``, ``gradient_checkpointing`` (``activation_checkpointing`` from
        transformers 5.23) with its kwargs, ``ddp_find_unused_parameters`` for adapters, and the
        parallelism's settings (``fsdp``, ``fsdp_config``, ``deepspeed``...) where they apply.

    Raises:
        ConfigurationError: the plan is for inference or serving.
    """
    if plan.intent in ("inference", "serving"):
        raise ConfigurationError(
            f"this plan is for {plan.intent}", fix="plan or load with intent='training', 'lora' or 'qlora'"
        )
    args = {**precision_arguments(plan), **optimizer_arguments(plan), **memory_arguments(plan)}
    par = plan.parallelism
    if par is not None and (par.launched or str(plan.hardware.get("source", "")).startswith("profile:")):
        from .policies.parallelism import merge_training_arguments

        args = merge_training_arguments(args, plan)
    return args
