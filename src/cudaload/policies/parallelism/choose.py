"""The strategy choice: every candidate judged on its per-GPU bytes, the one chosen, and the reasons.

:func:`choose_for` takes the configuration as one :class:`~cudaload.policies.memory.MemoryShape`, what was
asked as a :class:`ParallelAsk` and what the fit ladder found as a :class:`LadderFit`;
:func:`choose_parallelism` is the same with keywords. The steps, one helper each: the inputs every candidate
is sized from (:func:`_inputs`), the candidates an intent may take (:func:`_training_wanted`,
:func:`_inference_wanted`), the choice and its reasons or the error (:func:`_reasons`), and the chosen
strategy's settings (:func:`_config`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ...capabilities import Capabilities
from ...errors import ConfigurationError, DependencyError, DoesNotFitError, InvalidChoiceError
from ...model_info import ModelInfo
from ...plans.decision import Candidate, Decision
from ...plans.plan import Parallelism
from ...plans.training import StepShape
from ...units import param_count
from ..memory import CUDA_CONTEXT_BYTES, MemoryShape, breakdown_of
from .launch import _settings, launch_command
from .per_gpu import (
    NCCL_BYTES,
    _Eval,
    _gib,
    _inference,
    _Inputs,
    _state,
    _training,
    bd_optimizer,
    gc_on,
)
from .sharded_load import _weights_on_cpu
from .topology import ParallelFacts, RequestedParallelism, _check_launch, _raise_heads, rank_gpus_of, world


@dataclass(frozen=True)
class ParallelAsk:
    """What was asked of the several-GPU decision beyond the memory shape: ``strategy`` (one of
    :data:`REQUESTS`), ``lower_latency``, ``allow_offload``, ``offload`` (whether an offloading strategy may be
    chosen in this call; None: ``allow_offload``; its candidates still say what allow_offload allows), whether
    NCCL is available (None: not known) and the model's parallel facts (None: none)."""

    strategy: RequestedParallelism = "auto"
    lower_latency: bool = False
    allow_offload: bool = False
    offload: bool | None = None
    nccl: bool | None = None
    facts: ParallelFacts | None = None


@dataclass(frozen=True)
class LadderFit:
    """What the fit ladder found for one process: whether one GPU holds the model, and the fullest GPU's bytes
    of a one-process layer split (None: not known, computed here from the same breakdown)."""

    single_fits: bool | None = None
    split_per_gpu: int | None = None


def choose_parallelism(
    info: ModelInfo,
    caps: Capabilities,
    *,
    intent: str,
    dtype: str,
    quantization: str | None,
    seq_len: int,
    batch_size: int,
    attn: str = "sdpa",
    allow_offload: bool = False,
    facts: ParallelFacts | None = None,
    strategy: RequestedParallelism = "auto",
    lower_latency: bool = False,
    nccl: bool | None = None,
    single_fits: bool | None = None,
    split_per_gpu: int | None = None,
    optimizer: str | None = None,
    gradient_checkpointing: bool | None = None,
    offload: bool | None = None,
    step: StepShape | None = None,
) -> Parallelism | None:
    """The parallelism decision, or None when there is one GPU and nothing was asked for: :func:`choose_for`
    with these keywords as its three values.

    ``optimizer`` / ``gradient_checkpointing``: the training settings each rank runs with (None: the memory
    model's defaults); :func:`decide` tries them in the fit ladder's order for this layout, since N processes
    hold different bytes per GPU than the fit ladder's one process. ``quantization`` is the fit ladder's method
    (None, "int8", "nf4"). Raises a cudaload error for bad distributed input before any weights move.
    """
    shape = MemoryShape(
        dtype=dtype,
        quantization=quantization,
        intent=intent,
        seq_len=seq_len,
        batch_size=batch_size,
        attn=attn,
        optimizer=optimizer,
        gradient_checkpointing=gradient_checkpointing,
        step=step,
    )
    ask = ParallelAsk(strategy, lower_latency, allow_offload, offload, nccl, facts)
    return choose_for(info, caps, shape, ask, LadderFit(single_fits, split_per_gpu))


def choose_for(
    info: ModelInfo,
    caps: Capabilities,
    shape: MemoryShape,
    ask: ParallelAsk = ParallelAsk(),
    found: LadderFit = LadderFit(),
) -> Parallelism | None:
    """The parallelism decision for ``shape``, or None when there is one GPU and nothing was asked for.
    Raises a cudaload error for bad distributed input before any weights move."""
    strategy = ask.strategy
    n, local, launched = world(caps)
    if (n <= 1 or not caps.gpus) and strategy in ("auto", "single"):
        # one GPU, or the CPU (torchrun ranks on CPUs with gloo): nothing is shared between GPUs
        return None
    if not caps.gpus:
        raise ConfigurationError(
            f"parallelism={strategy!r} needs GPUs and none is visible", fix="drop the parallelism option"
        )
    facts = ask.facts or ParallelFacts()
    inp = _inputs(info, caps, shape, ask.nccl)
    if shape.training:
        evals, ds = _training(inp, intent=shape.intent, allow_offload=ask.allow_offload)
        wanted = _training_wanted(strategy, ds)
    else:
        evals = _inference(
            inp,
            facts,
            quantization=shape.quantization,
            single_fits=found.single_fits,
            split_per_gpu=found.split_per_gpu,
        )
        wanted = _inference_wanted(inp, ask, evals)
    may_offload = ask.allow_offload if ask.offload is None else ask.offload
    chosen = next(
        (x for x in wanted if x in evals and evals[x].ok and (may_offload or not x.endswith("_offload"))),
        None,
    )
    s = info.summary
    if launched and not shape.training and chosen is None and (s.num_heads % n or s.num_kv_heads % n):
        # under torchrun with a model that fits no single GPU, TP is the only way; name why it cannot run
        _raise_heads(s, n, caps)
    reasons, notes = _reasons(inp, shape, ask, found, evals, wanted, chosen)
    config: dict[str, Any] = {}
    if chosen is not None:
        config = _config(inp, shape, facts, evals, chosen, reasons, notes)
    cands = tuple(Candidate(k, e.ok, e.reasons) for k, e in evals.items())
    return Parallelism(
        decision=Decision(chosen, (*reasons, *notes), cands, explicit=strategy != "auto"),
        world_size=n,
        per_gpu={k: e.terms for k, e in evals.items()},
        budget_per_gpu=inp.budget,
        launched=launched,
        launch=launch_command(n, local)
        if chosen not in (None, "single", "layer_split") or (chosen == "single" and launched)
        else None,
        config=config,
    )


def _inputs(info: ModelInfo, caps: Capabilities, shape: MemoryShape, nccl: bool | None) -> _Inputs:
    """The one-process breakdown, the budget a GPU offers and the terms every GPU runs; checks the launch."""
    n, local, launched = world(caps)
    bd = breakdown_of(info, shape)
    t = bd.terms
    rank_gpus = rank_gpus_of(caps)
    # planned against a healthy rank's GPU; check_rank_memory then names any rank whose GPU is already
    # (nearly) full, rather than shrinking every rank's plan to fit around it
    budget = (
        max(g.available_memory for g in rank_gpus) if launched else min(g.available_memory for g in rank_gpus)
    )
    _check_launch(caps, launched, rank_gpus, nccl, n)
    return _Inputs(
        info=info,
        caps=caps,
        bd=bd,
        dtype=shape.dtype,
        n=n,
        local=local,
        launched=launched,
        act=t.get("activations", 0) + t.get("quantization_transient", 0),
        comm=NCCL_BYTES if n > 1 else 0,
        budget=budget,
    )


def _training_wanted(strategy: str, ds: bool) -> list[str]:
    """The training strategies ``strategy`` may take, in the order tried."""
    if strategy in ("tp", "layer_split", "single"):
        raise InvalidChoiceError(
            f"parallelism={strategy!r} is not a training strategy cudaload plans",
            fix="use 'ddp', 'fsdp2' or 'deepspeed' (or 'auto')",
        )
    fam = {
        "auto": ["ddp", "fsdp2", "fsdp2_offload"],
        "ddp": ["ddp"],
        "fsdp2": ["fsdp2", "fsdp2_offload"],
        "deepspeed": ["deepspeed_zero2", "deepspeed_zero3", "deepspeed_zero3_offload"],
    }
    if strategy == "deepspeed" and not ds:
        raise DependencyError(
            "parallelism='deepspeed' but deepspeed is not installed",
            fix="pip install deepspeed, or plan with --assume-installed deepspeed, or use 'fsdp2'",
        )
    return fam[strategy]


def _inference_wanted(inp: _Inputs, ask: ParallelAsk, evals: dict[str, _Eval]) -> list[str]:
    """The inference strategies ``ask.strategy`` may take here, in the order tried; an explicit request that
    cannot run raises why."""
    strategy, launched, caps = ask.strategy, inp.launched, inp.caps
    if ask.lower_latency or strategy == "tp":
        order = ["tp", "tp_fp8", "single", "layer_split"]
    else:
        order = ["single", "tp", "tp_fp8", "layer_split"]
    if launched:
        order.remove("layer_split")  # one process's device_map split; never from every rank
    if not launched and not caps.source.startswith("profile:"):
        # this process is already running alone: TP needs one process per GPU, so it is advice here
        order = ["single", "layer_split"] if strategy != "tp" else ["tp", "tp_fp8"]
    fam = {"auto": order, "single": ["single"], "tp": ["tp", "tp_fp8"], "layer_split": ["layer_split"]}
    if strategy in ("ddp", "fsdp2", "deepspeed"):
        raise InvalidChoiceError(
            f"parallelism={strategy!r} is a training strategy; this plan is for inference",
            fix="use 'tp', 'layer_split' or 'single' (or 'auto'), or plan with a training intent",
        )
    wanted = [x for x in fam[strategy] if x in order] if strategy != "auto" else order
    if launched and strategy == "layer_split":
        raise InvalidChoiceError(
            "a layer split runs in one process, and this one runs under torchrun",
            fix="launch one process (python script.py, not torchrun), or use 'tp'",
        )
    if strategy == "tp" and not evals["tp"].ok and not evals["tp_fp8"].ok:
        s, n = inp.info.summary, inp.n
        tp_reasons = [*evals["tp"].reasons, *evals["tp_fp8"].reasons]
        if s.num_heads % max(n, 1) or s.num_kv_heads % max(n, 1):
            _raise_heads(s, n, caps)
        raise InvalidChoiceError(
            "tensor parallelism cannot run this model here", reasons=tp_reasons, fix="use parallelism='auto'"
        )
    return wanted


def _reasons(
    inp: _Inputs,
    shape: MemoryShape,
    ask: ParallelAsk,
    found: LadderFit,
    evals: dict[str, _Eval],
    wanted: list[str],
    chosen: str | None,
) -> tuple[list[str], list[str]]:
    """The reasons and notes for ``chosen``; with none chosen, why this one process runs instead, or the
    error: an explicit strategy that does not fit, or a training job no strategy fits."""
    n, launched, training = inp.n, inp.launched, shape.training
    if chosen is not None:
        reasons = [_why(chosen, evals, n, launched, training)]
        if not launched and n > 1:
            reasons.append(f"launch one process per GPU: {launch_command(n, inp.local)}")
        notes: list[str] = []
        if shape.quantization == "nf4" and chosen in (
            "fsdp2",
            "fsdp2_offload",
            "deepspeed_zero3",
            "deepspeed_zero3_offload",
        ):
            notes.append(
                f"QLoRA sharded: the 4-bit weights are stored as {shape.dtype} so they can be sharded "
                f"(BitsAndBytesConfig bnb_4bit_quant_storage='{shape.dtype}', the QLoRA-FSDP recipe)"
            )
        return reasons, notes
    if ask.strategy != "auto":
        raise DoesNotFitError(
            f"parallelism={ask.strategy!r} does not fit here",
            reasons=[f"{k}: {'; '.join(evals[k].reasons)}" for k in wanted if k in evals],
            fix="use parallelism='auto' to let cudaload choose"
            + ("" if ask.allow_offload or not training else ", or allow_offload=True"),
        )
    # this one process already fits (one GPU, or a layer split over the GPUs): a training job that N ranks
    # cannot share still runs here, so that is no error (the N GPUs a suggestion names are for this split)
    one_process = not launched and (bool(found.single_fits) or found.split_per_gpu is not None)
    if training and one_process:
        return [
            f"no multi-process strategy fits {n} GPUs of {_gib(inp.budget)}: this one process runs the fit "
            "ladder's placement (a layer split: one GPU busy at a time)"
        ], []
    if training:
        _raise_no_fit(inp, shape, ask, evals)
    return [], []


def _raise_no_fit(inp: _Inputs, shape: MemoryShape, ask: ParallelAsk, evals: dict[str, _Eval]) -> None:
    """A training job no strategy fits, even sharded: what would (more GPUs, offload, a frozen base, less work)."""
    s, n, budget = inp.info.summary, inp.n, inp.budget
    state = _state(inp.bd.terms)
    need = evals["fsdp2"].terms["total"]
    gpus_needed = _gpus_needed(state, need - state // n, budget)
    raise DoesNotFitError(
        f"{s.name} ({param_count(s.params)} params, intent {shape.intent}) does not fit {n} GPUs "
        f"of {_gib(budget)} even sharded",
        reasons=[f"{k}: {'; '.join(e.reasons)}" for k, e in evals.items()],
        fix="; or ".join(
            x
            for x in (
                f"{gpus_needed} GPUs like {rank_gpus_of(inp.caps)[0].name} with FSDP2" if gpus_needed else "",
                "allow_offload=True (FSDP2 with CPU offload, "
                f"{_gib(evals['fsdp2_offload'].terms['total'])} per GPU)"
                if not ask.allow_offload
                else "",
                "intent='lora' or 'qlora' (a frozen base trains far less state)"
                if shape.intent == "training"
                else "",
                "a shorter seq_len or batch_size",
            )
            if x
        ),
    )


def _config(
    inp: _Inputs,
    shape: MemoryShape,
    facts: ParallelFacts,
    evals: dict[str, _Eval],
    chosen: str,
    reasons: list[str],
    notes: list[str],
) -> dict[str, Any]:
    """The chosen strategy's settings (TrainingArguments, from_pretrained, DeepSpeed), what each rank runs with,
    where FSDP2 ranks load weights no GPU holds whole, and DeepSpeed's way to run the same job; appends the
    reasons and notes they bring."""
    info, n, intent = inp.info, inp.n, shape.intent

    def settings(strategy: str) -> dict[str, Any]:
        return _settings(
            strategy,
            info,
            facts,
            n,
            intent=intent,
            dtype=shape.dtype,
            quantization=shape.quantization,
            seq_len=shape.seq_len,
            gradient_checkpointing=shape.gradient_checkpointing,
        )

    config = settings(chosen)
    if shape.training:
        # what the per-GPU numbers assume each rank runs with (may differ from a one-process plan's)
        config["optimizer"] = bd_optimizer(intent, shape.optimizer, shape.dtype)
        config["gradient_checkpointing"] = gc_on(shape.gradient_checkpointing)
        reasons.append(
            f"each rank runs optimizer {config['optimizer']}, gradient checkpointing "
            f"{'on' if config['gradient_checkpointing'] else 'off'} (what these per-GPU numbers assume)"
        )
    t = inp.bd.terms
    if chosen in ("fsdp2", "fsdp2_offload") and t.get("weights", 0) + CUDA_CONTEXT_BYTES > inp.budget:
        _weights_on_cpu(
            config,
            reasons,
            notes,
            info,
            inp.caps,
            t,
            chosen=chosen,
            n=n,
            local=inp.local,
            launched=inp.launched,
            intent=intent,
            dtype=shape.dtype,
            quantization=shape.quantization,
        )
    alt = next((k for k in evals if k.startswith("deepspeed") and evals[k].ok), None)
    if shape.training and alt is not None and not chosen.startswith("deepspeed"):
        # installed or assumed: the DeepSpeed way to run the same job, ready to use (not run by cudaload)
        ds_cfg = settings(alt)
        config["deepspeed_alternative"] = {"strategy": alt, "config": ds_cfg["deepspeed_config"]}
    return config


def _gpus_needed(state: int, per_gpu_fixed: int, budget: int) -> int | None:
    room = budget - per_gpu_fixed
    if room <= 0:
        return None
    k = -(-state // room)
    return k if k <= 4096 else None


def _why(chosen: str, evals: dict[str, _Eval], n: int, launched: bool, training: bool) -> str:
    need = _gib(evals[chosen].terms["total"])
    where = f"{n} ranks under torchrun" if launched else f"{n} GPUs"
    if chosen == "ddp":
        return (
            f"DDP on {where}: a full replica with its training state fits each GPU ({need} per GPU); "
            "only gradients are exchanged"
        )
    if chosen == "fsdp2":
        return (
            f"FSDP2 on {where}: a replica does not fit with its training state "
            f"({'; '.join(evals['ddp'].reasons[:1])}); sharded it needs {need} per GPU"
        )
    if chosen == "fsdp2_offload":
        return (
            f"FSDP2 with CPU offload on {where}: sharding alone does not fit ({evals['fsdp2'].reasons[0]}); "
            f"offloaded it needs {need} per GPU (allowed by allow_offload=True)"
        )
    if chosen.startswith("deepspeed"):
        return f"DeepSpeed {chosen.split('_', 1)[1].upper()} on {where} (asked for): {need} per GPU"
    if chosen == "single":
        return f"the model fits one GPU ({need})" + (
            f": each of the {n} ranks serves its own replica"
            if launched
            else "; one GPU avoids cross-device hops"
        )
    if chosen in ("tp", "tp_fp8"):
        return (
            f"tensor parallel over {n} GPUs ({'fp8 weights' if chosen == 'tp_fp8' else 'unquantized'}): "
            f"{need} per GPU; every GPU works on every token"
            + ("" if evals["single"].ok else f" (one GPU: {evals['single'].reasons[0]})")
        )
    return f"a layer split in this process: {need} on the fullest GPU"
