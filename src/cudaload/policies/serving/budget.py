"""How much of a device the paged cache may take, and how many tokens it then holds: the room left after the
weights, the CUDA context, one layer's working set and a stated headroom (:class:`DeviceRoom`), the declared work
counted in cache tokens (:class:`DeclaredWork`), and the cache sized from both (:func:`size_cache`), refusing a
request the device cannot hold at planning time rather than at its first step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ...errors import DoesNotFitError
from ...model_info import ModelInfo
from ..memory import CUDA_CONTEXT_BYTES, GiB
from ..memory import estimate as memory_estimate
from .kv_cache import TF_FIFO_SAFETY_MARGIN, CacheShape

#: Headroom kept free on each device beyond what is counted: allocator fragmentation, cuBLAS workspaces,
#: the CUDA-graph pool's private segments. 5% of the device, at least 1 GiB.
HEADROOM_FRACTION = 0.05
HEADROOM_MIN = 1 * GiB


@dataclass(frozen=True)
class WorkingSet:
    """One layer's working set at a step of ``m`` batch tokens, from the memory policy's inference estimate."""

    info: ModelInfo
    dtype: str
    quantization: str | None

    def __call__(self, m: int) -> int:
        return int(
            memory_estimate(
                self.info,
                dtype=self.dtype,
                quantization=self.quantization,
                intent="inference",
                seq_len=m,
                batch_size=1,
                attn="sdpa",
            )["activations"]
        )


@dataclass(frozen=True)
class DeviceRoom:
    """One device's memory as the serving plan divides it (bytes). ``has_cuda`` False: planning for the CPU."""

    device: int
    weights: int
    cuda_context: int
    headroom: int
    has_cuda: bool
    working_set: WorkingSet

    @classmethod
    def of(
        cls, working_set: WorkingSet, *, weights: int, device_total: int | None, device_budget: int | None
    ) -> DeviceRoom:
        """``device_total`` / ``device_budget``: one GPU's memory and what it may hold (None: no GPU)."""
        has_cuda = device_total is not None
        total = device_total if device_total is not None else (device_budget or 0)
        return cls(
            device=device_budget if device_budget is not None else total,
            weights=weights,
            cuda_context=CUDA_CONTEXT_BYTES if has_cuda else 0,
            headroom=max(HEADROOM_MIN, int(HEADROOM_FRACTION * total)) if total else HEADROOM_MIN,
            has_cuda=has_cuda,
            working_set=working_set,
        )

    def cache_budget(self, m: int) -> int:
        """What the cache and the batch buffers may take beside a step of ``m`` batch tokens."""
        return self.device - self.weights - self.cuda_context - self.working_set(m) - self.headroom

    def as_dict(self, m: int) -> dict[str, int]:
        """The plan's memory entries before the cache's own (in the order explain() shows them)."""
        return {
            "device": self.device,
            "weights": self.weights,
            "cuda_context": self.cuda_context,
            "working_set": self.working_set(m),
            "headroom": self.headroom,
        }


@dataclass(frozen=True)
class DeclaredWork:
    """The declared longest request (prompt + new tokens) and concurrent requests, in cache tokens: every
    request padded to whole blocks, plus one (initialization.py:91). All None when no length was declared."""

    seq_len: int | None
    batch_size: int | None
    per_request: int | None = None
    need: int | None = None
    #: the need with the FIFO scheduler's 15% admission margin, in whole blocks (never below the need: a
    #: multiple of them)
    goal: int | None = None

    @classmethod
    def of(cls, seq_len: int | None, batch_size: int | None, block: int) -> DeclaredWork:
        if seq_len is None:
            return cls(seq_len, batch_size)
        per_request = (math.ceil(seq_len / block) + 1) * block
        need = per_request * (batch_size or 1)
        goal = math.ceil(need / (1 - TF_FIFO_SAFETY_MARGIN)) // block * block
        return cls(seq_len, batch_size, per_request, need, goal)


@dataclass(frozen=True)
class CacheSize:
    """The cache the plan holds (tokens), how many declared requests fit at once, and what was said on the way."""

    tokens: int
    concurrent_fit: int | None
    notes: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()


def size_cache(
    fill: int, *, shape: CacheShape, work: DeclaredWork, room: DeviceRoom, m: int, block: int
) -> CacheSize:
    """The cache from ``fill``, the tokens that fit beside a step of ``m`` batch tokens: sized to the declared
    work when it fits, else the whole fill with a warning (transformers queues what does not fit); refused when
    not one block, or not one declared request, fits on the GPU."""
    notes: list[str] = []
    if not room.has_cuda and fill < block:
        # no GPU and no known host budget: the declared need, else 64 blocks
        fill = work.need or 64 * block
        notes.append("no GPU: the cache is sized to the declared work (64 blocks when none is declared)")
    if room.has_cuda and fill < block:
        raise _no_room(room, m)
    if work.need is None or work.per_request is None:
        if room.has_cuda:
            return CacheSize(fill, None, tuple(notes))
        notes.append("no GPU and no declared work: a small host cache of 64 blocks")
        return CacheSize(min(fill, 64 * block), None, tuple(notes))
    if work.per_request > fill:
        raise _request_too_long(fill, shape=shape, work=work, m=m, block=block)
    concurrent_fit = fill // work.per_request if work.per_request else None
    if work.need <= fill:
        # the declared work fits: the cache is sized to it (a larger one only costs masked kernels their
        # mask and the warm-up capture over the whole cache), with the FIFO scheduler's 15% admission margin
        notes.append(
            f"cache sized to the declared {work.batch_size} x {work.seq_len} tokens (+{TF_FIFO_SAFETY_MARGIN:.0%} "
            f"for the scheduler's admission margin, scheduler.py:337); the device could hold {fill:,} tokens"
        )
        return CacheSize(min(fill, work.goal or work.need), concurrent_fit, tuple(notes))
    warning = (
        f"{work.batch_size} concurrent {work.seq_len}-token requests need {work.need:,} cache tokens; "
        f"{concurrent_fit} fit at once: transformers' scheduler queues the rest until blocks free up "
        "(scheduler.py:122-143)"
    )
    return CacheSize(fill, concurrent_fit, tuple(notes), (warning,))


def _no_room(room: DeviceRoom, m: int) -> DoesNotFitError:
    return DoesNotFitError(
        f"no room for a KV cache: {room.device / GiB:.1f} GiB on the device minus weights "
        f"{room.weights / GiB:.1f} GiB, context, working set {room.working_set(m) / GiB:.2f} GiB and headroom "
        f"{room.headroom / GiB:.1f} GiB leaves nothing",
        fix="quantize the weights (quantization='nf4'), serve over more GPUs (tensor parallel), or free the device",
    )


def _request_too_long(
    fill: int, *, shape: CacheShape, work: DeclaredWork, m: int, block: int
) -> DoesNotFitError:
    assert work.per_request is not None
    return DoesNotFitError(
        f"a {work.seq_len}-token request needs {work.per_request:,} cache tokens "
        f"({work.per_request * shape.kv_bytes_per_token / GiB:.1f} GiB of KV), the device holds "
        f"{fill:,} ({fill * shape.kv_bytes_per_token / GiB:.1f} GiB) after the weights"
        + (f" and paged|eager's scores at max_batch_tokens {m}" if shape.score_bytes else ""),
        fix=f"declare a shorter seq_len (at most {max(fill - block, 0):,}), quantize the weights "
        "(quantization='nf4'), or serve over more GPUs (tensor parallel)"
        + (
            "; or install flash-attn (paged|flash_attention_2 holds neither the mask nor the scores)"
            if shape.score_bytes
            else ""
        ),
    )
