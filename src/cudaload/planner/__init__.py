"""``cudaload.plan()``: a model and a machine in, a :class:`~cudaload.plans.Plan` out.

Pure and deterministic for a given snapshot: no weights read (safetensors headers at most), no GPU touched,
no network. :func:`plan` checks the request once (:class:`cudaload.request.Request`), then :func:`plan_request`
runs the steps in order, each a module of this package: the machine (``machine``) -> the model summary
(``cudaload.model_info``) -> the work (``work``) -> dtype -> attention (needs the dtype; ``choices``) -> the fit
ladder, training's step and the parallelism (need dtype and attention for the activations; ``sizing``) -> how
generate() decodes (``decode``: a compiled plan's static cache replaces seq_len in the memory) -> the load path
(``load_path``) -> the sections beside the decisions: LoRA, Hub kernels, serving, warnings
(``sections``).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from typing import Any

from ..capabilities import Capabilities
from ..model_info import ModelInfo, model_info
from ..plans.decision import Decision
from ..plans.decode import DecodePlan
from ..plans.plan import Parallelism, Plan
from ..request import Request
from ..tuning import Timings
from .choices import attention_for, base_intent, dtype_for, fallbacks_for, trusted
from .decode import decode_for, quant_cost_for
from .load_path import load_path_for
from .machine import _first_use_here, hardware_summary, hub_probe_for, machine_for, resolve_hardware
from .sections import _kernels, _peft, _serving, sdpa_family, warnings_for
from .sizing import Sized, size
from .work import DEFAULT_SEQ_CAP, DEFAULT_SEQ_UNKNOWN, WorkSize, work_for

__all__ = [
    "DEFAULT_SEQ_CAP",
    "DEFAULT_SEQ_UNKNOWN",
    "_first_use_here",
    "hardware_summary",
    "hub_probe_for",
    "plan",
    "plan_request",
    "resolve_hardware",
    "sdpa_family",
]

log = logging.getLogger("cudaload.planner")


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
    new_tokens: int | None = None,
    generate_calls: int | None = None,
    decode: str = "auto",
    padded: bool = False,
    timings: Timings | None = None,
    from_pretrained_kwargs: Mapping[str, Any] | None = None,
    optimizer: str = "auto",
    gradient_checkpointing: bool | None = None,
    parallelism: str = "auto",
    lower_latency: bool = False,
    batch_layout: str = "auto",
    tokens_per_step: int | None = None,
    lora: Mapping[str, Any] | None = None,
    loss: str = "auto",
) -> Plan:
    """Decide dtype, attention, quantization, placement and load path for ``model`` on ``hardware``.

    Pure planning: reads the config (and a local checkpoint's safetensors headers), never the weights, and
    touches no GPU; :func:`cudaload.load_model` plans the same way and then loads.

    Args:
        model: a local model directory, a ``config.json`` path, a transformers config (or its dict), or a Hub
            id in the local cache.
        hardware: None (this machine, detected), a :class:`Capabilities` snapshot, a profile name
            (``"H100"``, ``"8xA100-80GB"``: :func:`cudaload.hardware`) or a file from ``cudaload env --json``.
        intent: ``"inference"`` (default), ``"training"`` (full fine-tune), ``"lora"``, ``"qlora"`` or
            ``"serving"`` (continuous batching).
        seq_len: tokens per sequence, prompt + new tokens (default: the model's context, at most 4096).
        batch_size: sequences per batch (default 1).
        attn: ``"auto"`` or an ``attn_implementation`` (``"sdpa"``, ``"eager"``, ``"flash_attention_2"``/``3``/
            ``4``, a Hub kernel repo, ``"cudaload_sdpa"``...).
        dtype: ``"auto"``, ``"bfloat16"`` (``"bf16"``), ``"float16"`` (``"fp16"``) or ``"float32"``.
        quantization: ``"auto"`` (only when the model does not fit otherwise), ``"none"``, ``"int8"``, ``"nf4"``.
        device_map: None (planned), or a ``from_pretrained`` device map to plan with.
        max_memory: per-device byte limits, as ``from_pretrained`` takes them.
        allow_offload: allow CPU/disk offload when nothing else fits.
        assume_installed: cudaload's package names (``"flash-attn"``, ``"bitsandbytes"``, ``"kernels"``...) to
            treat as installed and usable, e.g. for a profile (which lists no optional packages).
        assume_missing: package names to treat as absent.
        kernels: Hub layer kernels: None (auto: only when every one passes preflight and is trusted), True
            (those that pass), False (none).
        trust_kernels: Hub kernel repos (``org/name``) or publishers (``org/*``) whose code may run, added to
            ``CUDALOAD_TRUST_KERNELS``.
        model_class: the transformers auto class the model will be loaded with.
        revision: the Hub revision to read the config of.
        fast: cudaload's fast loader: None (where it is known to beat ``from_pretrained``), True, False.
        new_tokens: of ``seq_len``, how many tokens generate() adds. With ``batch_size`` and ``seq_len`` (the
            declared work) and ``padded`` it selects the measured attention timings of the nearest work: this
            machine's tune cache, then cudaload's shipped priors (:func:`cudaload.tuning.lookup`).
        generate_calls: how many generate() calls of ``new_tokens`` new tokens the process makes (default one):
            with ``new_tokens`` it declares the decode work the ``decode`` decision weighs.
        decode: ``"auto"`` (``"compiled"``, a static cache and generate()'s compiled decode step, only where the
            declared work pays for its compile; ``"dynamic"`` otherwise), ``"dynamic"`` or ``"compiled"``.
        padded: the declared batch's prompts differ in length (left-padded).
        timings: a measurement to decide the attention with instead of the cache and priors
            (``load_model(tune=True)`` passes one).
        from_pretrained_kwargs: the ``from_pretrained`` keywords the load will pass (some keep the fast
            loader out).
        optimizer: training: ``"auto"`` (fp32 AdamW, then 8-bit AdamW, then Adafactor, until one fits) or a
            ``TrainingArguments`` optim name (``"adamw_torch_fused"``, ``"adamw_8bit"``, ``"sgd"``...).
        gradient_checkpointing: training: None (on only when the activations do not fit without), True,
            False.
        parallelism: several GPUs: ``"auto"``, ``"single"``, ``"ddp"``, ``"fsdp2"``, ``"deepspeed"``,
            ``"tp"`` or ``"layer_split"``.
        lower_latency: inference on several GPUs: prefer tensor parallelism (every GPU on every token).
        batch_layout: training: ``"auto"`` (``"packed"`` where the attention keeps concatenated sequences apart,
            else ``"padded"``), ``"packed"`` or ``"padded"``.
        tokens_per_step: training, packed: the most real tokens one step may hold (default: the largest that fits
            without gradient checkpointing, between ``batch_size x seq_len`` and a quarter of it).
        lora: ``intent="lora"/"qlora"``: LoraConfig keywords over cudaload's (``r``, ``lora_alpha``,
            ``lora_dropout``, ``target_modules``...).
        loss: training: ``"auto"`` (transformers' loss; Liger's fused linear cross-entropy only where it alone
            avoids checkpointing), ``"transformers"`` or ``"liger"``.

    Returns:
        The :class:`~cudaload.plans.Plan`: each decision with its reasons and every rejected candidate
        (``plan.explain()``), the memory estimate, and the keywords the load will use; ``verified`` is None
        until :func:`cudaload.load_model` fills it; for training intents ``plan.training`` (the batch layout,
        tokens per step, loss, adapter settings). Its JSON form is docs/plan-schema.md.

    Raises:
        ConfigurationError: an invalid option or environment variable, or an unknown profile.
        InvalidChoiceError: an explicit ``attn``, ``dtype``, ``quantization``, ``optimizer``, ``parallelism``
            or ``fast=True`` this hardware cannot honour; ``reasons`` says why.
        DeviceSelectionError: a ``device_map`` or GPU selection that matches no GPU.
        ModelNotFoundError: the path does not exist, or a Hub id is not cached while offline.
        CheckpointError: an unreadable config or safetensors header, or an unknown model type.
        DependencyError: a ``parallelism`` that needs a package that is missing (deepspeed...).
        DoesNotFitError: nothing allowed fits; ``fix`` and ``suggestions`` say what would.
    """
    return plan_request(
        Request.build(
            model,
            entry="plan",
            hardware=hardware,
            intent=intent,
            seq_len=seq_len,
            batch_size=batch_size,
            attn=attn,
            dtype=dtype,
            quantization=quantization,
            device_map=device_map,
            max_memory=max_memory,
            allow_offload=allow_offload,
            assume_installed=assume_installed,
            assume_missing=assume_missing,
            kernels=kernels,
            trust_kernels=trust_kernels,
            model_class=model_class,
            revision=revision,
            fast=fast,
            new_tokens=new_tokens,
            generate_calls=generate_calls,
            decode=decode,
            padded=padded,
            timings=timings,
            from_pretrained_kwargs=from_pretrained_kwargs or {},
            optimizer=optimizer,
            gradient_checkpointing=gradient_checkpointing,
            parallelism=parallelism,
            lower_latency=lower_latency,
            batch_layout=batch_layout,
            tokens_per_step=tokens_per_step,
            lora=lora,
            loss=loss,
        )
    )


def plan_request(
    req: Request, caps: Capabilities | None = None, *, attn: str | None = None, timings: Timings | None = None
) -> Plan:
    """The plan for a checked request: the machine, the model, the work, then each decision in order.

    What a load learns replaces the request's in a new plan, made here like any other: ``caps`` (the machine as
    the ranks agreed on it, with the Hub's answer), ``attn`` (the backend that passed its probe after a
    fallback), ``timings`` (measured by ``tune=True``)."""
    caps = caps if caps is not None else machine_for(req)
    info = model_info(req.model, model_class=req.model_class, revision=req.revision)
    work = work_for(req, info)
    dt = dtype_for(req, info, caps)
    assert dt.choice is not None
    at, usable = attention_for(req, info, caps, dt.choice, work, attn=attn, timings=timings)
    sized = size(
        req, info, caps, dt.choice, at, work, decode_cost=quant_cost_for(req, info, caps, dt.choice, work)
    )
    decode, sized = decode_for(req, info, caps, work, dt.choice, at, sized)
    lp, par = load_path_for(req, info, sized)
    p = _assemble(req, info, caps, work, (dt, at, lp), usable, sized, par, decode)
    log.info(
        "plan for %s: dtype=%s attn=%s quantization=%s device_map=%s",
        info.summary.name,
        dt.choice,
        at.choice,
        p.quantization.choice,
        p.placement.device_map,
    )
    return p


def _assemble(
    req: Request,
    info: ModelInfo,
    caps: Capabilities,
    work: WorkSize,
    decisions: tuple[Decision, Decision, Decision],
    usable: list[str] | None,
    sized: Sized,
    par: Parallelism | None,
    decode: DecodePlan | None = None,
) -> Plan:
    dt, at, lp = decisions
    fr, training = sized.fit, sized.training
    assert dt.choice is not None and at.choice is not None
    return Plan(
        model=info.summary,
        hardware=hardware_summary(caps),
        intent=req.intent,
        seq_len=work.seq_len,
        batch_size=sized.batch_size,
        dtype=dt,
        attention=at,
        quantization=fr.decision,
        placement=sized.placement,
        memory=sized.memory,
        load_path=lp,
        kernels=_kernels(info, caps, base_intent(req.intent), req.kernels, trusted(req), req.model_class),
        quantization_config=fr.quantization_config,
        peft=_peft(info, req.lora, training.lora_dropout if training else None)
        if req.intent in ("lora", "qlora")
        else None,
        warnings=warnings_for(info, caps, dt, at, sized.placement.offload, work.seq_len),
        serving=_serving(
            info,
            caps,
            dt.choice,
            sdpa_family(at.choice) or at.choice,
            fr,
            sized.gpu_devices,
            work.declared_seq,
            work.declared_batch,
            usable,
        )
        if req.intent == "serving"
        else None,
        optimizer=fr.optimizer,
        gradient_checkpointing=fr.gradient_checkpointing,
        parallelism=par,
        training=training,
        attention_fallbacks=fallbacks_for(at),
        decode=decode,
    )
