"""``load_model()``: detect -> plan -> load -> probe the attention backend -> verify -> (PEFT-wrap) -> the model
with ``model.cudaload_plan`` attached; each step is a module of this package."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Sequence
from typing import Any

from ..capabilities import Capabilities
from ..errors import ConfigurationError, CudaloadError, DeviceSelectionError, DoesNotFitError
from ..policies.sdpa_dispatch import NAMES as SDPA_VARIANTS
from ..prefetch import MODES as _PREFETCH_MODES
from ..prefetch import REMOVED_MODES as _REMOVED_PREFETCH_MODES
from . import serving as _serving
from .adapters import _training_after_fallback, _wrap_peft, enable_planned_checkpointing
from .attention_probe import _confirm_sdpa_variant, _probe_and_fallback
from .failures import _gpu_memory_snapshot, _release_memory, _translate
from .from_pretrained import _DECIDED, resolve_auto_class
from .load_path import _load_once
from .phases import _Phases
from .ranks import _agree_on_gpus, _rank_error, _tell_ranks_before_planning
from .serving import _serving_after_fallback
from .sharded import _fsdp_weights_on_cpu, _placed_shards
from .tune_on_load import _tuned_plan
from .verification import verify

# the package's one logger, named as it was before the split (logging configuration refers to it)
logger = logging.getLogger("cudaload.execute")

# detection findings that make "which GPU" ambiguous or wrong; load_model refuses to guess past them
_DEVICE_FINDINGS = {"cvd-unmatched", "cvd-duplicate", "cvd-after-init", "local-rank"}


def load_model(
    model: str | os.PathLike[str],
    *,
    hardware: Capabilities | str | os.PathLike[str] | None = None,
    intent: str = "inference",
    seq_len: int | None = None,
    batch_size: int | None = None,
    attn: str = "auto",
    dtype: str = "auto",
    quantization: str = "auto",
    device_map: str | dict[str, Any] | None = None,
    max_memory: dict[str, Any] | None = None,
    allow_offload: bool = False,
    kernels: bool | None = None,
    trust_kernels: Sequence[str] = (),
    model_class: str | None = None,
    task: str | None = None,
    fast: bool | None = None,
    warmup: bool = False,
    prefetch: bool | str = True,
    new_tokens: int | None = None,
    padded: bool = False,
    tune: bool = False,
    tune_budget_s: float | None = None,
    batch_layout: str = "auto",
    tokens_per_step: int | None = None,
    lora: dict[str, Any] | None = None,
    loss: str = "auto",
    **from_pretrained_kwargs: Any,
) -> Any:
    """Detect the machine, plan, load, verify and return a ready transformers model.

    cudaload's options are keyword-only; every other keyword goes to ``from_pretrained`` unchanged.

    Args:
        model: a local model directory, or a Hub id (read from the local cache when offline).
        hardware: plan against this snapshot instead of detecting the machine: a :class:`Capabilities` or a
            file recorded with ``cudaload env --json``, which must describe this machine. A profile name
            ("H100") is refused: to plan for hardware you do not have, use :func:`cudaload.plan`.
        intent: ``"inference"`` (default), ``"training"`` (full fine-tune), ``"lora"``, ``"qlora"`` (LoRA on an
            nf4 base) or ``"serving"`` (continuous batching).
        seq_len: tokens per sequence, prompt + new tokens, that memory is planned for (default: the model's
            context, at most 4096).
        batch_size: sequences per batch (default 1).
        attn: ``"auto"`` or an ``attn_implementation`` (``"sdpa"``, ``"eager"``, ``"flash_attention_2"``/``3``/
            ``4``, a Hub kernel repo such as ``"kernels-community/flash-attn2"``, ``"cudaload_sdpa"``...). An
            explicit one is honoured or refused; an automatic one that fails its one-step forward falls back
            to the next valid candidate (``verified["attention_fallbacks"]``).
        dtype: ``"auto"``, ``"bfloat16"`` (``"bf16"``), ``"float16"`` (``"fp16"``) or ``"float32"``.
        quantization: ``"auto"`` (bitsandbytes only when the model does not fit otherwise), ``"none"``,
            ``"int8"`` or ``"nf4"``.
        device_map: None (planned), or a ``from_pretrained`` device map (``"auto"``, ``"cuda:1"``, a dict).
        max_memory: per-device byte limits, as ``from_pretrained`` takes them.
        allow_offload: allow CPU/disk offload when nothing else fits (otherwise the load is refused).
        kernels: Hub layer kernels: None (auto: only when every one passes preflight and is trusted), True
            (those that pass), False (none). See docs/kernels.md.
        trust_kernels: Hub kernel repos (``org/name``) or publishers (``org/*``) whose code may run, added to
            ``CUDALOAD_TRUST_KERNELS``.
        model_class: the transformers auto class to load with (``"AutoModelForSequenceClassification"``);
            default ``AutoModelForCausalLM``, or ``AutoModel`` for an encoder.
        task: a shorthand for ``model_class`` (``"causal-lm"``, ``"embedding"``, ``"seq2seq"``...: the keys of
            ``cudaload.execute.AUTO_CLASSES``); not with ``model_class``.
        fast: cudaload's fast safetensors loader: None (where it is known to beat ``from_pretrained``), True
            (wherever it can load exactly as ``from_pretrained`` would), False (never). It steps aside to
            ``from_pretrained`` on anything it cannot do (``verified["notes"]`` says why).
        warmup: run the attention probe's forward even when a cached verdict exists (a warm-up).
        prefetch: True (default): a local checkpoint's files are read into the page cache on background
            threads from the first line of this call, while torch and transformers are still being imported,
            so a cold load waits for about max(imports, disk read) instead of their sum (see
            :mod:`cudaload.prefetch`): threads that read the files, skipping what the page cache already holds
            (measured cold on the H200 at 0.60x plain ``from_pretrained``'s time to the first forward). The
            mode names ``"read"`` (the default, what True means) and ``"off"`` are accepted; False turns it
            off. With it on, when the GPU the model will load onto is known before planning (cuda:LOCAL_RANK
            under torchrun, a one-GPU process, a ``device_map`` naming one GPU), its CUDA context and cuBLAS
            are created on a thread while transformers imports (0.4-0.6 s a fresh process otherwise waits for
            after the imports; see :mod:`cudaload.gpu_start`). A call refused
            after that (a plan that does not fit, another rank's error) holds no memory of the load but leaves
            CUDA initialised in the process, as any torch.cuda call does: the context stays on that GPU, and
            CUDA_VISIBLE_DEVICES no longer changes anything in this process. ``prefetch=False`` or
            ``CUDALOAD_GPU_START=0`` touches no GPU before the load itself.
        new_tokens: of ``seq_len``, how many tokens generate() adds. With ``batch_size`` and ``seq_len`` it
            declares the work, which lets the attention choice use measured timings: this GPU's tune cache,
            else cudaload's shipped priors.
        padded: the declared batch's prompts differ in length (left-padded).
        tune: measure the timings here first when the cache has none for the declared work (every usable
            backend through generate(), as ``cudaload tune`` does); needs ``batch_size`` and ``seq_len``.
        tune_budget_s: seconds ``tune=True`` may spend (default 120).
        batch_layout: training: ``"auto"`` (``"packed"`` where the attention keeps concatenated sequences apart,
            else ``"padded"``), ``"packed"`` or ``"padded"``. :func:`cudaload.training_setup` packs the data.
        tokens_per_step: training, packed: the most real tokens one step may hold (default: the largest that
            fits without gradient checkpointing, between ``batch_size x seq_len`` and a quarter of it).
        lora: ``intent="lora"/"qlora"``: LoraConfig keywords over cudaload's (``r``, ``lora_alpha``,
            ``lora_dropout`` -- 0 unless given --, ``target_modules``...).
        loss: training: ``"auto"``, ``"transformers"`` or ``"liger"`` (Liger's fused linear cross-entropy,
            chosen automatically only where it alone avoids gradient checkpointing).
        **from_pretrained_kwargs: passed to ``from_pretrained`` (``revision``, ``token``, ``subfolder``,
            ``trust_remote_code`` - False unless you say so...). The keywords cudaload decides (``dtype``,
            ``attn_implementation``, ``device_map``, ``max_memory``, ``use_kernels``, ``kernel_config``) are
            refused, except ``torch_dtype`` / ``attn_implementation`` while ``dtype`` / ``attn`` are "auto",
            which are taken as those.

    Returns:
        The model transformers would return (a ``PeftModel`` for ``intent="lora"/"qlora"``), on the planned
        device(s), in eval mode for inference and serving and train mode otherwise, with the plan at
        ``model.cudaload_plan`` (a :class:`~cudaload.plans.Plan` whose ``verified`` says what was checked and
        where the seconds went; docs/api.md lists its keys). For intent ``"serving"`` also
        ``model.cudaload_cb_config``, the ``ContinuousBatchingConfig`` for ``generate_batch``.

    Raises:
        ConfigurationError: an invalid option, a keyword cudaload decides, a profile as ``hardware``,
            ``tune=True`` without the work, or (under torchrun) ranks that planned differently.
        InvalidChoiceError: an explicit ``attn``, ``dtype`` or ``quantization`` this machine cannot honour.
        DeviceSelectionError: the GPUs this process may use are misconfigured (``CUDA_VISIBLE_DEVICES``,
            ``LOCAL_RANK``, ranks sharing a GPU).
        ModelNotFoundError: the path does not exist, or a Hub id is not cached while offline.
        CheckpointError: a corrupt or truncated checkpoint, or an unknown model type.
        DependencyError: an optional package the plan needs is missing or broken (peft, bitsandbytes...).
        DoesNotFitError: nothing allowed fits, or (serving) too little memory is free after loading.
        LoadError: transformers failed to load, no attention backend passed its probe (or an explicit one
            failed it), or another torchrun rank failed.
        VerificationError: the loaded model is not what the plan said.

    A failed call releases the GPU memory its attempt allocated before it raises.
    """
    phases = _Phases()
    clash = sorted(_DECIDED & from_pretrained_kwargs.keys())
    if "torch_dtype" in from_pretrained_kwargs and dtype == "auto":
        dtype = str(from_pretrained_kwargs.pop("torch_dtype")).replace("torch.", "")
        clash.remove("torch_dtype")
    if "attn_implementation" in from_pretrained_kwargs and attn == "auto":
        attn = str(from_pretrained_kwargs.pop("attn_implementation"))
        clash.remove("attn_implementation")
    if clash:
        raise ConfigurationError(
            f"{', '.join(clash)} are decided by cudaload",
            fix="use load_model's own options (dtype=, attn=, device_map=)",
        )
    from ..planner import hub_probe_for, resolve_hardware
    from ..planner import plan as make_plan

    # a profile name or a recorded machine's JSON, as plan() takes: resolved the same way (cheap), and refused
    # when it is not this machine, before any file is read
    caps = resolve_hardware(hardware) if hardware is not None else None
    if caps is not None and caps.source.startswith("profile:"):
        raise ConfigurationError(
            f"load_model() loads on this machine, not on {caps.source}",
            fix="use cudaload.plan(..., hardware=...) to plan for other hardware",
        )
    # after the argument checks (no reading for a call that is refused), before everything slow
    pre = None
    early: Any = None
    if prefetch is not True and prefetch is not False and prefetch not in _PREFETCH_MODES:
        removed = _REMOVED_PREFETCH_MODES.get(prefetch) if isinstance(prefetch, str) else None
        raise ConfigurationError(
            f"prefetch={prefetch!r} is not a prefetch mode" + (f": {removed}" if removed else ""),
            fix=f"use prefetch=True (reads the files), False or one of {', '.join(repr(m) for m in _PREFETCH_MODES)}",
        )
    if prefetch:
        from .. import prefetch as _prefetch

        pre = _prefetch.start(
            model,
            mode=_prefetch.DEFAULT_MODE if prefetch is True else str(prefetch),
            subfolder=str(from_pretrained_kwargs.get("subfolder") or ""),
            variant=from_pretrained_kwargs.get("variant"),
        )
    # a refusal from here to the load (a broken GPU selection, a plan that does not fit, an import) must not
    # leave the threads reading a checkpoint nobody will load
    try:
        hub = None
        if caps is None:
            caps = resolve_hardware(None)  # detect(): NVML, no CUDA initialisation, no network
            # asked now, answered after transformers has imported: the round trip hides under the imports
            hub = hub_probe_for(caps)
        phases.mark("detect")
        # A GPU selection that is broken (a CUDA_VISIBLE_DEVICES entry matching nothing, LOCAL_RANK past the
        # visible GPUs...) would otherwise load somewhere the user did not mean, or on the CPU: stop here.
        broken = [f for f in caps.findings if f.severity == "error" and f.code in _DEVICE_FINDINGS]
        if broken:
            if pre is not None:
                pre.stop()
            bad_selection = DeviceSelectionError(
                "the GPUs this process may use are misconfigured",
                reasons=[f.message for f in broken],
                fix="; ".join(dict.fromkeys(f.fix for f in broken)),
            )
            if caps.distributed.active:
                _tell_ranks_before_planning(caps, bad_selection, model)
            raise bad_selection
        if prefetch and prefetch != "off":
            # the CUDA context and cuBLAS on the GPU the load will use, made while transformers imports
            from .. import gpu_start as _gpu_start

            early = _gpu_start.start(caps, device_map)
        # under torchrun: every rank plans from the same GPU facts (cudaload.policies.ranks), or errs alike
        rendezvous, ranks_note = None, None
        if caps.distributed.active:
            caps, rendezvous, ranks_note = _agree_on_gpus(caps, model)
            phases.mark("ranks")
        plan_kwargs: dict[str, Any] = dict(
            hardware=caps,
            intent=intent,
            seq_len=seq_len,
            batch_size=batch_size,
            attn=attn,
            dtype=dtype,
            quantization=quantization,
            device_map=device_map,
            max_memory=max_memory,
            allow_offload=allow_offload,
            kernels=kernels,
            trust_kernels=trust_kernels,
            model_class=model_class,
            revision=from_pretrained_kwargs.get("revision"),
            fast=fast,
            new_tokens=new_tokens,
            padded=padded,
            from_pretrained_kwargs=from_pretrained_kwargs,
            batch_layout=batch_layout,
            tokens_per_step=tokens_per_step,
            lora=lora,
            loss=loss,
        )
        try:  # from here to the plans' exchange, a rank that raises tells the others (they would wait for it)
            # timed apart because users ask where the seconds go: transformers is a lazy module, so name what the
            # plan and the load use (the config machinery and modeling_utils, which imports most of it)
            from transformers import AutoConfig, PreTrainedModel  # noqa: F401

            phases.mark("import_transformers")
            if hub is not None:
                from ..detection import with_hub_answer

                plan_kwargs["hardware"] = caps = with_hub_answer(caps, hub)
                phases.mark("hub_probe")
            plan = make_plan(model, **plan_kwargs)
            if tune:
                plan = _tuned_plan(model, plan, caps, plan_kwargs, tune_budget_s)
            auto_class = resolve_auto_class(model_class, task, plan)
        except Exception as e:
            if rendezvous is not None:  # the other ranks stop with this rank's reason instead of waiting
                rendezvous.tell("plans", _rank_error(e))
            raise
        if rendezvous is not None:
            from ..policies.ranks import check_same, decisions

            published = rendezvous.exchange("plans", {"decisions": decisions(plan)})
            if published is not None:
                unchecked = check_same(published)
                if unchecked:
                    ranks_note = f"{ranks_note}; {unchecked}"
            else:
                ranks_note = (
                    f"{ranks_note}; the ranks' plans were not compared (a rank did not publish in time)"
                )
        phases.mark("plan")
        is_main = caps.distributed.rank in (None, 0)
        logger.log(logging.INFO if is_main else logging.DEBUG, "cudaload plan:\n%s", plan.explain())

        if plan.attention.choice in ("flash_attention_4", "kernels-community/flash-attn4"):
            # FA4 JIT-compiles its kernels in every new process (~3 s on the H200) unless its persistent cache is
            # on; cudaload turns it on under its own cache directory where the user has not set it (the variables
            # are read once, when flash_attn.cute is first imported: so before the load imports it)
            from ..tuning import enable_fa4_compile_cache

            fa4_cache_note = enable_fa4_compile_cache().note
        else:
            fa4_cache_note = None
        if any(c.ok and c.name in SDPA_VARIANTS for c in plan.attention.candidates):
            # cudaload's sdpa variants are transformers attention functions: registered before the model is built
            # (and for a runtime fallback to one of them)
            from ..sdpa_decode import register as _register_sdpa_variants

            _register_sdpa_variants()
    except BaseException:
        if pre is not None:
            pre.stop()
        if early is not None:
            early.join()  # short: no thread of this call outlives its error
        raise
    early_start = early.join() if early is not None else None
    before = _gpu_memory_snapshot()
    failure: CudaloadError | None = None
    loaded: Any = None
    t0 = time.perf_counter()
    try:
        loaded, path_taken, notes = _load_once(plan, auto_class, from_pretrained_kwargs)
        if plan.kernels.get("use_kernels"):
            # exactly the planned mapping, by kernels' kernelize after loading (see hub_kernels.plan_kernels:
            # from_pretrained's use_kernels also pulls transformers' default kernels from the Hub)
            from ..hub_kernels import apply_kernels

            apply_kernels(loaded, plan.kernels)
        seconds = time.perf_counter() - t0
        phases.mark("load")
        if path_taken == "fast_sharded":
            plan = _placed_shards(plan, loaded)
        if _fsdp_weights_on_cpu(plan):
            # the model is on the CPU until the Trainer shards it: a forward
            # here would test nothing about the GPU backend, and a 70B CPU forward takes minutes
            fallbacks: list[dict[str, str]] = []
        else:
            plan, fallbacks = _probe_and_fallback(loaded, plan, caps, warmup=warmup)
            if fallbacks and plan.serving is not None:
                plan = _serving_after_fallback(plan, model, plan_kwargs)
            if fallbacks and plan.training is not None:
                plan = _training_after_fallback(plan, model, plan_kwargs)
        plan, sdpa_dispatch = _confirm_sdpa_variant(loaded, plan)
        phases.mark("probe")
        verified = verify(loaded, plan, allow_offload=allow_offload)
        phases.mark("verify")
    except Exception as e:  # translated below, after the attempt's memory is released
        failure = _translate(e, f"loading {plan.model.name}")
        del e
    if failure is not None:
        if pre is not None:
            pre.stop()  # nothing will read those pages now
        loaded = None
        _release_memory()
        after = _gpu_memory_snapshot()
        leaked = {i: after[i] - before.get(i, 0) for i in after if after[i] > before.get(i, 0)}
        if leaked:
            logger.error("GPU memory still held after a failed load: %s bytes", leaked)
        raise failure

    verified.update(
        {
            "load_path": path_taken,
            "load_seconds": round(seconds, 4),
            "attention_fallbacks": fallbacks,
            "notes": notes,
            "auto_class": auto_class,
            "phases": phases.as_dict(getattr(loaded, "cudaload_fastload", None)),
            "fa4_compile_cache": fa4_cache_note,
            "sdpa_decode_dispatch": sdpa_dispatch,
            "prefetch": pre.summary() if pre is not None else None,
            "gpu_start": early_start,
            "ranks": ranks_note,
        }
    )
    if plan.intent in ("lora", "qlora"):
        if path_taken != "fast_sharded":  # the sharded loader wrapped it before sharding (peft_config)
            loaded = _wrap_peft(loaded, plan)
        trainable = sum(p.numel() for p in loaded.parameters() if p.requires_grad)
        verified["trainable_parameters"] = trainable
    if plan.intent in ("inference", "serving"):
        loaded.eval()
    else:
        loaded.train()
        enable_planned_checkpointing(loaded, plan)
    if plan.serving is not None:
        refusal: DoesNotFitError | None = None
        try:
            # looked up on execute.serving at call time: a test replaces cudaload.execute.serving._attach_serving
            plan = _serving._attach_serving(loaded, plan, verified)
        except DoesNotFitError as e:
            # less is free after loading than serving needs: nothing is handed back, so nothing stays held. The
            # traceback holds _attach_serving's frame and its `model` local (the whole model, its GPU memory) for
            # as long as the caller keeps the error: dropped before the memory is released
            e.__traceback__ = None
            refusal = e
            del e
        if refusal is not None:
            if pre is not None:
                pre.stop()  # nothing will read those pages now
            loaded = None
            _release_memory()
            raise refusal
    plan = plan.with_verified(verified)
    loaded.cudaload_plan = plan
    logger.log(
        logging.INFO if is_main else logging.DEBUG,
        "cudaload loaded %s in %.2fs via %s",
        plan.model.name,
        seconds,
        path_taken,
    )
    return loaded
