"""Compiling a model's decoder layers for training, as :mod:`cudaload.policies.training.compile` decided:
``torch.compile`` on each decoder layer (``nn.Module.compile``, in place), dynamic in the sequence length so a
packed step of another length reuses the same code. The layers share their code and differ in their parameters,
which dynamo takes as inputs: one compile serves them all."""

from __future__ import annotations

import importlib.util
from typing import Any


def decoder_layers(model: Any) -> list[Any]:
    """The decoder layers of ``model`` (PEFT-wrapped or not): the longest ``nn.ModuleList`` whose modules are all
    of one class named in the model's ``_no_split_modules`` (transformers' unit of a layer: the decoder layer
    class of every model it ships), else of one class that is transformers' ``GradientCheckpointingLayer``."""
    import torch

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
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
        # dynamic: a packed step's row length changes every step; without it dynamo recompiles for the first few
        # lengths and then marks the length dynamic anyway
        layer.compile(dynamic=True)
    return len(layers)
