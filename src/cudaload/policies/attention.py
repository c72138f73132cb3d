"""Attention backend: every candidate checked against rules taken from the released sources, then the valid one
that costs least: measured seconds when the caller has them, else the cheapest safe default.

Candidates: each flash version twice, the pip package (``flash_attention_N``) and its Hub-kernel form (the
repo id transformers itself falls back to, ``FLASH_ATTN_KERNEL_FALLBACK``), plus sdpa, flex_attention and
eager. A rule that rejects a candidate cites the file and line it comes from; the model facts it needs come
from :class:`cudaload.model_info.ModelInfo` (q/k and v head dims, sinks, ALiBi, dropout, soft-capping, sliding
window, the model class's own attention tables). Architecture facts are in :mod:`cudaload.detection.support`.

Choosing among the valid candidates (``choose_attention``):

1. ``timings`` given (backend -> steady-state seconds of the declared work, measured by ``cudaload tune`` or a
   shipped prior): the valid measured backend with the least ``timings[b] + first-use seconds not yet paid``.
2. No timings (no declared work, or nothing measured for it): never pay seconds for nothing, and never do
   worse than plain transformers, whose default is sdpa. Which backend wins generate() depends on the work:
   on the H200 (transformers 5.17) sdpa won 4 of 7 shapes in the 2026-11-30 table (best of 2-3 calls) but few
   in the 2026-12-01 run (benchmarks/results/2026-12-01-h200/README.md), where first calls met new decode
   lengths and torch 2.11's cuDNN SDPA built a plan for each (40-60 ms); FA4 costs 2.7-9.7 s of import plus
   ~3 s of JIT in every fresh process. So sdpa where valid; where it is not (soft-capping, models without SDPA), an
   ahead-of-time compiled flash build (no JIT) or eager; backends with a first-use cost (FA4's JIT,
   flex_attention's compile) only when the caller declared training, where one-time seconds are amortised.
3. A declared single short sequence for inference picks eager (measured: 1 x 512 + 32, eager 1.03 s vs sdpa
   1.07 s vs FA4 1.84 s), unless timings say otherwise.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..capabilities import GPU, Capabilities
from ..decision import Candidate, Decision
from ..detection.support import flash_support, hub_kernel_support, smem_per_block
from ..detection.versions import version_tuple as _version
from ..errors import InvalidChoiceError
from . import sdpa_dispatch
from .sdpa_dispatch import SDPA_DECODE, SDPA_NO_CUDNN, SdpaFacts

#: attn_implementation -> distribution that provides it
FLASH_PACKAGE = {
    "flash_attention_2": "flash-attn",
    "flash_attention_3": "flash-attn-3",
    "flash_attention_4": "flash-attn-4",
}
#: attn_implementation -> its Hub-kernel form. Same ids in transformers 5.17 and 5.24
#: (modeling_flash_attention_utils.FLASH_ATTN_KERNEL_FALLBACK, CUDA entries).
HUB_KERNEL = {
    "flash_attention_2": "kernels-community/flash-attn2",
    "flash_attention_3": "kernels-community/vllm-flash-attn3",
    "flash_attention_4": "kernels-community/flash-attn4",
}
_KERNEL_TO_IMPL = {v: k for k, v in HUB_KERNEL.items()}
_VLLM_FA3 = HUB_KERNEL["flash_attention_3"]
#: flash-attn 2 gained soft-capping in 2.6.0 (its changelog); older builds fail on the softcap argument.
_FA2_SOFTCAP_MIN = (2, 6, 0)
_FA2_MIN = (2, 3, 3)  # transformers refuses older flash-attn (is_flash_attn_2_available)
_TRAINING = ("training", "lora", "qlora")

#: Declared work of one sequence up to this many tokens (prompt + new) is decode-bound: each new token costs
#: one attention call per layer and the host-side cost of the call decides. Measured on the H200, Qwen3-8B
#: shape, generate() with three backends loaded at once and interleaved (/work/shared/device/README.md,
#: "Measured there (2026-11-30)"): 1 x 512 + 32 tokens, eager 1.03 s, sdpa 1.07 s, FA4 1.84 s; at 1 x 4096
#: + 64 sdpa won (2.37 s vs eager 2.63 s), so the rule stops well below that.
SHORT_DECODE_MAX_TOKENS = 1024

ALL_NAMES = (
    "flash_attention_4",
    HUB_KERNEL["flash_attention_4"],
    "flash_attention_3",
    HUB_KERNEL["flash_attention_3"],
    "flash_attention_2",
    HUB_KERNEL["flash_attention_2"],
    "sdpa",
    SDPA_DECODE,
    SDPA_NO_CUDNN,
    "flex_attention",
    "eager",
)


# -- first-use costs ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FirstUse:
    """Seconds a backend costs once per process before its first useful call, and where the number is from."""

    seconds: float
    source: str


#: Measured on the H200 (/work/shared/device/README.md, "Measured there (2026-11-30)"): ``import
#: flash_attn.cute`` 9.7 s on cold files, ~2.7 s warm; the CuTe DSL JIT ~3 s in every new process, 0.55 s
#: once its disk cache (FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1) holds the kernels.
FA4_IMPORT_WARM_S = 2.7
FA4_IMPORT_COLD_S = 9.7
FA4_JIT_S = 3.0
FA4_JIT_CACHED_S = 0.55
#: Not measured yet: torch.compile of flex_attention's forward Triton kernels for one shape. An estimate,
#: to be replaced by ``cudaload tune``'s measurement (its benchmark reports flex's compile time apart).
FLEX_COMPILE_S = 5.0


def first_use_costs(*, fa4_cache_warm: bool = False, cold_files: bool = False) -> dict[str, FirstUse]:
    """The shipped first-use table. ``fa4_cache_warm``: FA4's persistent compile cache already holds this
    shape's kernels; ``cold_files``: the package files are not in the page cache (first run after boot)."""
    fa4_import = FA4_IMPORT_COLD_S if cold_files else FA4_IMPORT_WARM_S
    fa4_jit = FA4_JIT_CACHED_S if fa4_cache_warm else FA4_JIT_S
    fa4 = FirstUse(
        fa4_import + fa4_jit,
        f"import flash_attn.cute ~{fa4_import:g} s + CuTe JIT ~{fa4_jit:g} s per process (H200, 2026-11-30)",
    )
    return {
        "flash_attention_4": fa4,
        # the Hub build vendors the same CuTe DSL code: same import and JIT (assumed, not measured apart)
        HUB_KERNEL["flash_attention_4"]: FirstUse(fa4.seconds, fa4.source + "; same CuTe DSL code, assumed"),
        "flex_attention": FirstUse(
            FLEX_COMPILE_S, f"torch.compile of flex_attention ~{FLEX_COMPILE_S:g} s (estimate)"
        ),
    }


#: What a fresh process pays, files warm, FA4 cache not yet filled. Backends not listed cost nothing extra:
#: sdpa and eager are torch itself; flash-attn 2/3 and the other Hub kernels are compiled ahead of time, so
#: their first use is a shared-library load.
FIRST_USE: Mapping[str, FirstUse] = first_use_costs()


# -- candidate order (display; the choice is made by the rules below) -------------------------------------


def priority(gpu: GPU | None) -> tuple[str, ...]:
    """Candidate order for one GPU (None: the CPU). Every name appears, so rejections are explained too."""
    fa = {n: (n, HUB_KERNEL[n]) for n in HUB_KERNEL}
    tail = ("sdpa", SDPA_DECODE, SDPA_NO_CUDNN, "flex_attention", "eager")
    if gpu is None:
        head: tuple[str, ...] = ()
    elif gpu.compute_capability >= (10, 0):
        head = (*fa["flash_attention_4"], *fa["flash_attention_2"], *fa["flash_attention_3"])
    elif gpu.compute_capability >= (9, 0):
        head = (*fa["flash_attention_3"], *fa["flash_attention_4"], *fa["flash_attention_2"])
    elif gpu.compute_capability >= (8, 0):
        head = (*fa["flash_attention_2"], *fa["flash_attention_3"], *fa["flash_attention_4"])
    else:
        head = ()
    rest = tuple(n for n in ALL_NAMES if n not in head and n not in tail)
    return (*tail, *head, *rest)


# -- the rules ---------------------------------------------------------------------------------------------


def _qk_dim(info: Any) -> int:
    return int(getattr(info, "qk_head_dim", 0) or info.summary.head_dim)


def _v_dim(info: Any) -> int:
    return int(getattr(info, "v_head_dim", 0) or _qk_dim(info))


def _sliding(info: Any) -> bool:
    return bool(info.summary.sliding_window) and int(getattr(info, "sliding_layers", 0) or 0) > 0


def _transformers_checks(name: str, impl: str, info: Any, dtype: str) -> list[str]:
    """What transformers itself does with a flash request for this model, before any kernel runs."""
    bad: list[str] = []
    cls = info.class_name or info.summary.type
    if not info.supports_flash_attn:
        bad.append(f"{cls} does not support flash attention (_supports_flash_attn is False)")
        return bad
    compatible = getattr(info, "compatible_flash", None)
    if compatible and name not in compatible:
        # modeling_utils.py (5.17) _check_and_adjust_attn_implementation:1747-1762 rewrites the request
        bad.append(
            f"transformers replaces a {name} request for {cls} by {compatible[0]} "
            f"(its _compatible_flash_implementations: {', '.join(compatible)}); request that instead"
        )
    classes = getattr(info, "attention_classes", None)
    if classes is not None and name not in classes:
        # e.g. modeling_falcon.py (5.17) FALCON_ATTENTION_CLASSES:542-546, indexed at :555
        bad.append(
            f"{cls} builds its attention from a fixed table ({', '.join(classes)}): "
            f"attn_implementation={name!r} fails with KeyError when the model is built"
        )
    if getattr(info, "alibi", False):
        # modeling_falcon.py (5.17) FalconFlashAttention2.forward:476-477 raises on an ALiBi bias
        bad.append(f"{cls} uses ALiBi, which transformers' flash path refuses ('`alibi` is not supported')")
    if dtype not in ("bfloat16", "float16"):
        bad.append(f"flash attention needs float16 or bfloat16; the plan's dtype is {dtype}")
    qk, v = _qk_dim(info), _v_dim(info)
    if v > qk:
        # integrations/flash_attention.py (5.17) :60-64 pads v up to the q/k head dim (F.pad by qk - v: a
        # negative width cuts a wider v) and crops the output back at :99-100 (integrations/flash_paged.py
        # :43-47 the same). That is all transformers does to head dims: it rounds none, and hands the
        # package's own flash_attn_func / flash_attn_varlen_func / flash_attn_with_kvcache to the model
        # (modeling_flash_attention_utils.py (5.17) _lazy_imports :167, :177, :179, Hub kernels :194-196), so
        # whether a head dim is padded to the kernel's multiple is the kernel package's business (_fa2_checks,
        # _head_dim_fa3, _fa4_checks)
        bad.append(f"v head dim {v} > q/k head dim {qk}: transformers' flash path would cut v to {qk}")
    return bad


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


def _sm12x_fa4_smem(hd: int, hdv: int) -> int:
    """Shared memory FA4's SM120 forward needs: interface.py:360-365 picks a 128 x 64 tile for head dims
    over 64 (128 x 128 otherwise), flash_fwd_sm120.py:47-58 sums Q + K + V tiles in 16-bit."""
    tile_m, tile_n = (128, 64) if hd > 64 else (128, 128)
    return tile_m * hd * 2 + tile_n * hd * 2 + tile_n * hdv * 2


def _fa4_checks(
    info: Any, cc: tuple[int, int], training: bool, seq_len: int | None = None, hub: bool = False
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
        if _sliding(info) and (seq_len is None or seq_len > window):
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


def _fa2_checks(info: Any, cc: tuple[int, int], training: bool) -> list[str]:
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


def _fa2_pad_note(info: Any, training: bool) -> str | None:
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


def _no_sink_param(impl: str, info: Any) -> str | None:
    if getattr(info, "sinks", False):
        # modeling_flash_attention_utils.py (5.17) :665-669 passes s_aux only to a kernel whose signature has
        # s_aux / learnable_sink; flash-attn 2 and hopper's flash_attn_interface have neither, so the sinks
        # would be dropped without a word
        return f"the model has attention sinks; {impl} has no sink argument, transformers would drop them (wrong outputs)"
    return None


def _no_dropout(impl: str, info: Any, training: bool) -> str | None:
    if training and (info.attention_dropout or 0) > 0:
        # no dropout_p in FA3 / FA4 / vllm-flash-attn3: transformers maps only supported arguments
        # (modeling_flash_attention_utils.py (5.17) :647-648) and merely warns (_flash_attn_can_dispatch)
        return f"attention_dropout={info.attention_dropout}: {impl} has no dropout (training would differ)"
    return None


def _vllm_fa3_sinks(info: Any, cc: tuple[int, int], dtype: str, intent: str) -> list[str]:
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


def _flash_checks(
    name: str, impl: str, info: Any, caps: Capabilities, dtype: str, intent: str, seq_len: int | None = None
) -> list[str]:
    """Reasons against ``name`` (package or Hub form of ``impl``) from the GPU, the model and transformers."""
    if not caps.gpus:
        return ["no GPU: flash attention runs on CUDA GPUs only"]
    training = intent in _TRAINING
    cc = caps.gpus[0].compute_capability
    hub = name in _KERNEL_TO_IMPL
    bad: list[str] = []
    for g in caps.gpus:
        if hub:
            ok, why = hub_kernel_support(name, g.compute_capability)
        else:
            pkg = caps.package(FLASH_PACKAGE[impl])
            ok, why = flash_support(
                FLASH_PACKAGE[impl], g.compute_capability, pkg.version if pkg.installed else None
            )
        if not ok:
            bad.append(f"{g.name}: {why}")
            return bad  # nothing else matters without kernels
    bad += _transformers_checks(name, impl, info, dtype)
    if impl == "flash_attention_4":
        bad += _fa4_checks(info, cc, training, seq_len, hub=hub)
        bad += [r for r in (_no_dropout(impl, info, training),) if r]
    elif impl == "flash_attention_2":
        bad += _fa2_checks(info, cc, training)
        bad += [r for r in (_no_sink_param(name, info),) if r]
    elif name == _VLLM_FA3:
        hdm = _head_dim_fa3(name, _qk_dim(info))  # its flash_api_stable.cpp has the hopper/ checks
        bad += [r for r in (hdm, _no_dropout(name, info, training)) if r]
        bad += _vllm_fa3_sinks(info, cc, dtype, intent)
    else:  # flash_attention_3, the hopper/ package
        hdm = _head_dim_fa3(impl, _qk_dim(info))
        bad += [r for r in (hdm, _no_sink_param(impl, info), _no_dropout(impl, info, training)) if r]
    return bad


def _package_candidate(
    impl: str, info: Any, caps: Capabilities, dtype: str, intent: str, seq_len: int | None = None
) -> Candidate:
    pkg = caps.package(FLASH_PACKAGE[impl])
    bad: list[str] = []
    if not pkg.installed:
        note = ""
        if impl == "flash_attention_3" and caps.package("fa3-fwd").installed:
            note = " (fa3-fwd is installed, but transformers only detects the flash-attn-3 distribution)"
        bad.append(f"{pkg.name} is not installed{note}")
    elif not pkg.usable:
        bad.append(
            f"{pkg.name} {pkg.version or ''} is installed but not usable: {pkg.reason or 'it does not import'}"
        )
    else:
        v = _version(pkg.version)
        if impl == "flash_attention_2" and v is not None:
            if v < _FA2_MIN:
                bad.append(f"flash-attn {pkg.version} is older than 2.3.3, the oldest transformers accepts")
            if info.attn_softcapping and v < _FA2_SOFTCAP_MIN:
                bad.append(
                    f"the model uses attention soft-capping; flash-attn {pkg.version} < 2.6.0 lacks it"
                )
    bad = _flash_checks(impl, impl, info, caps, dtype, intent, seq_len) + bad
    if bad:
        return Candidate(impl, False, tuple(bad))
    why = [f"{pkg.name} {pkg.version or ''}".strip() + (" (assumed)" if pkg.assumed else "") + " is usable"]
    for g in caps.gpus[:1]:
        why.append(flash_support(FLASH_PACKAGE[impl], g.compute_capability, pkg.version)[1])
    pad = _fa2_pad_note(info, intent in _TRAINING) if impl == "flash_attention_2" else None
    return Candidate(impl, True, (*why, *([pad] if pad else [])))


def _kernel_candidate(
    impl: str,
    info: Any,
    caps: Capabilities,
    dtype: str,
    intent: str,
    trust: Sequence[str],
    revision: str | None,
    seq_len: int | None = None,
) -> Candidate:
    repo = HUB_KERNEL[impl]
    bad = _flash_checks(repo, impl, info, caps, dtype, intent, seq_len)
    if bad:
        return Candidate(repo, False, tuple(bad))
    try:
        from ..hub_kernels import check_attention_kernel
    except ImportError as e:
        return Candidate(repo, False, (f"Hub-kernel preflight is unavailable (cudaload.hub_kernels: {e})",))
    ok, reasons = check_attention_kernel(repo, caps, trust=tuple(trust), revision=revision)
    why = tuple(reasons) or (("Hub kernel available",) if ok else ("rejected",))
    pad = _fa2_pad_note(info, intent in _TRAINING) if ok and impl == "flash_attention_2" else None
    return Candidate(repo, bool(ok), (*why, *([pad] if pad else [])))


def _sdpa(info: Any, caps: Capabilities) -> Candidate:
    bad: list[str] = []
    if not info.supports_sdpa:
        bad.append(f"{info.class_name or info.summary.type} does not support SDPA (_supports_sdpa is False)")
    if info.attn_softcapping:
        # transformers 5.17 integrations/sdpa_attention.py:79 sdpa_attention_forward has no softcap parameter:
        # it is dropped
        bad.append(
            f"the model soft-caps attention logits ({info.attn_softcapping}); SDPA ignores soft-capping"
        )
    if bad:
        return Candidate("sdpa", False, tuple(bad))
    where = "torch's fused kernels (flash / memory-efficient / cuDNN)" if caps.gpus else "torch's CPU kernels"
    return Candidate("sdpa", True, (f"scaled_dot_product_attention: {where}, no extra package, no warm-up",))


def _flex(info: Any, caps: Capabilities, intent: str) -> Candidate:
    bad: list[str] = []
    if not info.supports_flex_attn:
        bad.append(f"{info.class_name or info.summary.type} does not support flex_attention")
    if not caps.gpus:
        # torch 2.13 nn/attention/flex_attention.py:2075-2083 _validate_device: no backward on CPU; transformers
        # integrations/flex_attention.py:315-317 refuses sinks on CPU
        if intent in _TRAINING:
            bad.append("flex_attention has no backward on CPU (torch flex_attention._validate_device)")
        if getattr(info, "sinks", False):
            bad.append("transformers' flex_attention cannot run attention sinks on CPU")
    elif caps.gpus[0].compute_capability < (7, 0):
        # torch utils/_triton.py has_triton (torch 2.13: line 190): CUDA devices need major >= 7 for Triton
        bad.append(
            f"flex_attention compiles Triton kernels, which need sm70+; this GPU is {caps.gpus[0].name}"
        )
    if bad:
        return Candidate("flex_attention", False, tuple(bad))
    return Candidate(
        "flex_attention",
        True,
        ("torch flex_attention: compiled on first use; serves soft-capping, sinks and masks SDPA cannot",),
    )


def _eager(info: Any) -> Candidate:
    why = "plain PyTorch attention: always works, O(seq_len^2) memory"
    if info.attn_softcapping:
        why += "; applies the model's soft-capping exactly"
    return Candidate("eager", True, (why,))


# -- the choice --------------------------------------------------------------------------------------------


def _fmt(s: float) -> str:
    return f"{s:.2f} s" if s < 100 else f"{s:.0f} s"


def _candidates(
    info: Any,
    caps: Capabilities,
    dtype: str,
    intent: str,
    trust: Sequence[str],
    revision: str | None,
    seq_len: int | None = None,
    sdpa_facts: Sequence[SdpaFacts] = (),
) -> list[Candidate]:
    order = priority(caps.gpus[0] if caps.gpus else None)
    cands: list[Candidate] = []
    variants = {c.name: c for c in sdpa_dispatch.candidates(caps, _sdpa(info, caps), sdpa_facts, dtype)}
    for name in order:
        if name in FLASH_PACKAGE:
            cands.append(_package_candidate(name, info, caps, dtype, intent, seq_len))
        elif name in _KERNEL_TO_IMPL:
            cands.append(
                _kernel_candidate(_KERNEL_TO_IMPL[name], info, caps, dtype, intent, trust, revision, seq_len)
            )
        elif name == "sdpa":
            cands.append(_sdpa(info, caps))
        elif name in variants:
            cands.append(variants[name])
        elif name == "flex_attention":
            cands.append(_flex(info, caps, intent))
        else:
            cands.append(_eager(info))
    return cands


def _static_order(caps: Capabilities) -> tuple[str, ...]:
    """Preference without measurements: sdpa, then ahead-of-time compiled flash builds for this architecture
    (no JIT), then FA4 and flex_attention (compiled at first use), then eager. For inference the caller moves
    every backend with a first-use cost behind eager."""
    gpu = caps.gpus[0] if caps.gpus else None
    if gpu is None or gpu.compute_capability < (8, 0):
        aot: tuple[str, ...] = ()
    elif gpu.compute_capability[0] == 9:
        aot = ("flash_attention_3", _VLLM_FA3, "flash_attention_2", HUB_KERNEL["flash_attention_2"])
    else:
        aot = ("flash_attention_2", HUB_KERNEL["flash_attention_2"], "flash_attention_3", _VLLM_FA3)
    jit = ("flash_attention_4", HUB_KERNEL["flash_attention_4"], "flex_attention")
    return ("sdpa", *aot, *jit, "eager")


def _ordered(cands: list[Candidate], chosen: str, caps: Capabilities) -> tuple[Candidate, ...]:
    """Candidates in the order a runtime fallback should walk them (cudaload.execute._next_attention takes the
    next valid one after the failed choice): the choice, then torch's own sdpa and eager, which need nothing
    else to work, then the rest by preference; rejected ones last, in the architecture's order."""
    by = {c.name: c for c in cands}
    names = [chosen, "sdpa", "eager", *_static_order(caps), *(c.name for c in cands)]
    seen: list[str] = []
    for n in names:
        if n in by and n not in seen:
            seen.append(n)
    ok = [by[n] for n in seen if by[n].ok]
    return (*ok, *(by[n] for n in seen if not by[n].ok))


def choose_attention(
    info: Any,
    caps: Capabilities,
    *,
    dtype: str,
    intent: str = "inference",
    requested: str = "auto",
    trust: Sequence[str] = (),
    revision: str | None = None,
    work: tuple[int, int] | None = None,
    timings: Mapping[str, float] | None = None,
    timings_source: str | None = None,
    first_use: Mapping[str, float] | None = None,
    timings_repeated: Mapping[str, float] | None = None,
    sdpa_facts: Sequence[SdpaFacts] = (),
) -> Decision:
    """``attn_implementation`` for ``info`` (a :class:`cudaload.model_info.ModelInfo`) on ``caps``.

    "auto" never raises: eager always qualifies. An explicit name is honoured when valid, else
    InvalidChoiceError with every reason.

    ``work``: the (batch_size, seq_len) the caller declared, None when it did not.
    ``timings``: backend name (as in :data:`ALL_NAMES`) -> steady-state seconds of the declared work on this
    GPU, lower is better; names that are not valid here are ignored (and said so).
    ``timings_source``: where the timings come from, shown in the reasons, e.g. "measured on this GPU on
    2026-12-01" or "shipped prior: H200, 2026-12-01, torch 2.11, transformers 5.17".
    ``first_use``: backend -> one-time seconds this process would still pay (import, JIT); overrides the
    shipped :data:`FIRST_USE` per name (pass 0.0 for a backend already imported and compiled here).
    ``timings`` are for the state a new process is in (lengths it has not met); ``timings_repeated``, the
    same work on lengths already met, is shown beside them and not weighed.
    ``sdpa_facts``: what was measured about SDPA's cuDNN dispatch (:mod:`cudaload.policies.sdpa_dispatch`);
    where they say leaving cuDNN out of decode helps on this GPU, the default is ``cudaload_sdpa``.
    """
    cands = _candidates(info, caps, dtype, intent, trust, revision, work[1] if work else None, sdpa_facts)
    by = {c.name: c for c in cands}
    costs: dict[str, tuple[float, str]] = {n: (f.seconds, f.source) for n, f in FIRST_USE.items()}
    for n, sec in (first_use or {}).items():
        costs[n] = (float(sec), "given by the caller")

    def cost(name: str) -> float:
        return costs.get(name, (0.0, ""))[0]

    # say what each valid backend would still cost once, so explain() shows it beside the candidate
    for i, c in enumerate(cands):
        if c.ok and cost(c.name) > 0:
            cands[i] = Candidate(
                c.name, True, (*c.reasons, f"first use: +{_fmt(cost(c.name))} ({costs[c.name][1]})")
            )
    by = {c.name: c for c in cands}
    valid = [c.name for c in cands if c.ok]
    measured = {n: float(t) for n, t in (timings or {}).items() if n in by and t is not None and t >= 0}
    source = timings_source or "timings given by the caller"

    if requested != "auto":
        name = requested.strip()
        if name not in by:
            raise InvalidChoiceError(
                f"attn={name!r} is not an attention implementation cudaload plans",
                fix=f"use 'auto' or one of: {', '.join(ALL_NAMES)}",
            )
        c = by[name]
        if not c.ok:
            raise InvalidChoiceError(
                f"attn={name} cannot be used here",
                reasons=c.reasons,
                fix="use attn='auto' to take the best valid backend, or fix the first reason",
            )
        extra: list[str] = []
        ok_measured = {n: t for n, t in measured.items() if by[n].ok}
        if ok_measured:
            extra.append(
                f"{source}: "
                + ", ".join(f"{n} {_fmt(t)}" for n, t in sorted(ok_measured.items(), key=lambda kv: kv[1]))
            )
        return Decision(
            name, ("requested explicitly", *c.reasons, *extra), _ordered(cands, name, caps), explicit=True
        )

    ignored = sorted(n for n in measured if not by[n].ok)
    usable = {n: t for n, t in measured.items() if by[n].ok}
    usable, dominated = _pool_sdpa_twins(usable)
    if usable:
        total = {n: t + cost(n) for n, t in usable.items()}
        best = min(total, key=lambda n: (total[n], valid.index(n)))
        ranked = sorted(total, key=lambda n: total[n])
        reasons = [
            f"{source}: "
            + ", ".join(f"{n} {_fmt(usable[n])}" for n in sorted(usable, key=lambda n: usable[n])),
        ]
        paid = [n for n in ranked if cost(n) > 0]
        if paid:
            reasons.append(
                "first use not yet paid in this process: " + ", ".join(f"{n} +{_fmt(cost(n))}" for n in paid)
            )
            reasons.append("steady state + first use: " + ", ".join(f"{n} {_fmt(total[n])}" for n in ranked))
        rep_ok = {n: float(t) for n, t in (timings_repeated or {}).items() if n in usable}
        if rep_ok:
            reasons.append(
                "the same work on lengths already met (not weighed: a new process has met none): "
                + ", ".join(f"{n} {_fmt(rep_ok[n])}" for n in sorted(rep_ok, key=lambda n: rep_ok[n]))
            )
        reasons.append(f"{best} costs least on the declared work")
        if ignored:
            reasons.append("measured but not valid here: " + ", ".join(ignored))
        unmeasured = [n for n in valid if n not in usable and n not in dominated]
        if unmeasured:
            reasons.append("valid but not measured (not weighed): " + ", ".join(unmeasured))
        if dominated:
            reasons.append(
                f"{SDPA_DECODE} weighed at the lower of its and {SDPA_NO_CUDNN}'s seconds: on lengths met for the "
                "first times both run the same kernels (their difference is the host's noise), and where lengths "
                f"recur {SDPA_NO_CUDNN} keeps cuDNN out, which is equal or slower there"
            )
        return Decision(best, tuple(reasons + list(by[best].reasons)), _ordered(cands, best, caps))

    short = _short_decode(work, intent, caps)
    if not timings:
        note = ["no timings for this GPU and work: the choice follows the rules above"]
    else:
        note = [
            f"{source} covers no valid backend"
            + (f" ({', '.join(ignored)} not valid here)" if ignored else "")
        ]
    if short:
        return Decision("eager", (short, *by["eager"].reasons, *note), _ordered(cands, "eager", caps))

    training = intent in _TRAINING
    order = _static_order(caps)
    if not training:
        # inference without measurements pays no one-time seconds: eager (none) beats FA4 / flex (seconds)
        order = tuple(n for n in order if cost(n) == 0) + tuple(n for n in order if cost(n) > 0)
    chosen = next(n for n in order if by[n].ok)
    reasons = []
    variant = _sdpa_variant(caps, by, sdpa_facts, training) if chosen == "sdpa" else None
    if variant is not None:
        chosen, why = variant
        reasons += why
    elif chosen == "sdpa":
        reasons.append(
            "sdpa: no import or compile cost, and what plain transformers uses (declare the work -- batch_size, "
            "seq_len, new_tokens -- to choose from measured generate() timings instead)"
        )
    else:
        skipped = [n for n in order[: order.index(chosen)] if n in by]
        reasons.append(f"preferred but rejected: {', '.join(skipped)}" if skipped else "first choice")
        if not training:
            dearer = [n for n in valid if cost(n) > 0 and n != chosen]
            if dearer:
                reasons.append(
                    "no timings, so no one-time seconds are paid for an unknown gain: "
                    + ", ".join(f"{n} would cost +{_fmt(cost(n))} first" for n in dearer)
                )
        else:
            reasons.append("training: one-time first-use seconds are amortised over the run")
    faster_unknown = [n for n in valid if n not in ("sdpa", "eager", chosen)]
    if faster_unknown and chosen == "sdpa":
        reasons.append(
            "also valid, not measured here: "
            + ", ".join(faster_unknown)
            + " (`cudaload tune` measures them on this GPU)"
        )
    reasons += note
    return Decision(chosen, tuple(reasons + list(by[chosen].reasons)), _ordered(cands, chosen, caps))


def _pool_sdpa_twins(measured: Mapping[str, float]) -> tuple[dict[str, float], set[str]]:
    """cudaload_sdpa and cudaload_sdpa_nocudnn measured side by side are two samples of one quantity on
    first-seen lengths (neither lets cuDNN take a shape met fewer than twice): cudaload_sdpa is weighed at the
    lower of the two, as either name would have been chosen at it, and cudaload_sdpa_nocudnn, equal or slower where lengths recur, is not chosen automatically (it stays
    valid for an explicit attn=). Returns (the timings to weigh, the names folded in)."""
    out = dict(measured)
    if SDPA_NO_CUDNN in out and SDPA_DECODE in out:
        out[SDPA_DECODE] = min(out[SDPA_DECODE], out.pop(SDPA_NO_CUDNN))
        return out, {SDPA_NO_CUDNN}
    return out, set()


def _sdpa_variant(
    caps: Capabilities, by: Mapping[str, Candidate], facts: Sequence[SdpaFacts], training: bool
) -> tuple[str, list[str]] | None:
    """``cudaload_sdpa`` in place of sdpa, with why, where it is valid here and measured to help on this GPU."""
    c = by.get(SDPA_DECODE)
    if c is None or not c.ok or training:
        return None
    f = sdpa_dispatch.facts_for(caps, facts, SDPA_DECODE)
    if f is None or not f.helps:
        return None
    takes = sdpa_dispatch.cudnn_takes_decode(caps)[1]
    return SDPA_DECODE, [
        "sdpa without cuDNN on lengths met for the first times: " + takes,
        f.describe(),
        f"a shape met {sdpa_dispatch.RECUR}+ times before goes to cuDNN, whose graph is then built once; "
        "load_model checks on the GPU that cuDNN takes decode calls, else keeps sdpa",
    ]


def _short_decode(work: tuple[int, int] | None, intent: str, caps: Capabilities) -> str | None:
    """Why the declared work is single-sequence short decode, where eager is fastest; None when it is not."""
    if work is None or intent != "inference" or not caps.gpus:
        return None
    batch, seq = work
    if batch != 1 or seq > SHORT_DECODE_MAX_TOKENS or caps.gpus[0].compute_capability < (8, 0):
        return None
    return (
        f"declared work: 1 sequence of at most {seq} tokens, so decoding dominates and each step's host-side "
        "overhead decides; eager's plain kernels had the least (H200, 2026-11-30: 1 x 512 + 32 tokens, eager "
        "1.03 s, sdpa 1.07 s, flash_attention_4 1.84 s)"
    )
