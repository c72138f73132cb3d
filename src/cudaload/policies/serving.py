"""Serving: the settings transformers' continuous batching runs with, planned from memory.

transformers 5 serves many requests at once through ``model.generate_batch(...)`` /
``model.init_continuous_batching(...)`` / ``model.continuous_batching_context_manager(...)``: a paged KV cache
(``PagedAttentionCache``), a scheduler that admits requests while blocks are free and queues the rest, and the
``paged|...`` attention implementations. Everything it reads comes from one ``ContinuousBatchingConfig``
(transformers 5.17 generation/configuration_utils.py:1674-1790). cudaload re-implements none of it: this policy
decides the values of those fields and why, and the model is handed to transformers' own API with them.

Decided here, each as a :class:`~cudaload.decision.Decision` with every candidate:

* ``attention``: a paged flash form when one is usable here (measured on the H200: paged flash_attention_4
  served 3.5-5.3x the tokens/s of paged sdpa, run10-serving-fa4-t522), else the paged form of the attention
  decision's choice. The attention decision weighs one ``generate()`` batch, where masks and padding pick the
  winner; continuous batching attends per request with flash and through one dense mask with sdpa/eager, so for
  intent="serving" the planner loads the implementation whose paged form serves. flash-attn-4's paged form needs
  transformers >= 5.19 (:data:`FA4_PAGED_FROM`). transformers 5.17
  registers ``paged|flash_attention_{2,3,4}``, ``paged|sdpa`` and ``paged|eager`` (modeling_utils.py:5082-5086);
  from 5.19 the prefix is dropped except for ``paged|eager`` (5.19.0 modeling_utils.py:1737-1749 strips it with a
  FutureWarning, as 5.22.2 :1732-1744 and 5.24.0 :1733-1745 still do). sdpa and eager need a dense block-diagonal mask over every key the batch reads
  (continuous_batching/utils.py:54-56, ``attn_mask_is_needed``); flash does not.
* ``cuda_graphs``: transformers' own rule turns graphs on iff no mask is needed (continuous_batching/
  initialization.py:228-247): padded shapes cost masked kernels more. cudaload decides with the numbers instead:
  on when the host's launches for a step exceed 1.5 x the step's padded bandwidth floor (weights and KV read
  once) and the capture cost is repaid by the expected run. The floor is not the step time: masked paged steps
  measured 90 ms (Qwen3-0.6B, 64 requests) against a 0.25 ms weights-only bound on the H200
  (benchmarks/results/2026-12-01-h200/run5-serving, run7-serving, run8-serving); what graphs measurably bring is
  quoted from there, not estimated.
* ``async_batching``: double-buffered inputs so the host prepares batch n+1 while the GPU runs batch n
  (``use_async_batching``, configuration_utils.py:1774-1778; transformers defaults it to graphs-and-no-mask,
  initialization.py:252-267). It doubles the IO tensors (cache.py:609, ``io_multiplier``), so it is on only with
  graphs and only where the doubled IO still leaves the KV cache the work needs.
* ``block_size``: tokens per KV block (configuration_utils.py:1753, default 256).
* ``num_blocks`` / ``max_batch_tokens``: from the memory left after weights, the CUDA context, one layer's working
  set and a stated headroom, through the same memory polynomial transformers checks the pair against
  (cache.py:565-814, ``PagedAttentionMemoryHandler``), so transformers' own ``_check_footprint`` (cache.py:733-742)
  accepts them.

* ``max_batch_tokens``: transformers' default (8192, cache.py:579) or the declared work when smaller; for
  ``paged|eager`` lowered until the attention scores it materialises fit beside the cache (below), else the plan
  switches to ``paged|sdpa`` or refuses.

The masked paths' per-layer transient (5.17; K = the keys one step attends, at most cache tokens + batch tokens,
the mask's width, input_outputs.py:185-190, 472; with graphs transformers pads the KV read to 16384-token steps,
model_runner.py:86, and warms up at the largest shape, model_runner.py:241-244):

* both: the K/V gathered from the cache (``index_select``, cache.py:434-435), 2 x K x kv_heads x head_dim, and
  their copies repeated to every query head (``repeat_kv``, eager_paged.py:15-16 called at :49-50; sdpa_paged.py:
  94-95 called at :128-130), 2 x K x heads x head_dim, in the model dtype;
* ``paged|eager`` also: the scores ``matmul(query, key^T) * scaling`` and ``+ mask`` (eager_paged.py:60-62),
  heads x q x K in the model dtype, then ``softmax(..., dtype=torch.float32).to(query.dtype)`` (eager_paged.py:75).
  torch converts a bfloat16 input to a float32 copy before the softmax writes a second float32 tensor (its fused
  half-to-float kernel is for float16 on CUDA only: aten/src/ATen/native/SoftMax.cpp, ``softmax``), so bfloat16
  holds 2 + 4 + 4 = 10 bytes a score at the softmax (float16 and float32: 8; :func:`eager_score_bytes`). The
  measured OOM (Qwen3-0.6B, block 256 x 752 blocks, 8192 batch tokens, H200,
  benchmarks/results/2026-12-01-h200/run7-serving/serving2.log:15,19) is one of those float32 tensors:
  16 x 8192 x (65,536 padded + 8192) x 4 B = 36.00 GiB in a step (the only padded shape that gives 36.00),
  16 x 8192 x (192,512 + 8192) x 4 B = 98.00 GiB in the warm-up;
* ``paged|sdpa``: torch's fused kernels for a masked call (cuDNN, memory-efficient) hold no scores.

transformers' own memory check (cache.py:565-814) counts neither the repeated K/V (5.17) nor the scores; the plan
counts both.

Bad input never reaches an out-of-memory crash: a declared request longer than the whole KV budget (beside
``paged|eager``'s scores where it runs) is a :class:`~cudaload.errors.DoesNotFitError` at planning time; more concurrent requests than blocks is a warning,
because transformers' scheduler queues requests until blocks free up (scheduler.py:122-143, 253-265).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from ..decision import Candidate, Decision
from ..detection.versions import version_tuple as _version
from ..errors import DoesNotFitError
from .dtype import dtype_bytes
from .memory import CUDA_CONTEXT_BYTES, GiB
from .memory import estimate as memory_estimate

#: transformers' defaults this plan departs from or keeps (5.17 file:line)
TF_DEFAULT_BLOCK_SIZE = 256  # configuration_utils.py:1753
TF_DEFAULT_MAX_BATCH_TOKENS = 8192  # cache.py:579 (_default_max_batch_tokens)
TF_MIN_MAX_BATCH_TOKENS = 256  # cache.py:578
TF_Q_PADDING = 64  # initialization.py:34 (graph query padding, tokens)
TF_KV_PADDING = 64 * 256  # initialization.py:35 (graph KV padding, tokens)
TF_MAX_REQUESTS = 1024  # initialization.py:32
TF_FIFO_SAFETY_MARGIN = 0.15  # scheduler.py:337: prefill admission stops below 15% free blocks

#: flash-attn's ``flash_attn_with_kvcache`` with a block table (the FA2/FA3 decode fast path transformers uses,
#: initialization.py:114-146) wants page_block_size a multiple of 256 (flash-attn 2.8.3
#: flash_attn/flash_attn_interface.py, flash_attn_with_kvcache docstring: "page_block_size must be a multiple of 256")
FLASH_PAGE_MULTIPLE = 256
BLOCK_SIZES = (256, 128, 64, 32, 16)

#: Headroom kept free on each device beyond what is counted: allocator fragmentation, cuBLAS workspaces,
#: the CUDA-graph pool's private segments. 5% of the device, at least 1 GiB.
HEADROOM_FRACTION = 0.05
HEADROOM_MIN = 1 * GiB

#: Host time to launch one decoder layer's kernels in an eager forward on the H200 host (torch 2.11 + cu130):
#: generate() at batch 1 ran ~60 ms a token for the 28-layer Qwen3-0.6B shape and ~87 ms (11.5 tok/s) for the
#: 36-layer 8B shape, both against a < 4 ms bandwidth floor (/work/shared/device/README.md, 2026-11-29), i.e.
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

#: the first transformers version whose flash/sdpa paged forms drop the "paged|" prefix: 5.19.0
#: modeling_utils.py:1737-1749 strips it with a FutureWarning announcing its removal in 5.23 (5.22.2 :1732-1744 and
#: 5.24.0 :1733-1745 still strip it), and its manager accepts "sdpa" and flash names as they are (5.19.0
#: continuous_api.py:770-775); 5.18 registers the prefixed names (modeling_utils.py:5125-5129)
PLAIN_NAMES_FROM = (5, 19)
#: ContinuousBatchingConfig with use_async_batching / use_cuda_graph exists from transformers 5.17 (the oldest
#: cudaload supports); before it the knobs lived on GenerationConfig
CB_CONFIG_FROM = (5, 17)

_PAGED = {
    "flash_attention_2": "paged|flash_attention_2",
    "flash_attention_3": "paged|flash_attention_3",
    "flash_attention_4": "paged|flash_attention_4",
    "sdpa": "paged|sdpa",
    "eager": "paged|eager",
}
_MASKED = frozenset({"paged|sdpa", "paged|eager"})
#: FA2/FA3 have transformers' decode fast path (block table + flash_attn_with_kvcache, initialization.py:122)
_FAST_DECODE = frozenset({"paged|flash_attention_2", "paged|flash_attention_3"})


def hbm_bandwidth(gpu_name: str | None) -> float:
    name = (gpu_name or "").upper()
    for key, bw in HBM_BYTES_S.items():
        if key in name:
            return bw
    return HBM_FALLBACK


def transformers_name(paged: str, transformers_version: str | None) -> str:
    """The ``attn_implementation`` string the installed transformers wants for a paged implementation."""
    v = _version(transformers_version)
    if v is not None and v[:2] >= PLAIN_NAMES_FROM and paged != "paged|eager":
        return paged.removeprefix("paged|")
    return paged


# ------------------------------------------------------------------------------------------------------------------
# memory: transformers' own polynomial (5.17 cache.py:565-814), evaluated before loading
# ------------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class CacheShape:
    """What the paged cache's footprint depends on, per device."""

    layers: int
    kv_heads: int  # per device (divided by the tensor-parallel size when it divides them)
    head_dim: int
    heads: int  # query heads per device
    hidden: int
    vocab: int
    dtype_bytes: int
    masked: bool  # sdpa/eager need the dense attention mask
    fast_decode: bool  # FA2/FA3 block table
    sliding: bool = False  # a sliding-window group exists (a second mask)
    # transformers >= 5.22 also counts the K/V read back from the cache with masked kernels' repeated heads
    # (generation/continuous_batching/cache.py, 5.22.2 :575-578, 5.24 :582-586: kv_heads_at_peak =
    # 2 * heads + kv_heads, else 2 * kv_heads)
    repeated_kv_peak: bool = False
    # bytes per element of the [heads, q, K] scores paged|eager holds at its softmax (eager_score_bytes); 0 for
    # kernels that materialise none. transformers' check leaves them out; the plan counts them.
    score_bytes: int = 0

    @property
    def page(self) -> int:
        """Elements of one token's K (or V) in one layer (cache.py:596, page_size)."""
        return self.kv_heads * self.head_dim

    @property
    def kv_bytes_per_token(self) -> int:
        """K and V of one token in every layer (cache.py:771: 2 * group_size * page_size * dtype, one group)."""
        return 2 * self.layers * self.page * self.dtype_bytes


def _eager_score_phases(dtype: str) -> tuple[int, int]:
    """Bytes per attention score alive at paged|eager's softmax and at its cast back (5.17 eager_paged.py:75,
    ``softmax(attn_weights, dim=-1, dtype=torch.float32).to(query.dtype)``), the masked scores of :60-62 alive
    throughout. torch's ``softmax(input, dim, dtype)`` (aten/src/ATen/native/SoftMax.cpp) has a fused
    half-to-float kernel for float16 on CUDA only; any other input is first converted (``input_.toType(dtype)``,
    a float32 copy) and then softmaxed into a second float32 tensor. The cast of a float32 result to float32 is a
    no-op."""
    b = dtype_bytes(dtype)
    if dtype == "float32":
        return 4 + 4, 4 + 4  # the conversion returns the input itself
    if dtype == "float16":
        return b + 4, b + 4 + b  # fused half_to_float: one float32 tensor
    return b + 4 + 4, b + 4 + b  # bfloat16 and the rest: the float32 copy and the float32 softmax


def eager_score_bytes(dtype: str) -> int:
    """Bytes per attention score that ``paged|eager`` holds at its peak: 10 for bfloat16 (the scores, their float32
    copy and the float32 softmax), 8 for float16 on CUDA and for float32 (see :func:`_eager_score_phases`)."""
    return max(_eager_score_phases(dtype))


def pad_to_interval(size: int, interval: int, cap: int) -> int:
    """transformers' padding of a graph shape (5.17 continuous_batching/utils.py:59-64)."""
    if interval <= 0:
        return cap
    padded = math.ceil(size / interval) * interval if size > 0 else interval
    return min(padded, cap)


def step_keys(
    q_tokens: int, kv_read: int, *, cache_tokens: int, max_batch_tokens: int, graphs: bool
) -> tuple[int, int]:
    """(query tokens, keys attended) of one varlen step as transformers 5.17 shapes it: with graphs the query is
    padded to 64-token steps and the KV read to 16384-token steps, capped at the batch and the cache
    (model_runner.py:78-91); the attention reads the KV plus the new tokens (input_outputs.py:472, ``kv_size``)."""
    if graphs:
        q_tokens = pad_to_interval(q_tokens, TF_Q_PADDING, max_batch_tokens)
        kv_read = pad_to_interval(kv_read, TF_KV_PADDING, cache_tokens)
    return q_tokens, kv_read + q_tokens


def warmup_keys(*, cache_tokens: int, max_batch_tokens: int) -> tuple[int, int]:
    """The largest step, which transformers' graph warm-up runs first "to get the biggest pool" (5.17
    model_runner.py:241-244: max_batch_tokens queries over the whole cache less them)."""
    return step_keys(
        max_batch_tokens,
        cache_tokens - max_batch_tokens,
        cache_tokens=cache_tokens,
        max_batch_tokens=max_batch_tokens,
        graphs=True,
    )


def masked_step_transient(
    *, heads: int, kv_heads: int, head_dim: int, dtype: str, q_tokens: int, keys: int, eager: bool
) -> dict[str, int]:
    """Bytes one layer of a masked paged attention step allocates beyond the cache and the static mask (5.17):

    * ``gathered_kv``: K and V read from the cache for every key (cache.py:434-435, ``index_select``);
    * ``repeated_kv``: both expanded to every query head (``repeat_kv``: expand + reshape copies, eager_paged.py:
      15-16, 49-50; sdpa_paged.py:94-95, 128-130); the gathered copies die as each is repeated;
    * eager only: ``scores`` (matmul * scaling, + mask: eager_paged.py:60-62, model dtype), ``softmax_fp32`` (one
      float32 tensor of the same shape, eager_paged.py:75; ``fp32_at_softmax`` of them alive at once, see
      :func:`_eager_score_phases`) and ``softmax_cast`` (``.to(query.dtype)``, same line);
    * ``peak``: the largest live set: the repeat of V (gathered V + both repeated), or eager's softmax or cast
      (both repeated + the score tensors alive then)."""
    b = dtype_bytes(dtype)
    per_key = keys * head_dim * b
    terms = {"gathered_kv": 2 * kv_heads * per_key, "repeated_kv": 2 * heads * per_key}
    peak = (2 * heads + kv_heads) * per_key
    if eager:
        n = heads * q_tokens * keys
        at_softmax, _ = _eager_score_phases(dtype)
        terms["scores"] = n * b
        terms["softmax_fp32"] = n * 4
        # float32 tensors beside the scores at the softmax (the scores themselves are the float32 one for float32)
        terms["fp32_at_softmax"] = (at_softmax - b) // 4
        terms["softmax_cast"] = 0 if dtype == "float32" else n * b
        peak = max(peak, terms["repeated_kv"] + n * eager_score_bytes(dtype))
    terms["peak"] = peak
    return terms


def footprint_coefficients(
    s: CacheShape, *, io_multiplier: int, max_blocks_per_request: int
) -> list[tuple[int, int, int, int]]:
    """Per activation peak: (per batch token M, per cache token N, per M*N, per M^2) bytes, as transformers 5.17
    computes them (cache.py:621-641 activation_peak, 770-804 _equation_coefficients)."""
    a = s.dtype_bytes  # activations and cache share the dtype (cache.py:598-599)
    i = 4  # int32
    k = io_multiplier
    masks = (2 if s.sliding else 1) if s.masked else 0
    groups = 1
    lm_head_m = s.hidden * a + s.vocab * 4  # hidden states + fp32 logits of every batch token
    attn_m = a * (s.hidden + s.heads * s.head_dim + 2 * s.page)
    attn_n = 2 * s.page * a  # old K and V read from the cache, whole cache in the worst case
    if s.repeated_kv_peak:
        at_peak = (2 * s.heads + s.kv_heads) if s.masked else 2 * s.kv_heads
        attn_m += a * at_peak * s.head_dim
        attn_n = max(attn_n, at_peak * s.head_dim * a)
    io_m = k * 7 * i + k * 1 * i + k * groups * max_blocks_per_request * i + k * groups * 8 + k * groups * 8
    cn_base = s.kv_bytes_per_token + k * groups * 8
    # eager's scores over M queries and K = N + M keys (masked_step_transient): M*N and M^2 terms of the attention
    # peak only; not doubled by async batching (one compute stream runs one step at a time)
    sc = s.heads * s.score_bytes
    return [
        (dm + io_m, dn + cn_base, k * masks * a + dsc, k * masks * a + dsc)
        for dm, dn, dsc in ((lm_head_m, 0, 0), (attn_m, attn_n, sc))
    ]


def footprint(
    s: CacheShape, m: int, n_tokens: int, *, io_multiplier: int, max_blocks_per_request: int
) -> int:
    """Bytes of the paged cache and the batch buffers: the largest peak (cache.py:806-814)."""
    return max(
        cn * n_tokens + cm * m + cmn * m * n_tokens + cmm * m * m
        for cm, cn, cmn, cmm in footprint_coefficients(
            s, io_multiplier=io_multiplier, max_blocks_per_request=max_blocks_per_request
        )
    )


def solve_cache_tokens(
    s: CacheShape, m: int, budget: int, *, io_multiplier: int, max_blocks_per_request: int
) -> int:
    """Largest cache size in tokens whose footprint with ``m`` batch tokens fits ``budget`` at every peak (linear
    in N, as cache.py:722-726 solves it, the minimum over peaks as cache.py:692-700)."""
    sizes = []
    for cm, cn, cmn, cmm in footprint_coefficients(
        s, io_multiplier=io_multiplier, max_blocks_per_request=max_blocks_per_request
    ):
        sizes.append(max(0, (budget - cm * m - cmm * m * m) // (cn + cmn * m)))
    return min(sizes)


# ------------------------------------------------------------------------------------------------------------------
# the section
# ------------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ServingPlan:
    """The serving section of a Plan: transformers' continuous-batching settings and why."""

    attention: Decision  # the paged attention implementation (cudaload's name, "paged|...")
    attn_implementation: str  # the string the installed transformers takes
    cuda_graphs: Decision  # "on" / "off"
    async_batching: Decision  # "on" / "off" / "unavailable"
    block_size: Decision  # "256", "128", ...
    num_blocks: int
    max_batch_tokens: int
    max_requests_per_batch: int | None
    max_memory_percent: float
    memory: dict[str, int] = field(
        default_factory=dict
    )  # bytes per device: weights, context, working set, ...
    kv_bytes_per_token: int = 0
    tensor_parallel: int = 1
    concurrent_requests: int | None = None  # declared requests (seq_len long) that fit at once
    notes: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    batch_tokens: Decision | None = None  # max_batch_tokens and why (None in plans saved before it existed)

    @property
    def cache_tokens(self) -> int:
        return self.num_blocks * int(self.block_size.choice or TF_DEFAULT_BLOCK_SIZE)

    def continuous_batching_config(self, fields: Iterable[str] | None = None) -> dict[str, Any]:
        """Keyword arguments for transformers' ``ContinuousBatchingConfig``. ``fields``: the installed class's
        field names (``dataclasses.fields``), so a renamed knob follows it (``block_size`` became ``page_size``
        by 5.22, configuration_utils.py:1901-1906 there) and an absent one is left out."""
        graphs = self.cuda_graphs.choice == "on"
        kw: dict[str, Any] = {
            "block_size": int(self.block_size.choice or TF_DEFAULT_BLOCK_SIZE),
            "num_blocks": self.num_blocks,
            "max_batch_tokens": self.max_batch_tokens,
            "max_memory_percent": self.max_memory_percent,
            "use_cuda_graph": graphs,
            "use_async_batching": self.async_batching.choice == "on",
        }
        if self.max_requests_per_batch is not None:
            kw["max_requests_per_batch"] = self.max_requests_per_batch
        if fields is None:
            return kw
        names = set(fields)
        if "auto_switch_to_flash" in names:
            # from 5.19 the manager swaps an sdpa/eager model to FA3/FA2 (package or Hub kernel) at its start unless
            # told not to (5.19 continuous_api.py:746-764, 5.24 :755-773): the plan's attention is the one served,
            # the one the cache was sized for and the attention decision checked (FA3 drops sinks, for one). 5.17
            # and 5.18 have no such field and switch whenever FA3/FA2 is available (5.17 continuous_api.py:660-668)
            kw["auto_switch_to_flash"] = False
        if "block_size" in kw and "page_size" in names:
            kw["page_size"] = kw.pop("block_size")
        return {k: v for k, v in kw.items() if k in names}

    def settings(self, fields: Iterable[str] | None = None) -> dict[str, Any]:
        """``{"attn_implementation": ..., "continuous_batching": {ContinuousBatchingConfig kwargs}}``."""
        return {
            "attn_implementation": self.attn_implementation,
            "continuous_batching": self.continuous_batching_config(fields),
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            "attention": self.attention.to_dict(),
            "attn_implementation": self.attn_implementation,
            "cuda_graphs": self.cuda_graphs.to_dict(),
            "async_batching": self.async_batching.to_dict(),
            "block_size": self.block_size.to_dict(),
            "num_blocks": self.num_blocks,
            "max_batch_tokens": self.max_batch_tokens,
            "max_requests_per_batch": self.max_requests_per_batch,
            "max_memory_percent": self.max_memory_percent,
            "memory": dict(self.memory),
            "kv_bytes_per_token": self.kv_bytes_per_token,
            "tensor_parallel": self.tensor_parallel,
            "concurrent_requests": self.concurrent_requests,
            "notes": list(self.notes),
            "warnings": list(self.warnings),
            "batch_tokens": self.batch_tokens.to_dict() if self.batch_tokens is not None else None,
            "continuous_batching_config": self.continuous_batching_config(),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ServingPlan:
        return cls(
            attention=Decision.from_dict(d["attention"]),
            attn_implementation=str(d["attn_implementation"]),
            cuda_graphs=Decision.from_dict(d["cuda_graphs"]),
            async_batching=Decision.from_dict(d["async_batching"]),
            block_size=Decision.from_dict(d["block_size"]),
            num_blocks=int(d["num_blocks"]),
            max_batch_tokens=int(d["max_batch_tokens"]),
            max_requests_per_batch=d.get("max_requests_per_batch"),
            max_memory_percent=float(d["max_memory_percent"]),
            memory={k: int(v) for k, v in d.get("memory", {}).items()},
            kv_bytes_per_token=int(d.get("kv_bytes_per_token", 0)),
            tensor_parallel=int(d.get("tensor_parallel", 1)),
            concurrent_requests=d.get("concurrent_requests"),
            notes=tuple(d.get("notes", ())),
            warnings=tuple(d.get("warnings", ())),
            batch_tokens=Decision.from_dict(d["batch_tokens"]) if d.get("batch_tokens") else None,
        )

    def explain_lines(self) -> list[str]:
        out = ["serving (transformers continuous batching):"]
        decisions = [
            ("attention", self.attention),
            ("cuda graphs", self.cuda_graphs),
            ("async batching", self.async_batching),
            ("block size", self.block_size),
        ]
        if self.batch_tokens is not None:
            decisions.append(("max batch tokens", self.batch_tokens))
        for label, dec in decisions:
            out.append(f"  {label}: {dec.choice}" + (f"  ({'; '.join(dec.reasons)})" if dec.reasons else ""))
            for c in dec.candidates:
                if c.name != dec.choice:
                    mark = "ok" if c.ok else "rejected"
                    out.append(f"      {c.name}: {mark}: {'; '.join(c.reasons)}")
        out.append(
            f"  KV cache: {self.num_blocks} blocks x {self.block_size.choice} tokens = {self.cache_tokens:,} tokens "
            f"({self.kv_bytes_per_token / 1024:.0f} KiB/token, {self.cache_tokens * self.kv_bytes_per_token / GiB:.1f}"
            f" GiB); max_batch_tokens {self.max_batch_tokens}; max_requests_per_batch {self.max_requests_per_batch}"
        )
        if self.memory:
            out.append(
                "  memory per device: " + ", ".join(f"{k} {v / GiB:.2f} GiB" for k, v in self.memory.items())
            )
        if self.tensor_parallel > 1:
            out.append(
                f"  tensor parallel over {self.tensor_parallel} GPUs: each rank holds its share of the cache"
            )
        out += [f"  note: {n}" for n in self.notes]
        out += [f"  WARNING: {w}" for w in self.warnings]
        kw = ", ".join(f"{k}={v!r}" for k, v in self.continuous_batching_config().items())
        out.append(f"  ContinuousBatchingConfig({kw}); attn_implementation={self.attn_implementation!r}")
        return out


# ------------------------------------------------------------------------------------------------------------------
# the decisions
# ------------------------------------------------------------------------------------------------------------------
#: the first transformers version whose paged flash path calls the varlen kernel with keywords: 5.19.0 strips the
#: "paged|" prefix (modeling_utils.py:5135-5140), so continuous batching runs the plain flash_attention_forward
#: (integrations/flash_attention.py:59-88, the paged cache updated there) -> modeling_flash_attention_utils.py
#: :828-847, ``cu_seqlens_q=...`` (same in 5.22.2 :840-859, 5.24.0 :842-861). 5.17 (flash_paged.py:72-79) and 5.18
#: (flash_paged.py:75-82, registered for "paged|flash_attention_4" and for a Hub kernel's "paged|<repo>",
#: 5.17 modeling_flash_attention_utils.py:279-282) pass ``cu_seq_lens_q`` 4th by position, where flash-attn-4
#: 4.0.0b36 takes ``qv`` (flash_attn/cute/interface.py:4214-4222): every request failed with
#: "'int' object has no attribute 'shape'" on the H200 (benchmarks/results/2026-12-01-h200/run9-serving-fa4-t517)
FA4_PAGED_FROM = (5, 19)
#: measured on the H200 (transformers 5.22.2, flash-attn-4 4.0.0b36, torch 2.11; 64 requests, prompts 128-2048,
#: 128-256 new tokens; benchmarks/results/2026-12-01-h200/run10-serving-fa4-t522)
MEASURED_FA4_PAGED = (
    "paged flash_attention_4 against paged sdpa with the same cache settings, H200, 64 requests: 1,617 vs 467 "
    "tok/s (Qwen3-0.6B shape, 11.6 vs 90 ms a decode step) and 1,489 vs 283 (8B, 19 vs 143 ms); "
    "benchmarks/results/2026-12-01-h200/run10-serving-fa4-t522"
)
#: paged eager against paged sdpa, cudaload's serving settings for attn="eager" in both (the named attention is
#: kept: a user may need eager's outputs; this says what it costs when the model also supports sdpa)
MEASURED_EAGER_PAGED = (
    "paged eager against paged sdpa with the same cache settings, H200, 64 requests (Qwen3-0.6B shape): 346 vs "
    "549 tok/s at 84 vs 25 GiB peak (benchmarks/results/2026-12-01-h200/run15-memtrain-servingeager): for "
    "serving pass attn='sdpa' or 'auto' unless you need eager"
)
#: the order cudaload prefers paged flash forms in when the attention decision chose none of them: transformers'
#: own order for continuous batching (FA3, then FA2: continuous_api.py:662-668, both with the decode fast path),
#: then FA4 (varlen only: flash_attn_with_kvcache is None for it, modeling_flash_attention_utils.py:178-181)
_FLASH_ORDER = ("flash_attention_3", "flash_attention_2", "flash_attention_4")


def _paged_blocker(impl: str, transformers_version: str | None) -> str | None:
    """Why transformers cannot run ``impl``'s paged form at this version (None: it can)."""
    v = _version(transformers_version) if transformers_version else None
    if impl == "flash_attention_4" and v is not None and v[:2] < FA4_PAGED_FROM:
        return (
            f"transformers {transformers_version} passes cu_seq_lens_q by position into flash-attn-4's qv argument "
            "(5.17 integrations/flash_paged.py:72-79, flash-attn-4 4.0.0b36 cute/interface.py:4214-4222): every "
            "request failed on the H200 (run9-serving-fa4-t517); transformers >= 5.19 passes keywords: upgrade "
            "transformers to serve with it"
        )
    return None


def choose_paged_attention(
    attention_choice: str,
    *,
    supports_sdpa: bool = True,
    usable: Iterable[str] | None = None,
    transformers_version: str | None = None,
) -> Decision:
    """The paged implementation continuous batching runs.

    ``usable``: every attention implementation the attention decision accepted (its ok candidates) when it chose
    automatically; a paged flash form among them is preferred over the attention decision's own choice, because
    that choice is made for one ``generate()`` batch, where masks and padding decide, while serving pages many
    requests, where sdpa and eager need a dense mask over every key the batch reads and flash attends per
    request. None: the caller named the attention; its paged form is used (where transformers can run it)."""
    base = attention_choice
    if base.startswith("kernels-community/"):
        from .attention import _KERNEL_TO_IMPL

        base = _KERNEL_TO_IMPL.get(base, base)
    ok_impls = {base} | set(usable or ())
    ok_impls = {i for i in ok_impls if i in _PAGED}
    preferred: str | None = None
    if usable is not None:
        order = ([base] if base.startswith("flash") else []) + [f for f in _FLASH_ORDER if f != base]
        preferred = next(
            (f for f in order if f in ok_impls and _paged_blocker(f, transformers_version) is None), None
        )
    cands: list[Candidate] = []
    for impl, paged in _PAGED.items():
        why: list[str] = []
        ok = True
        if impl == base:
            why.append(f"the attention decision chose {attention_choice}")
        if paged in _MASKED:
            why.append(
                "needs a dense block-diagonal mask over every key the batch reads (continuous_batching/utils.py:54)"
            )
        else:
            why.append("no mask: attends per request (varlen)")
        if paged in _FAST_DECODE:
            why.append("decode fast path with a block table (initialization.py:114-146)")
        if impl == "flash_attention_4":
            why.append(MEASURED_FA4_PAGED)
        blocker = _paged_blocker(impl, transformers_version)
        if impl.startswith("flash") and impl not in ok_impls:
            ok = False
            why.append(
                f"not the attention decision's choice ({attention_choice}): not installed or not supported"
                if usable is None
                else "not usable here: see the attention decision"
            )
        elif blocker is not None:
            ok = False
            why.append(blocker)
        if impl == "sdpa" and not supports_sdpa:
            ok = False
            why.append("the model does not support sdpa")
        if impl == "eager" and base != "eager":
            why.append("materialises the scores of every head over the batch's keys: last resort")
        cands.append(Candidate(paged, ok, tuple(why)))
    cands.append(
        Candidate(
            "flex_attention",
            False,
            (
                "no paged form: transformers 5.17 registers paged flash/sdpa/eager only (modeling_utils.py:5082-5086)",
            ),
        )
    )
    fallback = "paged|sdpa" if supports_sdpa else "paged|eager"
    reasons: list[str]
    if preferred is not None and preferred != base:
        choice = _PAGED[preferred]
        reasons = [
            f"{preferred} is usable here and its paged form attends per request without a mask; the attention "
            f"decision's {attention_choice} was chosen for one generate() batch"
        ]
        if preferred == "flash_attention_4":
            reasons.append(MEASURED_FA4_PAGED)
        else:
            reasons.append("not measured here; transformers' own first choice for continuous batching")
    elif base in _PAGED and _paged_blocker(base, transformers_version) is not None:
        # before the Hub-kernel branch: a Hub FA4 build goes through the same positional call (FA4_PAGED_FROM)
        choice = fallback
        reasons = [
            f"{attention_choice} cannot serve paged here: {_paged_blocker(base, transformers_version)}; "
            f"{choice} instead"
        ]
    elif attention_choice.startswith("kernels-community/") and base in _PAGED:
        # the Hub kernel itself, paged: transformers registers "paged|<repo>" when it loads the kernel
        # (modeling_flash_attention_utils.py:188-189)
        choice = f"paged|{attention_choice}"
        reasons = [f"paged form of the attention decision's {attention_choice}"]
        cands.insert(0, Candidate(choice, True, (f"the Hub kernel {attention_choice} provides {base}",)))
    elif base in _PAGED:
        choice = _PAGED[base]
        reasons = [f"paged form of the attention decision's {attention_choice}"]
        if base == "flash_attention_4":
            reasons.append(MEASURED_FA4_PAGED)
        if base == "eager" and supports_sdpa:
            reasons.append(MEASURED_EAGER_PAGED)
        # a flash implementation usable here whose paged form this transformers cannot run: say what it costs
        reasons += [
            f"{f} is usable here but cannot serve paged: {_paged_blocker(f, transformers_version)}"
            + (f" ({MEASURED_FA4_PAGED})" if f == "flash_attention_4" else "")
            for f in _FLASH_ORDER
            if usable is not None and f in ok_impls and f != base and _paged_blocker(f, transformers_version)
        ]
    else:  # flex_attention or an unknown kernel string: sdpa, or eager for models without sdpa
        choice = fallback
        reasons = [f"{attention_choice} has no paged form in transformers: {choice}"]
    return Decision(choice, tuple(reasons), tuple(cands))


def _kind(paged: str) -> str:
    """The implementation behind a paged name: "paged|kernels-community/flash-attn3" -> "flash_attention_3"."""
    name = paged.removeprefix("paged|")
    if name.startswith("kernels-community/"):
        from .attention import _KERNEL_TO_IMPL

        return _KERNEL_TO_IMPL.get(name, name)
    return name


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

    plain = replace(shape, score_bytes=0)
    kind = _score_dtype_text(dtype)
    cands: list[Candidate] = []
    reach_goal: str | None = None
    reach_need: str | None = None
    for mm in _batch_ladder(m_top):
        b = max(budget(mm), 0)
        n_fit = solve_cache_tokens(
            shape, mm, b, io_multiplier=io_multiplier, max_blocks_per_request=max_blocks_per_request
        )
        n_plan = min(n_fit, goal_tokens) if goal_tokens is not None else n_fit
        keys = (need_tokens if need_tokens is not None and n_fit < need_tokens else n_plan) + mm
        scores = shape.heads * mm * keys * shape.score_bytes
        head = (
            f"scores of {mm:,} x {keys:,} keys x {shape.heads} heads = {scores / GiB:.1f} GiB per layer step "
            f"({kind}, eager_paged.py:60-75)"
        )
        if need_tokens is not None:
            if n_fit >= need_tokens:
                ok = True
                why = [f"{head} fit beside the {n_plan:,}-token cache the declared work needs"]
                if goal_tokens is not None and n_fit >= goal_tokens and reach_goal is None:
                    reach_goal = str(mm)
                if reach_need is None:
                    reach_need = str(mm)
            else:
                ok = False
                left = b - footprint(
                    plain,
                    mm,
                    need_tokens,
                    io_multiplier=io_multiplier,
                    max_blocks_per_request=max_blocks_per_request,
                )
                why = [
                    f"{head}, more than the {max(left, 0) / GiB:.1f} GiB left beside the {need_tokens:,}-token cache "
                    f"the declared work needs (the device holds {n_fit:,} tokens beside them)"
                ]
        else:
            kv = n_fit * shape.kv_bytes_per_token
            ok = n_fit > 0 and scores <= kv
            if ok and reach_need is None:
                reach_need = str(mm)
            why = [
                f"{head} beside a {n_fit:,}-token cache ({kv / GiB:.1f} GiB)"
                + ("" if ok else ": more than the cache they serve")
            ]
        if ok and batch_size is not None and mm < batch_size:
            why.append(
                f"at most {mm} requests per step (transformers caps them at the batch, initialization.py:286)"
            )
        cands.append(Candidate(str(mm), ok, tuple(why)))
    pick = reach_goal or reach_need
    if pick is None:
        if (
            need_tokens is None
            and cands
            and solve_cache_tokens(
                shape,
                int(cands[-1].name),
                max(budget(int(cands[-1].name)), 0),
                io_multiplier=io_multiplier,
                max_blocks_per_request=max_blocks_per_request,
            )
            > 0
        ):
            # no declared work: the smallest step still leaves a cache; it is the most paged|eager can do
            last = cands[-1]
            return Decision(
                last.name,
                (f"paged|eager: the smallest step transformers allows; {last.reasons[0]}",),
                tuple(cands),
            )
        return Decision(
            None, ("paged|eager's scores leave no room for the cache at any step size",), tuple(cands)
        )
    chosen = next(c for c in cands if c.name == pick)
    lowered = f"max_batch_tokens lowered from {m_top} to {pick}: " if pick != str(m_top) else ""
    return Decision(pick, (f"paged|eager: {lowered}{chosen.reasons[0]}",), tuple(cands))


def _eager_to_sdpa(att: Decision, why: str) -> Decision:
    """The attention decision after paged|eager is rejected for memory: paged|sdpa, with the reason recorded."""
    cands = tuple(
        replace(c, ok=False, reasons=(*c.reasons, f"rejected: {why}")) if c.name == "paged|eager" else c
        for c in att.candidates
    )
    return Decision(
        "paged|sdpa",
        (
            f"paged|eager (the attention decision's eager, paged) does not fit: {why}; paged|sdpa computes the "
            "same masked attention in a fused kernel that holds no scores",
        ),
        cands,
    )


def plan_serving(
    info: Any,
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


def settle(
    section: ServingPlan,
    free_bytes: int,
    *,
    reserved_by_model: int = 0,
    longest_request: int | None = None,
) -> ServingPlan:
    """The plan's cache against the device memory measured after loading (a fact, passed in): never larger
    than planned, smaller when less is free than planned (another process, a bigger working set).

    Raises DoesNotFitError when what is free cannot hold the batch buffers and one block, or a cache for one
    ``longest_request`` (the declared seq_len): serving would then fail with an out-of-memory error at its first
    step or never start that request, and the caller frees the model instead."""
    m = section.memory
    usable = free_bytes - m.get("working_set", 0) - m.get("headroom", 0) - reserved_by_model
    planned = m.get("cache_and_buffers", 0)
    if planned <= 0 or usable >= planned:
        return section
    block = int(section.block_size.choice or TF_DEFAULT_BLOCK_SIZE)
    # the footprint is linear in the cache at a fixed step: scale the part that grows with it
    fixed = min(m.get("batch_buffers", 0), planned - 1)
    scale = max(usable - fixed, 0) / (planned - fixed)
    blocks = int(section.num_blocks * scale)
    need = max(1, -(-longest_request // block) if longest_request else 1)
    if blocks < need:
        what = f"one {longest_request:,}-token request" if longest_request else "one block"
        raise DoesNotFitError(
            f"serving: {free_bytes / GiB:.1f} GiB free after loading leaves room for {blocks} KV blocks "
            f"({blocks * block:,} tokens), less than {what} needs",
            reasons=[
                f"planned {section.num_blocks} blocks in {planned / GiB:.2f} GiB of cache and batch buffers "
                f"(batch buffers {fixed / GiB:.2f} GiB), {max(usable, 0) / GiB:.2f} GiB usable now",
            ],
            fix="free the GPU memory other processes hold (nvidia-smi), or plan a shorter seq_len, a smaller "
            "batch_size or quantization='int8'/'nf4'",
        )
    note = (
        f"measured {free_bytes / GiB:.1f} GiB free after loading, less than planned: "
        f"{section.num_blocks} -> {blocks} blocks ({blocks * block:,} tokens)"
    )
    return replace(
        section,
        num_blocks=blocks,
        memory={**m, "cache_and_buffers": fixed + int((planned - fixed) * scale)},
        notes=(*section.notes, note),
    )


__all__ = [
    "CacheShape",
    "ServingPlan",
    "choose_block_size",
    "choose_paged_attention",
    "decide_graphs",
    "footprint",
    "footprint_coefficients",
    "hbm_bandwidth",
    "plan_serving",
    "settle",
    "solve_cache_tokens",
    "transformers_name",
]
