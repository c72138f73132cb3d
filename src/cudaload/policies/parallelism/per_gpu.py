"""The per-GPU memory model: what each strategy holds on every GPU, term by term.

The terms reuse :func:`cudaload.policies.memory.breakdown` (weights, gradients, optimizer, master weights,
adapters, activations, KV cache); only what sharding changes is computed here. ``judge`` (made by
:func:`cudaload.policies.parallelism.choose.choose_parallelism`) records each candidate's terms and whether
they fit the budget."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from ...capabilities import Capabilities, Distributed
from ...dtypes import dtype_bytes
from ...errors import DoesNotFitError
from ...model_info import ModelInfo
from ...plans import Parallelism
from ..memory import CUDA_CONTEXT_BYTES, Breakdown, GiB, MiB, default_optimizer
from .topology import ParallelFacts, _divisors_of_both, rank_gpus_of

#: NCCL's communication buffers live outside torch's allocator, one set per communicator: NCCL_BUFFSIZE
#: (default 4 MiB, NCCL docs "Environment Variables") per channel for send and receive, up to 32 channels on
#: NVLink. A planning figure for one communicator, not measured here; bench_parallel.py reports the device's
#: used memory beside torch's peak so it can be checked.
NCCL_BYTES = 256 * MiB

#: DDP (its Reducer) copies every gradient into flat buckets for the all-reduce unless
#: ``gradient_as_bucket_view=True``, which neither Trainer nor accelerate sets: a second copy of the gradients.
#: torch 2.13 torch/nn/parallel/distributed.py:731 (``gradient_as_bucket_view`` docs) and :828 (default False).
DDP_BUCKET_COPIES = 1

#: A replica is only planned when it fits within this fraction of the budget: the memory estimates are held to
#: 5% of measured peaks (benchmarks/run.py GOAL_MEMORY), so a replica planned at 99% of the GPU may not fit.
REPLICA_HEADROOM = 0.95

#: FineGrainedFP8 (transformers' fp8 quantizer, the one with a tensor-parallel plan:
#: quantizers/quantizer_finegrained_fp8.py:168 update_tp_plan): 1 byte per weight and one fp32 scale per
#: 128x128 block (weight_block_size default, utils/quantization_config.py:1713).
FP8_BYTES_PER_PARAM = 1 + 4 / (128 * 128)
FP8_CONFIG = {"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}


def _terms(**kw: int) -> dict[str, int]:
    out = {k: int(v) for k, v in kw.items() if v}
    out["total"] = sum(out.values())
    return out


def _state(t: Mapping[str, int]) -> int:
    return sum(t.get(k, 0) for k in ("weights", "gradients", "optimizer", "master_weights", "adapters"))


def _working_set(info: ModelInfo, bd: Breakdown, dtype: str, trainable: bool) -> int:
    """Bytes FSDP2 / ZeRO-3 hold unsharded on each GPU at the peak.

    The root unit (embeddings, final norm, output head) stays gathered from forward to backward (FSDP2 sets
    the root's reshard_after_forward to False: torch 2.13 torch/distributed/fsdp/_fully_shard/_fully_shard.py:187-190
    and :248). One decoder layer is computed while the next is prefetched. When weights train, a unit's
    gradients exist unsharded in the compute dtype and again as the fp32 reduce-scatter input: for the root
    (largest unit of an LLM) that happens at the end of backward."""
    b = dtype_bytes(dtype)
    c = info.counts
    root = int((c.embedding + c.head + c.other // max(bd.layers, 1)) * b)
    layer_w = bd.layer_weight_bytes
    layer_p = layer_w // max(b, 1)
    if not trainable:
        return root + 2 * layer_w
    root_p = root // max(b, 1)
    return root + max(2 * layer_w + layer_p * (b + 4), root_p * (b + 4))


@dataclass(frozen=True)
class _Eval:
    ok: bool
    terms: dict[str, int]
    reasons: tuple[str, ...]


def gc_on(gradient_checkpointing: bool | None) -> bool:
    """The memory model's reading of ``gradient_checkpointing`` (None: on; memory/terms.py breakdown)."""
    return True if gradient_checkpointing is None else gradient_checkpointing


def bd_optimizer(intent: str, optimizer: str | None, dtype: str) -> str | None:
    """The optimizer the memory model plans with (None: the intent's default, as breakdown picks it)."""
    return optimizer if optimizer is not None else default_optimizer(intent, on_gpu=dtype_bytes(dtype) < 4)


def _gib(n: int) -> str:
    return f"{n / GiB:.1f} GiB"


def _training(
    info: ModelInfo,
    caps: Capabilities,
    bd: Breakdown,
    *,
    dtype: str,
    intent: str,
    n: int,
    local: int,
    act: int,
    comm: int,
    allow_offload: bool,
    judge: Any,
    evals: dict[str, _Eval],
) -> bool:
    """The training candidates' per-GPU terms (DDP, FSDP2, FSDP2 with CPU offload, DeepSpeed ZeRO-2/3), judged
    in that order; returns whether deepspeed is usable (installed or assumed)."""
    t = bd.terms
    ctx = CUDA_CONTEXT_BYTES
    state = _state(t)
    grads = t.get("gradients", 0)
    judge(
        "ddp",
        _terms(
            model_state=state,
            ddp_buckets=grads * DDP_BUCKET_COPIES,
            activations=act,
            nccl=comm,
            cuda_context=ctx,
        ),
        why="a full replica with its gradients, optimizer states and DDP's gradient buckets on every GPU",
    )
    work = _working_set(info, bd, dtype, trainable=intent == "training")
    judge(
        "fsdp2",
        _terms(
            sharded_state=state // n,
            unsharded_working_set=work,
            activations=act,
            nccl=comm,
            cuda_context=ctx,
        ),
        why=f"parameters, gradients and optimizer states sharded 1/{n}; one layer gathered at a time "
        "(plus the next, prefetched) and the root unit (embeddings, head) while it runs",
    )
    host_need = state * local // n
    host_ok = caps.host_memory is None or host_need <= caps.host_memory
    off_terms = _terms(unsharded_working_set=work, activations=act, nccl=comm, cuda_context=ctx)
    judge(
        "fsdp2_offload",
        off_terms,
        extra_ok=allow_offload and host_ok,
        why=(
            "sharded state in pinned CPU memory "
            f"({_gib(host_need)} on each node"
            + ("" if caps.host_memory is None else f" of {_gib(caps.host_memory)}")
            + "), optimizer step on the CPU (slow)"
            + ("" if allow_offload else "; needs allow_offload=True")
            + ("" if host_ok else "; more than the host's memory")
        ),
    )
    ds = caps.usable("deepspeed")
    ds_why = (
        "" if ds else "deepspeed is not installed (pip install deepspeed, or --assume-installed deepspeed)"
    )
    judge(
        "deepspeed_zero2",
        _terms(
            weights=t.get("weights", 0) + t.get("adapters", 0),
            sharded_grads_optimizer=(grads + t.get("optimizer", 0) + t.get("master_weights", 0)) // n,
            activations=act,
            nccl=comm,
            cuda_context=ctx,
        ),
        extra_ok=ds,
        why="ZeRO-2: gradients and optimizer states sharded, parameters replicated"
        + (f"; {ds_why}" if ds_why else ""),
    )
    judge(
        "deepspeed_zero3",
        dict(evals["fsdp2"].terms),
        extra_ok=ds,
        why="ZeRO-3: everything sharded, as FSDP2" + (f"; {ds_why}" if ds_why else ""),
    )
    judge(
        "deepspeed_zero3_offload",
        dict(off_terms),
        extra_ok=ds and allow_offload and host_ok,
        why="ZeRO-3 with optimizer and parameters offloaded to the CPU"
        + ("" if allow_offload else "; needs allow_offload=True")
        + (f"; {ds_why}" if ds_why else ""),
    )
    return ds


def _inference(
    info: ModelInfo,
    caps: Capabilities,
    bd: Breakdown,
    facts: ParallelFacts,
    *,
    dtype: str,
    quantization: str | None,
    n: int,
    budget: int,
    act: int,
    comm: int,
    judge: Any,
    evals: dict[str, _Eval],
    single_fits: bool | None,
    split_per_gpu: int | None,
    notes: list[str],
) -> None:
    s = info.summary
    t = bd.terms
    c = info.counts
    b = dtype_bytes(dtype)
    ctx = CUDA_CONTEXT_BYTES
    single = _terms(
        weights=t.get("weights", 0), kv_cache=t.get("kv_cache", 0), activations=act, cuda_context=ctx
    )
    judge(
        "single",
        single,
        why="the whole model on each GPU" + (" (every rank serves its own batch)" if n > 1 else ""),
    )
    if single_fits is not None and evals["single"].ok != single_fits:
        # the fit ladder's own budget (max_memory, the rank's GPU) has the last word on one GPU
        e = evals["single"]
        evals["single"] = _Eval(single_fits, e.terms, e.reasons)

    heads_ok = s.num_heads % n == 0 and s.num_kv_heads % n == 0
    tp_no: list[str] = []
    if not facts.tp_plan:
        tp_no.append(f"{s.architecture or s.type} has no base_model_tp_plan in its config class")
    if not heads_ok:
        tp_no.append(
            f"{n} GPUs do not divide {s.num_heads} attention heads and {s.num_kv_heads} KV heads "
            f"(use {', '.join(map(str, _divisors_of_both(s.num_heads, s.num_kv_heads, max(n, 8))))} GPUs)"
        )
    # sharded: every linear layer the plan covers (all decoder-layer projections of a dense LLM; MoE experts
    # when the plan names them) and the head when the model class's _tp_plan shards it; the rest replicated
    shard_params = c.linear + (c.other if facts.experts_tp else 0) + (c.head if facts.head_tp else 0)
    repl_params = c.embedding + (0 if facts.experts_tp else c.other) + (0 if facts.head_tp else c.head)
    kv = t.get("kv_cache", 0)

    def tp_terms(bytes_per_param: float, head_bytes: int) -> dict[str, int]:
        sharded = int((shard_params - (c.head if facts.head_tp else 0)) * bytes_per_param)
        sharded += c.head * head_bytes if facts.head_tp else 0
        return _terms(
            sharded_weights=sharded // n,
            replicated_weights=repl_params * b,
            kv_cache=kv // n,
            activations=act,
            nccl=comm,
            cuda_context=ctx,
        )

    bnb = quantization in ("int8", "nf4")
    tp_extra = [*tp_no]
    if bnb:
        tp_extra.append(
            f"{quantization} (bitsandbytes) weights are not sharded by transformers' tensor parallelism: "
            "its bnb quantizers define no update_tp_plan (transformers 5.17 quantizers/base.py:144 is a no-op)"
        )
    judge(
        "tp",
        tp_terms(b, b),
        extra_ok=not tp_extra,
        why="; ".join(
            [
                f"tensor parallel over {n} GPUs in {dtype}: each projection split by heads / columns, "
                "one all-reduce per attention and MLP block",
                *tp_extra,
            ]
        ),
    )
    fp8_no = [*tp_no]
    slow = [g for g in caps.gpus if not g.fp8]
    if slow:
        fp8_no.append(f"{slow[0].name} (sm{slow[0].sm}) has no fp8 (needs sm89+)")
    judge(
        "tp_fp8",
        tp_terms(FP8_BYTES_PER_PARAM, b),
        extra_ok=not fp8_no,
        why="; ".join(
            [
                f"tensor parallel over {n} GPUs with fp8 weights (FineGrainedFP8Config, quantized at load; "
                "transformers rewrites the TP plan for its scales)",
                *fp8_no,
            ]
        ),
    )
    if split_per_gpu is None:
        from ..placement import place

        plain = replace(caps, distributed=Distributed())
        f = place(plain, bd, device_map="auto")
        split_per_gpu = max(f.per_device.values()) if f.ok and f.per_device else None
    split = _terms(
        layers_and_kv=(split_per_gpu or bd.model_bytes // n + bd.every_device + ctx) - ctx, cuda_context=ctx
    )
    judge(
        "layer_split",
        split,
        extra_ok=split_per_gpu is not None,
        why="whole decoder layers per GPU in one process (device_map), one GPU busy at a time",
    )


def check_rank_memory(par: Parallelism, caps: Capabilities) -> None:
    """A rank whose GPU is already (nearly) full: name it before any weights move."""
    if not par.launched or par.choice is None:
        return
    need = par.per_gpu_bytes()
    if need is None:
        return
    if caps.distributed.ranks:
        # every rank's own GPU as it saw it before anyone loaded (cudaload.policies.ranks.agree): every rank
        # names the same one, also on another node
        for r in caps.distributed.ranks:
            if r.free_memory is not None and r.total_memory is not None and r.free_memory < need:
                used = r.total_memory - r.free_memory
                raise DoesNotFitError(
                    f"rank {r.rank}'s GPU (cuda:{r.local_rank} on {r.host}, {r.name}) has {_gib(r.free_memory)} "
                    f"free of {_gib(r.total_memory)}; the {par.choice} plan needs {_gib(need)} on every rank's GPU"
                    + (
                        f" ({_gib(used)} already held by other processes)"
                        if used > r.total_memory // 10
                        else ""
                    ),
                    fix=f"free that GPU (nvidia-smi on {r.host} lists the processes holding it), or leave it out "
                    "with CUDA_VISIBLE_DEVICES and launch fewer ranks",
                )
        return
    for g in rank_gpus_of(caps):
        free = g.available_memory
        if free < need:
            used = g.total_memory - free
            raise DoesNotFitError(
                f"cuda:{g.index} ({g.name}) has {_gib(free)} free of {_gib(g.total_memory)}; the {par.choice} plan "
                f"needs {_gib(need)} on every rank's GPU"
                + (f" ({_gib(used)} already held by other processes)" if used > g.total_memory // 10 else ""),
                fix="free that GPU (nvidia-smi lists the processes holding it), or leave it out with "
                "CUDA_VISIBLE_DEVICES and launch fewer ranks",
            )
