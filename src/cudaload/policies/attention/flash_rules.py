"""Every rule one flash candidate (package or Hub-kernel form) must pass, in order: kernels for each GPU
(:mod:`cudaload.detection.support`), what transformers does with the request (:mod:`.transformers_rules`), then
the kernel package's own checks (:mod:`.fa2_fa3_rules`, :mod:`.fa4_rules`)."""

from __future__ import annotations

from ...capabilities import Capabilities
from ...detection.support import flash_support, hub_kernel_support
from ...model_info import ModelInfo
from .fa2_fa3_rules import _fa2_checks, _head_dim_fa3, _vllm_fa3_sinks
from .fa4_rules import _fa4_checks
from .names import _KERNEL_TO_IMPL, _TRAINING, _VLLM_FA3, FLASH_PACKAGE
from .transformers_rules import _no_dropout, _no_sink_param, _qk_dim, _transformers_checks


def _flash_checks(
    name: str,
    impl: str,
    info: ModelInfo,
    caps: Capabilities,
    dtype: str,
    intent: str,
    seq_len: int | None = None,
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
