"""The per-GPU memory model: what each strategy holds on every GPU, term by term.

The terms reuse :func:`cudaload.policies.memory.breakdown` (weights, gradients, optimizer, master weights,
adapters, activations, KV cache); only what sharding changes is computed here. :func:`judge` records each candidate's terms and whether
they fit the budget; :func:`_training` and :func:`_inference` judge every candidate of their intent, from the
:class:`_Inputs` that :func:`cudaload.policies.parallelism.choose.choose_for` gathers."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from ...capabilities import Capabilities, Distributed
from ...dtypes import dtype_bytes
from ...errors import DoesNotFitError
from ...model_info import ModelInfo
from ...plans.plan import Parallelism
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


@dataclass(frozen=True)
class _Inputs:
    """What every candidate's per-GPU terms are computed from: the model, the machine, the one-process
    breakdown, ``n`` GPUs (``local`` of them on this node; ``launched``: under torchrun), the activations
    every GPU runs (with the quantization transient), NCCL's buffers (none on one GPU) and the budget a GPU
    offers."""

    info: ModelInfo
    caps: Capabilities
    bd: Breakdown
    dtype: str
    n: int
    local: int
    launched: bool
    act: int
    comm: int
    budget: int


def judge(inp: _Inputs, name: str, terms: dict[str, int], extra_ok: bool = True, why: str = "") -> _Eval:
    """``terms`` judged against the budget: a replica (single, ddp) only within :data:`REPLICA_HEADROOM`."""
    budget = inp.budget
    need = terms["total"]
    limit = budget * (REPLICA_HEADROOM if name in ("single", "ddp") else 1.0)
    fits = need <= limit and extra_ok
    msg = f"{_gib(need)} per GPU of {_gib(budget)}"
    if need > limit and name in ("single", "ddp") and need <= budget:
        msg += f" (over {REPLICA_HEADROOM:.0%} of it: the estimates are held to 5%, too tight to plan on)"
    elif need > budget:
        msg += " (does not fit)"
    return _Eval(fits, terms, tuple(r for r in (msg, why) if r))


def _training(inp: _Inputs, *, intent: str, allow_offload: bool) -> tuple[dict[str, _Eval], bool]:
    """The training candidates' per-GPU terms (DDP, FSDP2, FSDP2 with CPU offload, DeepSpeed ZeRO-2/3), judged
    in that order; and whether deepspeed is usable (installed or assumed)."""
    t = inp.bd.terms
    ctx = CUDA_CONTEXT_BYTES
    state = _state(t)
    evals: dict[str, _Eval] = {}
    evals["ddp"] = judge(
        inp,
        "ddp",
        _terms(
            model_state=state,
            ddp_buckets=t.get("gradients", 0) * DDP_BUCKET_COPIES,
            activations=inp.act,
            nccl=inp.comm,
            cuda_context=ctx,
        ),
        why="a full replica with its gradients, optimizer states and DDP's gradient buckets on every GPU",
    )
    work = _working_set(inp.info, inp.bd, inp.dtype, trainable=intent == "training")
    evals["fsdp2"] = judge(
        inp,
        "fsdp2",
        _terms(
            sharded_state=state // inp.n,
            unsharded_working_set=work,
            activations=inp.act,
            nccl=inp.comm,
            cuda_context=ctx,
        ),
        why=f"parameters, gradients and optimizer states sharded 1/{inp.n}; one layer gathered at a time "
        "(plus the next, prefetched) and the root unit (embeddings, head) while it runs",
    )
    host = inp.caps.host_memory
    host_need = state * inp.local // inp.n
    host_ok = host is None or host_need <= host
    off_terms = _terms(unsharded_working_set=work, activations=inp.act, nccl=inp.comm, cuda_context=ctx)
    evals["fsdp2_offload"] = judge(
        inp,
        "fsdp2_offload",
        off_terms,
        extra_ok=allow_offload and host_ok,
        why=(
            "sharded state in pinned CPU memory "
            f"({_gib(host_need)} on each node"
            + ("" if host is None else f" of {_gib(host)}")
            + "), optimizer step on the CPU (slow)"
            + ("" if allow_offload else "; needs allow_offload=True")
            + ("" if host_ok else "; more than the host's memory")
        ),
    )
    ds = inp.caps.usable("deepspeed")
    evals.update(
        _deepspeed(inp, evals["fsdp2"].terms, off_terms, ds, allow_offload=allow_offload, host_ok=host_ok)
    )
    return evals, ds


def _deepspeed(
    inp: _Inputs,
    zero3: dict[str, int],
    zero3_offload: dict[str, int],
    ds: bool,
    *,
    allow_offload: bool,
    host_ok: bool,
) -> dict[str, _Eval]:
    """DeepSpeed ZeRO-2 (gradients and optimizer states sharded), ZeRO-3 (as FSDP2's terms ``zero3``) and ZeRO-3
    offloaded (as FSDP2's offloaded terms); chosen only when asked for."""
    t = inp.bd.terms
    ds_why = (
        "" if ds else "deepspeed is not installed (pip install deepspeed, or --assume-installed deepspeed)"
    )
    zero2 = _terms(
        weights=t.get("weights", 0) + t.get("adapters", 0),
        sharded_grads_optimizer=(t.get("gradients", 0) + t.get("optimizer", 0) + t.get("master_weights", 0))
        // inp.n,
        activations=inp.act,
        nccl=inp.comm,
        cuda_context=CUDA_CONTEXT_BYTES,
    )
    return {
        "deepspeed_zero2": judge(
            inp,
            "deepspeed_zero2",
            zero2,
            extra_ok=ds,
            why="ZeRO-2: gradients and optimizer states sharded, parameters replicated"
            + (f"; {ds_why}" if ds_why else ""),
        ),
        "deepspeed_zero3": judge(
            inp,
            "deepspeed_zero3",
            dict(zero3),
            extra_ok=ds,
            why="ZeRO-3: everything sharded, as FSDP2" + (f"; {ds_why}" if ds_why else ""),
        ),
        "deepspeed_zero3_offload": judge(
            inp,
            "deepspeed_zero3_offload",
            dict(zero3_offload),
            extra_ok=ds and allow_offload and host_ok,
            why="ZeRO-3 with optimizer and parameters offloaded to the CPU"
            + ("" if allow_offload else "; needs allow_offload=True")
            + (f"; {ds_why}" if ds_why else ""),
        ),
    }


def _inference(
    inp: _Inputs,
    facts: ParallelFacts,
    *,
    quantization: str | None,
    single_fits: bool | None,
    split_per_gpu: int | None,
) -> dict[str, _Eval]:
    """The inference candidates' per-GPU terms (one GPU, tensor parallel unquantized and in fp8, a layer
    split), judged in that order."""
    t = inp.bd.terms
    single = _terms(
        weights=t.get("weights", 0),
        kv_cache=t.get("kv_cache", 0),
        activations=inp.act,
        cuda_context=CUDA_CONTEXT_BYTES,
    )
    e = judge(
        inp,
        "single",
        single,
        why="the whole model on each GPU" + (" (every rank serves its own batch)" if inp.n > 1 else ""),
    )
    if single_fits is not None and e.ok != single_fits:
        # the fit ladder's own budget (max_memory, the rank's GPU) has the last word on one GPU
        e = _Eval(single_fits, e.terms, e.reasons)
    return {
        "single": e,
        **_tensor_parallel(inp, facts, quantization),
        "layer_split": _layer_split(inp, split_per_gpu),
    }


def _tp_blockers(inp: _Inputs, facts: ParallelFacts) -> list[str]:
    """Why tensor parallelism cannot run this model on these GPUs (empty: it can)."""
    s = inp.info.summary
    n = inp.n
    out: list[str] = []
    if not facts.tp_plan:
        out.append(f"{s.architecture or s.type} has no base_model_tp_plan in its config class")
    if not (s.num_heads % n == 0 and s.num_kv_heads % n == 0):
        out.append(
            f"{n} GPUs do not divide {s.num_heads} attention heads and {s.num_kv_heads} KV heads "
            f"(use {', '.join(map(str, _divisors_of_both(s.num_heads, s.num_kv_heads, max(n, 8))))} GPUs)"
        )
    return out


def _tensor_parallel(inp: _Inputs, facts: ParallelFacts, quantization: str | None) -> dict[str, _Eval]:
    """Tensor parallel in the dtype and with fp8 weights: the sharded linear layers split 1/n, the rest
    replicated on every GPU."""
    c = inp.info.counts
    n = inp.n
    b = dtype_bytes(inp.dtype)
    # sharded: every linear layer the plan covers (all decoder-layer projections of a dense LLM; MoE experts
    # when the plan names them) and the head when the model class's _tp_plan shards it; the rest replicated
    shard_params = c.linear + (c.other if facts.experts_tp else 0) + (c.head if facts.head_tp else 0)
    repl_params = c.embedding + (0 if facts.experts_tp else c.other) + (0 if facts.head_tp else c.head)

    def tp_terms(bytes_per_param: float, head_bytes: int) -> dict[str, int]:
        sharded = int((shard_params - (c.head if facts.head_tp else 0)) * bytes_per_param)
        sharded += c.head * head_bytes if facts.head_tp else 0
        return _terms(
            sharded_weights=sharded // n,
            replicated_weights=repl_params * b,
            kv_cache=inp.bd.terms.get("kv_cache", 0) // n,
            activations=inp.act,
            nccl=inp.comm,
            cuda_context=CUDA_CONTEXT_BYTES,
        )

    tp_no = _tp_blockers(inp, facts)
    tp_extra = [*tp_no]
    if quantization in ("int8", "nf4"):
        tp_extra.append(
            f"{quantization} (bitsandbytes) weights are not sharded by transformers' tensor parallelism: "
            "its bnb quantizers define no update_tp_plan (transformers 5.17 quantizers/base.py:144 is a no-op)"
        )
    tp = judge(
        inp,
        "tp",
        tp_terms(b, b),
        extra_ok=not tp_extra,
        why="; ".join(
            [
                f"tensor parallel over {n} GPUs in {inp.dtype}: each projection split by heads / columns, "
                "one all-reduce per attention and MLP block",
                *tp_extra,
            ]
        ),
    )
    fp8_no = [*tp_no]
    slow = [g for g in inp.caps.gpus if not g.fp8]
    if slow:
        fp8_no.append(f"{slow[0].name} (sm{slow[0].sm}) has no fp8 (needs sm89+)")
    fp8 = judge(
        inp,
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
    return {"tp": tp, "tp_fp8": fp8}


def _layer_split(inp: _Inputs, split_per_gpu: int | None) -> _Eval:
    """Whole decoder layers per GPU in one process: the fit ladder's split where it found one, else placed here
    as ``device_map="auto"`` would place it."""
    ctx = CUDA_CONTEXT_BYTES
    if split_per_gpu is None:
        from ..placement import place

        plain = replace(inp.caps, distributed=Distributed())
        f = place(plain, inp.bd, device_map="auto")
        split_per_gpu = max(f.per_device.values()) if f.ok and f.per_device else None
    split = _terms(
        layers_and_kv=(split_per_gpu or inp.bd.model_bytes // inp.n + inp.bd.every_device + ctx) - ctx,
        cuda_context=ctx,
    )
    return judge(
        inp,
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
