"""The paged KV cache's memory: transformers' own footprint polynomial (5.17 cache.py:565-814), evaluated
before loading, and the per-layer transient of the masked paged kernels (sdpa, eager) that transformers' check
leaves out (see the package docstring for the cited shapes); and :func:`settle`, the planned cache against the
memory measured after loading.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from ...dtypes import dtype_bytes
from ...errors import DoesNotFitError
from ...plans.serving import TF_DEFAULT_BLOCK_SIZE, ServingPlan
from ..memory import GiB

#: transformers' defaults this plan departs from or keeps (5.17 file:line)
#: (TF_DEFAULT_BLOCK_SIZE, configuration_utils.py:1753, lives with ServingPlan in cudaload.plans.serving)
TF_DEFAULT_MAX_BATCH_TOKENS = 8192  # cache.py:579 (_default_max_batch_tokens)
TF_MIN_MAX_BATCH_TOKENS = 256  # cache.py:578
TF_Q_PADDING = 64  # initialization.py:34 (graph query padding, tokens)
TF_KV_PADDING = 64 * 256  # initialization.py:35 (graph KV padding, tokens)
TF_MAX_REQUESTS = 1024  # initialization.py:32
TF_FIFO_SAFETY_MARGIN = 0.15  # scheduler.py:337: prefill admission stops below 15% free blocks


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
