"""FlashAttention-2 and -3 rules taken from the released sources: head dims (flash-attn 2 pads them to a
multiple of 8, and what that costs; FA3 pads nothing), soft-capping with dropout, the hdim256 backward on GPUs
with little shared memory, and kernels-community/vllm-flash-attn3's attention sinks. Each rule cites the file
and line it comes from."""

from __future__ import annotations

from ...detection.support import smem_per_block
from ...model_info import ModelInfo
from .names import _VLLM_FA3
from .transformers_rules import _qk_dim

#: The largest head dim FlashAttention-2/3 kernels take (flash-attn 2.8.3 csrc/flash_attn/flash_api.cpp:393;
#: FA3 hopper/flash_api.cpp get_max_headdim() with every head dim compiled).
_FA23_MAX_HEAD_DIM = 256


def _round8(hd: int) -> int:
    return -(-hd // 8) * 8


def _head_dim_fa3(impl: str, hd: int) -> str | None:
    """FlashAttention-3's head-dim checks, for the hopper/ package and kernels-community/vllm-flash-attn3.

    Neither pads a head dim before its CUDA op (unlike flash-attn 2, _fa2_checks), so the op's checks are the
    rule. hopper/ at Dao-AILab/flash-attention commit 0251105a (hopper __version__ 3.0.0; PyPI's flash-attn-3
    has one release, 0.0.0, yanked as empty, so this source is the citation): flash_attn_interface.py
    _flash_attn_forward:60-153 passes q/k/v through (FlashAttnFunc:552, FlashAttnVarlenFunc:642 call it, as
    does flash_attn_with_kvcache:942); flash_api.cpp :779-780 head_size <= get_max_headdim() (256) and
    :854-855 ``head_size % alignment`` (8 for 16-bit types; mha_bwd :1349-1352 the same). flash-attn
    2.8.3's sdist ships hopper/ 3.0.0.b1, whose flash_attn_interface.py FlashAttnFunc.forward:256-308 pads
    nothing either.
    kernels-community/vllm-flash-attn3 (huggingface/kernels-community commit 40d4194f): torch-ext/
    vllm_flash_attn3/flash_attn_interface.py FlashAttnFunc:244 pads nothing, flash-attn/flash_api_stable.cpp
    :778-779 and :856-857 are the same checks. vLLM 0.19.1 agrees for its FA3 build:
    v1/attention/backends/flash_attn.py:161-162 supports_head_size."""
    if hd > _FA23_MAX_HEAD_DIM:
        return f"head dim {hd} > {_FA23_MAX_HEAD_DIM}, the largest {impl} supports"
    if hd % 8:
        return f"head dim {hd} is not a multiple of 8 ({impl} requires it and pads nothing)"
    return None


def _fa2_checks(info: ModelInfo, cc: tuple[int, int], training: bool) -> list[str]:
    """flash-attn 2.8.3 (csrc/flash_attn + flash_attn/flash_attn_interface.py), for the package and the
    kernels-community/flash-attn2 build (huggingface/kernels-community commit 40d4194f: its
    torch-ext/flash_attn2/flash_attn_interface.py pads as below, FlashAttnFunc:847 at :868-871,
    FlashAttnVarlenFunc:931 at :957-960, and flash-attn2/flash_attn/flash_api.cpp checks the same at
    :433-434, :641-642, :866-867, :1296)."""
    bad: list[str] = []
    hd = _qk_dim(info)
    if hd > _FA23_MAX_HEAD_DIM:
        # The Python interface pads q/k/v to the next multiple of 8 before the CUDA op and slices the output
        # (and the gradients) back: flash_attn_interface.py FlashAttnFunc.forward:829-833 / :856, backward
        # :865-866 / :887-889, FlashAttnVarlenFunc.forward:920-924 / :957; flash_attn_with_kvcache's op pads
        # in C++, flash_api.cpp:1300-1303 / :1459-1466. The op then checks the padded size: at most 256 at
        # flash_api.cpp:393 (forward), :604 (varlen), :830 (backward), :1269 (kvcache); its multiple-of-8
        # checks (:394, :605, :829) always pass. 256 being a multiple of 8, the padded size fits exactly when
        # hd <= 256: 252 and 254 pad to 256, 257 pads to 264.
        bad.append(
            f"head dim {hd} > {_FA23_MAX_HEAD_DIM}, the largest flash-attn 2 supports (its interface pads it "
            f"to {_round8(hd)}; the kernels take at most {_FA23_MAX_HEAD_DIM}, flash_api.cpp:393)"
        )
    dropout = float(info.attention_dropout or 0.0)
    if training and dropout > 0 and info.attn_softcapping:
        bad.append(
            "flash-attn 2 refuses soft-capping with dropout ('Softcapping does not support dropout for now', "
            "flash_api.cpp:397 and :838)"
        )
    smem = smem_per_block(cc)
    if training and dropout > 0 and 192 < hd <= 256 and smem is not None and smem < 144 * 1024:
        # head dims in (192, 256] round to the hdim256 kernel (flash_api.cpp:834); below 144 KB of shared
        # memory its backward only exists without dropout and launches nothing otherwise
        # (flash_bwd_launch_template.h:296-303): dq/dk/dv stay uninitialised, silently wrong gradients
        bad.append(
            f"head dim {hd} backward with attention_dropout={dropout}: flash-attn 2 launches no kernel on GPUs "
            f"with {smem // 1024} KB of shared memory per block (sm86/sm89/sm12x), so gradients would be garbage"
        )
    return bad


def _fa2_pad_note(info: ModelInfo, training: bool) -> str | None:
    """What flash-attn 2 padding a head dim to a multiple of 8 costs (_fa2_checks: the padded call works), for
    the reasons of a valid FA2 candidate; None when nothing is padded."""
    hd = _qk_dim(info)
    if hd % 8 == 0 or hd > _FA23_MAX_HEAD_DIM:
        return None
    padded = _round8(hd)
    # F.pad allocates new q/k/v on every call (flash_attn_interface.py:831-833); transformers' decode passes
    # the layer's whole cached K/V, and the kvcache op pads and copies back the whole cache in C++
    # (flash_api.cpp :1300-1303, :1465-1466: "It's expensive to copy the KV cache here"); the padded q/k/v and
    # output are what autograd keeps (:848)
    why = (
        f"head dim {hd} is not a multiple of 8: flash-attn 2 pads q, k and v to {padded} on every call "
        "and slices the output back (flash_attn_interface.py:829-833, :856), so each call copies them "
        "(in decode, the layer's whole KV cache; paged decode pads and copies back the whole cache, "
        "flash_api.cpp:1300-1303, :1459-1466): extra time and transient memory"
    )
    if training:
        why += "; training also keeps the padded q, k, v and output for backward (:848)"
    return why


def _vllm_fa3_sinks(info: ModelInfo, cc: tuple[int, int], dtype: str, intent: str) -> list[str]:
    """kernels-community/vllm-flash-attn3 flash_api.cpp ``if(s_aux_.has_value())`` block (sm90 only, <= 64
    query heads, equal head dims, bf16) and its flash_attn_interface.FlashAttnFunc.backward, which returns no
    gradient for s_aux (the sinks would never train). vLLM 0.19.1 agrees: sinks only with its FA3
    (v1/attention/backends/fa_utils.py:164-168) and not below sm90 (flash_attn.py:194-195)."""
    if not getattr(info, "sinks", False):
        return []
    bad: list[str] = []
    if cc != (9, 0):
        bad.append(
            f"{_VLLM_FA3} runs attention sinks on Hopper (sm90) only ('S aux is currently only supported for Hopper GPUs')"
        )
    if dtype != "bfloat16":
        bad.append(f"{_VLLM_FA3} takes attention sinks in bfloat16 only; the plan's dtype is {dtype}")
    if info.summary.num_heads > 64:
        bad.append(
            f"{_VLLM_FA3} supports at most 64 query heads with sinks; the model has {info.summary.num_heads}"
        )
    if intent == "training":
        bad.append(
            f"{_VLLM_FA3}'s backward returns no gradient for the sinks: full training would never update them"
        )
    return bad
