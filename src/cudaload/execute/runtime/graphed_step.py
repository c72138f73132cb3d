"""A decode step as a CUDA graph of the eager model, with no compiler (issue 43): the ``graphed`` decode.

Why: a dynamic decode step is bound by the host, which launches every kernel of every layer one by one (the 8B
shape on the H200: ~50 ms a token for a few ms of GPU work). inductor's compiled step removes that, but its compile
takes a minute or more with cold caches. Replaying the step's kernels as one CUDA graph removes the launches too;
capturing it costs about two eager steps. What it does not remove is the eager kernels' own time (nothing fused).

What makes the step capturable: transformers' static cache (``StaticCache``) keeps its tensors at fixed addresses
and counts its filled slots on the device (5.17 cache_utils.py ``StaticLayer.update``: ``cumulative_length``), so
a step reads nothing from the host; generate() builds the step's 4-d mask outside the model
(``prepare_inputs_for_generation``, 5.17 generation/utils.py:648-760), so the step's inputs keep their shapes from
step to step. The attention inside the graph is cudaload's grouped decode attention
(:func:`cudaload.execute.runtime.sdpa_decode.grouped_decode_attention`, switched on by
:func:`~cudaload.execute.runtime.sdpa_decode.grouped_decode`): sdpa with the cache's mask would scan every slot
with the memory-efficient kernel.

:class:`DecodeGraphs` holds one model's graphs, one per input signature (batch, cache, mask shape); a step whose
inputs it cannot capture (no static cache, a tensor of another kind) runs eagerly, and a capture that fails marks
that signature eager for the process. This module imports torch; ``execute`` imports it only for a call that
runs graphed.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import torch

from .sdpa_decode import grouped_decode

__all__ = ["MAX_GRAPHS", "DecodeGraphs", "signature"]

#: graphs kept per model: one per (batch, static cache) met; each holds a private memory pool (a decode step's
#: activations and logits, tens of MB for an 8B model at batch 8)
MAX_GRAPHS = 8


def signature(inputs: Mapping[str, Any]) -> tuple[Any, ...] | None:
    """What a captured step depends on: each tensor's shape, dtype and device, the cache object, every other
    value; None where a value cannot be captured (a cache that is not static, or an object of another kind)."""
    key: list[Any] = []
    for name in sorted(inputs):
        v = inputs[name]
        if isinstance(v, torch.Tensor):
            key.append((name, "t", tuple(v.shape), v.dtype, v.device))
        elif isinstance(v, Mapping):  # per-layer-type masks (models with sliding layers)
            inner = signature(v)
            if inner is None:
                return None
            key.append((name, "m", inner))
        elif v is None or isinstance(v, (bool, int, float, str)):
            key.append((name, "v", v))
        elif name in ("past_key_values", "cache"):
            if not _static(v):
                return None
            key.append((name, "c", id(v)))
        else:
            return None
    return tuple(key)


def _static(cache: Any) -> bool:
    """A cache whose every layer is transformers' ``StaticLayer`` (not the sliding one, whose update branches on
    a host int, 5.17 cache_utils.py:544-550), initialised (its tensors allocated by a prefill)."""
    layers = getattr(cache, "layers", None)
    if not getattr(cache, "is_compileable", False) or not layers:
        return False
    return all(
        type(layer).__name__ == "StaticLayer" and getattr(layer, "is_initialized", False) for layer in layers
    )


def _on_cuda(inputs: Mapping[str, Any]) -> bool:
    found = _tensors(inputs)
    return bool(found) and all(t.device.type == "cuda" for t in found.values())


def _tensors(inputs: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, v in inputs.items():
        if isinstance(v, torch.Tensor):
            out[prefix + name] = v
        elif isinstance(v, Mapping):
            out.update(_tensors(v, prefix + name + "."))
    return out


def _rebuild(inputs: Mapping[str, Any], static: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, v in inputs.items():
        if isinstance(v, torch.Tensor):
            out[name] = static[prefix + name]
        elif isinstance(v, Mapping):
            out[name] = _rebuild(v, static, prefix + name + ".")
        else:
            out[name] = v
    return out


class _Graph:
    """One captured step: its static input tensors, the graph, and the output it writes."""

    def __init__(self, model: Any, inputs: Mapping[str, Any]):
        self.cache = inputs.get("past_key_values", inputs.get("cache"))
        self.static = {k: v.clone() for k, v in _tensors(inputs).items()}
        call = _rebuild(inputs, self.static)
        # the inputs' device, not the current one: a model on cuda:1 with cuda:0 current captures on cuda:1's stream
        self.device = next(iter(self.static.values())).device
        with torch.cuda.device(self.device):
            filled = [layer.cumulative_length.clone() for layer in self.cache.layers]
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            # the warm-up: cuBLAS and the allocator meet the step's shapes before the capture
            with torch.cuda.stream(stream), grouped_decode():
                model(**call)
            torch.cuda.current_stream().wait_stream(stream)
            # the warm-up wrote this step into the cache: the real step writes the same slot again; the count is
            # put back
            for layer, n in zip(self.cache.layers, filled, strict=True):
                layer.cumulative_length.copy_(n)
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph), grouped_decode():
                self.output = model(**call)

    def replay(self, inputs: Mapping[str, Any]) -> Any:
        with torch.cuda.device(self.device):
            for k, v in _tensors(inputs).items():
                self.static[k].copy_(v, non_blocking=True)
            self.graph.replay()
        return self.output


class DecodeGraphs:
    """One model's decode step as CUDA graphs: :meth:`step` is a drop-in for ``model(**inputs)`` in a decode
    loop. ``captures`` records each capture (seconds, or the error that made its signature eager)."""

    def __init__(self, model: Any, max_graphs: int = MAX_GRAPHS):
        self.model = model
        self.max_graphs = max_graphs
        self.graphs: dict[tuple[Any, ...], _Graph] = {}
        self.eager: set[tuple[Any, ...]] = set()
        self.captures: list[dict[str, Any]] = []

    def step(self, **inputs: Any) -> Any:
        key = signature(inputs)
        if key is None or key in self.eager or not _on_cuda(inputs):
            return self.model(**inputs)
        graph = self.graphs.get(key)
        if graph is None:
            graph = self._capture(key, inputs)
            if graph is None:
                return self.model(**inputs)
        return graph.replay(inputs)

    def _capture(self, key: tuple[Any, ...], inputs: Mapping[str, Any]) -> _Graph | None:
        cache = inputs.get("past_key_values", inputs.get("cache"))
        # graphs of a cache generate() no longer uses hold its memory: dropped when another cache is captured
        for k in [k for k, g in self.graphs.items() if g.cache is not cache]:
            del self.graphs[k]
        while len(self.graphs) >= self.max_graphs:
            del self.graphs[next(iter(self.graphs))]
        t0 = time.perf_counter()
        try:
            graph = _Graph(self.model, inputs)
        except Exception as e:  # a step that cannot be captured runs eagerly: the same numbers, slower
            self.eager.add(key)
            self.captures.append({"error": f"{type(e).__name__}: {e}"[:300]})
            return None
        torch.cuda.synchronize()
        self.graphs[key] = graph
        self.captures.append({"seconds": round(time.perf_counter() - t0, 3)})
        return graph
