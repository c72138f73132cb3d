"""The attention function behind ``cudaload_varlen`` (why and where it is chosen: cudaload.policies.attention.torch_varlen_rules).

Packed training steps run torch's OWN flash kernels (FlashAttention-2, built into torch's CUDA wheels) over the
sequence boundaries, with a forward and a backward, and no flash-attn package:

- ``torch.nn.attention.varlen.varlen_attn`` where it takes ``scale`` and ``window_size`` (torch 2.11 and later:
  torch 2.11 ``nn/attention/varlen.py`` :159-250, a custom op with ``register_autograd`` :407; torch 2.13 the same
  plus an ``enable_gqa`` flag, which its varlen_attn requires when query and key heads differ);
- ``torch.ops.aten._flash_attention_forward`` otherwise (torch 2.9 and 2.10: 2.9 has no ``nn/attention/varlen``,
  2.10's varlen_attn takes neither a scale nor a window). The op is differentiable by itself: derivatives.yaml
  gives it ``_flash_attention_backward`` (torchgen/packaged/autograd/derivatives.yaml, 2.9 :2899-2901, 2.11
  :2905-2907), with the same schema in 2.9, 2.10, 2.11 and 2.13 for what is passed here (cum_seq_q/k, max_q/k,
  dropout_p, is_causal, scale, window_size_left/right: native_functions.yaml 2.9 :15036, 2.11 :15260).

It is transformers' attention-function signature, registered through its own extension points
(``AttentionInterface.register`` / ``AttentionMaskInterface.register``; nothing of transformers is patched), and
takes query / key / value as (batch, heads, tokens, head_dim). A call runs varlen when it is one row (batch 1)
whose keys are its queries (no cache content) and no mask was built for it; the boundaries are, in order:

1. ``cu_seq_lens_q`` / ``cu_seq_lens_k`` and ``max_length_q`` / ``max_length_k`` where the collator passed them
   (cudaload.train.data's ``PackedCollator(boundaries="cu_seq_lens")``, transformers' DataCollatorWithFlattening);
2. else derived from ``position_ids``, once per forward (the same tensor reaches every layer; the result is
   kept for it): a sequence starts wherever a position does not continue the previous one by +1, the rule
   transformers' masks use for sdpa (masking_utils.find_packed_sequence_indices, 5.17 :729-758), so the
   varlen call keeps exactly the sequences apart that sdpa's block-diagonal mask would. (transformers' flash
   path starts a sequence wherever the position equals the row's minimum, modeling_flash_attention_utils.
   prepare_fa_kwargs_from_position_ids, 5.17 :458-495: the same boundaries for position ids that restart at 0);
3. else the row is one sequence.

Every other call (a padding mask, a KV cache with earlier tokens, a decode step, batch > 1) goes to transformers'
own ``sdpa_attention_forward`` with the mask transformers built for sdpa: the same numbers plain sdpa gives. The
mask function registered with the name returns None exactly where this function runs varlen (one row, no
padding, no cache offset), and sdpa's own mask (``sdpa_mask``) everywhere else; so no tokens x tokens mask is
built for a packed step.

Where the kernels cannot run (a tensor off CUDA: a plan made from a GPU snapshot, run on the CPU) a packed row
runs sdpa with the block-diagonal mask of the same boundaries (same numbers, a tokens x tokens mask), with a
warning once per device type.

Attention dropout is refused (``ValueError``): the kernel's dropout is not wired, and the policy refuses models
that have it. Sliding-window layers pass their window (``sliding_window`` keyword, else the module's attribute)
as (window - 1, 0), transformers' flash convention (modeling_flash_attention_utils._process_flash_attention_kwargs,
5.17 :651-656). Query heads that are a multiple of the key/value heads go to the kernel as they are (FA2 takes
GQA); any other count is repeated first.

:func:`register` is called by ``load_model`` before the model is built; importing this module registers nothing.
It imports torch, so cudaload imports it only when a load needs it.
"""

from __future__ import annotations

import inspect
import threading
import weakref
from typing import Any

import torch

from ..policies.attention.names import TORCH_VARLEN

__all__ = [
    "TORCH_VARLEN",
    "boundaries_from_position_ids",
    "register",
    "registered",
    "varlen_attention_forward",
    "varlen_mask",
]

_LOCAL = threading.local()
#: which of torch's entry points this process calls: "varlen_attn" or "aten" (:func:`kernel`)
_KERNEL: tuple[str, Any, bool] | None = None


def kernel() -> tuple[str, Any, bool]:
    """(which entry point, the function, whether it takes ``enable_gqa``): ``varlen_attn`` where it takes a scale
    and a window (torch 2.11+), else ``aten._flash_attention_forward`` (differentiable by itself, 2.9+)."""
    global _KERNEL
    if _KERNEL is None:
        found: tuple[str, Any, bool] = ("aten", torch.ops.aten._flash_attention_forward, False)
        try:
            from torch.nn.attention.varlen import varlen_attn

            params = inspect.signature(varlen_attn).parameters
            if "scale" in params and "window_size" in params:
                found = ("varlen_attn", varlen_attn, "enable_gqa" in params)
        except (ImportError, TypeError, ValueError):
            pass
        _KERNEL = found
    return _KERNEL


def boundaries_from_position_ids(position_ids: Any) -> tuple[Any, int]:
    """(cumulative lengths as int32 on the ids' device, the longest sequence) of one packed row: a sequence starts
    wherever a position does not continue the previous one by +1 (masking_utils.find_packed_sequence_indices'
    rule, transformers 5.17 masking_utils.py:749-752). One host sync (the longest length)."""
    pos = position_ids.reshape(-1)
    n = pos.numel()
    starts = torch.ones(n, dtype=torch.bool, device=pos.device)
    if n > 1:
        starts[1:] = (pos[1:] - pos[:-1]) != 1
    idx = starts.nonzero().view(-1).to(torch.int32)
    cu = torch.cat([idx, torch.tensor([n], dtype=torch.int32, device=pos.device)])
    longest = int((cu[1:] - cu[:-1]).max().item())
    return cu, longest


def _cached_boundaries(position_ids: Any) -> tuple[Any, int]:
    """:func:`boundaries_from_position_ids`, computed once per position-ids tensor (every layer of a forward gets
    the same one); per thread, the last tensor only."""
    if torch.compiler.is_compiling():
        return boundaries_from_position_ids(position_ids)
    key = (position_ids.data_ptr(), position_ids._version, tuple(position_ids.shape))
    last = getattr(_LOCAL, "last", None)
    if last is not None:
        ref, k, value = last
        if ref() is position_ids and k == key:
            return value  # type: ignore[no-any-return]
    value = boundaries_from_position_ids(position_ids)
    _LOCAL.last = (weakref.ref(position_ids), key, value)
    return value


def _as_int(x: Any) -> int:
    return int(x.item()) if isinstance(x, torch.Tensor) else int(x)


def _boundaries(
    query: Any, key: Any, attention_mask: Any, kwargs: dict[str, Any]
) -> tuple[Any, Any, int, int] | None:
    """(cu_q, cu_k, max_q, max_k) where the call can run varlen; None where it goes to sdpa."""
    if attention_mask is not None or query.shape[0] != 1 or query.shape[2] != key.shape[2]:
        return None
    cu_q, cu_k = kwargs.get("cu_seq_lens_q"), kwargs.get("cu_seq_lens_k")
    max_q, max_k = kwargs.get("max_length_q"), kwargs.get("max_length_k")
    if cu_q is not None and cu_k is not None and max_q is not None and max_k is not None:
        dev = query.device
        return cu_q.to(dev, torch.int32), cu_k.to(dev, torch.int32), _as_int(max_q), _as_int(max_k)
    pos = kwargs.get("position_ids")
    n = int(query.shape[2])
    if pos is not None and pos.numel() == n:
        cu, longest = _cached_boundaries(pos)
        if cu.device != query.device:
            cu = cu.to(query.device)
        return cu, cu, longest, longest
    cu = torch.tensor([0, n], dtype=torch.int32, device=query.device)
    return cu, cu, n, n


def _window(module: Any, kwargs: dict[str, Any]) -> int:
    """The left window in flash's convention (-1: none): transformers' ``sliding_window`` counts the token
    itself, flash's left size does not (modeling_flash_attention_utils, 5.17 :651-656)."""
    sw = kwargs.get("sliding_window", getattr(module, "sliding_window", None))
    return int(sw) - 1 if sw else -1


def _flash_device(t: Any) -> bool:
    """Whether torch's flash kernels can take ``t`` (CUDA; the policy checked the architecture)."""
    return bool(t.is_cuda)


_WARNED: set[str] = set()


def _masked_sdpa(
    module: Any, query: Any, key: Any, value: Any, cu: Any, scale: float, causal: bool, left: int, kwargs: Any
) -> Any:
    """A packed row where the kernels cannot run (a tensor off CUDA: a snapshot planned for a GPU, run on the
    CPU): transformers' sdpa with the block-diagonal mask of the same boundaries, causal and windowed as the
    kernel would be (no mask for a row of one sequence without a window: sdpa's own causal call): the same
    numbers, with a tokens x tokens mask. Returns (1, tokens, heads, head_dim)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    dev = str(query.device.type)
    if dev not in _WARNED:
        _WARNED.add(dev)
        import logging

        logging.getLogger("cudaload.execute").warning(
            "cudaload_varlen on %s: torch's flash kernels run on CUDA only; packed rows run sdpa with a "
            "block-diagonal mask instead (same numbers, tokens x tokens memory)",
            dev,
        )
    rest = {k: v for k, v in kwargs.items() if k not in ("is_causal", "scaling", "dropout")}
    n = int(query.shape[2])
    if cu.numel() <= 2 and (left < 0 or left >= n - 1):
        return sdpa_attention_forward(
            module, query, key, value, None, scaling=scale, is_causal=causal, **rest
        )[0]
    cu = cu.to(query.device, torch.long)
    seq = torch.repeat_interleave(torch.arange(cu.numel() - 1, device=query.device), cu[1:] - cu[:-1])
    i = torch.arange(n, device=query.device)
    keep = seq[:, None] == seq[None, :]
    if causal:
        keep &= i[None, :] <= i[:, None]
    if left >= 0:
        keep &= i[None, :] >= i[:, None] - left
    return sdpa_attention_forward(
        module, query, key, value, keep[None, None], scaling=scale, is_causal=False, **rest
    )[0]


def varlen_attention_forward(
    module: Any,
    query: Any,
    key: Any,
    value: Any,
    attention_mask: Any,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[Any, None]:
    """transformers' attention-function signature; returns (batch, tokens, heads, head_dim) and no weights."""
    if dropout:
        raise ValueError(
            f"cudaload_varlen has no attention dropout (asked for {dropout}): load the model with "
            "attention_dropout=0, or with attn_implementation='sdpa'"
        )
    bounds = _boundaries(query, key, attention_mask, kwargs)
    if bounds is None:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(  # type: ignore[no-any-return]
            module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs
        )
    cu_q, cu_k, max_q, max_k = bounds
    if query.dtype == torch.float32:
        # fp32 q/k/v (PEFT's or QLoRA's fp32 norms): the kernels take fp16 / bf16; the dtype transformers' flash
        # path casts to (integrations/flash_attention.py get_target_dtype, 5.17 :12-23)
        from transformers.integrations.flash_attention import get_target_dtype

        target = get_target_dtype(query, module)
        if target is not None and target != torch.float32:
            query, key, value = query.to(target), key.to(target), value.to(target)
    hq, hkv, d = int(query.shape[1]), int(key.shape[1]), int(query.shape[3])
    scale = float(scaling) if scaling is not None else d**-0.5
    causal = kwargs.get("is_causal")
    causal = bool(getattr(module, "is_causal", True) if causal is None else causal)
    left = _window(module, kwargs)
    if not _flash_device(query):
        return _masked_sdpa(module, query, key, value, cu_q, scale, causal, left, kwargs), None
    if hq != hkv and hq % hkv:
        from transformers.integrations.sdpa_attention import repeat_kv

        key, value = repeat_kv(key, hq // hkv), repeat_kv(value, hq // hkv)
    # (1, heads, tokens, head_dim) -> (tokens, heads, head_dim): views, the last dimension stays contiguous
    q = query[0].transpose(0, 1)
    k = key[0].transpose(0, 1)
    v = value[0].transpose(0, 1)
    right = 0 if causal else -1
    which, fn, takes_gqa = kernel()
    if which == "varlen_attn":
        extra = {"enable_gqa": True} if takes_gqa and k.shape[1] != q.shape[1] else {}
        out = fn(q, k, v, cu_q, cu_k, max_q, max_k, scale=scale, window_size=(left, right), **extra)
    else:
        out = fn(
            q,
            k,
            v,
            cu_q,
            cu_k,
            max_q,
            max_k,
            0.0,
            causal and left < 0,
            False,
            scale=scale,
            window_size_left=left if left >= 0 else None,
            window_size_right=right if left >= 0 else None,
        )[0]
    return out.unsqueeze(0), None


def varlen_mask(
    batch_size: int,
    q_length: int,
    kv_length: int,
    q_offset: Any = 0,
    kv_offset: int = 0,
    attention_mask: Any = None,
    **kwargs: Any,
) -> Any:
    """The mask transformers builds for ``cudaload_varlen``: None where :func:`varlen_attention_forward` runs
    varlen (one row, no padding, no cache offset: its boundaries come with the call), sdpa's own mask elsewhere."""
    from transformers.masking_utils import sdpa_mask

    unpadded = attention_mask is None or (
        attention_mask.shape[-1] == kv_length and bool(attention_mask.all())
    )
    no_offset = not isinstance(q_offset, torch.Tensor) and q_offset == 0 and kv_offset == 0
    if batch_size == 1 and unpadded and no_offset and q_length == kv_length:
        return None
    return sdpa_mask(
        batch_size=batch_size,
        q_length=q_length,
        kv_length=kv_length,
        q_offset=q_offset,
        kv_offset=kv_offset,
        attention_mask=attention_mask,
        **kwargs,
    )


def registered() -> bool:
    """Whether transformers knows ``cudaload_varlen`` in this process."""
    from transformers import AttentionInterface

    return AttentionInterface._global_mapping.get(TORCH_VARLEN) is varlen_attention_forward


def register() -> None:
    """Make ``cudaload_varlen`` a valid ``attn_implementation`` value in this process (idempotent)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(TORCH_VARLEN, varlen_attention_forward)
    AttentionMaskInterface.register(TORCH_VARLEN, varlen_mask)
