"""Compiling a model's decoder layers for training, as :mod:`cudaload.policies.training.compile` decided:
``torch.compile`` on each decoder layer (``nn.Module.compile``, in place), dynamic in the sequence length so a
packed step of another length reuses the same code. The layers share their code and differ in their parameters,
which dynamo takes as inputs: one compile serves them all."""

from __future__ import annotations

import importlib.util
from typing import Any


def decoder_layers(model: Any) -> list[Any]:
    """The decoder layers of ``model`` (PEFT-wrapped or not): its decoder's ``layers`` (``get_decoder()``: the
    language model of a vision-language model, not its vision tower) where they are one class, else the longest
    ``nn.ModuleList`` whose modules are all of one class named in the model's ``_no_split_modules``
    (transformers' unit of a layer) or that is transformers' ``GradientCheckpointingLayer``."""
    import torch

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    get_decoder = getattr(base, "get_decoder", None)
    try:
        decoder = get_decoder() if callable(get_decoder) else None
    except (AttributeError, NotImplementedError, TypeError, ValueError):
        decoder = None
    own = getattr(decoder, "layers", None)
    if isinstance(own, torch.nn.ModuleList) and len(own) and len({type(m) for m in own}) == 1:
        return list(own)
    names = set(getattr(base, "_no_split_modules", None) or ())
    try:
        from transformers.modeling_layers import GradientCheckpointingLayer

        checkpointed: tuple[type, ...] = (GradientCheckpointingLayer,)
    except ImportError:  # transformers before 4.52
        checkpointed = ()

    best: list[Any] = []
    for module in base.modules():
        if not isinstance(module, torch.nn.ModuleList) or len(module) <= len(best):
            continue
        kinds = {type(m) for m in module}
        if len(kinds) != 1:
            continue
        kind = next(iter(kinds))
        if kind.__name__ in names or issubclass(kind, checkpointed):
            best = list(module)
    return best


def compile_problem(model: Any) -> str | None:
    """Why inductor cannot compile ``model``'s layers (None where it can): for CUDA tensors it writes Triton
    kernels (on the CPU, C++)."""
    on_cuda = any(p.is_cuda for p in model.parameters())
    if on_cuda and importlib.util.find_spec("triton") is None:
        return "triton is not installed (torch's inductor writes the compiled layers' kernels in Triton)"
    return None


def compile_layers(model: Any) -> int:
    """Compile each decoder layer of ``model`` in place (``nn.Module.compile(dynamic=True)``); the count."""
    layers = decoder_layers(model)
    for layer in layers:
        # dynamic: a packed step's row length changes every step; compiled for a symbolic length from the first
        # step (the H100 runs still saw one recompile at the second step, ~8 s, for another guard)
        layer.compile(dynamic=True)
    return len(layers)


def eager_layers(model: Any) -> int:
    """Put compiled decoder layers back to eager (``nn.Module.compile`` keeps its compiled call in
    ``_compiled_call_impl``, torch 2.13 nn/modules/module.py:3053, and has no public undo); the count undone."""
    undone = 0
    for layer in decoder_layers(model):
        if getattr(layer, "_compiled_call_impl", None) is not None:
            layer._compiled_call_impl = None
            undone += 1
    return undone
