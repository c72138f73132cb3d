"""The attention functions behind ``cudaload_sdpa`` and ``cudaload_sdpa_nocudnn`` (why: cudaload.policies.sdpa_dispatch).

Both are transformers' own ``sdpa_attention_forward`` (same masks, GQA handling, causal flags and outputs)
called with torch's cuDNN SDPA backend switched off for the call: ``cudaload_sdpa_nocudnn`` for every call;
``cudaload_sdpa`` for a problem shape this thread has met in too few earlier calls of the same layer for cuDNN's
graph build to pay (``recur_threshold``: :data:`RECUR` for prompts, more for padded decode steps, never for
unpadded ones). cuDNN's execution graphs are built per shape and cached per thread, so a shape met for the first
times runs flash / memory-efficient attention (no build), and a shape that keeps recurring goes to cuDNN,
whose graph is then built once and reused (it is equal or faster there: up to 10% in prefill, and more in
padded decode). The counts are per thread, like cuDNN's cache, and bounded (:data:`MAX_SHAPES`). They enter transformers through its
extension points, ``AttentionInterface.register`` and ``AttentionMaskInterface.register`` (transformers
5.17 ``modeling_utils.py`` :5067-5105 and ``masking_utils.py`` :712-726; the mask is sdpa's own
``sdpa_mask``): nothing of transformers is patched, and a model loaded with another attention is untouched.

Only the cuDNN flag is changed, only inside the call, and only when it is on: the other backends keep
whatever the user set, and the flag is restored before the call returns. The flag is torch's process-wide
setting, so another thread's SDPA call that runs at the same moment also skips cuDNN for that moment
(slower at worst, never different results). Under ``torch.compile`` the same rule is traced through
``torch.nn.attention.sdpa_kernel`` (which dynamo supports); the backend is then fixed at compile time.

A compiled decode step (generate()'s static-cache path: one query per sequence, a boolean mask over every
slot of the cache) runs :func:`grouped_decode_attention` instead: transformers' sdpa would repeat the key/value
heads (a mask rules out ``enable_gqa``, sdpa_attention.py:27-36) and torch then sends the call to the
memory-efficient kernel, which scans every slot with one block per head. Measured on the H200 (8B layer, bf16,
CUDA graphs; benchmarks/results/2026-12-03-h200/README.md): 64 / 251 / 492 us a layer at 1,024 /
4,096 / 8,192 slots, 18 ms of a decode step's 22 at 8,192, against 8 / 14 / 22 us grouped, near flash over the
valid slots alone (9 / 15 / 18 us).

:func:`register` is called by ``load_model`` before the model is built; importing this module registers
nothing. It imports torch and transformers, so cudaload imports it only when a load needs it.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

import torch

from ...policies.sdpa_dispatch import RECUR, RECUR_MASKED_DECODE, SDPA_DECODE, SDPA_NO_CUDNN, recur_threshold

__all__ = [
    "SDPA_DECODE",
    "SDPA_NO_CUDNN",
    "decode_backend",
    "grouped_decode",
    "grouped_decode_attention",
    "register",
    "registered",
]

_NON_CUDNN: list[Any] | None = None
#: shapes counted per thread before the counts start again (each entry is a few hundred bytes)
MAX_SHAPES = 1 << 18
_MET = threading.local()


def _non_cudnn_backends() -> list[Any]:
    global _NON_CUDNN
    if _NON_CUDNN is None:
        from torch.nn.attention import SDPBackend

        _NON_CUDNN = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
    return _NON_CUDNN


def _without_cudnn(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    if torch.compiler.is_compiling():
        from torch.nn.attention import sdpa_kernel

        with sdpa_kernel(_non_cudnn_backends()):
            return fn(*args, **kwargs)
    # eager: flip the one flag directly (0.4 us a call; sdpa_kernel's enter and exit cost ~30 us, which a
    # 36-layer model would pay 72 times per decode step)
    if not torch._C._get_cudnn_sdp_enabled():
        return fn(*args, **kwargs)
    torch._C._set_sdp_use_cudnn(False)
    try:
        return fn(*args, **kwargs)
    finally:
        torch._C._set_sdp_use_cudnn(True)


def _recurs(module: Any, query: torch.Tensor, key: torch.Tensor, mask: torch.Tensor | None) -> bool:
    """Whether this layer has met this problem shape in enough earlier calls on this thread for cuDNN's build to
    pay (``recur_threshold``: RECUR for prompts, more for padded decode steps, never unpadded ones); counted."""
    need = recur_threshold(int(query.shape[2]), mask is not None)
    if need is None:
        return False
    counts: dict[Any, int] | None = getattr(_MET, "counts", None)
    if counts is None:
        counts = _MET.counts = {}
    k = (
        getattr(module, "layer_idx", None),
        query.shape,
        key.shape,
        None if mask is None else mask.shape,
        query.dtype,
        query.device,
    )
    n = counts.get(k, 0)
    if n < need:
        if len(counts) >= MAX_SHAPES:
            counts.clear()
        counts[k] = n + 1
        return False
    return True


def grouped_decode_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor,
    scaling: float | None,
) -> tuple[torch.Tensor, None]:
    """Attention of a few queries per sequence over a masked cache, the query heads grouped by the key/value head
    they share, so each key/value head is read once and nothing is repeated: two batched matmuls and a softmax
    in fp32, the arithmetic of transformers' ``eager_attention_forward`` (bf16 scores, fp32 softmax). Returns
    transformers' layout (batch, queries, heads, head_dim)."""
    b, hq, lq, d = query.shape
    hkv = key.shape[1]
    g = hq // hkv
    # (b, hkv, g*lq, d): the g query heads of one key/value head are adjacent (repeat_kv's order)
    qg = query.reshape(b, hkv, g * lq, d)
    scores = torch.matmul(qg, key.transpose(-1, -2)).float() * (d**-0.5 if scaling is None else scaling)
    scores = scores.view(b, hkv, g, lq, -1)
    # the mask (b or 1, 1, lq, slots) broadcast over the heads; finfo.min, not -inf: no NaN on an empty row
    scores = scores.masked_fill(~attention_mask[:, :, None], torch.finfo(torch.float32).min)
    probs = torch.softmax(scores, dim=-1).to(value.dtype).view(b, hkv, g * lq, -1)
    out = torch.matmul(probs, value).view(b, hq, lq, value.shape[-1])
    return out.transpose(1, 2).contiguous(), None


#: the most queries per sequence that :func:`grouped_decode_attention` takes in a compiled step (a decode step
#: has one; a few more are speculative decoding's candidates); prefill is never compiled by generate()
GROUPED_MAX_QUERIES = 8


def _grouped_applies(
    query: torch.Tensor, key: torch.Tensor, attention_mask: torch.Tensor | None, kwargs: dict[str, Any]
) -> bool:
    """A compiled decode step whose attention :func:`grouped_decode_attention` computes as sdpa does, to eager's
    precision (bf16 scores: within bf16 tolerance of sdpa's fp32 ones, not bit-equal): a boolean mask of one
    head (what sdpa_mask builds), whole groups of heads, nothing else sdpa would add or refuse (a position
    bias, dropout, causal alignment of a mask-less call, soft-capping, attention sinks)."""
    return (
        attention_mask is not None
        and attention_mask.dtype == torch.bool
        and attention_mask.dim() == 4
        and attention_mask.shape[1] == 1
        and attention_mask.shape[2] == query.shape[2]
        and query.shape[2] <= GROUPED_MAX_QUERIES
        and query.shape[1] % key.shape[1] == 0
        and kwargs.get("position_bias") is None
        # sdpa refuses soft-capping and has no sinks; dropping them here would change the model's attention
        and kwargs.get("softcap") is None
        and kwargs.get("s_aux") is None
        and kwargs.get("sinks") is None
        and not kwargs.get("dropout")
        and not kwargs.get("output_attentions")
    )


_GROUPED = threading.local()


@contextlib.contextmanager
def grouped_decode() -> Iterator[None]:
    """Inside: this thread's decode steps run :func:`grouped_decode_attention` as a compiled step does (the
    graphed decode captures them: :mod:`cudaload.execute.runtime.graphed_step`)."""
    before = getattr(_GROUPED, "on", False)
    _GROUPED.on = True
    try:
        yield
    finally:
        _GROUPED.on = before


def _compiled_decode_step(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    kwargs: dict[str, Any],
) -> tuple[torch.Tensor, None] | None:
    """Both variants' rule inside a compiled or captured step (:func:`grouped_decode`): a decode step
    :func:`_grouped_applies` to runs grouped (its result), anything else None (the variant's own path)."""
    inside = torch.compiler.is_compiling() or getattr(_GROUPED, "on", False)
    if inside and attention_mask is not None and _grouped_applies(query, key, attention_mask, kwargs):
        return grouped_decode_attention(query, key, value, attention_mask, kwargs.get("scaling"))
    return None


def sdpa_decode_forward(
    module: Any,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """transformers' sdpa; cuDNN left out unless this shape recurs (see the module's docstring)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    grouped = _compiled_decode_step(query, key, value, attention_mask, kwargs)
    if grouped is not None:
        return grouped
    # a compiled graph fixes its kernels when traced: no counting there, cuDNN stays out (new lengths under
    # dynamic shapes would each build a graph)
    if torch.compiler.is_compiling() or not _recurs(module, query, key, attention_mask):
        return _without_cudnn(sdpa_attention_forward, module, query, key, value, attention_mask, **kwargs)  # type: ignore[no-any-return]
    return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)  # type: ignore[no-any-return]


def sdpa_no_cudnn_forward(
    module: Any,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """transformers' sdpa with cuDNN left out of every call (a compiled decode step: grouped, as above)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    grouped = _compiled_decode_step(query, key, value, attention_mask, kwargs)
    if grouped is not None:
        return grouped
    return _without_cudnn(sdpa_attention_forward, module, query, key, value, attention_mask, **kwargs)  # type: ignore[no-any-return]


_FUNCTIONS = {SDPA_DECODE: sdpa_decode_forward, SDPA_NO_CUDNN: sdpa_no_cudnn_forward}


def registered() -> list[str]:
    """The variants transformers knows in this process."""
    from transformers import AttentionInterface

    return [n for n in _FUNCTIONS if AttentionInterface._global_mapping.get(n) is _FUNCTIONS[n]]


def register() -> None:
    """Make both names valid ``attn_implementation`` values in this process (idempotent)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    for name, fn in _FUNCTIONS.items():
        AttentionInterface.register(name, fn)
        # the mask transformers builds for sdpa (bool, skipped when causal and unpadded)
        AttentionMaskInterface.register(name, sdpa_mask)


def decode_backend(
    device: torch.device | str,
    dtype: torch.dtype,
    heads: int,
    kv_heads: int,
    head_dim: int,
    *,
    kv_len: int = 1024,
) -> dict[str, str]:
    """Which backend torch's own SDPA picks for a decode step on ``device``, as transformers calls it: with no
    mask (GQA passed as ``enable_gqa``) and with a padding mask (keys repeated), the cuDNN flag as the process
    has it. Asks torch's selector (``torch._fused_sdp_choice``); runs no kernel."""
    from torch.nn.attention import SDPBackend

    names = {int(b.value): n.lower() for n, b in SDPBackend.__members__.items()}
    q = torch.zeros(1, heads, 1, head_dim, device=device, dtype=dtype)
    k = torch.zeros(1, kv_heads, kv_len, head_dim, device=device, dtype=dtype)
    out: dict[str, str] = {}
    gqa = heads != kv_heads
    out["no_mask"] = names.get(int(torch._fused_sdp_choice(q, k, k, None, 0.0, False, enable_gqa=gqa)), "?")
    kr = k.repeat_interleave(heads // kv_heads, dim=1) if gqa else k
    mask = torch.ones(1, 1, 1, kv_len, device=device, dtype=torch.bool)
    out["padded"] = names.get(int(torch._fused_sdp_choice(q, kr, kr, mask, 0.0, False)), "?")
    return out


def confirm(model: Any) -> tuple[bool, dict[str, str], str]:
    """After the load: does torch send this model's decode steps to cuDNN on its GPU? (keep the variant, the
    dispatch seen, why). Where it does not, the variant would run what sdpa runs, and the caller keeps sdpa."""
    try:
        p = next(p for p in model.parameters() if p.device.type != "meta")
    except StopIteration:
        return True, {}, "no parameters to check the dispatch on"
    if p.device.type != "cuda":
        return False, {}, f"the model is on {p.device.type}: no cuDNN attention there"
    text = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    heads = int(getattr(text, "num_attention_heads", 0) or 0)
    kv = int(getattr(text, "num_key_value_heads", 0) or heads)
    hd = int(getattr(text, "head_dim", 0) or (int(getattr(text, "hidden_size", 0)) // max(1, heads)))
    if not heads or not hd:
        return True, {}, "the model's attention shape is unknown: not checked"
    dtype = p.dtype if p.dtype in (torch.float16, torch.bfloat16) else torch.bfloat16
    seen = decode_backend(p.device, dtype, heads, kv, hd)
    if "cudnn_attention" in seen.values():
        why = (
            f"torch sends decode steps to cuDNN here ({seen}): cuDNN left out of each shape until met often enough "
            f"to repay its build ({RECUR} times for a prompt, {RECUR_MASKED_DECODE} for a padded decode step, never "
            "for an unpadded one)"
        )
        return True, seen, why
    return (
        False,
        seen,
        f"torch does not send decode steps to cuDNN here ({seen}): plain sdpa runs the same kernels",
    )
