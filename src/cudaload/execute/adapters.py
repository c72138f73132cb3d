"""The plan's LoRA adapters: the LoraConfig and the peft wrap (k-bit preparation for quantized bases), the
adapters' input cast as planned, and gradient checkpointing switched on where the plan trains with it."""

from __future__ import annotations

import inspect
from typing import Any

from ..errors import ConfigurationError, DependencyError
from ..plans import Plan

#: non-reentrant checkpointing: inputs need not require grad (no enable_input_require_grads hook), and it is what
#: the memory estimate measured (cudaload.training.memory_arguments passes the same to Trainer)
_CHECKPOINT_KWARGS = {"use_reentrant": False}


def _lora_config(plan: Plan) -> Any:
    """The plan's LoraConfig (one for the whole-model and the sharded path alike)."""
    try:
        from peft import LoraConfig
    except ImportError as e:
        raise DependencyError(
            f"intent {plan.intent!r} needs peft", reasons=[str(e)], fix="pip install 'cudaload[peft]'"
        ) from None
    return LoraConfig(**(plan.peft or {"target_modules": "all-linear"}))


def _checkpointing(plan: Plan) -> bool:
    """Whether the plan checkpoints any layer (every layer, or every n-th: ``partial``)."""
    return plan.checkpoint_every > 0


def _wrap_peft(model: Any, plan: Plan) -> Any:
    config = _lora_config(plan)
    from peft import get_peft_model, prepare_model_for_kbit_training

    if plan.quantization.choice in ("nf4", "int8"):
        t = plan.training
        upcast = t is None or t.kbit_upcast is None or t.kbit_upcast.choice == "fp32"
        if upcast:
            # peft's recipe: the non-k-bit parameters cast to fp32 (the plan says why, fp16 compute); it also
            # turns checkpointing on when asked, so ask exactly what the plan decided (plans made before the
            # training section: peft's default, on). It turns it on for every layer: a partial plan's
            # enable_planned_checkpointing sets every layer's flag again afterwards
            model = prepare_model_for_kbit_training(
                model,
                use_gradient_checkpointing=_checkpointing(plan) if t is not None else True,
                gradient_checkpointing_kwargs=dict(_CHECKPOINT_KWARGS),
            )
        # bf16: the base stays as loaded; get_peft_model freezes it (peft tuners_utils _mark_only_adapters_as_trainable)
    return get_peft_model(model, config)


def apply_adapter_cast(model: Any, plan: Plan) -> int:
    """The plan's ``adapter_cast`` on every LoRA layer of ``model``: ``outside-autocast`` registers a forward
    pre-hook on each that switches PEFT's input cast off under autocast (the result is the same to the bit: see
    cudaload.policies.training.choose_adapter_cast). Returns how many layers were set."""
    t = plan.training
    if t is None or t.adapter_cast is None or t.adapter_cast.choice != "outside-autocast":
        return 0
    try:
        from peft.tuners.lora import LoraLayer
    except ImportError:  # no peft: nothing was wrapped
        return 0
    import torch

    autocast_on = torch.is_autocast_enabled

    def cast_outside_autocast(module: Any, args: tuple[Any, ...]) -> None:
        # a pre-hook on every adapted layer, each forward: PEFT's cast of the input to the adapters' dtype only
        # outside autocast, the rule of PEFT's own bitsandbytes layers (peft 0.21 tuners/lora/bnb.py:543-546);
        # under autocast the cast copy would be cast straight back for the matmul
        if args:  # transformers' layers pass the input positionally; a keyword call keeps PEFT's setting
            module.cast_input_dtype_enabled = not autocast_on(args[0].device.type)

    n = 0
    for module in model.modules():
        if isinstance(module, LoraLayer) and hasattr(module, "cast_input_dtype_enabled"):
            # every concrete LoraLayer is an nn.Module as well (peft's Linear(nn.Module, LoraLayer))
            module.register_forward_pre_hook(cast_outside_autocast)  # type: ignore[attr-defined]
            n += 1
    return n


def enable_planned_checkpointing(model: Any, plan: Plan) -> None:
    """Gradient checkpointing on the model where the plan trains with it -- every layer, or every n-th
    (``partial``: transformers' ``every_n_layers``) -- so a training loop of one's own runs what was planned
    (Trainer switches it on again from training_arguments, with the same ``every_n_layers``, which changes
    nothing). Not under torchrun's multi-process strategies: there the parallelism's settings say how (FSDP
    wraps its own activation checkpointing, fsdp_config), and checkpointing a sharded module from outside breaks
    its recompute.

    Raises:
        ConfigurationError: a partial plan on a transformers whose checkpointing takes no ``every_n_layers``
            (a plan made for another installation).
    """
    par = plan.parallelism
    if par is not None and par.launched:
        return
    every = plan.checkpoint_every
    if plan.intent not in ("training", "lora", "qlora") or every == 0:
        return
    # 5.23 renamed the method (the old one a deprecated alias that warns: transformers 5.24
    # modeling_utils.py:3200-3206); its kwargs argument is renamed with it
    enable = getattr(model, "activation_checkpointing_enable", None)
    kw_name = "activation_checkpointing_kwargs"
    if enable is None:
        enable, kw_name = (
            getattr(model, "gradient_checkpointing_enable", None),
            "gradient_checkpointing_kwargs",
        )
    if enable is None:
        return
    kwargs: dict[str, Any] = {kw_name: dict(_CHECKPOINT_KWARGS)}
    if every > 1:
        if "every_n_layers" not in inspect.signature(enable).parameters:
            raise ConfigurationError(
                f"the plan checkpoints every {every} layers, and {type(model).__name__}.{enable.__name__} takes "
                "no every_n_layers (transformers 5.17 and later have it)",
                fix="plan again on this installation (cudaload.load_model does), or install transformers>=5.17",
            )
        kwargs["every_n_layers"] = every
    enable(**kwargs)
