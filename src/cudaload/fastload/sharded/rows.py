"""What each rank reads: FSDP2's rows of dim 0 for a rank (:func:`shard_rows`), their byte range in the
checkpoint file, and the list of local shards and buffers to fill (:func:`_plan_shards`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ...errors import ConfigurationError
from ..materialize import KeyPlan, step_aside
from ..reader import TensorInfo


def shard_rows(rows: int, world: int, rank: int) -> tuple[int, int]:
    """The rows ``[start, stop)`` of dim 0 that FSDP2 gives ``rank`` of ``world``.

    FSDP2 splits dim 0 with ``torch.chunk`` and pads the missing chunks with empty ones (torch 2.13
    distributed/fsdp/_fully_shard/_fsdp_common.py:134-140 ``_chunk_with_empty``, used at
    _fsdp_param.py:298): every chunk has ``ceil(rows / world)`` rows except the last non-empty one, and the
    ranks after it get none (7 rows on 3 ranks: 3, 3, 1; 5 rows on 4 ranks: 2, 2, 1, 0)."""
    if world < 1 or not 0 <= rank < world:
        raise ConfigurationError(f"rank {rank} of world {world}", fix="use 0 <= rank < world")
    per = -(-rows // world) if rows else 0
    start = min(rank * per, rows)
    return start, min(start + per, rows)


def _rows_info(info: TensorInfo, start: int, stop: int) -> TensorInfo:
    """The byte range of rows ``[start, stop)`` of a row-major checkpoint tensor, as a TensorInfo of its own."""
    rows = info.shape[0]
    row_bytes = info.nbytes // rows if rows else 0
    return TensorInfo(
        info.name,
        info.dtype,
        (stop - start, *info.shape[1:]),
        info.file,
        info.start + start * row_bytes,
        info.start + stop * row_bytes,
    )


@dataclass
class _Shard:
    name: str  # model key
    target: Any  # the contiguous local tensor to fill
    source: TensorInfo  # the byte range to read into it


def _local(t: Any) -> Any:
    """The local shard of an FSDP2 parameter (a DTensor), or the tensor itself."""
    return t._local_tensor if hasattr(t, "_local_tensor") else t


def _plan_shards(
    model: Any,
    base_modules: Mapping[int, list[str]],
    keys: KeyPlan,
    tensors: Mapping[str, TensorInfo],
    world: int,
    rank: int,
    root: str,
) -> list[_Shard]:
    """What this rank reads: for each sharded parameter, its rows of the checkpoint tensor into its local
    shard; for each buffer, the whole tensor. A tensor reached under two names (tied) is read once.
    ``base_modules``: id(module) -> its names in the model transformers built, before a checkpoint wrapper or
    PEFT renamed them (their own modules, e.g. lora_A, hold nothing from the checkpoint)."""
    from torch.distributed.tensor import DTensor, Shard

    params: dict[str, Any] = {}
    buffers: dict[str, Any] = {}
    for module in model.modules():
        names = base_modules.get(id(module), ())
        for leaf, p in module.named_parameters(recurse=False):
            for b in names:
                params[f"{b}.{leaf}" if b else leaf] = p
        for leaf, t in module.named_buffers(recurse=False):
            for b in names:
                buffers[f"{b}.{leaf}" if b else leaf] = t
    seen: set[int] = set()
    out: list[_Shard] = []
    for name, src in keys.load.items():
        t = params.get(name, buffers.get(name))
        if t is None:
            raise step_aside(root, f"{name!r} is neither a parameter nor a buffer after sharding")
        if id(t) in seen:
            continue  # one tensor under two names: read once
        seen.add(id(t))
        info = tensors[src]
        if isinstance(t, DTensor):
            if tuple(t.placements) != (Shard(0),):
                raise step_aside(root, f"{name!r} is sharded as {t.placements}, not on dim 0")
            local = t._local_tensor
            start, stop = shard_rows(info.shape[0], world, rank)
            expect = (stop - start, *info.shape[1:])
            if tuple(local.shape) != expect or not local.is_contiguous():
                raise step_aside(
                    root,
                    f"{name!r}: FSDP2 gave rank {rank} a local shard of {tuple(local.shape)}, "
                    f"rows {start}:{stop} of {info.shape} expected",
                )
            if stop > start:
                out.append(_Shard(name, local, _rows_info(info, start, stop)))
        else:
            if math.prod(t.shape) and not t.is_contiguous():
                raise step_aside(root, f"buffer {name!r} is not contiguous")
            out.append(_Shard(name, t, info))
    return out
