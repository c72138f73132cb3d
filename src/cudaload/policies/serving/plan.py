"""The serving section built: :func:`plan_serving` runs the decisions (paged attention, block size, step size,
graphs, async) over the memory left after the weights, the CUDA context, one layer's working set and a stated
headroom, and sizes the KV cache (:func:`~cudaload.policies.serving.kv_cache.settle` later fits it to the memory
measured after loading).

One helper per step, in the order :func:`plan_serving` runs them: the paged implementation (:class:`_Paged`),
the heads each tensor-parallel rank holds (:func:`_heads_per_rank`), the cache's shape, block size and block
table (:func:`_layout`), the step's size and paged|eager's fallback to paged|sdpa (:func:`_batch_tokens`), CUDA
graphs (:func:`_graphs`), then the cache itself (:mod:`.budget`) and the masked kernels' transient
(:func:`_transient_note`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, replace

from ...dtypes import dtype_bytes
from ...model_info import ModelInfo
from ...plans.decision import Decision
from ...plans.serving import TF_DEFAULT_BLOCK_SIZE, ServingPlan
from ..memory import GiB
from .batching import (
    H200_LAUNCH_S_PER_LAYER,
    _batch_ladder,
    choose_batch_tokens,
    choose_block_size,
    decide_async,
    decide_graphs,
    hbm_bandwidth,
)
from .budget import HEADROOM_FRACTION, DeclaredWork, DeviceRoom, WorkingSet, size_cache
from .kv_cache import (
    TF_DEFAULT_MAX_BATCH_TOKENS,
    TF_MAX_REQUESTS,
    TF_MIN_MAX_BATCH_TOKENS,
    CacheShape,
    eager_score_bytes,
    footprint,
    masked_step_transient,
    solve_cache_tokens,
    warmup_keys,
)
from .paged_attention import (
    _FAST_DECODE,
    _MASKED,
    _PAGED,
    _eager_to_sdpa,
    _kind,
    choose_paged_attention,
    transformers_name,
)

_SLIDING_NOTE = (
    "sliding-window layers: transformers gives them their own cache group and disables the decode fast path "
    "(continuous_api.py:1048-1050); planned as full-length (an upper bound)"
)


@dataclass(frozen=True)
class ServingQuery:
    """What the serving section is asked: the model's ``dtype`` and ``quantization``, the attention decision's
    ``attention`` and, when it chose automatically, its accepted implementations (``usable``; see
    :func:`choose_paged_attention`), the declared longest request (``seq_len``: prompt + new tokens) and concurrent
    requests (``batch_size``), None when the caller did not declare them."""

    dtype: str
    quantization: str | None
    attention: str
    usable: tuple[str, ...] | None = None
    seq_len: int | None = None
    batch_size: int | None = None


@dataclass(frozen=True)
class ServingDevice:
    """The GPU the cache lives on: the whole model's ``weights_bytes`` (split over ``world_size`` tensor-parallel
    ranks), one GPU's memory (``total``) and what it may hold (``budget``; both None: no GPU, planning for the
    CPU), its ``gpu_name``, and the kernel launches' seconds a layer (None: the H200's)."""

    weights_bytes: int
    total: int | None
    budget: int | None
    gpu_name: str | None
    world_size: int = 1
    launch_s_per_layer: float | None = None


def plan_serving(
    info: ModelInfo,
    *,
    dtype: str,
    attention_choice: str,
    quantization: str | None,
    weights_bytes: int,
    device_total: int | None,
    device_budget: int | None,
    gpu_name: str | None,
    seq_len: int | None,
    batch_size: int | None,
    world_size: int = 1,
    transformers_version: str | None = None,
    launch_s_per_layer: float | None = None,
    usable_attention: Iterable[str] | None = None,
) -> ServingPlan:
    """:func:`select_serving` with its values as keywords (the tests' form)."""
    return select_serving(
        info,
        ServingQuery(
            dtype,
            quantization,
            attention_choice,
            tuple(usable_attention) if usable_attention is not None else None,
            seq_len,
            batch_size,
        ),
        ServingDevice(weights_bytes, device_total, device_budget, gpu_name, world_size, launch_s_per_layer),
        transformers_version,
    )


def select_serving(
    info: ModelInfo, query: ServingQuery, device: ServingDevice, transformers_version: str | None = None
) -> ServingPlan:
    """The serving section for ``query`` on ``device`` (what each holds: :class:`ServingQuery`,
    :class:`ServingDevice`), with the transformers release whose continuous batching it configures."""
    dtype, quantization, seq_len, batch_size = (
        query.dtype,
        query.quantization,
        query.seq_len,
        query.batch_size,
    )
    gpu_name, launch_s_per_layer, world_size = device.gpu_name, device.launch_s_per_layer, device.world_size
    tp = max(1, int(world_size))
    supports_sdpa = bool(getattr(info, "supports_sdpa", True))
    attention = choose_paged_attention(
        query.attention,
        supports_sdpa=supports_sdpa,
        usable=query.usable,
        transformers_version=transformers_version,
    )
    heads = _heads_per_rank(info, tp)
    room = DeviceRoom.of(
        WorkingSet(info, dtype, quantization),
        weights=device.weights_bytes // tp,
        device_total=device.total,
        device_budget=device.budget,
    )
    layout = _layout(info, dtype, _Paged.of(attention), heads, seq_len=seq_len, has_cuda=room.has_cuda)
    work = DeclaredWork.of(seq_len, batch_size, layout.block)
    m_top = _top_batch_tokens(seq_len, batch_size)
    step = _batch_tokens(layout, room, work, m_top=m_top, dtype=dtype, supports_sdpa=supports_sdpa)
    layout, m = step.layout, int(step.decision.choice or m_top)
    budget = room.cache_budget(m)

    def cache_tokens_for(io: int) -> int:
        return layout.tokens(m, budget, io_multiplier=io)

    # graphs first (they decide whether async is worth anything), then async within memory
    graphs, graphs_notes = _graphs(
        layout,
        room,
        work,
        m=m,
        fill=cache_tokens_for(1),
        gpu_name=gpu_name,
        launch_s_per_layer=launch_s_per_layer,
    )
    async_dec, io = decide_async(
        graphs,
        cache_tokens_for=cache_tokens_for,
        need_tokens=work.need,
        transformers_version=transformers_version,
    )
    cache = size_cache(
        cache_tokens_for(io), shape=layout.shape, work=work, room=room, m=m, block=layout.block
    )
    num_blocks = max(1, cache.tokens // layout.block)
    notes = [*heads.notes, *([_SLIDING_NOTE] if info.sliding_layers else []), *step.notes, *graphs_notes]
    notes += cache.notes
    if layout.paged.masked and room.has_cuda:
        notes.append(_transient_note(layout, dtype, cache_tokens=num_blocks * layout.block, m=m))
    return ServingPlan(
        batch_tokens=step.decision,
        attention=layout.paged.decision,
        attn_implementation=transformers_name(layout.paged.name, transformers_version),
        cuda_graphs=graphs,
        async_batching=async_dec,
        block_size=layout.block_size,
        num_blocks=num_blocks,
        max_batch_tokens=m,
        # transformers caps the requests of a step at its tokens (initialization.py:286)
        max_requests_per_batch=min(batch_size, TF_MAX_REQUESTS, m) if batch_size is not None else None,
        # transformers checks (total - reserved) * max_memory_percent >= footprint (cache.py:643-649, 733-742):
        # pass the fraction our headroom leaves, so the check and this plan agree
        max_memory_percent=round(1.0 - HEADROOM_FRACTION, 3),
        memory=_memory(layout, room, m=m, cache_tokens=num_blocks * layout.block, io=io),
        kv_bytes_per_token=layout.shape.kv_bytes_per_token,
        tensor_parallel=tp,
        concurrent_requests=cache.concurrent_fit,
        notes=tuple(notes),
        warnings=(*heads.warnings, *cache.warnings),
    )


@dataclass(frozen=True)
class _Paged:
    """The paged attention decision and what the sizing reads from its choice."""

    decision: Decision
    name: str  # the chosen paged name, e.g. "paged|sdpa" or "paged|kernels-community/flash-attn3"
    kind: str  # the transformers implementation behind it, paged: "paged|flash_attention_3"
    masked: bool  # sdpa/eager need the dense attention mask
    fast: bool  # FA2/FA3's block-table decode

    @classmethod
    def of(cls, decision: Decision) -> _Paged:
        name = decision.choice or "paged|sdpa"
        kind = _PAGED.get(_kind(name), name)
        return cls(decision, name, kind, kind in _MASKED, kind in _FAST_DECODE)


@dataclass(frozen=True)
class _Heads:
    """Query and KV heads one tensor-parallel rank holds, and what was said about the split."""

    kv_heads: int
    heads: int
    notes: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()


def _heads_per_rank(info: ModelInfo, tp: int) -> _Heads:
    s = info.summary
    kv_heads = s.num_kv_heads or s.num_heads
    heads = s.num_heads
    if tp == 1:
        return _Heads(kv_heads, heads)
    if kv_heads % tp or heads % tp:
        return _Heads(
            kv_heads,
            heads,
            warnings=(
                f"{s.num_kv_heads} KV heads do not divide over {tp} ranks: the cache is planned unsharded",
            ),
        )
    note = (
        f"tensor parallel over {tp} ranks: each holds 1/{tp} of the weights and of the KV heads; "
        "transformers shards the paged cache by the model's tp_plan (continuous_api.py:1031-1038) and keeps "
        "num_blocks equal on every rank (cache.py:224-228). The parallelism decision owns how the model is "
        "split; load it with tp_plan='auto' under torchrun"
    )
    return _Heads(kv_heads // tp, heads // tp, notes=(note,))


@dataclass(frozen=True)
class _Layout:
    """What the paged cache is before any memory is counted: the implementation, the shape one rank holds, tokens
    per block and the block table's width (FA2/FA3's decode fast path; 0 otherwise)."""

    paged: _Paged
    shape: CacheShape
    block_size: Decision
    table_width: int

    @property
    def block(self) -> int:
        return int(self.block_size.choice or TF_DEFAULT_BLOCK_SIZE)

    def tokens(self, m: int, budget: int, *, io_multiplier: int) -> int:
        """The cache tokens that fit ``budget`` (at least 0) beside a step of ``m`` batch tokens."""
        return solve_cache_tokens(
            self.shape,
            m,
            max(budget, 0),
            io_multiplier=io_multiplier,
            max_blocks_per_request=self.table_width,
        )

    def footprint(self, m: int, cache_tokens: int, *, io_multiplier: int) -> int:
        return footprint(
            self.shape, m, cache_tokens, io_multiplier=io_multiplier, max_blocks_per_request=self.table_width
        )


def _layout(
    info: ModelInfo, dtype: str, paged: _Paged, heads: _Heads, *, seq_len: int | None, has_cuda: bool
) -> _Layout:
    """The cache's layout. ``has_cuda`` False: no device to run out of, so paged|eager's scores are not counted
    (the host cache is sized to the work)."""
    s = info.summary
    shape = CacheShape(
        layers=max(s.layers, 1),
        kv_heads=heads.kv_heads,
        head_dim=s.head_dim,
        heads=heads.heads,
        hidden=s.hidden_size,
        vocab=s.vocab_size,
        dtype_bytes=dtype_bytes(dtype),
        masked=paged.masked,
        fast_decode=paged.fast,
        sliding=bool(info.sliding_layers) and info.sliding_layers < s.layers,
        # counted for every version: masked kernels really hold the expanded K/V of every key the batch reads
        # (sdpa_paged.py repeat_kv); 5.17's check leaves it out, which only makes its check pass more easily
        repeated_kv_peak=True,
        score_bytes=eager_score_bytes(dtype) if paged.kind == "paged|eager" and has_cuda else 0,
    )
    block_size = choose_block_size(paged.kind, seq_len)
    block = int(block_size.choice or TF_DEFAULT_BLOCK_SIZE)
    return _Layout(paged, shape, block_size, _block_table_width(paged, seq_len, block))


def _top_batch_tokens(seq_len: int | None, batch_size: int | None) -> int:
    """The largest batch in tokens: transformers' default, never more than the declared work (for paged|eager
    :func:`choose_batch_tokens` may lower it until its scores leave room)."""
    if seq_len is not None and batch_size is not None:
        return min(TF_DEFAULT_MAX_BATCH_TOKENS, max(TF_MIN_MAX_BATCH_TOKENS, seq_len * batch_size))
    return TF_DEFAULT_MAX_BATCH_TOKENS


def _block_table_width(paged: _Paged, seq_len: int | None, block: int) -> int:
    """The block table's width (FA2/FA3's decode fast path; 0 otherwise): enough blocks for the longest declared
    request (initialization.py:88-92), an even number."""
    if not paged.fast:
        return 0
    width = (math.ceil(seq_len / block) + 1) if seq_len else 32
    return width + width % 2


@dataclass(frozen=True)
class _Step:
    """The step-size decision, with the layout it was made for (paged|sdpa's where paged|eager did not fit)."""

    decision: Decision
    layout: _Layout
    notes: tuple[str, ...] = ()


def _batch_tokens(
    layout: _Layout, room: DeviceRoom, work: DeclaredWork, *, m_top: int, dtype: str, supports_sdpa: bool
) -> _Step:
    """``max_batch_tokens`` (:func:`choose_batch_tokens`). Where no step leaves paged|eager's scores room beside
    the cache, the plan moves to paged|sdpa (no scores held), or, for a model without sdpa, keeps paged|eager at
    transformers' smallest step."""

    def choose(shape: CacheShape) -> Decision:
        return choose_batch_tokens(
            shape,
            m_top=m_top,
            budget=room.cache_budget,
            io_multiplier=1,
            max_blocks_per_request=layout.table_width,
            need_tokens=work.need,
            goal_tokens=work.goal,
            batch_size=work.batch_size,
            dtype=dtype,
        )

    dec = choose(layout.shape)
    if dec.choice is not None:
        return _Step(dec, layout)
    floor = _batch_ladder(m_top)[-1]
    if not supports_sdpa:
        why = (
            f"the model has no sdpa: paged|eager at the smallest batch transformers allows ({floor}); the "
            "cache holds fewer requests than declared"
        )
        return _Step(Decision(str(floor), (why,), dec.candidates), layout)
    why = (
        f"its scores leave no room for the cache the declared work needs ({work.need:,} tokens) even at "
        f"max_batch_tokens {floor}"
        if work.need is not None
        else f"its scores leave no room for a cache even at max_batch_tokens {floor}"
    )
    sdpa = replace(
        layout,
        paged=_Paged.of(_eager_to_sdpa(layout.paged.decision, why)),
        shape=replace(layout.shape, score_bytes=0),
    )
    return _Step(
        choose(sdpa.shape), sdpa, (f"paged|eager rejected: {why}; planned for paged|sdpa (no scores held)",)
    )


def _graphs(
    layout: _Layout,
    room: DeviceRoom,
    work: DeclaredWork,
    *,
    m: int,
    fill: int,
    gpu_name: str | None,
    launch_s_per_layer: float | None,
) -> tuple[Decision, list[str]]:
    """The CUDA-graphs decision for a decode step of the declared work (``fill``: the cache tokens that fit
    without async batching), and the step estimate behind it as a note (on a GPU)."""
    planned_tokens = min(fill, work.need) if work.need else fill
    bw = hbm_bandwidth(gpu_name)
    concurrent = min(work.batch_size or 64, max(1, planned_tokens // max(work.per_request or 2048, 1)))
    # expected decode steps of a declared workload: each request generates at most seq_len tokens; assume half
    expected = None
    if work.seq_len is not None and work.batch_size is not None:
        expected = math.ceil(work.batch_size / max(concurrent, 1)) * max(1, work.seq_len // 2)
    shape = layout.shape
    graphs, est = decide_graphs(
        has_cuda=room.has_cuda,
        masked=layout.paged.masked,
        layers=shape.layers,
        launch_s_per_layer=launch_s_per_layer if launch_s_per_layer is not None else H200_LAUNCH_S_PER_LAYER,
        weight_bytes=room.weights,
        kv_bytes_per_token=shape.kv_bytes_per_token,
        kv_heads=shape.kv_heads,
        heads=shape.heads,
        bandwidth=bw,
        concurrent=concurrent,
        context=(work.seq_len or 2048) // 2,  # a request is half-way through on average
        cache_tokens=planned_tokens,
        max_batch_tokens=m,
        expected_steps=expected,
    )
    if not room.has_cuda:
        return graphs, []
    note = (
        "step estimate: host launches {eager_step_ms:.1f} ms, bandwidth floor {gpu_step_ms:.1f} ms, with graph "
        "padding {graph_step_ms:.1f} ms (a floor, not the step time: see the graphs decision); "
        "~{graphs:.0f} graphs".format(**est)
        + f" (HBM {bw / 1e12:.2f} TB/s for {gpu_name or 'an unknown GPU'})"
    )
    return graphs, [note]


def _memory(layout: _Layout, room: DeviceRoom, *, m: int, cache_tokens: int, io: int) -> dict[str, int]:
    """The plan's memory entries: the device's division, then the cache with the batch buffers and the part
    that does not grow with the cache (batch IO, the mask's and eager's scores' M^2 terms), which settle() keeps
    while it scales the rest."""
    return {
        **room.as_dict(m),
        "cache_and_buffers": layout.footprint(m, cache_tokens, io_multiplier=io),
        "batch_buffers": layout.footprint(m, 0, io_multiplier=io),
    }


def _transient_note(layout: _Layout, dtype: str, *, cache_tokens: int, m: int) -> str:
    """The masked kernels' per-layer transient at the graph warm-up's step, counted in cache_and_buffers."""
    shape = layout.shape
    q_w, k_w = warmup_keys(cache_tokens=cache_tokens, max_batch_tokens=m)
    tr = masked_step_transient(
        heads=shape.heads,
        kv_heads=shape.kv_heads,
        head_dim=shape.head_dim,
        dtype=dtype,
        q_tokens=q_w,
        keys=k_w,
        eager=shape.score_bytes > 0,
    )
    parts = f"repeated K/V {tr['repeated_kv'] / GiB:.2f} GiB"
    if shape.score_bytes:
        parts += (
            f", scores {tr['scores'] / GiB:.2f} GiB + {tr['fp32_at_softmax']} x fp32 "
            f"{tr['softmax_fp32'] / GiB:.2f} GiB at the softmax"
        )
    return (
        f"{layout.paged.kind} per-layer transient at the largest step ({q_w:,} queries x {k_w:,} keys, the graph warm-up's "
        f"shape, model_runner.py:241-244): peak {tr['peak'] / GiB:.2f} GiB ({parts}), counted in "
        "cache_and_buffers; transformers' own check leaves it out"
    )
