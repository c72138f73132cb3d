"""The planner's entry point: the several-GPU decision run with what the fit ladder found, and this process's
part of a multi-process plan (its fit, placement and memory) in place of the fit ladder's one-process answer."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from ...capabilities import Capabilities
from ...errors import DoesNotFitError
from ...model_info import ModelInfo
from ...plans.decision import Candidate, Decision
from ...plans.plan import MemoryEstimate, Parallelism, Placement
from ...plans.training import StepShape
from ..memory import GiB, MemoryShape, breakdown_of
from ..optimizer_ladder import RequestedOptimizer
from ..quant_methods import RequestedQuantization
from .choose import LadderFit, ParallelAsk, choose_for
from .launch import launch_command
from .per_gpu import check_rank_memory, gc_on
from .topology import STRATEGIES, RequestedParallelism, model_facts, nccl_available, rank_gpus_of, world

if TYPE_CHECKING:
    from ..quantization import FitResult


@dataclass(frozen=True)
class Outcome:
    """What the planner takes from the several-GPU decision: the Parallelism, and when it changes what this
    process loads (a model no single process fits, or unquantized TP instead of quantizing for one GPU) the
    fit, placement and memory to plan with instead of the fit ladder's."""

    parallelism: Parallelism | None = None
    fit: FitResult | None = None
    placement: Placement | None = None
    memory: MemoryEstimate | None = None


#: the strategies a launcher runs as one process per GPU (single and layer_split are one process)
MULTI_PROCESS = tuple(s for s in STRATEGIES if s not in ("single", "layer_split"))


def decide(
    info: ModelInfo,
    caps: Capabilities,
    fr: FitResult | None,
    nofit: DoesNotFitError | None,
    *,
    strategy: RequestedParallelism = "auto",
    lower_latency: bool = False,
    dtype: str,
    intent: str,
    seq_len: int,
    batch_size: int,
    attn: str,
    quantization: RequestedQuantization,
    device_map: Any,
    max_memory: Any,
    allow_offload: bool,
    optimizer: RequestedOptimizer = "auto",
    gradient_checkpointing: bool | None = None,
    step: StepShape | None = None,
) -> Outcome:
    """Run :func:`choose_parallelism` with what the fit ladder found (``fr``, or the error ``nofit``).

    ``optimizer`` / ``gradient_checkpointing`` are plan()'s requests; where the fit ladder decided them
    (``fr.optimizer``, ``fr.gradient_checkpointing``), its choices are what the shards are sized for."""
    from ..quantization import bnb_problems, training_ladder

    n, _, launched = world(caps)
    if (n <= 1 or not caps.gpus) and strategy in ("auto", "single"):
        if nofit is not None:
            raise nofit
        return Outcome()
    q: str | None = fr.decision.choice if fr is not None else ("nf4" if intent == "qlora" else None)
    if fr is None and q is not None and bnb_problems(caps):
        # QLoRA needs bitsandbytes however the GPUs are shared: the fit ladder's error says why
        assert nofit is not None
        raise nofit
    deployment = launched or caps.source.startswith("profile:")
    # the optimizer and checkpointing rungs, tried again for N processes: the fit ladder chose them for one
    # process (a layer split spreads the activations over the GPUs, a rank holds its batch's on its own GPU),
    # so its choices may not fit a rank (checkpointing off) or may cost more than needed there
    opts, gcs, _ = training_ladder(
        intent, caps, optimizer=optimizer, gradient_checkpointing=gradient_checkpointing
    )
    shape = MemoryShape(dtype, q, intent, seq_len, batch_size, attn, step=step)
    ask = ParallelAsk(
        strategy, lower_latency, allow_offload, nccl=nccl_available(caps), facts=model_facts(info)
    )
    par: Parallelism | None = None
    if intent == "inference" and deployment and q is not None and quantization == "auto":
        par = _unquantized_tp(info, caps, fr, replace(shape, quantization=None), ask)
    override_q = par is not None
    if override_q:
        q = None
    rung = _Rung(par, opts[-1], gcs[-1]) if par is not None else _rungs(info, caps, fr, shape, ask, opts, gcs)
    par = rung.parallelism
    if par is None or par.choice is None:
        if nofit is not None:
            raise nofit
        return Outcome(parallelism=par)
    check_rank_memory(par, caps)
    if par.choice not in MULTI_PROCESS or not deployment or (not launched and fr is not None):
        # one GPU or a layer split in this process, or a profile that one process can also run: the fit
        # ladder's placement is what load_model() would do; the parallelism says how to launch N processes
        if fr is None:
            assert nofit is not None
            _raise_one_process(par, caps, nofit)
        return Outcome(parallelism=par)
    # this process's part of a multi-process plan, in place of the fit ladder's one-process answer
    bd = breakdown_of(
        info, replace(shape, quantization=q, optimizer=rung.optimizer, gradient_checkpointing=rung.gc)
    )
    placement = _rank_placement(par, caps, dtype)
    memory = _rank_memory(par, caps, bd.notes)
    dec, qcfg = _rank_quantization(par, fr, q, override_q, dtype)
    opt_dec = gc_dec = None
    if intent != "inference":
        opt_dec, gc_dec = _rank_training_decisions(
            par,
            opts,
            gcs,
            rung.optimizer,
            rung.gc,
            explicit_opt=optimizer != "auto",
            explicit_gc=gradient_checkpointing is not None,
        )
    from ..placement import Fit
    from ..quantization import FitResult

    fit = Fit(True, placement, dict(memory.per_device), dict(memory.budget))
    fit_result = FitResult(dec, fit, bd, qcfg, opt_dec, gc_dec)
    return Outcome(parallelism=par, fit=fit_result, placement=placement, memory=memory)


@dataclass(frozen=True)
class _Rung:
    """The parallelism decision and the optimizer and checkpointing rung it was sized with."""

    parallelism: Parallelism | None
    optimizer: str | None
    gc: bool | None


def _ladder_fit(fr: FitResult | None) -> LadderFit:
    """What the fit ladder found for one process: one GPU, or a layer split over GPUs only (its fullest GPU)."""
    if fr is None:
        return LadderFit(single_fits=False)
    pl = fr.fit.placement
    assert pl is not None  # the ladder's result is the rung that fits: it is placed
    one = len(pl.devices) == 1 and pl.devices[0].startswith("cuda") and not pl.offload
    split_per_gpu: int | None = None
    if not one and not pl.offload and all(d.startswith("cuda") for d in pl.devices):
        split_per_gpu = max(fr.fit.per_device.values())
    return LadderFit(single_fits=one, split_per_gpu=split_per_gpu)


def _unquantized_tp(
    info: ModelInfo, caps: Capabilities, fr: FitResult | None, shape: MemoryShape, ask: ParallelAsk
) -> Parallelism | None:
    """The ladder quantized to fit one GPU (or one process), not asked to: N GPUs may hold the model
    unquantized as TP. The TP decision, or None."""
    if fr is not None and fr.decision.explicit:
        return None
    trial = choose_for(info, caps, shape, ask, LadderFit(single_fits=False))
    return trial if trial is not None and trial.choice in ("tp", "tp_fp8") else None


def _rungs(
    info: ModelInfo,
    caps: Capabilities,
    fr: FitResult | None,
    shape: MemoryShape,
    ask: ParallelAsk,
    opts: list[str | None],
    gcs: list[bool | None],
) -> _Rung:
    """The fit ladder's order: each optimizer with checkpointing off then on, offloading strategies only after
    every rung (and only when allowed); the last rung's answer (or error) stands when none fits."""
    found = _ladder_fit(fr)
    rungs = [(o, g, False) for o in opts for g in gcs]
    if ask.allow_offload:
        rungs.append((opts[-1], gcs[-1], True))
    out = _Rung(None, opts[-1], gcs[-1])
    for i, (o, g, off) in enumerate(rungs):
        try:
            par = choose_for(
                info,
                caps,
                replace(shape, optimizer=o, gradient_checkpointing=g),
                replace(ask, offload=off),
                found,
            )
        except DoesNotFitError:
            if i == len(rungs) - 1:
                raise
            continue
        out = _Rung(par, o, g)
        if par is None or par.choice is not None:
            break
    return out


def _raise_one_process(par: Parallelism, caps: Capabilities, nofit: DoesNotFitError) -> None:
    """Nothing fits this one process: where N processes would fit, say how to launch them; else the fit
    ladder's error."""
    if par.choice in MULTI_PROCESS:
        n, local, _ = world(caps)
        raise DoesNotFitError(
            nofit.message,
            reasons=nofit.reasons,
            fix=f"launch one process per GPU ({par.choice}, {(par.per_gpu_bytes() or 0) / GiB:.1f} GiB "
            f"per GPU): {launch_command(n, local)}; or {nofit.fix}",
        )
    raise nofit


def _rank_placement(par: Parallelism, caps: Capabilities, dtype: str) -> Placement:
    """Where this rank loads the weights: its shard onto cuda:LOCAL_RANK (TP), the whole model on its CPU
    (FSDP2 whose weights fit no GPU whole), or the whole model onto its GPU for the Trainer to shard."""
    n, _, launched = world(caps)
    r = (caps.distributed.local_rank or 0) if launched else 0
    dev = f"cuda:{caps.gpus[r].index}" if r < len(caps.gpus) else "cuda:0"
    if par.choice in ("tp", "tp_fp8"):
        return Placement(
            dev,
            (dev,),
            reasons=(
                f"tensor parallel over {n} ranks: each rank loads its 1/{n} shard onto cuda:LOCAL_RANK "
                "(from_pretrained(distributed_config=DistributedConfig(tp_plan='auto')))",
            ),
        )
    if par.config.get("weights_on_cpu"):
        # loaded on the CPU, not onto cuda:LOCAL_RANK: the Trainer's FSDP2 setup (accelerate 1.x
        # utils/fsdp_utils.py fsdp2_prepare_model, cpu_ram_efficient_loading) moves the model to meta, shards
        # it and broadcasts rank 0's weights into each rank's shard on its GPU
        return Placement(
            "cpu",
            ("cpu",),
            reasons=(
                f"{par.choice}: the weights in {dtype} do not fit one GPU whole, so no rank loads them onto its "
                f"GPU ({dev} here): every rank loads them on its CPU, and the Trainer shards the model and sends "
                "each rank its part of rank 0's (fsdp_config cpu_ram_efficient_loading)",
            ),
        )
    return Placement(
        dev,
        (dev,),
        reasons=(
            f"{par.choice} over {n} ranks: each rank loads the weights onto cuda:LOCAL_RANK ({dev} here); "
            "the Trainer shards them and their training state",
        ),
    )


def _rank_memory(par: Parallelism, caps: Capabilities, notes: tuple[str, ...]) -> MemoryEstimate:
    """The chosen strategy's per-GPU terms on every rank's GPU."""
    assert par.choice is not None
    rank_gpus = rank_gpus_of(caps)
    per = par.per_gpu_bytes() or 0
    return MemoryEstimate(
        terms={k: v for k, v in par.per_gpu[par.choice].items() if k != "total"},
        total=per * len(rank_gpus),
        per_device={f"cuda:{g.index}": per for g in rank_gpus},
        budget={f"cuda:{g.index}": g.available_memory for g in rank_gpus},
        notes=(*notes, f"per GPU under {par.choice} over {par.world_size} GPUs (see parallelism)"),
    )


def _rank_quantization(
    par: Parallelism, fr: FitResult | None, q: str | None, override_q: bool, dtype: str
) -> tuple[Decision, dict[str, Any] | None]:
    """The quantization decision of a multi-process plan and its config: the fit ladder's, unquantized where
    TP replaced its quantization, or the method N processes fit with where no single process fits."""
    from ..quantization import quantization_config

    n = par.world_size
    if override_q:
        assert fr is not None
        cands = tuple(
            Candidate(
                c.name,
                c.name == "none",
                (f"fits as tensor parallel over {n} GPUs",)
                if c.name == "none"
                else (*c.reasons, f"not needed: tensor parallel over {n} GPUs holds the unquantized model"),
            )
            for c in fr.decision.candidates
        )
        dec = Decision(
            None,
            (
                f"tensor parallel over {n} GPUs holds the model unquantized (one GPU would need {fr.decision.choice})",
            ),
            cands,
        )
    elif fr is not None:
        dec = fr.decision
    else:
        per = par.per_gpu_bytes() or 0
        dec = Decision(
            q,
            (f"{par.choice} over {n} GPUs fits ({per / GiB:.1f} GiB per GPU); no single process does",),
            tuple(Candidate(m, m == (q or "none"), ()) for m in ("none", "int8", "nf4")),
        )
    if par.choice == "tp_fp8":
        dec = replace(
            dec, reasons=(*dec.reasons, "weights become fp8 at load for tensor parallelism: see parallelism")
        )
    qcfg = quantization_config(dec.choice, dtype)
    if fr is not None and not override_q:
        qcfg = fr.quantization_config
    if qcfg is not None and dec.choice == "nf4" and par.config.get("quantization_config"):
        qcfg = {**qcfg, **par.config["quantization_config"]}
    return dec, qcfg


def _rank_training_decisions(
    par: Parallelism,
    opts: list[str | None],
    gcs: list[bool | None],
    opt: str | None,
    gc: bool | None,
    *,
    explicit_opt: bool,
    explicit_gc: bool,
) -> tuple[Decision, Decision]:
    """The optimizer and checkpointing decisions of a multi-process plan: the first rung of the ladder with
    which a strategy fits each rank (:func:`decide` tries them in order)."""
    from ..memory import OPTIMIZERS

    where = f"{par.choice} over {par.world_size} GPUs"
    chosen_opt = par.config.get("optimizer", opt)
    on = bool(par.config.get("gradient_checkpointing", gc_on(gc)))
    opt_c: list[Candidate] = []
    for o in OPTIMIZERS:
        if o == chosen_opt:
            why = f"fits each rank under {where}" + (" (requested)" if explicit_opt else "")
        elif o in opts and opts.index(o) < opts.index(opt):
            why = f"does not fit a rank under {where} or any other strategy"
        elif o in opts:
            why = f"not needed: {chosen_opt} fits"
        else:
            why = "not requested" if explicit_opt else "not on this intent's ladder"
        opt_c.append(Candidate(o, o == chosen_opt, (why,)))
    gc_c: list[Candidate] = []
    for name, val in (("off", False), ("on", True)):
        if val == on:
            why = f"{'requested; ' if explicit_gc else ''}fits each rank under {where}"
            if val and not explicit_gc and len(gcs) > 1:
                why += ": without it a rank's activations do not fit (~1/3 more compute)"
        elif val in gcs:
            why = "does not fit a rank" if not val else "not needed: fits without"
        else:
            why = "not requested" if explicit_gc else "k-bit training runs with it on"
        gc_c.append(Candidate(name, val == on, (why,)))
    return (
        Decision(chosen_opt, next(c.reasons for c in opt_c if c.ok), tuple(opt_c), explicit=explicit_opt),
        Decision(
            "on" if on else "off", next(c.reasons for c in gc_c if c.ok), tuple(gc_c), explicit=explicit_gc
        ),
    )
