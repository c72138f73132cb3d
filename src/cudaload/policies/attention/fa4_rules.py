"""FlashAttention-4 rules (the flash-attn-4 4.0.0b36 package and the kernels-community/flash-attn4 build) taken
from the released sources: head dims per architecture, shared memory on sm8x/sm12x, attention sinks, and what
its backward supports. Each rule cites the file and line it comes from."""

from __future__ import annotations

from ...detection.support import smem_per_block
from ...model_info import ModelInfo
from .names import HUB_KERNEL
from .transformers_rules import _qk_dim, _sliding


def _sm12x_fa4_smem(hd: int, hdv: int) -> int:
    """Shared memory FA4's SM120 forward needs: interface.py:360-365 picks a 128 x 64 tile for head dims
    over 64 (128 x 128 otherwise), flash_fwd_sm120.py:47-58 sums Q + K + V tiles in 16-bit."""
    tile_m, tile_n = (128, 64) if hd > 64 else (128, 128)
    return tile_m * hd * 2 + tile_n * hd * 2 + tile_n * hdv * 2


def _fa4_checks(
    info: ModelInfo, cc: tuple[int, int], training: bool, seq_len: int | None = None, hub: bool = False
) -> list[str]:
    """flash-attn-4 4.0.0b36 (flash_attn/cute) for the package; ``hub``: kernels-community/flash-attn4, which
    vendors an older beta (below) and differs in the head dims it takes on sm10x/sm11x.

    Head dims: nothing pads them. transformers rounds none (_transformers_checks), and interface.py's
    _flash_attn_fwd:678 passes q/k/v to the kernels as they are (no F.pad anywhere in interface.py); the
    kernels round the head dim only inside their tiles (flash_fwd.py:81-86, to a multiple of 16), which
    needs 16-byte aligned rows. The Hub build: huggingface/kernels-community (commit 40d4194f; flash-attn4/
    last changed at 8a730d96) flash-attn4/torch-ext/flash_attn4/__init__.py:3 ``__version__ =
    "4.0.0.beta8"``, built as the v0 branch transformers loads (build.toml ``version = 0``)."""
    bad: list[str] = []
    hd = _qk_dim(info)
    hdv = hd  # transformers pads v to the q/k head dim before calling the kernel
    major = cc[0]
    sm = f"sm{cc[0]}{cc[1]}"
    if training and major == 8:
        bad.append(f"flash-attn-4's backward asserts sm90+ (interface.py:2288); {sm} runs inference only")
    if hd % 8:
        if major in (8, 12):
            # interface.py:848 skips _validate_head_dims on sm8x/sm12x and never calls the kernels'
            # can_implement (:1777 "TODO: check @can_implement"), but the SM80-MMA kernel both use needs it:
            # flash_fwd.py:63-64 "All contiguous dimensions must be at least 16 bytes aligned, which means
            # that the head dimension should be a multiple of 8", can_implement :151-154
            # (flash_fwd_sm120.py:39-42)
            where = "its sm80-path kernels need 16-byte aligned rows, flash_fwd.py:63-64; nothing pads"
        else:
            # interface.py:847 alignment = 16 // element size (8 for 16-bit), asserted by
            # _validate_head_dims at :130 (sm90) and :135 (sm100/sm110); the Hub build's beta8 the same
            # (its interface.py:420-422 and :109/:114)
            where = "interface.py:847-849, asserted at :130/:135; nothing pads"
        bad.append(f"head dim {hd} is not a multiple of 8 (flash-attn-4 alignment: {where})")
    elif major == 9 and not 8 <= hd <= 256:
        # package interface.py:128-133; the Hub build's beta8 interface.py:107-112 the same
        bad.append(f"head dim {hd} outside 8..256 (flash-attn-4 on sm90, interface.py:128-133)")
    elif major in (10, 11) and not (8 <= hd <= 128 or (hd == 256 and not hub)):
        # package interface.py:121-138: 8..128, (192, 128) DeepSeek, (256, 256), or (64 or 512, 512), the MLA
        # absorbed form, which is the qv call (q=None, head_dim read from qv, :755-756; :1177-1182) that
        # transformers never makes: a plain (512, 512) call passes the check and then fails the kernel's TMEM
        # budget (flash_fwd_sm100.py:362-368: 2 x 128 S columns + 512 O columns > 512). The Hub build's beta8
        # has only 8..128 and (192, 128) (its interface.py:102-117): no 256.
        why = (
            " (DeepSeek's (192, 128) shape is accepted, but transformers pads v to 192 first)"
            if hd == 192
            else ""
        )
        if hub:
            bad.append(
                f"head dim {hd}: {HUB_KERNEL['flash_attention_4']} (flash-attn-4 4.0.0.beta8 vendored) on "
                f"sm{major}x takes 8..128 only (its interface.py:102-117; the 4.0.0b36 package adds 256){why}"
            )
        else:
            bad.append(
                f"head dim {hd}: flash-attn-4 on sm{major}x takes 8..128 or exactly 256 "
                f"(interface.py:121-138){why}"
            )
    elif major in (8, 12):
        # no head-dim range is checked on sm8x/sm12x (interface.py:848): the limit is the shared memory
        limit = smem_per_block(cc) or (99 * 1024 if major == 12 else 163 * 1024)
        need = _sm12x_fa4_smem(hd, hdv)
        if need > limit:
            bad.append(
                f"head dim {hd}: flash-attn-4's {sm} kernel needs {need // 1024} KB of shared memory, the GPU "
                f"has {limit // 1024} KB per block (flash_fwd_sm120.py:47-58)"
            )
    sinks = getattr(info, "sinks", False)
    if sinks and major in (8, 12):
        # flash_fwd.py:651, FlashAttentionForwardSm80.__call__ (FlashAttentionForwardSm120 subclasses it)
        bad.append(
            f"the model has attention sinks; flash-attn-4's {sm} kernel asserts 'Learnable sink is not supported'"
        )
    if training and major in (10, 11) and hd == 256:
        # dedicated sm100 hd256 backward: sm100_hd256_2cta_fmha_backward.py:60 (no local), :67 (no score_mod,
        # which is how softcap enters: interface.py:2579-2584), interface.py:2453-2456 (no sink)
        # transformers passes the window only when the keys outnumber it (modeling_flash_attention_utils.py
        # (5.17) :650-655), so a declared sequence within the window never reaches the local kernel
        window = info.summary.sliding_window
        if window is not None and _sliding(info) and (seq_len is None or seq_len > window):
            bad.append(
                "flash-attn-4's sm100 backward for head dim 256 does not support a sliding window (local attention)"
            )
        if info.attn_softcapping:
            bad.append("flash-attn-4's sm100 backward for head dim 256 does not support soft-capping")
        if sinks:
            bad.append("flash-attn-4's sm100 backward for head dim 256 does not support attention sinks")
    if training and major == 12 and info.attn_softcapping:
        bad.append("flash-attn-4's sm120 backward has no score_mod, so no soft-capping (interface.py:2350)")
    return bad
