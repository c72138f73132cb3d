"""Ranks that plan alike (pure).

Under torchrun every rank runs ``load_model()`` on its own and plans from what it detected. Each rank's NVML
numbers are its own, read at its own moment: near a threshold two ranks can choose differently (one
``fsdp2``, one ``ddp``; one int8, one bf16), and on several nodes a rank sees only its node's GPUs. Ranks that
planned differently do not fail together: they hang in their first collective. So before planning, every
rank publishes its GPU as it saw it (:class:`~cudaload.capabilities.RankGPU`, exchanged through torchrun's
store by :mod:`cudaload.detection.ranks`), and every rank plans from the same facts:

- :func:`agree` refuses a launch whose ranks run on different GPU models or share one GPU (each a clear error
  on every rank, before any weights move), and plans every rank as the healthiest rank's GPU;
  :func:`cudaload.policies.parallelism.check_rank_memory` then names any rank whose GPU holds less than the
  plan needs, on every rank alike;
- after planning, :func:`decisions` is what every rank must have chosen alike and :func:`check_same` names
  the ranks and fields that differ (a node with another flash-attn, another checkpoint...) or the rank whose
  planning failed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from ..capabilities import GPU, Capabilities, RankGPU
from ..errors import ConfigurationError, DeviceSelectionError, LoadError

if TYPE_CHECKING:
    from ..plans.plan import Plan

GiB = 1 << 30


def own_gpu(caps: Capabilities) -> GPU | None:
    """The GPU this rank loads onto: cuda:LOCAL_RANK (as the placement policy picks it)."""
    lr = caps.distributed.local_rank if caps.distributed.local_rank is not None else 0
    return next((g for g in caps.gpus if g.index == lr), None)


def facts(caps: Capabilities, host: str) -> RankGPU:
    """What this rank publishes: its rank numbers and its own GPU as detected (before it loads anything)."""
    d = caps.distributed
    g = own_gpu(caps)
    return RankGPU(
        rank=d.rank if d.rank is not None else 0,
        local_rank=d.local_rank,
        host=host,
        name=g.name if g else None,
        compute_capability=g.compute_capability if g else None,
        total_memory=g.total_memory if g else None,
        free_memory=g.available_memory if g else None,
        uuid=g.uuid if g else None,
        host_memory=caps.host_memory,
    )


def _spans(ranks: Sequence[int]) -> str:
    """[0, 1, 2, 5] -> "0-2, 5"."""
    out: list[str] = []
    for r in sorted(ranks):
        if out and out[-1].split("-")[-1] == str(r - 1):
            out[-1] = f"{out[-1].split('-')[0]}-{r}"
        else:
            out.append(str(r))
    return ", ".join(out)


def _describe(r: RankGPU) -> str:
    if r.name is None:
        return "no GPU"
    cc = f"sm{r.compute_capability[0]}{r.compute_capability[1]}" if r.compute_capability else "sm?"
    size = f", {r.total_memory / GiB:.0f} GiB" if r.total_memory else ""
    return f"{r.name} ({cc}{size})"


#: one GPU model's memory as two nodes report it: NVML's total differs a little with the driver's reservation,
#: and a unified-memory GPU (GB10) reports the host's MemTotal, which moves with the kernel's own reservations
SAME_MEMORY = 0.05


def _model_of(r: RankGPU, seen: Mapping[tuple[Any, ...], list[int]]) -> tuple[Any, ...]:
    """The group ``r`` belongs to: an earlier one with its name and compute capability and a total memory within
    SAME_MEMORY of it (a few MiB apart is one GPU model, not "different GPUs" that print alike), else its own."""
    for key in seen:
        name, cc, total = key
        if (name, cc) != (r.name, r.compute_capability):
            continue
        if total == r.total_memory or (
            total
            and r.total_memory
            and abs(total - r.total_memory) <= SAME_MEMORY * max(total, r.total_memory)
        ):
            return key
    return r.model


def agree(caps: Capabilities, ranks: Sequence[RankGPU]) -> Capabilities:
    """This rank's Capabilities with every rank's GPU attached (``distributed.ranks``) and the GPUs of this
    node's ranks planned as the healthiest rank's (the most free memory any rank saw) and the host's memory as
    the smallest node's, so every rank's planning inputs about memory are the same numbers. Raises on a launch no plan can run well."""
    d = caps.distributed
    world = d.world_size or 1
    got = sorted(ranks, key=lambda r: r.rank)
    if [r.rank for r in got] != list(range(world)):
        raise ConfigurationError(
            f"the ranks that published their GPUs are {[r.rank for r in got]}, not 0..{world - 1} "
            f"(WORLD_SIZE={world})",
            fix="launch every rank with the same torchrun command (one WORLD_SIZE), and call load_model() "
            "once per rank in the same order",
        )
    models: dict[tuple[Any, ...], list[int]] = {}
    for r in got:
        models.setdefault(_model_of(r, models), []).append(r.rank)
    if len(models) > 1:
        listing = "; ".join(
            f"rank{'s' if len(rs) > 1 else ''} {_spans(rs)} ({', '.join(sorted({got[i].host for i in rs}))}): "
            f"{_describe(got[rs[0]])}"
            for rs in models.values()
        )
        raise DeviceSelectionError(
            f"the ranks run on different GPUs: {listing}; every rank gets an equal share and steps at the "
            "slowest one's pace, and a backend or dtype one GPU supports another may not",
            fix="launch the job on nodes with one GPU model (a node selector or --nnodes over like nodes), or "
            "run a separate job per GPU model",
        )
    seen: dict[tuple[str, str], int] = {}
    for r in got:
        if r.uuid is None:
            continue
        other = seen.setdefault((r.host, r.uuid), r.rank)
        if other != r.rank:
            raise DeviceSelectionError(
                f"ranks {other} and {r.rank} on {r.host} both run on the GPU {r.uuid} (LOCAL_RANK "
                f"{got[other].local_rank} and {r.local_rank}): they would load two copies onto one GPU",
                fix="give each rank its own GPU: torchrun --nproc_per_node at most the node's GPU count, and no "
                "CUDA_VISIBLE_DEVICES that maps two ranks to one device",
            )
    # host memory bounds what a node holds while loading and under CPU offload: every rank plans for the
    # smallest node, whose ranks would otherwise choose (and size) differently from the others
    hosts = [r.host_memory for r in got if r.host_memory is not None]
    if hosts:
        caps = replace(caps, host_memory=min(hosts))
    frees = [r.free_memory for r in got if r.free_memory is not None]
    if not frees or not caps.gpus:
        return replace(caps, distributed=replace(d, ranks=tuple(got)))
    healthy = max(frees)
    from .parallelism import rank_gpus_of

    mine = {g.index for g in rank_gpus_of(caps)}
    gpus = tuple(replace(g, free_memory=healthy) if g.index in mine else g for g in caps.gpus)
    return replace(caps, gpus=gpus, distributed=replace(d, ranks=tuple(got)))


def lowest(ranks: Sequence[RankGPU]) -> RankGPU | None:
    """The rank whose GPU had the least free memory (for explain and errors)."""
    have = [r for r in ranks if r.free_memory is not None]
    return min(have, key=lambda r: (r.free_memory or 0, r.rank)) if have else None


def decisions(plan: Plan) -> dict[str, Any]:
    """What every rank must have chosen alike: not the device (cuda:LOCAL_RANK differs by design) nor host
    numbers, but everything that shapes the model and the collectives its ranks run together."""
    par = plan.parallelism
    config = dict(par.config) if par is not None else {}
    serving = plan.serving.settings() if plan.serving is not None else None
    return {
        "model": [plan.model.architecture, plan.model.params, plan.model.layers],
        "intent": plan.intent,
        "dtype": plan.dtype.choice,
        "attention": plan.attention.choice,
        "quantization": plan.quantization.choice,
        "quantization_config": plan.quantization_config,
        "peft": plan.peft,
        "optimizer": plan.optimizer.choice if plan.optimizer is not None else None,
        "gradient_checkpointing": (
            plan.gradient_checkpointing.choice if plan.gradient_checkpointing is not None else None
        ),
        # a partial plan's n: ranks checkpointing other layers differ in memory and speed
        "checkpoint_every": plan.checkpoint_every,
        "parallelism": par.choice if par is not None else None,
        "training_arguments": config.get("training_arguments"),
        "sharded_load": bool(config.get("sharded_load")),
        "weights_on_cpu": bool(config.get("weights_on_cpu")),
        "load_path": plan.load_path.choice,
        "kernels": plan.kernels.get("use_kernels"),
        "serving": serving,
    }


def check_failed(published: Sequence[Mapping[str, Any]]) -> None:
    """``published[r]`` is what rank r published in one exchange; raises on every rank alike when a rank
    published its error instead (its GPU selection was broken, its planning raised...), naming that rank."""
    failed = [(r, p["error"]) for r, p in enumerate(published) if p.get("error")]
    if failed:
        r, why = failed[0]
        theirs = published[r].get("fix")
        raise LoadError(
            f"rank {r} could not plan ({why})"
            + (f"; {len(failed) - 1} more ranks failed" if len(failed) > 1 else ""),
            fix=(f"on rank {r}: {theirs}" if theirs else f"see rank {r}'s error")
            + " (every rank stopped before loading anything)",
        )


def check_same(published: Sequence[Mapping[str, Any]]) -> str | None:
    """``published[r]`` is rank r's ``{"decisions": ...}``, ``{"error": ...}`` or ``{"alone": ...}`` (it did
    not see every rank's GPU in time and planned from its own). Raises on every rank alike when a rank failed to
    plan or the ranks chose differently; returns a note when a rank planned alone (nothing to compare with)."""
    check_failed(published)
    alone = [r for r, p in enumerate(published) if "decisions" not in p]
    if alone:
        return (
            f"the ranks' plans were not compared: rank{'s' if len(alone) > 1 else ''} {_spans(alone)} planned "
            f"alone ({published[alone[0]].get('alone') or 'it did not see every rank in time'})"
        )
    first = published[0]["decisions"]
    differ: list[str] = []
    for key in first:
        values: dict[str, list[int]] = {}
        for r, p in enumerate(published):
            values.setdefault(repr(p["decisions"].get(key)), []).append(r)
        if len(values) > 1:
            differ.append(f"{key}: " + "; ".join(f"ranks {_spans(rs)} {v}" for v, rs in values.items()))
    if differ:
        fix = (
            "give every node the same packages (pip freeze), transformers version and checkpoint files, and "
            "call load_model() with the same arguments on every rank"
        )
        keys = {d.split(":", 1)[0] for d in differ}
        if "attention" in keys:
            # with declared work (batch_size, seq_len) the attention choice weighs this node's tune cache and
            # FA4 compile cache (cudaload.planner._first_use_here): per-node state, not only packages
            fix += (
                "; the attention choice also reads each node's tune cache and FA4 compile cache: pass attn= "
                "explicitly, or share CUDALOAD_CACHE between the nodes"
            )
        if "kernels" in keys:
            fix += (
                "; the Hub kernels are read from each node's Hub cache: fill it alike or pass kernels=False"
            )
        raise ConfigurationError(
            "the ranks planned differently from the same GPUs, so their collectives would not match: "
            + " | ".join(differ),
            fix=fix,
        )
    return None
