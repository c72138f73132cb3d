"""The model on the meta device before and after ``fully_shard``: the decoder layers FSDP2 shards as its units
and what keeps them from being sharded exactly, activation checkpointing, the finishing on meta, and the tensors
that already hold values (initialised, not read), kept across ``to_empty``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ...errors import ConfigurationError
from ..materialize import KeyPlan, StepAside, allocate, finish, step_aside
from .rows import _local

if TYPE_CHECKING:
    import torch


def _layer_modules(model: Any) -> list[Any]:
    """The decoder layers FSDP2 wraps one by one: modules whose class is in ``_no_split_modules`` (the blocks
    transformers never splits across devices; accelerate's TRANSFORMER_BASED_WRAP uses the same classes,
    accelerate 1.15 utils/dataclasses.py FullyShardedDataParallelPlugin.set_auto_wrap_policy)."""
    names = set(getattr(model, "_no_split_modules", None) or ())
    return [m for m in model.modules() if m is not model and type(m).__name__ in names]


def _checkpoint_layers(model: Any, layers: list[Any], *, keep_names: bool = False) -> list[Any]:
    """Each layer replaced in its parent by ``checkpoint_wrapper(layer, preserve_rng_state=False)``, exactly as
    accelerate's fsdp2_apply_ac does (1.15 utils/fsdp_utils.py:719-727, ``model.set_submodule``); returns the
    wrappers, which FSDP2 then shards as the units.

    ``keep_names``: checkpoint each layer with torch's composable ``checkpoint`` instead (forward hooks; "does not
    modify model structure or fully-qualified names", torch 2.13 distributed/_composable/checkpoint_activation.py
    :38-47), for a PeftModel: peft 0.21 finds the adapters to save by module names (tuners_utils.py:1717
    _get_tuner_state_dict_key_prefixes) and matches them against the state dict's keys, which torch's
    ``get_model_state_dict`` gives without the wrapper's ``_checkpoint_wrapped_module.``: behind wrappers
    Trainer.save_model wrote an adapter file with no tensors. The RNG state is preserved (the default), so a
    LoRA dropout draws the same mask when the layer is recomputed. Returns the layers themselves."""
    if keep_names:
        from torch.distributed._composable.checkpoint_activation import checkpoint

        for layer in layers:
            checkpoint(layer)
        return list(layers)
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    wanted = {id(m) for m in layers}
    names = [n for n, m in model.named_modules() if id(m) in wanted]
    out = []
    for name in names:
        wrapped = checkpoint_wrapper(model.get_submodule(name), preserve_rng_state=False)
        model.set_submodule(name, wrapped)
        out.append(wrapped)
    return out


def _check_shardable(model: Any, root: str) -> list[Any]:
    layers = _layer_modules(model)
    if not layers:
        raise step_aside(
            root, "the model declares no decoder layer classes (_no_split_modules) for FSDP2 to shard by"
        )
    scalars = [n for n, p in model.named_parameters() if p.ndim == 0]
    if scalars:
        # FSDP2 shards dim 0 and rejects a 0-dim parameter (torch 2.13 _fsdp_param.py:276-279)
        raise step_aside(root, f"0-dim parameters FSDP2 cannot shard: {scalars[:4]}")
    return layers


def _check_shared_within_units(model: Any, layers: list[Any], root: str) -> None:
    """Step aside when one parameter (tied, or shared) belongs to two FSDP units, or one unit holds another.

    fully_shard gives each unit a DTensor of its own, so a tie across units is cut and the side not in the
    checkpoint is never read; torch 2.13 then raises at the first forward (_fully_shard/_fsdp_state.py:223,
    _validate_no_duplicate_params). RoBERTa as a causal LM has this: its embeddings are one of the
    _no_split_modules, the head tied to them is in the root unit. Nested units would need fully_shard bottom-up
    (accelerate 1.15 utils/fsdp_utils.py get_module_children_bottom_up): no causal LM here has them."""
    unit: dict[int, int] = {}  # id(parameter) -> the layer (unit) holding it
    inside: set[int] = set()  # modules within some layer
    for i, layer in enumerate(layers):
        subs = {id(m) for m in layer.modules()}
        if subs & inside or id(layer) in inside:
            raise step_aside(root, f"decoder layer classes nest ({type(layer).__name__} in another)")
        inside |= subs
        for p in layer.parameters():
            if unit.setdefault(id(p), i) != i:
                raise step_aside(
                    root, "a parameter is shared by two decoder layers: sharding per layer would cut it"
                )
    for name, module in model.named_modules():
        if id(module) in inside:
            continue
        for leaf, p in module.named_parameters(recurse=False):
            if id(p) in unit:
                raise step_aside(
                    root,
                    f"{name}.{leaf} is tied to a parameter of a decoder layer class ({type(layers[unit[id(p)]]).__name__}"
                    ", one of _no_split_modules): sharding per layer would cut the tie",
                )


def _finish_on_meta(model: Any, keys: KeyPlan, prep: Any, dev: torch.device, dtype: torch.dtype) -> Any:
    """Give every checkpoint-loaded tensor a meta stand-in of its load dtype, flagged loaded (the fast path's
    ``allocate`` on the meta device), then run from_pretrained's finishing (``materialize.finish``) with those
    stand-ins left on meta: tying, the initialisation of missing keys and non-persistent buffers (on ``dev``,
    whole) and the load report are transformers' own. transformers' init functions skip a tensor flagged
    ``_is_hf_initialized`` (transformers 5.17 initialization.py:45-71, e.g. ``normal_`` at :53), so the meta
    stand-ins are left alone."""
    import torch

    allocate(model, keys, prep.header, torch.device("meta"), dtype)
    try:
        return finish(model, keys, prep.options, prep.model_kwargs, dev, dtype, pending=keys.load.keys())
    except (StepAside, ConfigurationError):
        raise
    except Exception as e:  # e.g. a model's _init_weights that reads values: it needs real tensors
        raise step_aside(
            prep.options.path, f"finishing the load on the meta device failed ({type(e).__name__}: {e})"
        ) from e


def _agree_on_initialised(model: Any, dist: Any, mesh: Any) -> None:
    """Parameters initialised here rather than read (missing or size-mismatched keys) were drawn from each
    rank's own random generator: take rank 0's, so every rank shards the same tensor."""
    real = [p for p in model.parameters() if p.device.type != "meta"]
    group = mesh.get_group()
    src = dist.get_global_rank(group, 0)
    for p in real:
        dist.broadcast(p.data, src=src, group=group)


def _real_tensors(model: Any) -> dict[str, Any]:
    """Tensors already holding values after ``fully_shard`` (non-persistent buffers, initialised missing
    parameters' local shards): ``to_empty`` replaces them with uninitialised storage, so keep them to put back.
    Keyed by every name (tied parameters under each)."""
    out: dict[str, Any] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        local = _local(p)
        if local.device.type != "meta":
            out[name] = local
    for name, b in model.named_buffers(remove_duplicate=False):
        if b.device.type != "meta":
            out[name] = b
    return out


def _restore(model: Any, kept: Mapping[str, Any], buffer_device: torch.device) -> None:
    """Put back what ``to_empty`` replaced: parameters' values into their new local shards, buffers as they
    were; the other buffers (read from the checkpoint next) get uninitialised storage on ``buffer_device``."""
    import torch

    buffers = dict(model.named_buffers(remove_duplicate=False))
    made: dict[int, Any] = {}  # a buffer under two names stays one tensor
    with torch.no_grad():
        for name, old in kept.items():
            if name not in buffers:
                owner, _, leaf = name.rpartition(".")
                _local(getattr(model.get_submodule(owner), leaf)).copy_(old)
        for name, buf in buffers.items():
            owner, _, leaf = name.rpartition(".")
            module = model.get_submodule(owner)
            if name in kept:
                module._buffers[leaf] = kept[name]
            elif buf.device != buffer_device:
                if id(buf) not in made:
                    made[id(buf)] = torch.empty_like(buf, device=buffer_device)
                module._buffers[leaf] = made[id(buf)]
