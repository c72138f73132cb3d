"""Attention backend: every candidate checked, the first valid one wins, every rejection keeps its reason.

Priority follows the architecture (Blackwell: FA4 first; Hopper: FA3 and FA4 before FA2; Ampere/Ada: FA2;
older GPUs and the CPU: SDPA). Each flash candidate comes twice: the pip package (``flash_attention_N``) and
its Hub-kernel form (the repo id transformers itself falls back to, ``FLASH_ATTN_KERNEL_FALLBACK``), which
``from_pretrained`` accepts as ``attn_implementation``. Architecture facts come from
:mod:`cudaload.detection.support`; Hub-kernel preflight (kernels usable with this transformers, trust,
cache when offline) from :mod:`cudaload.hub_kernels`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..capabilities import GPU, Capabilities
from ..decision import Candidate, Decision
from ..detection.support import flash_support
from ..errors import InvalidChoiceError

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
#: Hub kernels that ship no backward pass (vLLM's FA3 build is inference-only).
_FORWARD_ONLY_KERNELS = frozenset({"kernels-community/vllm-flash-attn3"})
#: flash-attn 2 gained soft-capping in 2.6.0 (its changelog); older builds silently ignore nothing, they fail.
_FA2_SOFTCAP_MIN = (2, 6, 0)
_FA2_MIN = (2, 3, 3)  # transformers refuses older flash-attn (is_flash_attn_2_available)

#: Declared work of one sequence up to this many tokens (prompt + new) is decode-bound: each new token costs
#: one attention call per layer, and the host-side cost of the call decides, not the math. Eager's few plain
#: kernels then beat SDPA's dispatch and FA4's Python wrapper. Measured on the H200 (bf16, generate() of a
#: 512-token prompt + 32 tokens, benchmarks/results/2026-11-29-h200/results.md section 2): Qwen3-8B eager
#: 1.17 s, FA4 1.47 s, SDPA 1.88 s; Qwen3-0.6B eager 0.995 s, FA4 1.15 s, SDPA 1.36 s. With 8 sequences of
#: 2048 tokens FA4 was fastest (8B: 1.78 s vs eager 2.08 s), so the rule stops at one sequence.
SHORT_DECODE_MAX_TOKENS = 1024

ALL_NAMES = (
    "flash_attention_4",
    HUB_KERNEL["flash_attention_4"],
    "flash_attention_3",
    HUB_KERNEL["flash_attention_3"],
    "flash_attention_2",
    HUB_KERNEL["flash_attention_2"],
    "sdpa",
    "flex_attention",
    "eager",
)


def priority(gpu: GPU | None) -> tuple[str, ...]:
    """Candidate order for one GPU (None: the CPU). Every name appears, so rejections are explained too."""
    fa = {n: (n, HUB_KERNEL[n]) for n in HUB_KERNEL}
    tail = ("sdpa", "flex_attention", "eager")
    if gpu is None:
        head: tuple[str, ...] = ()
    elif gpu.compute_capability >= (10, 0):
        head = (*fa["flash_attention_4"], *fa["flash_attention_2"], *fa["flash_attention_3"])
    elif gpu.compute_capability >= (9, 0):
        head = (*fa["flash_attention_3"], *fa["flash_attention_4"], *fa["flash_attention_2"])
    elif gpu.compute_capability >= (8, 0):
        head = (*fa["flash_attention_2"], *fa["flash_attention_4"], *fa["flash_attention_3"])
    else:
        head = ()
    rest = tuple(n for n in ALL_NAMES if n not in head and n not in tail)
    # older GPUs / CPU: sdpa first, the flash candidates listed after eager only to explain why not
    return (*head, *tail, *rest) if head else (*tail, *rest)


def _version(v: str | None) -> tuple[int, ...] | None:
    if not v:
        return None
    out: list[int] = []
    for part in v.split("."):
        digits = "".join(ch for ch in part if ch.isdigit())
        if not digits:
            break
        out.append(int(digits))
        if not part.isdigit():
            break
    return tuple(out) or None


def _head_dim_limit(impl: str, head_dim: int, cc: tuple[int, int]) -> str | None:
    """None when ``head_dim`` is supported, else the reason."""
    if impl in ("flash_attention_2", "flash_attention_3"):
        # flash-attn 2 and 3 compile head dims up to 256 (their READMEs)
        return None if head_dim <= 256 else f"head_dim {head_dim} > 256, the largest {impl} supports"
    # flash-attn-4 4.0.0b36 interface._validate_head_dims: sm90 8..256; sm100/110 8..128, or exactly 256
    # (and the DeepSeek 192/128 shape, which no model here uses); multiples of 8.
    if head_dim % 8:
        return f"head_dim {head_dim} is not a multiple of 8 (flash-attn-4)"
    if cc[0] == 9 and not 8 <= head_dim <= 256:
        return f"head_dim {head_dim} outside 8..256 (flash-attn-4 on sm90)"
    if cc[0] in (10, 11) and not (8 <= head_dim <= 128 or head_dim == 256):
        return f"head_dim {head_dim}: flash-attn-4 on sm{cc[0]}x takes 8..128 or exactly 256"
    if head_dim > 256:
        return f"head_dim {head_dim} > 256 (flash-attn-4)"
    return None


def _flash_checks(
    impl: str, info: Any, caps: Capabilities, dtype: str, intent: str, hub_form: bool
) -> list[str]:
    """Reasons against ``impl`` (package or Hub form) that do not depend on where it comes from."""
    bad: list[str] = []
    if not caps.gpus:
        return ["no GPU: flash attention runs on CUDA GPUs only"]
    pkg = FLASH_PACKAGE[impl]
    for g in caps.gpus:
        ok, why = flash_support(pkg, g.compute_capability)
        if not ok:
            bad.append(f"{g.name}: {why}")
            break
    if not info.supports_flash_attn:
        bad.append(
            f"{info.class_name or info.summary.type} does not support flash attention "
            "(_supports_flash_attn is False)"
        )
    if dtype not in ("bfloat16", "float16"):
        bad.append(f"flash attention needs float16 or bfloat16; the plan's dtype is {dtype}")
    cc = caps.gpus[0].compute_capability
    hd = _head_dim_limit(impl, info.summary.head_dim, cc)
    if hd:
        bad.append(hd)
    training = intent != "inference"
    if training:
        if hub_form and HUB_KERNEL[impl] in _FORWARD_ONLY_KERNELS:
            bad.append(
                f"{HUB_KERNEL[impl]} is a forward-only (inference) build; "
                f"intent {intent} needs a backward pass"
            )
        # flash-attn-4 4.0.0b36: backward asserts sm9x-12x; sm100 hd256 backward has no softcap
        if (
            impl == "flash_attention_4"
            and cc[0] in (10, 11)
            and info.summary.head_dim == 256
            and info.attn_softcapping
        ):
            bad.append("flash-attn-4's sm100 backward for head_dim 256 does not support soft-capping")
        if info.attention_dropout > 0 and impl != "flash_attention_2":
            bad.append(
                f"attention_dropout={info.attention_dropout}: {impl} has no dropout (training would differ)"
            )
    return bad


def _package_candidate(impl: str, info: Any, caps: Capabilities, dtype: str, intent: str) -> Candidate:
    bad = _flash_checks(impl, info, caps, dtype, intent, hub_form=False)
    pkg = caps.package(FLASH_PACKAGE[impl])
    if not pkg.installed:
        note = ""
        if impl == "flash_attention_3" and caps.package("fa3-fwd").installed:
            note = " (fa3-fwd is installed, but transformers only detects the flash-attn-3 distribution)"
        bad.append(f"{pkg.name} is not installed{note}")
    elif not pkg.usable:
        bad.append(
            f"{pkg.name} {pkg.version or ''} is installed but not usable: "
            f"{pkg.reason or 'it does not import'}"
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
    if bad:
        return Candidate(impl, False, tuple(bad))
    why = [f"{pkg.name} {pkg.version or ''}".strip() + (" (assumed)" if pkg.assumed else "") + " is usable"]
    for g in caps.gpus[:1]:
        why.append(flash_support(FLASH_PACKAGE[impl], g.compute_capability)[1])
    return Candidate(impl, True, tuple(why))


def _kernel_candidate(
    impl: str,
    info: Any,
    caps: Capabilities,
    dtype: str,
    intent: str,
    trust: Sequence[str],
    revision: str | None,
) -> Candidate:
    repo = HUB_KERNEL[impl]
    bad = _flash_checks(impl, info, caps, dtype, intent, hub_form=True)
    if bad:
        return Candidate(repo, False, tuple(bad))
    try:
        from ..hub_kernels import check_attention_kernel
    except ImportError as e:
        return Candidate(repo, False, (f"Hub-kernel preflight is unavailable (cudaload.hub_kernels: {e})",))
    ok, reasons = check_attention_kernel(repo, caps, trust=tuple(trust), revision=revision)
    return Candidate(repo, bool(ok), tuple(reasons) or (("Hub kernel available",) if ok else ("rejected",)))


def _sdpa(info: Any, caps: Capabilities) -> Candidate:
    bad: list[str] = []
    if not info.supports_sdpa:
        bad.append(f"{info.class_name or info.summary.type} does not support SDPA (_supports_sdpa is False)")
    if info.attn_softcapping:
        # transformers' sdpa_attention_forward drops the softcap argument: outputs would differ from training
        bad.append(
            f"the model soft-caps attention logits ({info.attn_softcapping}); SDPA ignores soft-capping"
        )
    if bad:
        return Candidate("sdpa", False, tuple(bad))
    where = "torch's fused kernels (flash / memory-efficient)" if caps.gpus else "torch's CPU kernels"
    return Candidate("sdpa", True, (f"scaled_dot_product_attention: {where}, no extra package",))


def _flex(info: Any, caps: Capabilities) -> Candidate:
    bad: list[str] = []
    if not info.supports_flex_attn:
        bad.append(f"{info.class_name or info.summary.type} does not support flex_attention")
    if not caps.gpus:
        bad.append("flex_attention compiles Triton kernels: GPU only")
    elif caps.gpus[0].compute_capability < (8, 0):
        bad.append("flex_attention's Triton kernels target sm80+")
    if bad:
        return Candidate("flex_attention", False, tuple(bad))
    return Candidate(
        "flex_attention",
        True,
        (
            "torch flex_attention (compiled on first use: seconds of warm-up); "
            "serves soft-capping and masks SDPA cannot",
        ),
    )


def _eager(info: Any) -> Candidate:
    why = "plain PyTorch attention: always works, O(seq_len^2) memory"
    if info.attn_softcapping:
        why += "; applies the model's soft-capping exactly"
    return Candidate("eager", True, (why,))


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
) -> Decision:
    """``attn_implementation`` for ``info`` (a :class:`cudaload.model_info.ModelInfo`) on ``caps``.

    "auto" never raises: eager always qualifies. An explicit name is honoured when valid, else
    InvalidChoiceError with every reason. ``work`` is the (batch_size, seq_len) the caller declared, None
    when it did not: one short sequence for inference on a GPU picks eager (see SHORT_DECODE_MAX_TOKENS).
    """
    order = priority(caps.gpus[0] if caps.gpus else None)
    cands: list[Candidate] = []
    for name in order:
        if name in FLASH_PACKAGE:
            cands.append(_package_candidate(name, info, caps, dtype, intent))
        elif name in _KERNEL_TO_IMPL:
            cands.append(_kernel_candidate(_KERNEL_TO_IMPL[name], info, caps, dtype, intent, trust, revision))
        elif name == "sdpa":
            cands.append(_sdpa(info, caps))
        elif name == "flex_attention":
            cands.append(_flex(info, caps))
        else:
            cands.append(_eager(info))
    by = {c.name: c for c in cands}

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
        return Decision(name, ("requested explicitly", *c.reasons), tuple(cands), explicit=True)

    # sdpa before flex before eager, except that a soft-capping model prefers exact flex/eager over nothing
    chosen = next(c for c in cands if c.ok)  # eager is always ok
    reasons = [
        f"first valid candidate in the {'CPU' if not caps.gpus else caps.gpus[0].architecture} order",
        *chosen.reasons,
    ]
    skipped = [c.name for c in cands[: cands.index(chosen)]]
    if skipped:
        reasons.append("preferred but rejected: " + ", ".join(skipped))
    short = _short_decode(work, intent, caps)
    if short and chosen.name != "eager":
        eager = by["eager"]
        return Decision(
            "eager",
            (
                short,
                *eager.reasons,
                f"{chosen.name} would be chosen for batched or longer work",
                *(["preferred but rejected: " + ", ".join(skipped)] if skipped else []),
            ),
            tuple(cands),
        )
    return Decision(chosen.name, tuple(reasons), tuple(cands))


def _short_decode(work: tuple[int, int] | None, intent: str, caps: Capabilities) -> str | None:
    """Why the declared work is single-sequence short decode, where eager is fastest; None when it is not."""
    if work is None or intent != "inference" or not caps.gpus:
        return None
    batch, seq = work
    if batch != 1 or seq > SHORT_DECODE_MAX_TOKENS or caps.gpus[0].compute_capability < (8, 0):
        return None
    return (
        f"declared work: 1 sequence of at most {seq} tokens, so decoding dominates and each step's "
        "host-side overhead decides; eager's plain kernels had the least (measured on the H200: 1.25x "
        "FA4, 1.6x SDPA for a 512-token prompt + 32 tokens)"
    )
