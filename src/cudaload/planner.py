"""``cudaload.plan()``: a model and a machine in, a :class:`~cudaload.plans.Plan` out.

Pure and deterministic for a given snapshot: no weights read (safetensors headers at most), no GPU touched,
no network. Order: model summary -> dtype -> attention (needs the dtype) -> fit ladder (quantization and
placement, needs dtype and attention for the activation estimate) -> load path -> Hub kernels -> warnings.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from typing import Any

from . import _env
from .capabilities import Capabilities
from .errors import ConfigurationError, DoesNotFitError
from .model_info import ModelInfo, model_info
from .plans import INTENTS, MemoryEstimate, Plan
from .policies.attention import choose_attention
from .policies.dtype import choose_dtype
from .policies.load_path import choose_load_path
from .policies.memory import LORA_ALPHA, LORA_DROPOUT, LORA_R, gpu_terms
from .policies.parallelism import decide as decide_parallelism
from .policies.quantization import fit

log = logging.getLogger(__name__)

#: Default work size: the model's context, capped. Planning KV cache for a 128k context by default would
#: push every model into quantization for a length few callers use.
DEFAULT_SEQ_CAP = 4096
DEFAULT_SEQ_UNKNOWN = 2048


def resolve_hardware(hardware: Capabilities | str | os.PathLike[str] | None) -> Capabilities:
    if isinstance(hardware, Capabilities):
        return hardware
    if hardware is None:
        from .detection import detect

        return detect()
    from .profiles import hardware as profile

    return profile(os.fspath(hardware))


def hardware_summary(caps: Capabilities) -> dict[str, Any]:
    return {
        "source": caps.source,
        "gpus": [
            {
                "index": g.index,
                "name": g.name,
                "compute_capability": list(g.compute_capability),
                "architecture": g.architecture,
                "total_memory": g.total_memory,
                "free_memory": g.free_memory,
            }
            for g in caps.gpus
        ],
        "distributed": caps.distributed.to_dict() if caps.distributed.active else None,
        "torch": caps.torch_version,
        "torch_cuda": caps.torch_cuda_version,
        "transformers": caps.transformers_version,
        "host_memory": caps.host_memory,
        "packages": {p.name: (p.version or True) if p.usable else False for p in caps.packages},
    }


def _peft(info: ModelInfo) -> dict[str, Any]:
    return {
        "r": LORA_R,
        "lora_alpha": LORA_ALPHA,
        "lora_dropout": LORA_DROPOUT,
        "target_modules": "all-linear",
        "bias": "none",
        "task_type": info.task_type,
    }


def _kernels(
    info: ModelInfo,
    caps: Capabilities,
    intent: str,
    request: bool | None,
    trust: Sequence[str],
    model_class: str | None,
) -> dict[str, Any]:
    try:
        from .hub_kernels import plan_kernels
    except ImportError as e:
        return {
            "requested": request,
            "use_kernels": False,
            "reasons": [f"Hub-kernel planning unavailable (cudaload.hub_kernels: {e})"],
        }
    return dict(
        plan_kernels(
            info.summary,
            caps,
            intent=intent,
            request=request,
            trust=tuple(trust),
            model_class_name=model_class or info.class_name,
        )
    )


def plan(
    model: Any,
    *,
    hardware: Capabilities | str | os.PathLike[str] | None = None,
    intent: str = "inference",
    seq_len: int | None = None,
    batch_size: int | None = None,
    attn: str = "auto",
    dtype: str = "auto",
    quantization: str = "auto",
    device_map: Any = None,
    max_memory: Mapping[Any, Any] | None = None,
    allow_offload: bool = False,
    assume_installed: Sequence[str] = (),
    assume_missing: Sequence[str] = (),
    kernels: bool | None = None,
    trust_kernels: Sequence[str] = (),
    model_class: str | None = None,
    revision: str | None = None,
    fast: bool | None = None,
    parallelism: str = "auto",
    lower_latency: bool = False,
) -> Plan:
    """Decide dtype, attention, quantization, placement and load path for ``model`` on ``hardware``.

    ``parallelism`` ("auto", "ddp", "fsdp2", "deepspeed", "tp", "layer_split", "single") and
    ``lower_latency`` (prefer tensor parallelism for inference) steer the several-GPU decision."""
    if intent not in INTENTS:
        raise ConfigurationError(f"unknown intent {intent!r}", fix=f"use one of {', '.join(INTENTS)}")
    for name, v in (("seq_len", seq_len), ("batch_size", batch_size)):
        if v is not None and (not isinstance(v, int) or v < 1):
            raise ConfigurationError(f"{name}={v!r} must be a positive integer", fix=f"pass {name}=1 or more")
    caps = resolve_hardware(hardware)
    if assume_installed or assume_missing:
        caps = caps.with_packages(assume_installed, assume_missing)
    info = model_info(model, model_class=model_class, revision=revision)
    s = info.summary
    # the work the caller declared (both numbers), before defaults fill them in for the memory estimate
    declared = (batch_size, seq_len) if batch_size is not None and seq_len is not None else None
    if seq_len is None:
        seq_len = min(s.max_position_embeddings or DEFAULT_SEQ_UNKNOWN, DEFAULT_SEQ_CAP)
    batch_size = batch_size or 1

    dt = choose_dtype(
        caps,
        checkpoint_dtype=s.checkpoint_dtype,
        model_type=s.type,
        intent=intent,
        requested=str(dtype),
        fp16_overflow=info.fp16_overflow,
    )
    assert dt.choice is not None
    trust = (*trust_kernels, *_env.trusted_kernel_repos())
    at = choose_attention(
        info, caps, dtype=dt.choice, intent=intent, requested=attn, trust=trust, revision=None, work=declared
    )
    assert at.choice is not None
    fit_kw: dict[str, Any] = dict(
        dtype=dt.choice,
        intent=intent,
        seq_len=seq_len,
        batch_size=batch_size,
        attn=at.choice,
        quantization=quantization,
        device_map=device_map,
        max_memory=max_memory,
        allow_offload=allow_offload,
    )
    fr = None
    try:
        fr = fit(info, caps, **fit_kw)
    except DoesNotFitError as e:
        nofit: DoesNotFitError | None = e
    else:
        nofit = None
    # several GPUs (torchrun ranks, or a profile's N GPUs): DDP / FSDP2 / TP / layer split; may rescue a
    # model that no single process fits, or replace a quantization chosen only to fit one rank's GPU
    pd = decide_parallelism(
        info, caps, fr, nofit, strategy=parallelism, lower_latency=lower_latency, **fit_kw
    )
    if pd.fit is not None:
        fr = pd.fit
    assert fr is not None
    placement = pd.placement or fr.fit.placement
    assert placement is not None
    if pd.memory is not None:
        memory = pd.memory
    else:
        gpu_devs = [d for d in fr.fit.per_device if d.startswith("cuda")]
        terms = gpu_terms(fr.breakdown, len(gpu_devs))
        per_device = dict(fr.fit.per_device)
        memory = MemoryEstimate(
            terms=terms,
            total=sum(per_device.values()),
            per_device=per_device,
            budget=dict(fr.fit.budget),
            notes=fr.breakdown.notes,
        )
    lp = choose_load_path(info, quantization=fr.decision.choice, placement=placement, prefer=fast)

    warnings: list[str] = []
    warnings.extend(r.removeprefix("WARNING: ") for r in dt.reasons if r.startswith("WARNING: "))
    if placement.offload:
        warnings.append(
            "layers are offloaded to CPU/disk: every forward pass copies them in (expect slow generation)"
        )
    fused_ok = any(c.ok for c in at.candidates if c.name != "eager")
    if caps.gpus and at.choice == "eager" and not info.attn_softcapping and not fused_ok:
        # eager chosen on purpose (explicitly, or for a declared short single sequence) is not a problem
        warnings.append("eager attention on a GPU: no fused backend qualified (see attention candidates)")
    if s.max_position_embeddings and seq_len > s.max_position_embeddings:
        warnings.append(
            f"seq_len {seq_len} exceeds the model's max_position_embeddings {s.max_position_embeddings}"
        )
    for f in caps.findings:
        if f.severity == "error":
            warnings.append(f"{f.code}: {f.message} (fix: {f.fix})")

    p = Plan(
        model=s,
        hardware=hardware_summary(caps),
        intent=intent,
        seq_len=seq_len,
        batch_size=batch_size,
        dtype=dt,
        attention=at,
        quantization=fr.decision,
        placement=placement,
        memory=memory,
        load_path=lp,
        kernels=_kernels(info, caps, intent, kernels, trust, model_class),
        quantization_config=fr.quantization_config,
        peft=_peft(info) if intent in ("lora", "qlora") else None,
        warnings=tuple(warnings),
        parallelism=pd.parallelism,
    )
    log.info(
        "plan for %s: dtype=%s attn=%s quantization=%s device_map=%s",
        s.name,
        dt.choice,
        at.choice,
        fr.decision.choice,
        placement.device_map,
    )
    return p
