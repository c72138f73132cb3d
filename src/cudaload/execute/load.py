"""``load_model()``: a request checked once, then detect -> plan -> load -> probe the attention backend ->
verify -> (PEFT-wrap) -> the model with ``model.cudaload_plan`` attached; each step is a module of this package
(``start``: the threads started ahead, ``planning``: the plan the load follows, ``load_path``, ``attention_probe``,
``verification``, ``adapters``, ``serving``, ``failures``)."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from ..capabilities import Capabilities
from ..errors import CudaloadError, DeviceSelectionError, DoesNotFitError
from ..plans.plan import Plan
from ..request import Request
from . import serving as _serving
from .adapters import apply_adapter_cast, enable_planned_checkpointing, wrap_peft
from .attention_probe import confirm_sdpa_variant, probe_and_fallback, replanned
from .chunked_loss import chunked_loss_problem, install_chunked_loss
from .decode_calls import ready_decode, replanned_decode
from .failures import gpu_memory_snapshot, release_memory, translate
from .load_path import load_covered
from .phases import Phases
from .planning import Planned, plan_for_load
from .ranks import agree_on_gpus, tell_ranks_before_planning, tell_ranks_refused
from .sharded import fsdp_weights_on_cpu, placed_shards
from .start import Started
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
    generate_calls: int | None = None,
    decode: str = "auto",
    padded: bool = False,
    tune: bool = False,
    tune_budget_s: float | None = None,
    batch_layout: str = "auto",
    tokens_per_step: int | None = None,
    lora: dict[str, Any] | None = None,
    loss: str = "auto",
    new_weights: bool | str | Sequence[str] = False,
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
        warmup: run the attention probe's forward even when a cached verdict exists (a warm-up). A compiled
            decode plan is always warmed: generate()'s decode step is compiled for each planned batch size
            before the model is handed back and its compile artifacts saved for the next process
            (``verified["decode"]["warmup"]``), so the first ``generate()`` runs compiled.
        prefetch: True (default): a local checkpoint's files are read into the page cache on background
            threads from the first line of this call, while torch and transformers are still being imported,
            so a cold load waits for about max(imports, disk read) instead of their sum (see
            :mod:`cudaload.execute.runtime.prefetch`): threads that read the files, skipping what the page cache already holds
            (measured cold on the H200 at 0.60x plain ``from_pretrained``'s time to the first forward). The
            mode names ``"read"`` (the default, what True means) and ``"off"`` are accepted; False turns it
            off. With it on, when the GPU the model will load onto is known before planning (cuda:LOCAL_RANK
            under torchrun, a one-GPU process, a ``device_map`` naming one GPU), its CUDA context and cuBLAS
            are created on a thread while transformers imports (0.4-0.6 s a fresh process otherwise waits for
            after the imports; see :mod:`cudaload.execute.runtime.gpu_start`). A call refused
            after that (a plan that does not fit, another rank's error) holds no memory of the load but leaves
            CUDA initialised in the process, as any torch.cuda call does: the context stays on that GPU, and
            CUDA_VISIBLE_DEVICES no longer changes anything in this process. ``prefetch=False`` or
            ``CUDALOAD_GPU_START=0`` touches no GPU before the load itself.
        new_tokens: of ``seq_len``, how many tokens generate() adds. With ``batch_size`` and ``seq_len`` it
            declares the work, which lets the attention choice use measured timings: this GPU's tune cache,
            else cudaload's shipped priors.
        generate_calls: how many generate() calls of ``new_tokens`` new tokens the process makes (default one):
            with ``new_tokens`` it declares the decode work the ``decode`` decision weighs.
        decode: ``"auto"`` (``"compiled"``, a static cache and generate()'s compiled decode step, only where the
            declared work pays for its compile; ``"dynamic"`` otherwise), ``"dynamic"`` or ``"compiled"``.
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
        new_weights: the model tensors meant to be new, not read from the checkpoint (a new task head:
            ``AutoModelForSequenceClassification`` on a base checkpoint makes ``score.weight`` or
            ``classifier.*``). False (default): none; a load whose checkpoint lacks a tensor, holds one inside
            the architecture that the model has no place for, or holds one of another shape raises
            :class:`~cudaload.errors.CheckpointCoverageError` naming them, where transformers would initialise
            them randomly and only log a table. True: any; or ``fnmatch`` patterns over the names transformers
            reports (``["score.*"]``; a module name covers its tensors), which also cover checkpoint tensors
            left unused on purpose (fewer layers than saved) and reshaped ones (as transformers'
            ``ignore_mismatched_sizes=True``, which is honoured too). A head transformers creates new is not
            accepted by default: it reports a head meant to be trained and one lost from a fine-tuned
            checkpoint alike, and either gives random outputs. Accepted without it: what transformers itself
            expects (tied weights, the class's ``_keys_to_ignore_on_load_*``), and checkpoint tensors of a
            head this class does not build (``lm_head`` for ``AutoModel``). What was initialised anew or left
            unused is in ``verified["checkpoint"]`` (``new_weights``, ``mismatched``, ``unused``).
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
        CheckpointError: a corrupt or truncated checkpoint, or an unknown model type;
            :class:`~cudaload.errors.CheckpointCoverageError` (also a LoadError) for tensors the checkpoint
            lacks, holds in excess or in another shape (see ``new_weights``), raised after the model is freed.
        DependencyError: an optional package the plan needs is missing or broken (peft, bitsandbytes...).
        DoesNotFitError: nothing allowed fits, or (serving) too little memory is free after loading.
        LoadError: transformers failed to load, no attention backend passed its probe (or an explicit one
            failed it), or another torchrun rank failed.
        VerificationError: the loaded model is not what the plan said.

    A failed call releases the GPU memory its attempt allocated before it raises.
    """
    try:
        req = Request.build(
            model,
            entry="load_model",
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
            kernels=kernels,
            trust_kernels=trust_kernels,
            model_class=model_class,
            task=task,
            fast=fast,
            warmup=warmup,
            prefetch=prefetch,
            new_tokens=new_tokens,
            generate_calls=generate_calls,
            decode=decode,
            padded=padded,
            tune=tune,
            tune_budget_s=tune_budget_s,
            batch_layout=batch_layout,
            tokens_per_step=tokens_per_step,
            lora=lora,
            loss=loss,
            new_weights=new_weights,
            **from_pretrained_kwargs,
        )
    except CudaloadError as e:
        tell_ranks_refused(e, model)  # under torchrun the other ranks would wait for this one
        raise
    return load_request(req)


def load_request(req: Request) -> Any:
    """Load what a checked request asks for (:func:`load_model` builds the request)."""
    phases = Phases()
    started = Started(req)  # after the request's checks: no reading for a call that is refused
    try:  # a refusal from here to the load must not leave threads reading a checkpoint nobody will load
        caps, hub = _detect(req, started, phases)
        rendezvous, ranks_note = None, None
        if caps.distributed.active:
            # under torchrun: every rank plans from the same GPU facts (cudaload.policies.ranks), or errs alike
            caps, rendezvous, ranks_note = agree_on_gpus(caps, req.model)
            phases.mark("ranks")
        planned = plan_for_load(req, caps, hub, rendezvous, ranks_note, phases)
    except BaseException:
        started.abandon()
        raise
    loaded, plan, verified = _load_checked(req, planned, started, phases)
    try:
        loaded, plan = _ready(req, loaded, plan, verified)
    except DoesNotFitError:
        # less is free after loading than serving needs, or the chunked loss the step needs cannot be taken:
        # nothing is handed back, so nothing stays held. The
        # traceback keeps this frame: the model is dropped from it before the memory is released
        loaded = None
        started.stop_reading()  # nothing will read those pages now
        release_memory()
        raise
    loaded.cudaload_plan = plan
    logger.log(
        logging.INFO if planned.is_main else logging.DEBUG,
        "cudaload loaded %s in %.2fs via %s",
        plan.model.name,
        verified["load_seconds"],
        verified["load_path"],
    )
    return loaded


def _detect(req: Request, started: Started, phases: Phases) -> tuple[Capabilities, Any]:
    """This machine (or the recorded snapshot given), refused where its GPU selection is broken; the Hub probe
    asked now and answered after transformers has imported, so the round trip hides under the imports."""
    from ..planner import hub_probe_for, resolve_hardware

    caps, hub = req.hardware, None
    if caps is None:
        caps = resolve_hardware(None)  # detect(): NVML, no CUDA initialisation, no network
        hub = hub_probe_for(caps)
    phases.mark("detect")
    # A GPU selection that is broken (a CUDA_VISIBLE_DEVICES entry matching nothing, LOCAL_RANK past the visible
    # GPUs...) would otherwise load somewhere the user did not mean, or on the CPU: stop here, unless the CPU
    # is what was asked for
    broken = (
        []
        if req.device_map == "cpu"
        else [f for f in caps.findings if f.severity == "error" and f.code in _DEVICE_FINDINGS]
    )
    if broken:
        bad_selection = DeviceSelectionError(
            "the GPUs this process may use are misconfigured",
            reasons=[f.message for f in broken],
            fix="; ".join(dict.fromkeys(f.fix for f in broken)),
        )
        if caps.distributed.active:
            tell_ranks_before_planning(caps, bad_selection, req.model)
        raise bad_selection
    started.start_gpu(req, caps)
    return caps, hub


@dataclass
class _Loaded:
    model: Any
    path_taken: str
    notes: list[str]
    seconds: float
    coverage: dict[str, Any]  # what the checkpoint coverage check accepted (load_path.load_covered)


def _load_checked(
    req: Request, planned: Planned, started: Started, phases: Phases
) -> tuple[Any, Plan, dict[str, Any]]:
    """Load, probe the attention, verify; a failure releases what the attempt allocated, then raises the
    translated error. Returns the model, the plan it follows (made again where the load learnt otherwise) and
    what was verified."""
    early_start = started.gpu_summary()
    before = gpu_memory_snapshot()
    failure: CudaloadError | None = None
    plan = planned.plan
    try:
        got = _load(req, planned, phases)
        plan, checks = _checked_backend(req, planned, got.model, phases)
        if got.path_taken == "fast_sharded":
            plan = placed_shards(plan, got.model)
        verified = verify(got.model, plan, allow_offload=req.allow_offload)
        phases.mark("verify")
    except Exception as e:  # translated below, after the attempt's memory is released
        failure = translate(e, f"loading {plan.model.name}")
        del e
    if failure is not None:
        started.stop_reading()  # nothing will read those pages now
        release_memory()
        after = gpu_memory_snapshot()
        leaked = {i: after[i] - before.get(i, 0) for i in after if after[i] > before.get(i, 0)}
        if leaked:
            logger.error("GPU memory still held after a failed load: %s bytes", leaked)
        raise failure
    verified.update(
        {
            "load_path": got.path_taken,
            "load_seconds": round(got.seconds, 4),
            **checks,
            "notes": got.notes,
            "checkpoint": got.coverage,
            "auto_class": planned.auto_class,
            "phases": phases.as_dict(getattr(got.model, "cudaload_fastload", None)),
            "fa4_compile_cache": planned.fa4_cache_note,
            "prefetch": started.prefetch_summary(),
            "gpu_start": early_start,
            "ranks": planned.ranks_note,
        }
    )
    return got.model, plan, verified


def _load(req: Request, planned: Planned, phases: Phases) -> _Loaded:
    plan = planned.plan
    t0 = time.perf_counter()
    model, path_taken, notes, coverage = load_covered(
        plan, planned.auto_class, req.from_pretrained_kwargs, new_weights=req.new_weights
    )
    if plan.kernels.get("use_kernels"):
        # exactly the planned mapping, by kernels' kernelize after loading (see hub_kernels.plan_kernels:
        # from_pretrained's use_kernels also pulls transformers' default kernels from the Hub)
        from ..hub_kernels import apply_kernels

        apply_kernels(model, plan.kernels)
    seconds = time.perf_counter() - t0
    phases.mark("load")
    return _Loaded(model, path_taken, notes, seconds, coverage)


def _checked_backend(
    req: Request, planned: Planned, model: Any, phases: Phases
) -> tuple[Plan, dict[str, Any]]:
    """The attention backend tried on the model (its one-step forward, the fallbacks, the sdpa variant's cuDNN
    dispatch); where the model ends up on another backend than planned, the plan made again for it."""
    plan, caps = planned.plan, planned.caps
    fallbacks: list[dict[str, str]] = []
    replans: list[str] = []
    # an FSDP rank's model is on the CPU until the Trainer shards it: a forward here would test nothing about the
    # GPU backend, and a 70B CPU forward takes minutes
    if not fsdp_weights_on_cpu(plan):
        current, fallbacks = probe_and_fallback(model, plan, caps, warmup=req.warmup)
        if fallbacks and current is not None:
            why = [f"runtime fallback: {f['from']} -> {f['to']}: {f['reason']}" for f in fallbacks]
            plan = replanned(req, caps, plan, current, why)
            replans.append(f"planned again for {current}: {why[-1]}")
    kept, dispatch = confirm_sdpa_variant(model, plan)
    if not kept and dispatch is not None:
        why = [f"checked on the GPU: {dispatch['why']}; sdpa kept"]
        plan = replanned(req, caps, plan, "sdpa", why)
        replans.append(f"planned again for sdpa: {why[0]}")
    phases.mark("probe")
    return plan, {"attention_fallbacks": fallbacks, "sdpa_decode_dispatch": dispatch, "replanned": replans}


def _chunked_loss(model: Any) -> str:
    """cudaload's chunked loss on the model, as the plan's memory counted it (the logits never whole). Raises
    DoesNotFitError where this model's forward cannot take it: the plan's step needs it to fit."""
    problem = chunked_loss_problem(model)
    if problem is not None:
        raise DoesNotFitError(
            "the plan's step fits only with cudaload's chunked loss, which this loaded model cannot take",
            reasons=[problem],
            fix="pass loss='transformers' (the plan then checkpoints more or takes smaller steps)",
        )
    install_chunked_loss(model)
    return "installed: training calls with labels compute the head and the loss a chunk of rows at a time"


def _ready(req: Request, model: Any, plan: Plan, verified: dict[str, Any]) -> tuple[Any, Plan]:
    """Adapters wrapped, train or eval mode, checkpointing as planned, the serving section settled against the
    memory free after loading; the plan with what was verified. Raises DoesNotFitError where serving finds too
    little free (the caller releases the model)."""
    if plan.intent in ("lora", "qlora"):
        if verified["load_path"] != "fast_sharded":  # the sharded loader wrapped it before sharding
            model = wrap_peft(model, plan)
        verified["trainable_parameters"] = sum(p.numel() for p in model.parameters() if p.requires_grad)
        verified["adapter_cast_layers"] = apply_adapter_cast(model, plan)
    if plan.intent in ("inference", "serving"):
        model.eval()
        if plan.decode is not None:
            # generate()'s decode as planned (static cache, compile settings on the generation config); with
            # warmup=True compiled now, so the first generate() does not pay the compile (execute.decode)
            # a compiled plan is warmed here whatever warmup= says: the plan judged the compile worth paying for
            # the declared work, the first generate() would pay it anyway, and only a compile run here can save
            # its artifacts for the next process (a user's own generate() call ends outside cudaload)
            verified["decode"] = ready_decode(model, plan.decode, warm=req.warmup or plan.decode.compiled)
            undone = verified["decode"].get("undone")
            if undone:  # the model decodes dynamically now: the plan says so, as a new attention plan does
                plan = replace(plan, decode=replanned_decode(plan.decode, undone))
                verified.setdefault("replanned", []).append(f"decode planned again as dynamic: {undone}")
    else:
        model.train()
        enable_planned_checkpointing(model, plan)
        if plan.training is not None and plan.training.loss.choice == "cudaload_chunked":
            verified["chunked_loss"] = _chunked_loss(model)
    if plan.serving is not None:
        try:
            # looked up on execute.serving at call time: a test replaces cudaload.execute.serving.attach_serving
            plan = _serving.attach_serving(model, plan, verified)
        except DoesNotFitError as e:
            # the traceback holds attach_serving's frame and its `model` local (the whole model, its GPU
            # memory) for as long as the caller keeps the error: dropped, and this frame's reference with it
            e.__traceback__ = None
            model = None
            raise
    return model, plan.with_verified(verified)
