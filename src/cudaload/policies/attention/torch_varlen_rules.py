"""``cudaload_varlen``: packed training on torch's own flash kernels (FlashAttention-2 as built into torch's CUDA
wheels), no flash-attn package. The attention function is :mod:`cudaload.execute.varlen_attention`; these are
the rules that say where it runs, each with its source.

torch's entry points, read from the released wheels (``torch/nn/attention/varlen.py``, and
``torchgen/packaged/ATen/native/native_functions.yaml`` / ``torchgen/packaged/autograd/derivatives.yaml``):

- 2.9: no ``torch.nn.attention.varlen``; ``aten._flash_attention_forward`` takes cum_seq_q/k, max_q/k, a
  scale and window_size_left/right (native_functions.yaml :15036), and is differentiable through
  ``_flash_attention_backward`` (derivatives.yaml :2899-2901);
- 2.10: ``varlen_attn(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, is_causal=False, return_aux=None)``
  with a backward, but no scale and no window; the aten op as in 2.9 (native_functions.yaml :15192,
  derivatives.yaml :2894);
- 2.11: ``varlen_attn(..., *, return_aux, scale, window_size)``, causal as ``window_size=(-1, 0)``, backward
  registered (varlen.py :159-250, :407); the aten op unchanged (native_functions.yaml :15260, derivatives.yaml
  :2905-2907);
- 2.13: as 2.11, plus ``enable_gqa`` (required when query and key heads differ), ``seqused_k``, ``block_table``
  and ``num_splits``.

So 2.11+ runs ``varlen_attn``, 2.9 and 2.10 the aten op (``Capabilities.torch_varlen`` records which the
installed torch offers, read from those files without importing torch). Older releases were not read:
refused.
"""

from __future__ import annotations

from ...capabilities import Capabilities
from ...detection.versions import version_tuple
from ...model_info import ModelInfo
from ...plans.decision import Candidate
from .names import TORCH_VARLEN
from .transformers_rules import _qk_dim, _sliding, _v_dim

#: the oldest torch release whose files were read (see the module's docstring)
TORCH_MIN = (2, 9)
#: varlen_attn with a scale and a window: from this release it is the entry point
VARLEN_ATTN_FROM = (2, 11)
#: torch's copy of FlashAttention-2 (aten/src/ATen/native/transformers/cuda/flash_attn/flash_api.cpp,
#: ``mha_varlen_fwd``) checks: sm80 or newer, fp16 / bf16, ``head_size_og <= 256``, ``head_size_og % 8 == 0``
#: ("ensured by padding", which only sdpa's wrapper does), ``num_heads % num_heads_k == 0``, and v of q's head
#: size (CHECK_SHAPE); a left window at least the longest sequence is dropped (-1)
MAX_HEAD_DIM = 256


def torch_varlen_entry(caps: Capabilities) -> tuple[str | None, str]:
    """Which of torch's varlen entry points the snapshot's torch offers ("varlen_attn", "aten", None) and why.
    Recorded by detection (``caps.torch_varlen``); a snapshot without it is read from its torch version, and a
    profile, which names no torch, is predicted for a current CUDA build."""
    if caps.torch_version is not None and caps.torch_cuda_version is None:
        return None, f"torch {caps.torch_version} is a CPU build: no flash kernels"
    if caps.torch_varlen is not None:
        which = caps.torch_varlen
    elif caps.torch_version is None:
        return "varlen_attn", "no torch named (a profile): predicted for a current CUDA build (2.11 or later)"
    else:
        v = (version_tuple(caps.torch_version) or (0,))[:2]
        which = "varlen_attn" if v >= VARLEN_ATTN_FROM else "aten" if v >= TORCH_MIN else "none"
    tv = f"torch {caps.torch_version}" if caps.torch_version else "torch"
    if which == "varlen_attn":
        return (
            which,
            f"{tv}: torch.nn.attention.varlen.varlen_attn, forward and backward, with scale and window",
        )
    if which == "aten":
        return which, (
            f"{tv}: aten._flash_attention_forward over cum_seq_q/k, differentiable through "
            "_flash_attention_backward (derivatives.yaml)"
        )
    return None, (
        f"{tv} has no varlen flash attention with a backward that cudaload has read (torch 2.9 or later: "
        "aten._flash_attention_forward with cum_seq and window sizes; 2.11+: torch.nn.attention.varlen)"
    )


def torch_varlen_checks(info: ModelInfo, caps: Capabilities, dtype: str, intent: str) -> list[str]:
    """Reasons against ``cudaload_varlen`` (empty: valid)."""
    if not caps.gpus:
        return ["no GPU: torch's flash kernels run on CUDA GPUs only"]
    bad: list[str] = []
    for g in caps.gpus:
        if g.compute_capability < (8, 0):
            # flash_api.cpp mha_varlen_fwd: "FlashAttention only supports Ampere GPUs or newer."
            bad.append(f"{g.name} is sm{g.sm}: torch's flash kernels need sm80 or newer")
            return bad
    which, why = torch_varlen_entry(caps)
    if which is None:
        bad.append(why)
    cls = info.class_name or info.summary.type
    if not info.supports_sdpa:
        # every call that is not one packed row (a padding mask, a cache, decode) runs transformers' sdpa
        bad.append(
            f"{cls} does not support SDPA, which cudaload_varlen runs for calls that are not packed rows"
        )
    if info.attention_classes is not None:
        bad.append(
            f"{cls} builds its attention from a fixed table ({', '.join(info.attention_classes)}): it does not call "
            "transformers' attention functions"
        )
    if getattr(info, "alibi", False):
        bad.append(f"{cls} uses ALiBi, a bias flash kernels do not read")
    if info.attn_softcapping:
        bad.append(
            f"the model soft-caps attention logits ({info.attn_softcapping}); torch's flash kernels do not"
        )
    if getattr(info, "sinks", False):
        bad.append("the model has attention sinks; torch's flash kernels have no sink argument")
    if dtype not in ("bfloat16", "float16"):
        bad.append(f"torch's flash kernels need float16 or bfloat16; the plan's dtype is {dtype}")
    qk, v = _qk_dim(info), _v_dim(info)
    if qk > MAX_HEAD_DIM:
        bad.append(f"head dim {qk} > {MAX_HEAD_DIM}, the largest torch's flash kernels take")
    elif qk % 8:
        bad.append(f"head dim {qk} is not a multiple of 8 (torch's flash kernels pad nothing here)")
    if v != qk:
        bad.append(f"v head dim {v} differs from q/k head dim {qk}: flash kernels take one head dim")
    if (info.attention_dropout or 0) > 0:
        bad.append(
            f"attention_dropout={info.attention_dropout}: cudaload_varlen runs the kernels without dropout "
            "(training would differ)"
        )
    return bad


def torch_varlen_candidate(info: ModelInfo, caps: Capabilities, dtype: str, intent: str) -> Candidate:
    """The candidate: valid with what it runs, or rejected with every reason."""
    bad = torch_varlen_checks(info, caps, dtype, intent)
    if bad:
        return Candidate(TORCH_VARLEN, False, tuple(bad))
    _which, why = torch_varlen_entry(caps)
    reasons = [
        f"torch's own flash kernels over each packed sequence, forward and backward, no flash-attn package ({why})",
        "calls that are not one packed row (a padding mask, a cache, decode) run transformers' sdpa",
    ]
    if _sliding(info):
        reasons.append(
            f"sliding window {info.summary.sliding_window} passed to the kernel as (window - 1, 0)"
        )
    return Candidate(TORCH_VARLEN, True, tuple(reasons))
