"""The quantized skeleton's storage (:func:`_fill_and_quantize`): non-quantized tensors read as they are,
quantized weights read and quantized layer by layer through one reused device scratch.

Memory: non-quantized tensors (embeddings, norms, an unconverted ``lm_head``) are read straight into their
storage (``materialize.allocate(..., skip=quantized)``); quantized weights are read layer by layer (grouped by
the first numbered module in their name, e.g. ``model.layers.7``) into one reused device scratch, quantized
there and the scratch refilled, so the device peak is the quantized model plus one layer's unquantized weights
(and bitsandbytes' temporaries for one weight), never the whole bf16 model. Host memory is the staging pool.
"""

from __future__ import annotations

import contextlib
import re
import time
from typing import TYPE_CHECKING, Any

from ..materialize import allocate, torch_dtype
from ..reader import TensorInfo
from .prepare import _Prepared
from .quantize import _quantize_one

if TYPE_CHECKING:
    import torch

#: offsets of weights inside the layer scratch are rounded up to this (any dtype view, coalesced copies)
_SCRATCH_ALIGN = 256
#: a numbered module in a parameter name ("model.layers.7."): the unit quantized together
_LAYER_RE = re.compile(r"^(.*?\.\d+)\.")


def _layer_groups(prep: _Prepared) -> list[list[str]]:
    """Quantized weights grouped by layer (the first numbered module of the name), in model order."""
    groups: dict[str, list[str]] = {}
    for name in prep.quantized:
        m = _LAYER_RE.match(name)
        groups.setdefault(m.group(1) if m else name, []).append(name)
    order = {n: i for i, (n, _) in enumerate(prep.model.named_parameters(remove_duplicate=False))}
    out = [sorted(g, key=lambda n: order.get(n, 0)) for g in groups.values()]
    out.sort(key=lambda g: order.get(g[0], 0))
    return out


class _KeepOpen:
    """A staging pool lent to several ``fill_cuda`` calls: their ``close()`` is a no-op, the load closes the
    real pool once after its last fill (pinning again for every layer would cost ~60 ms each)."""

    def __init__(self, pool: Any) -> None:
        self._pool = pool
        self.nbytes = pool.nbytes
        self.count = pool.count

    @property
    def pin_seconds(self) -> float:
        return float(self._pool.pin_seconds)

    def get(self) -> Any:
        return self._pool.get()

    def put(self, slot: Any) -> None:
        self._pool.put(slot)

    def close(self) -> None:
        pass

    def __getattr__(self, name: str) -> Any:  # anything else fill_cuda may come to use: the real pool's
        return getattr(self._pool, name)


def _fill(
    targets: list[Any], infos: list[TensorInfo], dev: Any, threads: int, buffer_bytes: int, pool: Any
) -> None:
    from .. import staging

    if dev.type == "cuda":
        staging.fill_cuda(targets, infos, device=dev, threads=threads, buffer_bytes=buffer_bytes, pool=pool)
    else:
        staging.fill_cpu(targets, infos, threads=threads, buffer_bytes=buffer_bytes)


def _fill_and_quantize(prep: _Prepared, dev: torch.device, threads: int, buffer_bytes: int) -> dict[str, Any]:
    """Give the skeleton its storage: non-quantized tensors as they are, quantized weights layer by layer."""
    import torch

    from .. import staging

    model, header, keys = prep.model, prep.header, prep.keys
    groups = _layer_groups(prep)
    layout = [_scratch_layout(prep, g) for g in groups]
    scratch_bytes = max(size for _, size in layout)
    t0 = time.perf_counter()
    pool: Any = None
    if dev.type == "cuda":
        # started now, the pool pins while the non-quantized tensors are allocated
        pool = staging.PinnedPool(
            staging.pool_size(header.total_bytes, threads, buffer_bytes), buffer_bytes, device=dev
        )
    try:
        lent = _KeepOpen(pool) if pool is not None else None
        # 1. everything that is not quantized, straight into its storage (the quantized weights are skipped:
        #    they get no full-size storage)
        fills = allocate(model, keys, header, dev, prep.dtype, skip=prep.quantized)
        _fill(
            [staging.Target(n, t.detach(), torch_dtype(i.dtype)) for n, t, i in fills],
            [i for _, _, i in fills],
            dev,
            threads,
            buffer_bytes,
            lent,
        )
        del fills
        t_plain = time.perf_counter()
        # 2. quantized weights, one layer at a time through one reused scratch
        scratch = torch.empty(scratch_bytes, dtype=torch.uint8, device=dev)
        done = torch.cuda.Event() if dev.type == "cuda" else None  # type: ignore[no-untyped-call]
        # bitsandbytes launches on the current device and the event records on its current stream
        on_dev = torch.cuda.device(dev) if dev.type == "cuda" else contextlib.nullcontext()
        with torch.no_grad(), on_dev:
            for group, (offsets, size) in zip(groups, layout, strict=True):
                if done is not None:
                    done.synchronize()  # the previous layer's quantization has finished reading the scratch
                infos = [header.tensors[prep.quantized[n]] for n in group]
                views = [
                    scratch[off : off + info.numel * _itemsize(model.get_parameter(n))]
                    .view(model.get_parameter(n).dtype)
                    .view(info.shape)
                    for n, off, info in zip(group, offsets, infos, strict=True)
                ]
                _fill(
                    [
                        staging.Target(n, v, torch_dtype(i.dtype))
                        for n, v, i in zip(group, views, infos, strict=True)
                    ],
                    infos,
                    dev,
                    threads,
                    _layer_chunk(size, threads, buffer_bytes),
                    lent,
                )
                for name, value in zip(group, views, strict=True):
                    _quantize_one(prep, name, value, dev)
                del views
                if done is not None:
                    done.record()
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        del scratch
    finally:
        if pool is not None:
            pool.close()  # every copy out of it has finished: fill_cuda synchronises its stream
    t_quant = time.perf_counter()
    return {
        "plain_s": round(t_plain - t0, 4),
        "quantize_s": round(t_quant - t_plain, 4),
        "layers": len(groups),
        "scratch_bytes": scratch_bytes,
    }


def _layer_chunk(layer_bytes: int, threads: int, buffer_bytes: int) -> int:
    """Read size for one layer's fill: small enough that every reader gets about two chunks (a 0.6B layer is
    31 MB, two 16 MiB chunks, which would leave six of eight readers idle), never above the staging buffer."""
    want = layer_bytes // (2 * threads) // (64 << 10) * (64 << 10)
    return min(buffer_bytes, max(1 << 20, want))


def _itemsize(t: Any) -> int:
    return int(t.element_size())


def _scratch_layout(prep: _Prepared, group: list[str]) -> tuple[list[int], int]:
    """Byte offset of each weight of a layer in the scratch (in the dtype it is quantized from), and the size."""
    offsets, at = [], 0
    for name in group:
        meta = prep.model.get_parameter(name)
        offsets.append(at)
        at += -(-meta.numel() * meta.element_size() // _SCRATCH_ALIGN) * _SCRATCH_ALIGN
    return offsets, max(at, 1)
