"""The strategy choice: every candidate judged on its per-GPU bytes, the one chosen, and the reasons."""

from __future__ import annotations

from typing import Any

from ...capabilities import Capabilities
from ...decision import Candidate, Decision
from ...errors import ConfigurationError, DependencyError, DoesNotFitError, InvalidChoiceError
from ...model_info import ModelInfo
from ...plans import Parallelism
from ...training_plan import StepShape
from ...units import param_count
from ..memory import CUDA_CONTEXT_BYTES, breakdown
from .launch import _settings, launch_command
from .per_gpu import (
    NCCL_BYTES,
    REPLICA_HEADROOM,
    _Eval,
    _gib,
    _inference,
    _state,
    _training,
    bd_optimizer,
    gc_on,
)
from .sharded_load import _weights_on_cpu
from .topology import REQUESTS, ParallelFacts, _check_launch, _raise_heads, rank_gpus_of, world


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
    strategy: str = "auto",
    lower_latency: bool = False,
    nccl: bool | None = None,
    single_fits: bool | None = None,
    split_per_gpu: int | None = None,
    optimizer: str | None = None,
    gradient_checkpointing: bool | None = None,
    offload: bool | None = None,
    step: StepShape | None = None,
) -> Parallelism | None:
    """The parallelism decision, or None when there is one GPU and nothing was asked for.

    ``optimizer`` / ``gradient_checkpointing``: the training settings each rank runs with (None: the memory
    model's defaults); :func:`decide` tries them in the fit ladder's order for this layout, since N processes
    hold different bytes per GPU than the fit ladder's one process. ``offload``: whether an offloading strategy
    may be chosen in this call (None: ``allow_offload``); its candidates still say what allow_offload allows.

    ``quantization`` is the fit ladder's method (None, "int8", "nf4"); ``single_fits`` / ``split_per_gpu``
    what the fit ladder found for one GPU and for a one-process layer split (None: not known, computed
    here from the same breakdown). Raises a cudaload error for bad distributed input before any weights move.
    """
    if strategy not in REQUESTS:
        raise ConfigurationError(f"unknown parallelism {strategy!r}", fix=f"use one of {', '.join(REQUESTS)}")
    n, local, launched = world(caps)
    if (n <= 1 or not caps.gpus) and strategy in ("auto", "single"):
        # one GPU, or the CPU (torchrun ranks on CPUs with gloo): nothing is shared between GPUs
        return None
    if not caps.gpus:
        raise ConfigurationError(
            f"parallelism={strategy!r} needs GPUs and none is visible", fix="drop the parallelism option"
        )
    facts = facts or ParallelFacts()
    s = info.summary
    training = intent != "inference"
    bd = breakdown(
        info,
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
    t = bd.terms
    rank_gpus = rank_gpus_of(caps)
    # planned against a healthy rank's GPU; check_rank_memory then names any rank whose GPU is already
    # (nearly) full, rather than shrinking every rank's plan to fit around it
    budget = (
        max(g.available_memory for g in rank_gpus) if launched else min(g.available_memory for g in rank_gpus)
    )
    _check_launch(caps, launched, rank_gpus, nccl, n)

    ctx = CUDA_CONTEXT_BYTES
    act = t.get("activations", 0) + t.get("quantization_transient", 0)
    state = _state(t)
    evals: dict[str, _Eval] = {}
    comm = NCCL_BYTES if n > 1 else 0

    def judge(name: str, terms: dict[str, int], extra_ok: bool = True, why: str = "") -> None:
        need = terms["total"]
        limit = budget * (REPLICA_HEADROOM if name in ("single", "ddp") else 1.0)
        fits = need <= limit and extra_ok
        msg = f"{_gib(need)} per GPU of {_gib(budget)}"
        if need > limit and name in ("single", "ddp") and need <= budget:
            msg += f" (over {REPLICA_HEADROOM:.0%} of it: the estimates are held to 5%, too tight to plan on)"
        elif need > budget:
            msg += " (does not fit)"
        evals[name] = _Eval(fits, terms, tuple(r for r in (msg, why) if r))

    notes: list[str] = []
    config: dict[str, Any] = {}
    if training:
        ds = _training(
            info,
            caps,
            bd,
            dtype=dtype,
            intent=intent,
            n=n,
            local=local,
            act=act,
            comm=comm,
            allow_offload=allow_offload,
            judge=judge,
            evals=evals,
        )
        order = ["ddp", "fsdp2", "fsdp2_offload"]
        fam = {
            "auto": order,
            "ddp": ["ddp"],
            "fsdp2": ["fsdp2", "fsdp2_offload"],
            "deepspeed": ["deepspeed_zero2", "deepspeed_zero3", "deepspeed_zero3_offload"],
        }
        if strategy in ("tp", "layer_split", "single"):
            raise InvalidChoiceError(
                f"parallelism={strategy!r} is not a training strategy cudaload plans",
                fix="use 'ddp', 'fsdp2' or 'deepspeed' (or 'auto')",
            )
        wanted = fam[strategy]
        if strategy == "deepspeed" and not ds:
            raise DependencyError(
                "parallelism='deepspeed' but deepspeed is not installed",
                fix="pip install deepspeed, or plan with --assume-installed deepspeed, or use 'fsdp2'",
            )
    else:
        _inference(
            info,
            caps,
            bd,
            facts,
            dtype=dtype,
            quantization=quantization,
            n=n,
            budget=budget,
            act=act,
            comm=comm,
            judge=judge,
            evals=evals,
            single_fits=single_fits,
            split_per_gpu=split_per_gpu,
            notes=notes,
        )
        if lower_latency or strategy == "tp":
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
            tp_reasons = [*evals["tp"].reasons, *evals["tp_fp8"].reasons]
            if s.num_heads % max(n, 1) or s.num_kv_heads % max(n, 1):
                _raise_heads(s, n, caps)
            raise InvalidChoiceError(
                "tensor parallelism cannot run this model here",
                reasons=tp_reasons,
                fix="use parallelism='auto'",
            )

    may_offload = allow_offload if offload is None else offload
    chosen = next(
        (x for x in wanted if x in evals and evals[x].ok and (may_offload or not x.endswith("_offload"))),
        None,
    )
    # this one process already fits (one GPU, or a layer split over the GPUs): a training job that N ranks
    # cannot share still runs here, so that is no error (the N GPUs a suggestion names are for this split)
    one_process = not launched and (bool(single_fits) or split_per_gpu is not None)
    if launched and not training and chosen is None and (s.num_heads % n or s.num_kv_heads % n):
        # under torchrun with a model that fits no single GPU, TP is the only way; name why it cannot run
        _raise_heads(s, n, caps)
    reasons: list[str] = []
    if chosen is not None:
        reasons.append(_why(chosen, evals, n, launched, training))
        if not launched and n > 1:
            reasons.append(f"launch one process per GPU: {launch_command(n, local)}")
        if quantization == "nf4" and chosen in (
            "fsdp2",
            "fsdp2_offload",
            "deepspeed_zero3",
            "deepspeed_zero3_offload",
        ):
            notes.append(
                f"QLoRA sharded: the 4-bit weights are stored as {dtype} so they can be sharded "
                f"(BitsAndBytesConfig bnb_4bit_quant_storage='{dtype}', the QLoRA-FSDP recipe)"
            )
    elif strategy != "auto":
        raise DoesNotFitError(
            f"parallelism={strategy!r} does not fit here",
            reasons=[f"{k}: {'; '.join(evals[k].reasons)}" for k in wanted if k in evals],
            fix="use parallelism='auto' to let cudaload choose"
            + ("" if allow_offload or not training else ", or allow_offload=True"),
        )
    elif training and one_process:
        reasons.append(
            f"no multi-process strategy fits {n} GPUs of {_gib(budget)}: this one process runs the fit "
            "ladder's placement (a layer split: one GPU busy at a time)"
        )
    elif training:
        need = evals["fsdp2"].terms["total"]
        gpus_needed = _gpus_needed(state, need - state // n, budget)
        raise DoesNotFitError(
            f"{s.name} ({param_count(s.params)} params, intent {intent}) does not fit {n} GPUs "
            f"of {_gib(budget)} even sharded",
            reasons=[f"{k}: {'; '.join(e.reasons)}" for k, e in evals.items()],
            fix="; or ".join(
                x
                for x in (
                    f"{gpus_needed} GPUs like {rank_gpus[0].name} with FSDP2" if gpus_needed else "",
                    "allow_offload=True (FSDP2 with CPU offload, "
                    f"{_gib(evals['fsdp2_offload'].terms['total'])} per GPU)"
                    if not allow_offload
                    else "",
                    "intent='lora' or 'qlora' (a frozen base trains far less state)"
                    if intent == "training"
                    else "",
                    "a shorter seq_len or batch_size",
                )
                if x
            ),
        )
    cands = tuple(Candidate(k, e.ok, e.reasons) for k, e in evals.items())
    if chosen is not None:

        def settings(strategy: str) -> dict[str, Any]:
            return _settings(
                strategy,
                info,
                facts,
                n,
                intent=intent,
                dtype=dtype,
                quantization=quantization,
                seq_len=seq_len,
                gradient_checkpointing=gradient_checkpointing,
            )

        config = settings(chosen)
        if training:
            # what the per-GPU numbers assume each rank runs with (may differ from a one-process plan's)
            config["optimizer"] = bd_optimizer(intent, optimizer, dtype)
            config["gradient_checkpointing"] = gc_on(gradient_checkpointing)
            reasons.append(
                f"each rank runs optimizer {config['optimizer']}, gradient checkpointing "
                f"{'on' if config['gradient_checkpointing'] else 'off'} (what these per-GPU numbers assume)"
            )
        if chosen in ("fsdp2", "fsdp2_offload") and t.get("weights", 0) + ctx > budget:
            _weights_on_cpu(
                config,
                reasons,
                notes,
                info,
                caps,
                t,
                chosen=chosen,
                n=n,
                local=local,
                launched=launched,
                intent=intent,
                dtype=dtype,
                quantization=quantization,
            )
        alt = next((k for k in evals if k.startswith("deepspeed") and evals[k].ok), None)
        if training and alt is not None and not chosen.startswith("deepspeed"):
            # installed or assumed: the DeepSpeed way to run the same job, ready to use (not run by cudaload)
            ds_cfg = settings(alt)
            config["deepspeed_alternative"] = {"strategy": alt, "config": ds_cfg["deepspeed_config"]}
    explicit = strategy != "auto"
    decision = Decision(chosen, (*reasons, *notes), cands, explicit=explicit)
    return Parallelism(
        decision=decision,
        world_size=n,
        per_gpu={k: e.terms for k, e in evals.items()},
        budget_per_gpu=budget,
        launched=launched,
        launch=launch_command(n, local)
        if chosen not in (None, "single", "layer_split") or (chosen == "single" and launched)
        else None,
        config=config,
    )


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
