"""The candidates, one per backend name: each flash version as its pip package and as its Hub kernel (the rules
of :mod:`.flash_rules`, then the installed version or the Hub preflight), sdpa and cudaload's sdpa variants
(:mod:`cudaload.policies.sdpa_dispatch`), flex_attention and eager; and the order they are listed in
(``priority``: display only, the choice is made in :mod:`.choice`)."""

from __future__ import annotations

from collections.abc import Sequence

from ...capabilities import GPU, Capabilities
from ...detection.support import flash_support
from ...detection.versions import version_tuple as _version
from ...model_info import ModelInfo
from ...plans.decision import Candidate
from .. import sdpa_dispatch
from ..sdpa_dispatch import SDPA_DECODE, SDPA_NO_CUDNN, SdpaFacts
from .fa2_fa3_rules import _fa2_pad_note
from .flash_rules import _flash_checks
from .names import (
    _FA2_MIN,
    _FA2_SOFTCAP_MIN,
    _KERNEL_TO_IMPL,
    _TRAINING,
    ALL_NAMES,
    FLASH_PACKAGE,
    HUB_KERNEL,
    TORCH_VARLEN,
)
from .torch_varlen_rules import torch_varlen_candidate


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


def _package_candidate(
    impl: str, info: ModelInfo, caps: Capabilities, dtype: str, intent: str, seq_len: int | None = None
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
    info: ModelInfo,
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
        from ...hub_kernels import check_attention_kernel
    except ImportError as e:
        return Candidate(repo, False, (f"Hub-kernel preflight is unavailable (cudaload.hub_kernels: {e})",))
    ok, reasons = check_attention_kernel(repo, caps, trust=tuple(trust), revision=revision)
    why = tuple(reasons) or (("Hub kernel available",) if ok else ("rejected",))
    pad = _fa2_pad_note(info, intent in _TRAINING) if ok and impl == "flash_attention_2" else None
    return Candidate(repo, bool(ok), (*why, *([pad] if pad else [])))


def _sdpa(info: ModelInfo, caps: Capabilities) -> Candidate:
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


def _flex(info: ModelInfo, caps: Capabilities, intent: str) -> Candidate:
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


def _eager(info: ModelInfo) -> Candidate:
    why = "plain PyTorch attention: always works, O(seq_len^2) memory"
    if info.attn_softcapping:
        why += "; applies the model's soft-capping exactly"
    return Candidate("eager", True, (why,))


def _candidates(
    info: ModelInfo,
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
        if name == TORCH_VARLEN:
            # an attention for packed training steps: inference has no packed rows (its prompts run sdpa's
            # flash kernel already), so it is a candidate for the training intents only
            if intent in _TRAINING:
                cands.append(torch_varlen_candidate(info, caps, dtype, intent))
        elif name in FLASH_PACKAGE:
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
