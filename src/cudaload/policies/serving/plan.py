"""The serving section built: :func:`plan_serving` runs the decisions (paged attention, block size, step size,
graphs, async) over the memory left after the weights, the CUDA context, one layer's working set and a stated
headroom, and sizes the KV cache (:func:`~cudaload.policies.serving.kv_cache.settle` later fits it to the memory
measured after loading).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import replace

from ...decision import Decision
from ...dtypes import dtype_bytes
from ...errors import DoesNotFitError
from ...model_info import ModelInfo
from ...serving_plan import TF_DEFAULT_BLOCK_SIZE, ServingPlan
from ..memory import CUDA_CONTEXT_BYTES, GiB
from ..memory import estimate as memory_estimate
from .batching import (
    H200_LAUNCH_S_PER_LAYER,
    _batch_ladder,
    choose_batch_tokens,
    choose_block_size,
    decide_async,
    decide_graphs,
    hbm_bandwidth,
)
from .kv_cache import (
    TF_DEFAULT_MAX_BATCH_TOKENS,
    TF_FIFO_SAFETY_MARGIN,
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

#: Headroom kept free on each device beyond what is counted: allocator fragmentation, cuBLAS workspaces,
#: the CUDA-graph pool's private segments. 5% of the device, at least 1 GiB.
HEADROOM_FRACTION = 0.05
HEADROOM_MIN = 1 * GiB


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
    """The serving section. ``weights_bytes``: the whole model's weights (split over ``world_size`` ranks);
    ``device_total`` / ``device_budget``: one GPU's memory and what it may hold (None: no GPU, planning for the CPU);
    ``seq_len`` / ``batch_size``: the declared longest request (prompt + new tokens) and concurrent requests, or
    None when the caller did not declare them; ``usable_attention``: the attention decision's accepted
    implementations when it chose automatically (see :func:`choose_paged_attention`)."""
    s = info.summary
    tp = max(1, int(world_size))
    notes: list[str] = []
    warnings: list[str] = []

    supports_sdpa = bool(getattr(info, "supports_sdpa", True))
    att = choose_paged_attention(
        attention_choice,
        supports_sdpa=supports_sdpa,
        usable=usable_attention,
        transformers_version=transformers_version,
    )
    paged = att.choice or "paged|sdpa"
    kind = _PAGED.get(_kind(paged), paged)
    masked = kind in _MASKED
    fast = kind in _FAST_DECODE
    kv_heads = s.num_kv_heads or s.num_heads
    heads = s.num_heads
    if tp > 1:
        if kv_heads % tp == 0 and heads % tp == 0:
            kv_heads //= tp
            heads //= tp
            notes.append(
                f"tensor parallel over {tp} ranks: each holds 1/{tp} of the weights and of the KV heads; "
                "transformers shards the paged cache by the model's tp_plan (continuous_api.py:1031-1038) and keeps "
                "num_blocks equal on every rank (cache.py:224-228). The parallelism decision owns how the model is "
                "split; load it with tp_plan='auto' under torchrun"
            )
        else:
            warnings.append(
                f"{s.num_kv_heads} KV heads do not divide over {tp} ranks: the cache is planned unsharded"
            )
    b = dtype_bytes(dtype)
    shape = CacheShape(
        layers=max(s.layers, 1),
        kv_heads=kv_heads,
        head_dim=s.head_dim,
        heads=heads,
        hidden=s.hidden_size,
        vocab=s.vocab_size,
        dtype_bytes=b,
        masked=masked,
        fast_decode=fast,
        sliding=bool(info.sliding_layers) and info.sliding_layers < s.layers,
        # counted for every version: masked kernels really hold the expanded K/V of every key the batch reads
        # (sdpa_paged.py repeat_kv); 5.17's check leaves it out, which only makes its check pass more easily
        repeated_kv_peak=True,
        score_bytes=eager_score_bytes(dtype) if kind == "paged|eager" else 0,
    )
    if info.sliding_layers:
        notes.append(
            "sliding-window layers: transformers gives them their own cache group and disables the decode fast path "
            "(continuous_api.py:1048-1050); planned as full-length (an upper bound)"
        )
    bs_dec = choose_block_size(kind, seq_len)
    block = int(bs_dec.choice or TF_DEFAULT_BLOCK_SIZE)

    # --- memory per device: weights, context, headroom, and one layer's working set at the largest batch
    w_dev = weights_bytes // tp
    has_cuda = device_total is not None
    total = device_total if device_total is not None else (device_budget or 0)
    budget_dev = device_budget if device_budget is not None else total
    headroom = max(HEADROOM_MIN, int(HEADROOM_FRACTION * total)) if total else HEADROOM_MIN
    ctx = CUDA_CONTEXT_BYTES if has_cuda else 0

    def working(mm: int) -> int:
        return int(
            memory_estimate(
                info,
                dtype=dtype,
                quantization=quantization,
                intent="inference",
                seq_len=mm,
                batch_size=1,
                attn="sdpa",
            )["activations"]
        )

    def cache_budget_at(mm: int) -> int:
        """What the cache and the batch buffers may take beside a step of ``mm`` batch tokens."""
        return budget_dev - w_dev - ctx - working(mm) - headroom

    # the declared need, in tokens: every request padded to whole blocks, plus one (initialization.py:91)
    need_tokens = None
    per_request_tokens = None
    goal_tokens = None
    if seq_len is not None:
        per_request_tokens = (math.ceil(seq_len / block) + 1) * block
        need_tokens = per_request_tokens * (batch_size or 1)
        # with the FIFO scheduler's 15% admission margin, in whole blocks (never below the need: a multiple of them)
        goal_tokens = math.ceil(need_tokens / (1 - TF_FIFO_SAFETY_MARGIN)) // block * block

    # --- the largest batch in tokens: transformers' default, never more than the declared work; for paged|eager
    # no more than its scores leave room for
    m_top = TF_DEFAULT_MAX_BATCH_TOKENS
    if seq_len is not None and batch_size is not None:
        m_top = min(m_top, max(TF_MIN_MAX_BATCH_TOKENS, seq_len * batch_size))
    max_blocks_req = 0
    if fast:
        # the block table's width: enough blocks for the longest declared request (initialization.py:88-92)
        max_blocks_req = (math.ceil(seq_len / block) + 1) if seq_len else 32
        max_blocks_req += max_blocks_req % 2
    if not has_cuda:
        shape = replace(shape, score_bytes=0)  # no device to run out of: the host cache is sized to the work

    def batch_tokens_for(shape: CacheShape) -> Decision:
        return choose_batch_tokens(
            shape,
            m_top=m_top,
            budget=cache_budget_at,
            io_multiplier=1,
            max_blocks_per_request=max_blocks_req,
            need_tokens=need_tokens,
            goal_tokens=goal_tokens,
            batch_size=batch_size,
            dtype=dtype,
        )

    bt_dec = batch_tokens_for(shape)
    if bt_dec.choice is None:
        floor = _batch_ladder(m_top)[-1]
        if supports_sdpa:
            why = (
                f"its scores leave no room for the cache the declared work needs ({need_tokens:,} tokens) even at "
                f"max_batch_tokens {floor}"
                if need_tokens is not None
                else f"its scores leave no room for a cache even at max_batch_tokens {floor}"
            )
            att = _eager_to_sdpa(att, why)
            paged = kind = "paged|sdpa"
            shape = replace(shape, score_bytes=0)
            notes.append(f"paged|eager rejected: {why}; planned for paged|sdpa (no scores held)")
            bt_dec = batch_tokens_for(shape)
        else:
            bt_dec = Decision(
                str(floor),
                (
                    f"the model has no sdpa: paged|eager at the smallest batch transformers allows ({floor}); the "
                    "cache holds fewer requests than declared",
                ),
                bt_dec.candidates,
            )
    m = int(bt_dec.choice or m_top)
    work = working(m)
    cache_budget = cache_budget_at(m)
    mem = {
        "device": budget_dev,
        "weights": w_dev,
        "cuda_context": ctx,
        "working_set": work,
        "headroom": headroom,
    }

    def cache_tokens_for(io: int) -> int:
        return solve_cache_tokens(
            shape, m, max(cache_budget, 0), io_multiplier=io, max_blocks_per_request=max_blocks_req
        )

    # --- graphs first (they decide whether async is worth anything), then async within memory
    fill1 = cache_tokens_for(1)
    planned_tokens = min(fill1, need_tokens) if need_tokens else fill1
    bw = hbm_bandwidth(gpu_name)
    concurrent = min(batch_size or 64, max(1, planned_tokens // max(per_request_tokens or 2048, 1)))
    context = (seq_len or 2048) // 2  # a request is half-way through on average
    lps = launch_s_per_layer if launch_s_per_layer is not None else H200_LAUNCH_S_PER_LAYER
    # expected decode steps of a declared workload: each request generates at most seq_len tokens; assume half
    expected = None
    if seq_len is not None and batch_size is not None:
        expected = math.ceil(batch_size / max(concurrent, 1)) * max(1, seq_len // 2)
    graphs, est = decide_graphs(
        has_cuda=has_cuda,
        masked=masked,
        layers=shape.layers,
        launch_s_per_layer=lps,
        weight_bytes=w_dev,
        kv_bytes_per_token=shape.kv_bytes_per_token,
        kv_heads=kv_heads,
        heads=heads,
        bandwidth=bw,
        concurrent=concurrent,
        context=context,
        cache_tokens=planned_tokens,
        max_batch_tokens=m,
        expected_steps=expected,
    )
    if has_cuda:
        notes.append(
            "step estimate: host launches {eager_step_ms:.1f} ms, bandwidth floor {gpu_step_ms:.1f} ms, with graph "
            "padding {graph_step_ms:.1f} ms (a floor, not the step time: see the graphs decision); "
            "~{graphs:.0f} graphs".format(**est)
            + f" (HBM {bw / 1e12:.2f} TB/s for {gpu_name or 'an unknown GPU'})"
        )

    async_dec, io = decide_async(
        graphs,
        cache_tokens_for=cache_tokens_for,
        need_tokens=need_tokens,
        transformers_version=transformers_version,
    )

    fill = cache_tokens_for(io)
    if not has_cuda and fill < block:
        # no GPU and no known host budget: the declared need, else 64 blocks
        fill = need_tokens or 64 * block
        notes.append("no GPU: the cache is sized to the declared work (64 blocks when none is declared)")
    if has_cuda and fill < block:
        raise DoesNotFitError(
            f"no room for a KV cache: {budget_dev / GiB:.1f} GiB on the device minus weights {w_dev / GiB:.1f} GiB, "
            f"context, working set {work / GiB:.2f} GiB and headroom {headroom / GiB:.1f} GiB leaves nothing",
            fix="quantize the weights (quantization='nf4'), serve over more GPUs (tensor parallel), or free the device",
        )
    cache_tokens = fill
    concurrent_fit: int | None = None
    if need_tokens is not None and per_request_tokens is not None:
        if per_request_tokens > fill:
            raise DoesNotFitError(
                f"a {seq_len}-token request needs {per_request_tokens:,} cache tokens "
                f"({per_request_tokens * shape.kv_bytes_per_token / GiB:.1f} GiB of KV), the device holds "
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
        concurrent_fit = fill // per_request_tokens if per_request_tokens else None
        if need_tokens <= fill:
            # the declared work fits: the cache is sized to it (a larger one only costs masked kernels their
            # mask and the warm-up capture over the whole cache), with the FIFO scheduler's 15% admission margin
            cache_tokens = min(fill, goal_tokens or need_tokens)
            notes.append(
                f"cache sized to the declared {batch_size} x {seq_len} tokens (+{TF_FIFO_SAFETY_MARGIN:.0%} for the "
                f"scheduler's admission margin, scheduler.py:337); the device could hold {fill:,} tokens"
            )
        else:
            warnings.append(
                f"{batch_size} concurrent {seq_len}-token requests need {need_tokens:,} cache tokens; "
                f"{concurrent_fit} fit at once: transformers' scheduler queues the rest until blocks free up "
                "(scheduler.py:122-143)"
            )
    elif not has_cuda:
        cache_tokens = min(fill, 64 * block)
        notes.append("no GPU and no declared work: a small host cache of 64 blocks")
    num_blocks = max(1, cache_tokens // block)

    max_req: int | None = None
    if batch_size is not None:
        # transformers caps the requests of a step at its tokens (initialization.py:286)
        max_req = min(batch_size, TF_MAX_REQUESTS, m)
    # transformers checks (total - reserved) * max_memory_percent >= footprint (cache.py:643-649, 733-742): pass
    # the fraction our headroom leaves, so the check and this plan agree
    pct = round(1.0 - HEADROOM_FRACTION, 3)
    mem["cache_and_buffers"] = footprint(
        shape, m, num_blocks * block, io_multiplier=io, max_blocks_per_request=max_blocks_req
    )
    # the part that does not grow with the cache (batch IO, the mask's and eager's scores' M^2 terms): settle()
    # scales only the rest
    mem["batch_buffers"] = footprint(shape, m, 0, io_multiplier=io, max_blocks_per_request=max_blocks_req)
    if masked and has_cuda:
        q_w, k_w = warmup_keys(cache_tokens=num_blocks * block, max_batch_tokens=m)
        tr = masked_step_transient(
            heads=heads,
            kv_heads=kv_heads,
            head_dim=s.head_dim,
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
        notes.append(
            f"{kind} per-layer transient at the largest step ({q_w:,} queries x {k_w:,} keys, the graph warm-up's "
            f"shape, model_runner.py:241-244): peak {tr['peak'] / GiB:.2f} GiB ({parts}), counted in "
            "cache_and_buffers; transformers' own check leaves it out"
        )
    return ServingPlan(
        batch_tokens=bt_dec,
        attention=att,
        attn_implementation=transformers_name(paged, transformers_version),
        cuda_graphs=graphs,
        async_batching=async_dec,
        block_size=bs_dec,
        num_blocks=num_blocks,
        max_batch_tokens=m,
        max_requests_per_batch=max_req,
        max_memory_percent=pct,
        memory=mem,
        kv_bytes_per_token=shape.kv_bytes_per_token,
        tensor_parallel=tp,
        concurrent_requests=concurrent_fit,
        notes=tuple(notes),
        warnings=tuple(warnings),
    )
