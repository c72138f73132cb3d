"""``cudaload.plan()``: a model and a machine in, a :class:`~cudaload.plans.Plan` out.

Pure and deterministic for a given snapshot: no weights read (safetensors headers at most), no GPU touched,
no network. Order: model summary -> dtype -> attention (needs the dtype) -> fit ladder (quantization and
placement, needs dtype and attention for the activation estimate) -> load path -> Hub kernels -> warnings.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from . import _env
from .capabilities import Capabilities
from .decision import Candidate, Decision
from .errors import ConfigurationError, DoesNotFitError
from .model_info import ModelInfo, model_info
from .plans import INTENTS, MemoryEstimate, Plan
from .policies.attention import choose_attention
from .policies.dtype import choose_dtype, dtype_bytes
from .policies.load_path import choose_load_path, fast_kwargs_blockers
from .policies.memory import LORA_ALPHA, LORA_DROPOUT, LORA_R, gpu_terms
from .policies.parallelism import SHARDED_REASON, SHARDED_STEPPED_ASIDE
from .policies.parallelism import decide as decide_parallelism
from .policies.quantization import fit
from .policies.sdpa_dispatch import NAMES as SDPA_VARIANTS
from .policies.serving import ServingPlan, choose_paged_attention, plan_serving
from .policies.training import (
    DEFAULT_SEQUENCES,
    StepChoice,
    choose_kbit_upcast,
    choose_layout,
    choose_lora_dropout,
    plan_step,
)
from .training_plan import StepShape
from .tuning import Timings, Work, load_sdpa_facts, load_training_facts
from .tuning import lookup as lookup_timings

if TYPE_CHECKING:
    from .detection.hub import Probe

log = logging.getLogger(__name__)

#: Default work size: the model's context, capped. Planning KV cache for a 128k context by default would
#: push every model into quantization for a length few callers use.
DEFAULT_SEQ_CAP = 4096
DEFAULT_SEQ_UNKNOWN = 2048


def resolve_hardware(hardware: Capabilities | str | os.PathLike[str] | None) -> Capabilities:
    """A snapshot as given, a profile or recorded machine by name or path, or this machine (None).

    This machine is detected without asking the Hub (``hub.reachable`` None): the answer is asked for only
    where a decision needs it, through :func:`hub_probe_for` and ``detection.with_hub_answer``."""
    if isinstance(hardware, Capabilities):
        return hardware
    if hardware is None:
        from .detection import detect

        return detect(probe_hub=False)
    from .profiles import hardware as profile

    return profile(os.fspath(hardware))


def hub_probe_for(caps: Capabilities) -> Probe | None:
    """The Hub reachability probe, started on a thread, when a decision on this detected machine needs its answer
    (``hub_kernels.needs_hub_answer``: a Hub kernel ``kernels`` might download); None otherwise. Before this, every
    ``load_model()`` waited for a HEAD request to the Hub before importing anything: a round trip online, and the
    whole ``CUDALOAD_HUB_TIMEOUT`` (2 s) behind a firewall that drops packets, for a local model whose plan no
    answer could change."""
    from .hub_kernels import needs_hub_answer

    if not needs_hub_answer(caps):
        return None
    from .detection import hub_probe

    return hub_probe()


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


def _plan_training(
    info: ModelInfo,
    caps: Capabilities,
    fit_kw: dict[str, Any],
    *,
    intent: str,
    attn: str,
    batch_declared: bool,
    batch_layout: str,
    tokens_per_step: int | None,
    lora: Mapping[str, Any] | None,
    loss: str,
    assumed: Sequence[str],
) -> StepChoice:
    """The training section: layout, then the step bound, loss and checkpointing through the fit ladder
    (cudaload.policies.training.plan_step). Sets ``fit_kw``'s ``batch_size`` (the sequences a step holds) and
    ``step`` (the shape memory is planned for), which the parallelism decision sizes its shards with."""
    kbit = choose_kbit_upcast(intent, fit_kw["dtype"], "nf4" if intent == "qlora" else None)
    act_bytes = 4 if kbit is not None and kbit.choice == "fp32" else dtype_bytes(fit_kw["dtype"])
    layout = choose_layout(info, attn, act_bytes, batch_layout)
    notes = list(assumed)
    if not batch_declared and layout.choice == "packed":
        fit_kw["batch_size"] = DEFAULT_SEQUENCES
        notes.append(
            f"at most {DEFAULT_SEQUENCES} sequences a step (Trainer's default per_device_train_batch_size; "
            "declare batch_size=)"
        )
    probe_kw = {k: v for k, v in fit_kw.items() if k not in ("gradient_checkpointing", "step")}
    packed = layout.choice == "packed"
    # what the parallelism decision sizes shards with if no single process fits (replaced by the choice below)
    fit_kw["step"] = StepShape.padded(fit_kw["batch_size"], fit_kw["seq_len"], packed=packed)

    def probe(step: StepShape, gc: bool | None) -> Any:
        return fit(info, caps, **probe_kw, gradient_checkpointing=gc, step=step)

    choice = plan_step(
        probe,
        info=info,
        caps=caps,
        intent=intent,
        layout=layout,
        attn=attn,
        batch_size=fit_kw["batch_size"],
        seq_len=fit_kw["seq_len"],
        tokens_per_step=tokens_per_step,
        loss=loss,
        gradient_checkpointing=fit_kw["gradient_checkpointing"],
        lora_dropout=choose_lora_dropout(intent, lora),
        kbit_upcast=kbit,
        assumed=notes,
        sequences_declared=batch_declared,
    )
    fit_kw["step"] = choice.step
    return choice


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


def _serving(
    info: ModelInfo,
    caps: Capabilities,
    dtype: str,
    attn: str,
    fr: Any,
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
    sp = plan_serving(
        info,
        dtype=dtype,
        attention_choice=attn,
        quantization=fr.decision.choice,
        weights_bytes=weights,
        device_total=total,
        device_budget=budget,
        gpu_name=name,
        seq_len=seq_len,
        batch_size=batch_size,
        world_size=world,
        transformers_version=caps.transformers_version,
        usable_attention=usable_attention,
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


def _first_use_here(caps: Capabilities) -> dict[str, float] | None:
    """One-time attention costs this process has already paid (None: the shipped table applies as is).

    Only for the machine this process runs on: a profile or a recorded machine is planned as a fresh process.
    FA4 imported already: only its JIT is left; its persistent compile cache holding kernels (cudaload turns
    it on under its cache directory): the JIT costs what a cache hit costs."""
    import sys

    from .policies.attention.first_use import FA4_IMPORT_WARM_S, FA4_JIT_CACHED_S, FA4_JIT_S
    from .policies.attention.names import HUB_KERNEL

    if caps.source != "detected":
        return None
    from pathlib import Path

    enabled, directory = _env.fa4_compile_cache()
    d = Path(directory or Path(_env.cache_dir()) / "fa4")
    # a user's FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=0 stands (cudaload never overrides it): no cache hits then
    cached = enabled != "0" and d.is_dir() and any(d.iterdir())
    jit = FA4_JIT_CACHED_S if cached else FA4_JIT_S
    imported = "flash_attn.cute" in sys.modules
    if not imported and not cached:
        return None
    fa4 = jit + (0.0 if imported else FA4_IMPORT_WARM_S)
    return {"flash_attention_4": fa4, HUB_KERNEL["flash_attention_4"]: fa4}


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
    if intent not in INTENTS:
        raise ConfigurationError(f"unknown intent {intent!r}", fix=f"use one of {', '.join(INTENTS)}")
    for name, v in (("seq_len", seq_len), ("batch_size", batch_size)):
        if v is not None and (not isinstance(v, int) or v < 1):
            raise ConfigurationError(f"{name}={v!r} must be a positive integer", fix=f"pass {name}=1 or more")
    # serving plans the model like inference, then adds transformers' continuous-batching settings
    base_intent = "inference" if intent == "serving" else intent
    declared_seq, declared_batch = seq_len, batch_size
    caps = resolve_hardware(hardware)
    if assume_installed or assume_missing:
        caps = caps.with_packages(assume_installed, assume_missing)
    if hardware is None:
        from .detection import with_hub_answer

        caps = with_hub_answer(caps, hub_probe_for(caps))
    info = model_info(model, model_class=model_class, revision=revision)
    s = info.summary
    # the work the caller declared (both numbers), before defaults fill them in for the memory estimate
    declared = (batch_size, seq_len) if batch_size is not None and seq_len is not None else None
    assumed: list[str] = []
    if seq_len is None:
        seq_len = min(s.max_position_embeddings or DEFAULT_SEQ_UNKNOWN, DEFAULT_SEQ_CAP)
        assumed.append(
            f"sequences of at most {seq_len} tokens (the model's context, at most {DEFAULT_SEQ_CAP}; declare "
            "seq_len=, the longest sequence of the data)"
        )
    batch_declared = batch_size is not None
    batch_size = batch_size or 1

    dt = choose_dtype(
        caps,
        checkpoint_dtype=s.checkpoint_dtype,
        model_type=s.type,
        intent=base_intent,
        requested=str(dtype),
        fp16_overflow=info.fp16_overflow,
    )
    assert dt.choice is not None
    trust = (*trust_kernels, *_env.trusted_kernel_repos())
    # one generate() call's work picks its kernel; a server's many requests are not one short sequence
    work = None if intent == "serving" else declared
    if timings is None and work is not None and base_intent == "inference" and attn == "auto":
        # measured seconds for this work: this GPU's tune cache first, then the priors cudaload ships
        timings = lookup_timings(caps, info, dt.choice, Work.from_total(work[0], work[1], new_tokens, padded))
    at = choose_attention(
        info,
        caps,
        dtype=dt.choice,
        intent=base_intent,
        requested=attn,
        trust=trust,
        revision=None,
        work=work,
        timings=timings.seconds if timings is not None else None,
        timings_source=timings.source if timings is not None else None,
        first_use=_first_use_here(caps),
        timings_repeated=timings.repeated if timings is not None else None,
        sdpa_facts=load_sdpa_facts(),
        training_facts=load_training_facts(),
    )
    assert at.choice is not None
    usable_attention: list[str] | None = None
    if intent == "serving" and attn == "auto":
        # the attention decision weighs one generate() batch; continuous batching pages many requests, where a
        # flash form attends per request and sdpa/eager mask every key the batch reads: the model is loaded with
        # the implementation whose paged form serves (transformers pages the model's own attention at the
        # manager's start, 5.17 continuous_api.py:651-683)
        usable_attention = [at.choice, *(c.name for c in at.candidates if c.ok)]
        at = _serving_attention(at, info, caps, usable_attention)
    attn_choice = at.choice
    assert attn_choice is not None
    fit_kw: dict[str, Any] = dict(
        dtype=dt.choice,
        intent=base_intent,
        seq_len=seq_len,
        # serving: one longest request must fit beside the weights; the paged cache for the rest is the serving
        # section's (transformers queues what does not fit at once)
        batch_size=1 if intent == "serving" else batch_size,
        # cudaload's sdpa variants run sdpa's kernels and masks: the memory model's sdpa
        attn=sdpa_family(at.choice),
        quantization=quantization,
        device_map=device_map,
        max_memory=max_memory,
        allow_offload=allow_offload,
        optimizer=optimizer,
        gradient_checkpointing=gradient_checkpointing,
    )
    fr = None
    training: StepChoice | None = None
    nofit: DoesNotFitError | None = None
    try:
        if base_intent in ("training", "lora", "qlora"):
            training = _plan_training(
                info,
                caps,
                fit_kw,
                intent=intent,
                attn=fit_kw["attn"] or attn_choice,
                batch_declared=batch_declared,
                batch_layout=batch_layout,
                tokens_per_step=tokens_per_step,
                lora=lora,
                loss=loss,
                assumed=assumed,
            )
            fr = training.fit
        else:
            fr = fit(info, caps, **fit_kw)
    except DoesNotFitError as e:
        nofit = e
    if base_intent in ("training", "lora", "qlora"):
        batch_size = fit_kw["batch_size"]  # packed steps hold Trainer's default when none was declared
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
    gpu_devs = [d for d in fr.fit.per_device if d.startswith("cuda")]
    if pd.memory is not None:
        memory = pd.memory
    else:
        terms = gpu_terms(fr.breakdown, len(gpu_devs))
        per_device = dict(fr.fit.per_device)
        memory = MemoryEstimate(
            terms=terms,
            total=sum(per_device.values()),
            per_device=per_device,
            budget=dict(fr.fit.budget),
            notes=fr.breakdown.notes,
        )
    par = pd.parallelism
    if par is not None and par.choice in ("tp", "tp_fp8") and par.launched:
        # each rank holds a shard of every weight: transformers slices them as it loads (distributed_config,
        # transformers 5.17 modeling_utils.py:4082); the fast path fills whole tensors on one device
        why = "tensor parallel under torchrun: from_pretrained shards each weight as it loads"
        lp = Decision(
            "from_pretrained",
            (why,),
            (Candidate("fast", False, (why,)), Candidate("from_pretrained", True, (why,))),
        )
    elif par is not None and par.launched and par.config.get("weights_on_cpu"):
        why = (
            "FSDP with weights that fit no GPU whole: from_pretrained loads them on each rank's CPU; the fast "
            "path fills a GPU"
        )
        blocked = fast_kwargs_blockers(from_pretrained_kwargs or {})
        if fast is False:
            blocked.append("fast=False was passed")
        if par.config.get("sharded_load") and not blocked:
            # cudaload.fastload.sharded.load_fsdp2 under this rank's process group (execute._load_once)
            sharded = (
                f"FSDP2 with weights that fit no GPU whole: each rank builds the model on the meta device, shards "
                f"it and reads only its own rows of each weight (1/{par.world_size}) from the safetensors files "
                "onto its GPU; if the fast path steps aside at load time, from_pretrained loads the whole model "
                "on each rank's CPU"
            )
            lp = Decision(
                "fast",
                (sharded,),
                (Candidate("fast", True, (sharded,)), Candidate("from_pretrained", True, (why,))),
            )
        else:
            if par.config.get("sharded_load"):
                # the ranks will load whole on their CPUs after all: the host figure is the staged one
                cfg = dict(par.config)
                cfg["host_bytes_per_node"] = cfg.pop("host_bytes_per_node_if_stepped_aside")
                cfg.pop("sharded_load")
                staged = tuple(
                    r.replace(SHARDED_STEPPED_ASIDE, "while the Trainer shards")
                    for r in par.decision.reasons
                    if not r.startswith(SHARDED_REASON)
                )
                par = replace(par, config=cfg, decision=replace(par.decision, reasons=staged))
                why += f" (no sharded loading: {'; '.join(blocked)})"
            lp = Decision(
                "from_pretrained",
                (why,),
                (Candidate("fast", False, (why,)), Candidate("from_pretrained", True, (why,))),
            )
    else:
        lp = choose_load_path(
            info,
            quantization=fr.decision.choice,
            placement=placement,
            prefer=fast,
            from_pretrained_kwargs=from_pretrained_kwargs,
        )

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
        # errors, and the one warning that is about this very load's time: its imports (cudaload.detection.bytecode)
        if f.severity == "error" or f.code == "bytecode-uncached":
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
        kernels=_kernels(info, caps, base_intent, kernels, trust, model_class),
        quantization_config=fr.quantization_config,
        peft=_peft(info, lora, training.plan.lora_dropout if training else None)
        if intent in ("lora", "qlora")
        else None,
        warnings=tuple(warnings),
        serving=_serving(
            info,
            caps,
            dt.choice,
            sdpa_family(attn_choice) or attn_choice,
            fr,
            gpu_devs,
            declared_seq,
            declared_batch,
            usable_attention,
        )
        if intent == "serving"
        else None,
        optimizer=fr.optimizer,
        gradient_checkpointing=fr.gradient_checkpointing,
        parallelism=par,
        training=training.plan if training is not None else None,
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
