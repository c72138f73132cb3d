"""Serving: the settings transformers' continuous batching runs with, planned from memory.

transformers 5 serves many requests at once through ``model.generate_batch(...)`` /
``model.init_continuous_batching(...)`` / ``model.continuous_batching_context_manager(...)``: a paged KV cache
(``PagedAttentionCache``), a scheduler that admits requests while blocks are free and queues the rest, and the
``paged|...`` attention implementations. Everything it reads comes from one ``ContinuousBatchingConfig``
(transformers 5.17 generation/configuration_utils.py:1674-1790). cudaload re-implements none of it: this policy
decides the values of those fields and why, and the model is handed to transformers' own API with them.

Decided here, each as a :class:`~cudaload.plans.Decision` with every candidate:

* ``attention``: a paged flash form when one is usable here (measured on the H200: paged flash_attention_4
  served 3.5-5.3x the tokens/s of paged sdpa, benchmarks/results/2026-12-01-h200/run10-serving-fa4-t522), else the paged form of the attention
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

Where each part lives (``from cudaload.policies.serving import X`` finds every one of them):

* :mod:`.paged_attention`: which paged implementation serves and the name transformers takes for it;
* :mod:`.kv_cache`: the cache's memory, transformers' polynomial and the masked kernels' transient, and
  :func:`settle` (the planned cache fitted to the memory measured after loading);
* :mod:`.batching`: block size, ``max_batch_tokens``, CUDA graphs, async batching;
* :mod:`.budget`: the device's room for the cache (weights, context, working set, headroom), the declared work in
  cache tokens, and the cache sized from both (a request the device cannot hold is refused here);
* :mod:`.plan`: :func:`plan_serving`, the section from those decisions;
* the section itself, :class:`~cudaload.plans.serving.ServingPlan`, is plan data: it lives below the policies in
  :mod:`cudaload.plans.serving`.
"""

from __future__ import annotations

from ...plans.serving import TF_DEFAULT_BLOCK_SIZE, ServingPlan
from .batching import (
    BLOCK_SIZES,
    CAPTURE_FORWARDS,
    CB_CONFIG_FROM,
    FLASH_PAGE_MULTIPLE,
    GRAPH_Q_SIZES,
    GRAPH_SPEEDUP_MIN,
    H200_LAUNCH_S_PER_LAYER,
    HBM_BYTES_S,
    HBM_FALLBACK,
    MEASURED_FLASH_GRAPHS,
    MEASURED_MASKED_STEPS,
    MEASURED_PLAN_VS_DEFAULTS,
    choose_batch_tokens,
    choose_block_size,
    decide_async,
    decide_graphs,
    hbm_bandwidth,
)
from .budget import HEADROOM_FRACTION, HEADROOM_MIN
from .kv_cache import (
    TF_DEFAULT_MAX_BATCH_TOKENS,
    TF_FIFO_SAFETY_MARGIN,
    TF_KV_PADDING,
    TF_MAX_REQUESTS,
    TF_MIN_MAX_BATCH_TOKENS,
    TF_Q_PADDING,
    CacheShape,
    eager_score_bytes,
    footprint,
    footprint_coefficients,
    masked_step_transient,
    pad_to_interval,
    settle,
    solve_cache_tokens,
    step_keys,
    warmup_keys,
)
from .kv_cache import _eager_score_phases as _eager_score_phases  # tests check the phases themselves
from .paged_attention import (
    FA4_PAGED_FROM,
    MEASURED_EAGER_PAGED,
    MEASURED_FA4_PAGED,
    PLAIN_NAMES_FROM,
    choose_paged_attention,
    transformers_name,
)
from .paged_attention import _eager_to_sdpa as _eager_to_sdpa  # tests check the fallback's record
from .plan import ServingDevice, ServingQuery, plan_serving, select_serving

__all__ = [
    "BLOCK_SIZES",
    "CAPTURE_FORWARDS",
    "CB_CONFIG_FROM",
    "FA4_PAGED_FROM",
    "FLASH_PAGE_MULTIPLE",
    "GRAPH_Q_SIZES",
    "GRAPH_SPEEDUP_MIN",
    "H200_LAUNCH_S_PER_LAYER",
    "HBM_BYTES_S",
    "HBM_FALLBACK",
    "HEADROOM_FRACTION",
    "HEADROOM_MIN",
    "MEASURED_EAGER_PAGED",
    "MEASURED_FA4_PAGED",
    "MEASURED_FLASH_GRAPHS",
    "MEASURED_MASKED_STEPS",
    "MEASURED_PLAN_VS_DEFAULTS",
    "PLAIN_NAMES_FROM",
    "TF_DEFAULT_BLOCK_SIZE",
    "TF_DEFAULT_MAX_BATCH_TOKENS",
    "TF_FIFO_SAFETY_MARGIN",
    "TF_KV_PADDING",
    "TF_MAX_REQUESTS",
    "TF_MIN_MAX_BATCH_TOKENS",
    "TF_Q_PADDING",
    "CacheShape",
    "ServingDevice",
    "ServingPlan",
    "ServingQuery",
    "choose_batch_tokens",
    "choose_block_size",
    "choose_paged_attention",
    "decide_async",
    "decide_graphs",
    "eager_score_bytes",
    "footprint",
    "footprint_coefficients",
    "hbm_bandwidth",
    "masked_step_transient",
    "pad_to_interval",
    "plan_serving",
    "select_serving",
    "settle",
    "solve_cache_tokens",
    "step_keys",
    "transformers_name",
    "warmup_keys",
]
