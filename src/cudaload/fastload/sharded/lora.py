"""A LoRA fine-tune's adapters on the sharded model: which ``LoraConfig`` can be built on the meta device,
``peft.get_peft_model`` with peft's own initialisation (:func:`_wrap_lora`), and what a sharded LoRA model
cannot yet train right (:func:`_check_lora_sharding`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ...errors import DependencyError
from ..materialize import step_aside

if TYPE_CHECKING:
    import torch


#: LoRA initialisations that draw A from peft's own reset and zero B, needing no base weight values (peft 0.21
#: tuners/lora/layer.py:332-343 ``reset_lora_parameters``, which ``update_layer`` calls for these); the others
#: (PiSSA, OLoRA, LoftQ, EVA, CorDA, orthogonal) compute from the base weights, which are on meta here, and
#: False leaves nn.Linear's init, B included (the model then differs from the base model)
_LORA_INITS: tuple[object, ...] = (True, "gaussian")


#: the peft modules holding LoRA weights in a LoraLayer (``LoraLayer.adapter_layer_names``, peft 0.21
#: tuners/lora/layer.py:110-116, less DoRA's lora_magnitude_vector, which steps aside)
_LORA_PARTS = ("lora_A", "lora_B", "lora_embedding_A", "lora_embedding_B")


def _lora_blockers(cfg: Any) -> list[str]:
    """What in a LoraConfig the sharded loader cannot build exactly on the meta device."""
    out: list[str] = []
    if type(cfg).__name__ != "LoraConfig":
        out.append(f"{type(cfg).__name__}: only LoRA adapters are built on the meta device")
        return out
    init = getattr(cfg, "init_lora_weights", True)
    if not any(init is x or (isinstance(x, str) and init == x) for x in _LORA_INITS):
        out.append(f"init_lora_weights={init!r} needs the base weights' values or leaves lora_B non-zero")
    if getattr(cfg, "use_dora", False):
        out.append("DoRA's magnitude vector is computed from the base weights' values")
    for key in ("modules_to_save", "trainable_token_indices", "layer_replication", "target_parameters"):
        if getattr(cfg, key, None):
            out.append(f"{key} copies or wraps base weights, whose values are not there before sharding")
    return out


def _wrap_lora(
    model: Any, cfg: Any, dev: torch.device, root: str, wrap: Callable[[Any, Any], Any] | None = None
) -> tuple[Any, int]:
    """``peft.get_peft_model(model, cfg)`` on the finished meta model, the LoRA weights then given storage on
    the CPU and initialised by peft's own ``reset_lora_parameters`` (what ``update_layer`` runs for
    ``init_lora_weights`` True or "gaussian", peft 0.21 tuners/lora/layer.py:311-312: A by kaiming-uniform or
    normal, B zeros), then moved to ``dev``.

    peft creates the adapters on the CPU, initialises them, and moves them to the base layer's device and
    dtype (layer.py:314, tuners_utils.py:2168-2212 ``_move_adapter_to_device_of_base_layer``): on meta here,
    so the draw is lost and is made again; ``cast_adapter_dtype`` (tuners_utils.py:2705-2745, get_peft_model's
    default autocast_adapter_dtype=True) has already made them float32, as on a real model. Each rank draws
    from its own generator; ``_agree_on_initialised`` then broadcasts rank 0's. Until sharding every rank
    holds every adapter whole in float32 on ``dev``: r x (in + out) per wrapped linear, 0.4 GB for a 70B at
    r=8. Returns the PeftModel and how many LoRA tensors it initialised; steps aside on what it cannot build
    exactly."""
    import torch

    try:
        from peft import get_peft_model
        from peft.tuners.lora import LoraLayer
    except ImportError as e:
        raise DependencyError(
            "a LoRA fine-tune needs peft", reasons=[str(e)], fix="pip install 'cudaload[peft]'"
        ) from None
    blockers = _lora_blockers(cfg)
    if blockers:
        raise step_aside(root, f"the LoRA configuration: {'; '.join(blockers)}")
    before = {id(p) for p in model.parameters()}
    # ``wrap``: load_model passes its checked get_peft_model (execute.adapters: peft's errors translated at the
    # boundary, a task type for another model refused); called directly, peft's own
    wrapped = (wrap or get_peft_model)(model, cfg)
    made: set[int] = set()
    with torch.no_grad():
        for module in wrapped.modules():
            if not isinstance(module, LoraLayer):
                continue
            parts = [getattr(module, n) for n in _LORA_PARTS if hasattr(module, n)]
            for part in parts:
                part.to_empty(device="cpu")  # the meta adapters' shapes and float32 dtype, with storage
            for adapter in {*module.lora_A.keys(), *module.lora_embedding_A.keys()}:
                module.reset_lora_parameters(adapter, cfg.init_lora_weights)
            base_dtype = getattr(getattr(module.get_base_layer(), "weight", None), "dtype", None)
            for part in parts:
                if base_dtype is not None and base_dtype.is_floating_point:
                    # peft draws in float32, moves the adapter to the base layer's dtype and upcasts it again
                    # (update_layer -> _move_adapter_to_device_of_base_layer, tuners_utils.py:2183-2210; then
                    # cast_adapter_dtype): on a bf16 base its values are bf16's, in float32
                    for t in part.parameters():
                        t.copy_(t.to(base_dtype))
                part.to(dev)
                made |= {id(t) for t in part.parameters()}
    # anything else new (a copy of a base module, a magnitude vector) would be left on meta, never read
    other = [n for n, p in wrapped.named_parameters() if id(p) not in before and id(p) not in made]
    if other:
        raise step_aside(root, f"peft added parameters that are not LoRA weights: {other[:4]}")
    return wrapped, len(made)


def _check_lora_sharding(root: str, peft_config: Any, world: int) -> None:
    """What a sharded LoRA model cannot yet train right (found with a real Trainer on 2 gloo ranks,
    tests/test_sharded_lora.py test_trainer_trains_and_saves_the_sharded_adapters): steps aside on every rank."""
    ranks = [
        int(getattr(peft_config, "r", 8) or 8),
        *(int(v) for v in (getattr(peft_config, "rank_pattern", None) or {}).values()),
    ]
    if min(ranks) < world:
        # some ranks' lora_A shards would be empty; accelerate 1.15 maps the optimizer's parameters to the
        # sharded ones by data_ptr (utils/fsdp_utils.py:670-698), which empty shards share
        raise step_aside(
            root,
            f"LoRA rank r={min(ranks)} below the {world} ranks: empty adapter shards, which accelerate's optimizer "
            "swap cannot tell apart",
        )
