"""The plan's sections beside the decisions: the LoRA config, the Hub-kernel mapping, the serving settings, and
the warnings a person should read first."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from ..capabilities import Capabilities
from ..model_info import ModelInfo
from ..plans.decision import Decision
from ..policies.memory import LORA_ALPHA, LORA_DROPOUT, LORA_R
from ..policies.sdpa_dispatch import NAMES as SDPA_VARIANTS
from ..policies.serving import (
    ServingDevice,
    ServingPlan,
    ServingQuery,
    choose_paged_attention,
    select_serving,
)

if TYPE_CHECKING:
    from ..policies.quantization import FitResult


def _peft(info: ModelInfo, lora: Mapping[str, Any] | None, dropout: Decision | None) -> dict[str, Any]:
    """The LoraConfig keywords: cudaload's defaults, the caller's ``lora`` over them, the dropout decided."""
    return {
        "r": LORA_R,
        "lora_alpha": LORA_ALPHA,
        "target_modules": "all-linear",
        "bias": "none",
        "task_type": info.task_type,
        **dict(lora or {}),
        "lora_dropout": float(dropout.choice) if dropout is not None and dropout.choice else LORA_DROPOUT,
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
        from ..hub_kernels import plan_kernels
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


def _serving(
    info: ModelInfo,
    caps: Capabilities,
    dtype: str,
    attn: str,
    fr: FitResult,
    gpu_devs: list[str],
    seq_len: int | None,
    batch_size: int | None,
    usable_attention: list[str] | None = None,
) -> ServingPlan:
    """The serving section on the first GPU the model is placed on (every rank is alike under tensor parallel)."""
    weights = int(fr.breakdown.terms.get("weights", 0))
    world = caps.distributed.world_size or 1
    total: int | None = None
    name = None
    # no GPU: the host's budget (None when unknown)
    budget: int | None = fr.fit.budget.get("cpu")
    if gpu_devs:
        dev = gpu_devs[0]
        gpu = next((g for g in caps.gpus if f"cuda:{g.index}" == dev), None)
        if gpu is not None:
            total, name = gpu.total_memory, gpu.name
        budget = int(fr.fit.budget.get(dev, total or 0))
        if len(gpu_devs) > 1 and world == 1:
            # layers split over GPUs (one runs at a time): plan each device's share of the weights
            weights = weights // len(gpu_devs)
    sp = select_serving(
        info,
        ServingQuery(
            dtype,
            fr.decision.choice,
            attn,
            tuple(usable_attention) if usable_attention is not None else None,
            seq_len,
            batch_size,
        ),
        ServingDevice(weights, total, budget, name, world),
        caps.transformers_version,
    )
    if len(gpu_devs) > 1 and world == 1:
        sp = replace(
            sp,
            notes=(
                *sp.notes,
                f"layers split over {len(gpu_devs)} GPUs run one device at a time; tensor parallel (torchrun, "
                "tp_plan='auto') serves faster: see the parallelism decision",
            ),
        )
    return sp


def _serving_attention(at: Decision, info: ModelInfo, caps: Capabilities, usable: list[str]) -> Decision:
    """The attention decision for intent="serving": the implementation whose paged form the serving policy
    prefers, when it differs from the one-batch choice (every candidate kept, the reason stated first)."""
    paged = choose_paged_attention(
        sdpa_family(at.choice) or "sdpa",
        supports_sdpa=bool(getattr(info, "supports_sdpa", True)),
        usable=[sdpa_family(u) or u for u in usable],
        transformers_version=caps.transformers_version,
    )
    base = (paged.choice or "").removeprefix("paged|")
    if not base or base == at.choice or base.startswith("kernels-community/"):
        return at
    # the candidates are the runtime fallback order (execute._next_attention walks the ok ones after a failed
    # probe): the serving choice first, then the one-batch order, whose head is the one-batch choice and sdpa.
    # Left as it was, a failed FA4 would fall to the candidates after it (flex_attention), which continuous
    # batching refuses ("not supported for continuous batching", 5.24 continuous_api.py:779-784)
    first = [c for c in at.candidates if c.name == base]
    return replace(
        at,
        choice=base,
        candidates=(*first, *(c for c in at.candidates if c.name != base)),
        reasons=(
            f"serving: {paged.reasons[0]}",
            *paged.reasons[1:],
            f"(for one generate() batch: {at.choice})",
        ),
    )


def sdpa_family(name: str | None) -> str | None:
    """``sdpa`` for cudaload's sdpa variants (same kernels, masks and memory), else the name itself."""
    return "sdpa" if name in SDPA_VARIANTS else name


def warnings_for(
    info: ModelInfo, caps: Capabilities, dt: Decision, at: Decision, offload: bool, seq_len: int
) -> tuple[str, ...]:
    """What a person should read first: a dtype warning, offload, eager on a GPU with nothing better, a context
    longer than the model's, and the machine's errors (and the bytecode finding, which is about this load's time)."""
    s = info.summary
    warnings: list[str] = []
    warnings.extend(r.removeprefix("WARNING: ") for r in dt.reasons if r.startswith("WARNING: "))
    if offload:
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
        # errors, and the one warning that is about this very load's time: its imports (cudaload.detection.bytecode)
        if f.severity == "error" or f.code == "bytecode-uncached":
            warnings.append(f"{f.code}: {f.message} (fix: {f.fix})")
    return tuple(warnings)
