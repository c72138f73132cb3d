"""How continuous batching runs the cache: tokens per block, tokens per step (``max_batch_tokens``), CUDA
graphs and async (double-buffered) batching, each a Decision with every candidate.

The graphs decision is made from numbers (host launches against the step's padded bandwidth floor, the capture
cost against the expected run) and quotes what was measured on the H200, since the floor is not the step time.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

from ...detection.versions import version_tuple as _version
from ...plans.decision import Candidate, Decision
from ...plans.serving import TF_DEFAULT_BLOCK_SIZE
from ..memory import GiB
from .kv_cache import (
    TF_DEFAULT_MAX_BATCH_TOKENS,
    TF_KV_PADDING,
    TF_MIN_MAX_BATCH_TOKENS,
    TF_Q_PADDING,
    CacheShape,
    footprint,
    solve_cache_tokens,
)
from .paged_attention import _FAST_DECODE

#: flash-attn's ``flash_attn_with_kvcache`` with a block table (the FA2/FA3 decode fast path transformers uses,
#: initialization.py:114-146) wants page_block_size a multiple of 256 (flash-attn 2.8.3
#: flash_attn/flash_attn_interface.py, flash_attn_with_kvcache docstring: "page_block_size must be a multiple of 256")
FLASH_PAGE_MULTIPLE = 256
BLOCK_SIZES = (256, 128, 64, 32, 16)

#: Host time to launch one decoder layer's kernels in an eager forward on the H200 host (torch 2.11 + cu130):
#: generate() at batch 1 ran ~60 ms a token for the 28-layer Qwen3-0.6B shape and ~87 ms (11.5 tok/s) for the
#: 36-layer 8B shape, both against a < 4 ms bandwidth floor (measured: /work/shared/device/README.md), i.e.
#: ~2.1-2.4 ms per layer of launch-bound host work. A measured figure passed as ``launch_s_per_layer`` wins.
H200_LAUNCH_S_PER_LAYER = 2.0e-3
#: What the masked paged path measured on the H200 (torch 2.11, transformers 5.17, no flash-attn; 64 requests,
#: prompts 128-2048, 128-256 new tokens; benchmarks/bench_serving.py). Quoted in the graphs decision's reasons so
#: that its bandwidth-floor estimate is not read as the step time.
MEASURED_MASKED_STEPS = (
    "paged|sdpa with graphs on the H200, 64 requests: a decode step took 89.9-90.7 ms for the Qwen3-0.6B shape "
    "against a 0.248 ms weights-only bound, 144 ms for the 8B against 3.41 ms; "
    "benchmarks/results/2026-12-01-h200/run5-serving, run7-serving, run8-serving"
)
MEASURED_PLAN_VS_DEFAULTS = (
    "measured on the H200 (run5/7/8-serving): this plan (graphs and async on, 752 blocks sized to the work) 467-477 "
    "tok/s for the 0.6B shape and 280 for the 8B; transformers' continuous-batching defaults (resolved in "
    "run7-serving: graphs and async off for the mask, initialization.py:229-267; 3,802 blocks from "
    "max_memory_percent 0.9) 347-355 and 252. The plan with torch's cuDNN attention switched off decoded as slowly "
    "as the defaults (141 vs 144 ms a step, 304 tok/s, run8-serving): which of the differences carries the gain is "
    "not measured apart"
)
MEASURED_FLASH_GRAPHS = (
    "measured with paged flash_attention_4 on the H200 (run10-serving-fa4-t522, same cache settings): graphs and "
    "async on 1,617 vs off 935 tok/s (Qwen3-0.6B shape, 11.6 vs 47 ms a decode step), 1,489 vs 657 (8B, 19 vs 56 ms)"
)
#: graphs must make the step at least this much faster to be worth their padding
GRAPH_SPEEDUP_MIN = 1.5
#: a capture runs the forward twice (a warm run, then the capture: 5.17 continuous_batching/model_runner.py:145-155
#: _capture_graph)
CAPTURE_FORWARDS = 2
#: query sizes a run meets in practice: decode-only batches, full prefill chunks, a couple of tails
GRAPH_Q_SIZES = 4

#: HBM bandwidth by GPU name (vendor datasheets), for the decode step estimate
HBM_BYTES_S = {"H200": 4.8e12, "H100": 3.35e12, "H20": 4.0e12, "A100": 2.0e12, "B200": 8.0e12, "L40": 0.86e12}
HBM_FALLBACK = 1.0e12

#: ContinuousBatchingConfig with use_async_batching / use_cuda_graph exists from transformers 5.17 (the oldest
#: cudaload supports); before it the knobs lived on GenerationConfig
CB_CONFIG_FROM = (5, 17)


def hbm_bandwidth(gpu_name: str | None) -> float:
    name = (gpu_name or "").upper()
    for key, bw in HBM_BYTES_S.items():
        if key in name:
            return bw
    return HBM_FALLBACK


def choose_block_size(paged: str, seq_len: int | None) -> Decision:
    """Tokens per KV block. A request wastes half a block on average: keep that under 1/16 of the declared
    length. FA2/FA3's block-table decode wants multiples of 256."""
    cands = []
    for b in BLOCK_SIZES:
        why = []
        ok = True
        if paged in _FAST_DECODE and b % FLASH_PAGE_MULTIPLE:
            ok = False
            why.append(f"flash_attn_with_kvcache needs page blocks of a multiple of {FLASH_PAGE_MULTIPLE}")
        if seq_len is not None and b > max(BLOCK_SIZES[-1], seq_len // 8):
            ok = False
            why.append(f"half a block ({b // 2}) wastes more than 1/16 of a {seq_len}-token request")
        if b == TF_DEFAULT_BLOCK_SIZE:
            why.append("transformers' default (configuration_utils.py:1753)")
        elif ok:
            why.append(
                f"finer allocation (a request wastes under {b} tokens), {TF_DEFAULT_BLOCK_SIZE // b}x the blocks"
            )
        cands.append(Candidate(str(b), ok, tuple(why)))
    pick = next((c for c in cands if c.ok), None)
    if pick is None:  # fast decode with a very short declared length: the kernel's constraint wins
        return Decision(
            "256", ("flash decode needs 256-token blocks; short requests waste the rest",), tuple(cands)
        )
    return Decision(
        pick.name, ("the largest block whose average waste stays under 1/16 of a request",), tuple(cands)
    )


def decide_graphs(
    *,
    has_cuda: bool,
    masked: bool,
    layers: int,
    launch_s_per_layer: float,
    weight_bytes: int,
    kv_bytes_per_token: int,
    kv_heads: int,
    heads: int,
    bandwidth: float,
    concurrent: int,
    context: int,
    cache_tokens: int,
    max_batch_tokens: int,
    expected_steps: int | None,
) -> tuple[Decision, dict[str, float]]:
    """CUDA graphs for continuous batching, with the estimate behind the choice."""
    eager = layers * launch_s_per_layer
    # a decode step at `concurrent` requests of `context` tokens: weights once, plus the KV the batch reads.
    # Masked kernels gather the keys and expand them to every query head (sdpa_paged.py repeat_kv): read + write
    # of the gathered and the expanded copies.
    expand = 1 + 2 * max(1, heads // max(kv_heads, 1)) if masked else 1
    kv_read = concurrent * context * kv_bytes_per_token * expand
    gpu = (weight_bytes + kv_read) / bandwidth
    pad_tokens = TF_KV_PADDING if masked else 0
    gpu_padded = gpu + pad_tokens * kv_bytes_per_token * expand / bandwidth
    # distinct graph shapes (model_runner.py maybe_pad_inputs: query padded to 64-token steps, KV to 16384-token
    # steps): in a run, a few query sizes (decode-only batches, full prefill chunks of max_batch_tokens, tails)
    # times the KV buckets the cache spans
    kv_buckets = max(1, math.ceil(cache_tokens / TF_KV_PADDING))
    q_buckets = min(GRAPH_Q_SIZES, max(1, math.ceil(max_batch_tokens / TF_Q_PADDING)))
    graphs = kv_buckets * q_buckets
    capture_s = graphs * CAPTURE_FORWARDS * max(eager, gpu_padded)
    saving = max(eager, gpu) - gpu_padded
    est = {
        "eager_step_ms": eager * 1e3,
        "gpu_step_ms": gpu * 1e3,
        "graph_step_ms": gpu_padded * 1e3,
        "graphs": float(graphs),
        "capture_s": capture_s,
        "break_even_steps": (capture_s / saving) if saving > 0 else float("inf"),
    }
    on_why: list[str] = []
    off_why: list[str] = []
    ok_on = True
    if not has_cuda:
        ok_on = False
        on_why.append("no CUDA device (transformers turns graphs off there too, initialization.py:210-217)")
    else:
        step = (
            f"~{eager * 1e3:.1f} ms of host launches a step ({layers} layers x {launch_s_per_layer * 1e3:.1f} ms) "
            f"vs a bandwidth floor of ~{gpu_padded * 1e3:.1f} ms with graph padding (weights and the KV read once)"
        )
        if not masked:
            on_why.append("no attention mask: padding to graph shapes is cheap (transformers' own default)")
            on_why.append(MEASURED_FLASH_GRAPHS)
        elif eager < GRAPH_SPEEDUP_MIN * gpu_padded:
            ok_on = False
            on_why.append(f"{step}: not launch-bound enough to repay the padding of a masked kernel")
        else:
            on_why.append(
                f"{step}: launch-bound by this estimate; the graph replay removes the launches, not the GPU work. "
                f"Measured, masked steps run far above the floor ({MEASURED_MASKED_STEPS})"
            )
            on_why.append(MEASURED_PLAN_VS_DEFAULTS)
        if ok_on and expected_steps is not None and saving > 0 and expected_steps < est["break_even_steps"]:
            ok_on = False
            on_why.append(
                f"~{graphs} captures cost ~{capture_s:.1f} s, more than the ~{expected_steps} expected steps save"
            )
        elif ok_on:
            on_why.append(
                f"~{graphs} captures (~{capture_s:.1f} s) repaid after ~{est['break_even_steps']:.0f} steps"
            )
    off_why.append("every step pays the host's kernel launches")
    if masked:
        off_why.append("transformers' default for masked attention (initialization.py:228-236)")
    cands = (Candidate("on", ok_on, tuple(on_why)), Candidate("off", True, tuple(off_why)))
    choice = "on" if ok_on else "off"
    return Decision(choice, tuple(on_why), cands), est


def _batch_ladder(m_top: int) -> list[int]:
    """max_batch_tokens candidates: the top, halved down to transformers' floor of 256 (cache.py:578)."""
    out = [m_top]
    while out[-1] // 2 >= TF_MIN_MAX_BATCH_TOKENS:
        out.append(out[-1] // 2)
    if out[-1] > TF_MIN_MAX_BATCH_TOKENS:
        out.append(TF_MIN_MAX_BATCH_TOKENS)
    return out


def _score_dtype_text(dtype: str) -> str:
    if dtype == "float32":
        return "fp32 scores and their fp32 softmax"
    if dtype == "float16":
        return "fp16 scores, their fp32 softmax and its fp16 cast"
    short = {"bfloat16": "bf16"}.get(dtype, dtype)
    return f"{short} scores, their fp32 copy and the fp32 softmax: torch converts first, SoftMax.cpp"


def choose_batch_tokens(
    shape: CacheShape,
    *,
    m_top: int,
    budget: Callable[[int], int],
    io_multiplier: int,
    max_blocks_per_request: int,
    need_tokens: int | None,
    goal_tokens: int | None,
    batch_size: int | None = None,
    dtype: str = "bfloat16",
) -> Decision:
    """``max_batch_tokens``. ``budget(m)``: bytes the cache and the batch buffers may take beside a step of ``m``
    tokens. Kernels that hold no scores take ``m_top`` (transformers' default, or the declared work when smaller).

    ``paged|eager`` materialises heads x M x (N + M) scores at :func:`eager_score_bytes` each per layer step
    (:func:`masked_step_transient`), N the cache tokens: the largest M from ``m_top`` down (halving, not below
    transformers' 256) whose scores fit beside the cache the declared work needs (``need_tokens``; its scheduler
    margin ``goal_tokens`` when some M holds that too) or, with no declared work, beside a cache at least as large
    as the scores themselves (a transient larger than the cache it serves holds fewer requests than it could).
    ``choice`` None: no M holds the declared need (or, undeclared, any cache at all)."""
    if shape.score_bytes == 0:
        return _no_scores_batch_tokens(shape, m_top)
    room = _StepRoom(shape, budget, io_multiplier, max_blocks_per_request)
    rungs = [
        _eager_rung(
            room, mm, need_tokens=need_tokens, goal_tokens=goal_tokens, batch_size=batch_size, dtype=dtype
        )
        for mm in _batch_ladder(m_top)
    ]
    cands = tuple(r.candidate for r in rungs)
    # the largest step that holds the scheduler's margin too, else the largest that holds the need
    pick = next((r for r in rungs if r.holds_goal), None) or next((r for r in rungs if r.holds_need), None)
    if pick is not None:
        chosen = pick.candidate
        lowered = (
            f"max_batch_tokens lowered from {m_top} to {chosen.name}: " if chosen.name != str(m_top) else ""
        )
        return Decision(chosen.name, (f"paged|eager: {lowered}{chosen.reasons[0]}",), cands)
    if need_tokens is None and cands and room.cache_tokens(int(cands[-1].name)) > 0:
        # no declared work: the smallest step still leaves a cache; it is the most paged|eager can do
        last = cands[-1]
        return Decision(
            last.name, (f"paged|eager: the smallest step transformers allows; {last.reasons[0]}",), cands
        )
    return Decision(None, ("paged|eager's scores leave no room for the cache at any step size",), cands)


def _no_scores_batch_tokens(shape: CacheShape, m_top: int) -> Decision:
    """``max_batch_tokens`` for kernels that hold no scores: ``m_top``, the only candidate."""
    if m_top == TF_DEFAULT_MAX_BATCH_TOKENS:
        top = f"transformers' default ({TF_DEFAULT_MAX_BATCH_TOKENS}, cache.py:579)"
    else:
        top = (
            f"the declared work holds {m_top} tokens, fewer than transformers' default "
            f"{TF_DEFAULT_MAX_BATCH_TOKENS} (cache.py:579)"
        )
    if shape.masked:
        top += "; the masked kernel holds no scores, so the step's size only moves the mask (counted)"
    return Decision(str(m_top), (top,), (Candidate(str(m_top), True, (top,)),))


@dataclass(frozen=True)
class _StepRoom:
    """What a step of ``m`` batch tokens leaves the cache: ``budget(m)`` bytes, never below 0, filled through
    transformers' footprint polynomial."""

    shape: CacheShape
    budget: Callable[[int], int]
    io_multiplier: int
    max_blocks_per_request: int

    def bytes_at(self, m: int) -> int:
        return max(self.budget(m), 0)

    def cache_tokens(self, m: int) -> int:
        return solve_cache_tokens(
            self.shape,
            m,
            self.bytes_at(m),
            io_multiplier=self.io_multiplier,
            max_blocks_per_request=self.max_blocks_per_request,
        )

    def left_beside(self, m: int, cache_tokens: int) -> int:
        """Bytes left for the scores beside a cache of ``cache_tokens`` and the batch buffers."""
        plain = replace(self.shape, score_bytes=0)
        return self.bytes_at(m) - footprint(
            plain,
            m,
            cache_tokens,
            io_multiplier=self.io_multiplier,
            max_blocks_per_request=self.max_blocks_per_request,
        )


@dataclass(frozen=True)
class _Rung:
    """One step size of paged|eager's ladder: its candidate, and whether the cache beside its scores holds the
    declared need with the scheduler's margin (``holds_goal``) and without (``holds_need``; undeclared: any cache
    at least as large as the scores)."""

    candidate: Candidate
    holds_goal: bool
    holds_need: bool


def _eager_rung(
    room: _StepRoom,
    mm: int,
    *,
    need_tokens: int | None,
    goal_tokens: int | None,
    batch_size: int | None,
    dtype: str,
) -> _Rung:
    shape = room.shape
    n_fit = room.cache_tokens(mm)
    n_plan = min(n_fit, goal_tokens) if goal_tokens is not None else n_fit
    keys = (need_tokens if need_tokens is not None and n_fit < need_tokens else n_plan) + mm
    scores = shape.heads * mm * keys * shape.score_bytes
    head = (
        f"scores of {mm:,} x {keys:,} keys x {shape.heads} heads = {scores / GiB:.1f} GiB per layer step "
        f"({_score_dtype_text(dtype)}, eager_paged.py:60-75)"
    )
    goal = False
    if need_tokens is not None:
        ok = n_fit >= need_tokens
        goal = ok and goal_tokens is not None and n_fit >= goal_tokens
        if ok:
            why = [f"{head} fit beside the {n_plan:,}-token cache the declared work needs"]
        else:
            left = room.left_beside(mm, need_tokens)
            why = [
                f"{head}, more than the {max(left, 0) / GiB:.1f} GiB left beside the {need_tokens:,}-token cache "
                f"the declared work needs (the device holds {n_fit:,} tokens beside them)"
            ]
    else:
        kv = n_fit * shape.kv_bytes_per_token
        ok = n_fit > 0 and scores <= kv
        why = [
            f"{head} beside a {n_fit:,}-token cache ({kv / GiB:.1f} GiB)"
            + ("" if ok else ": more than the cache they serve")
        ]
    if ok and batch_size is not None and mm < batch_size:
        why.append(
            f"at most {mm} requests per step (transformers caps them at the batch, initialization.py:286)"
        )
    return _Rung(Candidate(str(mm), ok, tuple(why)), goal, ok)


def decide_async(
    graphs: Decision,
    *,
    cache_tokens_for: Callable[[int], int],
    need_tokens: int | None,
    transformers_version: str | None,
) -> tuple[Decision, int]:
    """Async batching (``use_async_batching``) and the IO multiplier the cache is then sized with: 2 when on, since
    it doubles the IO tensors (cache.py:609), else 1. On only with graphs, and only where the doubled IO still
    leaves the cache the declared work needs. ``cache_tokens_for(io)``: the cache tokens that fit with that
    multiplier."""
    fill1 = cache_tokens_for(1)
    v = _version(transformers_version)
    async_cands: list[Candidate] = []
    if v is not None and v[:2] < CB_CONFIG_FROM:
        async_dec = Decision(
            "unavailable",
            (f"transformers {transformers_version} has no ContinuousBatchingConfig.use_async_batching",),
            (Candidate("on", False, ("not in this transformers",)), Candidate("off", True, ())),
        )
        io = 1
    else:
        fill2 = cache_tokens_for(2)
        on_ok = graphs.choice == "on"
        why_on: list[str] = []
        if not on_ok:
            why_on.append("without graphs the host is busy launching the current step: nothing to overlap")
        else:
            why_on.append("the host prepares the next batch while the graph replays")
        if on_ok and need_tokens is not None and fill2 < need_tokens <= fill1:
            on_ok = False
            why_on.append(
                f"the doubled IO tensors would shrink the cache below the declared {need_tokens:,} tokens"
            )
        if on_ok and need_tokens is None and fill2 < 0.9 * fill1:
            on_ok = False
            why_on.append(
                f"the doubled IO tensors cost {100 * (1 - fill2 / max(fill1, 1)):.0f}% of the cache"
            )
        elif on_ok:
            why_on.append("its doubled IO tensors are counted in the cache budget (cache.py:609)")
        async_cands = [
            Candidate("on", on_ok, tuple(why_on)),
            Candidate("off", True, ("one set of IO tensors; the host prepares each batch between steps",)),
        ]
        choice = "on" if on_ok else "off"
        async_dec = Decision(choice, async_cands[0].reasons, tuple(async_cands))
        io = 2 if on_ok else 1
    return async_dec, io
