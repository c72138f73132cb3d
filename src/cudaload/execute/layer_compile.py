"""Compiling a model's decoder layers for training, as :mod:`cudaload.policies.training.compile` decided:
``torch.compile`` on each decoder layer's forward, in place, dynamic in the sequence length so a packed step of
another length reuses the same code, and used only while the layer trains (:func:`compile_layers`). The layers
share their code and differ in their parameters, which dynamo takes as inputs: one compile serves them all."""

from __future__ import annotations

import functools
import importlib.util
import weakref
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


#: decoder layer -> the forward it had before compile_layers (None: its class's), so eager_layers puts it back
_EAGER: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()


def is_compiled(layer: Any) -> bool:
    """Whether :func:`compile_layers` compiled ``layer`` (and :func:`eager_layers` has not undone it)."""
    return layer in _EAGER


def compile_layers(model: Any) -> int:
    """Compile each decoder layer of ``model`` for training, in place; the count.

    Each layer's forward becomes one that runs the compiled forward (``torch.compile(dynamic=True)``) while the
    layer trains with autograd on, and its own eager forward otherwise: an evaluation under ``no_grad``, or
    ``generate()``, whose cache makes every layer a graph of its own (each reads its ``layer_idx``) until torch's
    recompile limit, never meets the compiler. The forward is set on the instance, as accelerate's hooks set theirs
    (accelerate 1.16 hooks.py:193); transformers' classes are untouched."""
    import torch

    layers = decoder_layers(model)
    for layer in layers:
        if layer in _EAGER:
            continue
        own = layer.__dict__.get("forward")
        eager = layer.forward
        # dynamic: a packed step's row length changes every step; compiled for a symbolic length from the first
        # step (the H100 runs still saw one recompile at the second step, ~8 s, for another guard)
        compiled = torch.compile(eager, dynamic=True)

        @functools.wraps(eager)
        def forward(
            *args: Any, _layer: Any = layer, _eager: Any = eager, _fast: Any = compiled, **kwargs: Any
        ) -> Any:
            if _layer.training and torch.is_grad_enabled() and not _has_cache(kwargs):
                return _fast(*args, **kwargs)
            return _eager(*args, **kwargs)

        layer.forward = forward
        _EAGER[layer] = own
    return len(layers)


#: the layer keywords a KV cache comes in: ``past_key_values`` (transformers 5.17-5.23), ``cache`` (5.24 and
#: later), ``past_key_value`` (4.x)
_CACHE_KEYWORDS = ("past_key_values", "cache", "past_key_value")


def _has_cache(kwargs: dict[str, Any]) -> bool:
    """Whether a layer call carries a KV cache. A training forward without ``use_cache=False`` builds one
    (transformers 5.17 modeling_qwen3.py:383-384, 5.25 :377-378), and each layer then indexes it by its own
    ``layer_idx``: a graph per layer up to torch's recompile limit (8), measured on the CPU. Such calls run eager;
    cudaload's collators and TRL pass ``use_cache=False`` (trl 1.16 sft_trainer.py:1564)."""
    return any(kwargs.get(k) is not None for k in _CACHE_KEYWORDS)


def eager_layers(model: Any) -> int:
    """Put decoder layers :func:`compile_layers` compiled back to their own forward; the count undone."""
    undone = 0
    for layer in decoder_layers(model):
        if layer not in _EAGER:
            continue
        own = _EAGER.pop(layer)
        if own is None:
            del layer.forward  # the class's forward again
        else:
            layer.forward = own
        undone += 1
    return undone
