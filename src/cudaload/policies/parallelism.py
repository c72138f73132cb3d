"""Several GPUs: DDP, FSDP2, DeepSpeed ZeRO, tensor parallelism or a layer split, with per-GPU bytes for each.

Training (one process per GPU, ``torchrun``): DDP when a full replica, its training state and DDP's gradient
buckets fit each GPU with the estimates' margin; FSDP2 (parameters, gradients and optimizer states sharded
1/N; activations per GPU) when not; FSDP2 with CPU offload only with ``allow_offload=True``. LoRA / QLoRA
compose with both (the frozen base is sharded under FSDP2). DeepSpeed ZeRO-2/3 is planned beside them when
the package is installed or assumed, with the config dict it needs, and chosen only when asked for.

Inference: one GPU when the model fits (under torchrun every rank serves its own replica); tensor parallelism
(``DistributedConfig(tp_plan="auto")`` under torchrun) when it does not fit one GPU and the model has a
``base_model_tp_plan``, or when lower latency is asked for; a layer split (``device_map``) in one process
otherwise.

``choose_parallelism`` is pure: the model's parallel facts (:class:`ParallelFacts`, read from the config and
model classes by :func:`model_facts`) and whether NCCL is available come in as data. The per-GPU terms reuse
:func:`cudaload.policies.memory.breakdown` (weights, gradients, optimizer, master weights, adapters,
activations, KV cache); only what sharding changes is computed here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from ..capabilities import Capabilities, Distributed
from ..decision import Candidate, Decision
from ..errors import (
    ConfigurationError,
    DependencyError,
    DeviceSelectionError,
    DoesNotFitError,
    InvalidChoiceError,
)
from ..plans import Parallelism, Plan
from .dtype import dtype_bytes
from .memory import CUDA_CONTEXT_BYTES, Breakdown, GiB, MiB, breakdown, default_optimizer

STRATEGIES = (
    "single",
    "ddp",
    "fsdp2",
    "fsdp2_offload",
    "deepspeed_zero2",
    "deepspeed_zero3",
    "deepspeed_zero3_offload",
    "tp",
    "tp_fp8",
    "layer_split",
)
#: what ``strategy=`` accepts (a family picks the best fitting member)
REQUESTS = ("auto", "single", "ddp", "fsdp2", "deepspeed", "tp", "layer_split")

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


@dataclass(frozen=True)
class ParallelFacts:
    """What sharding needs to know about the model class (plain data, so policies and tests stay pure)."""

    decoder_layer_class: str | None = None  # the unit FSDP wraps (the model class's _no_split_modules)
    tp_plan: tuple[str, ...] = ()  # keys of the config's base_model_tp_plan (empty: no tensor parallelism)
    head_tp: bool = False  # the model class's _tp_plan shards the output head too
    experts_tp: bool = False  # the plan shards MoE experts (their 3-D weights are split too)


def model_facts(info: Any) -> ParallelFacts:
    """Read :class:`ParallelFacts` from the config class and the transformers model class (no weights)."""
    config = info.config
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    plan = getattr(text, "base_model_tp_plan", None) or getattr(type(text), "base_model_tp_plan", None) or {}
    cls = None
    if info.class_name:
        try:
            import transformers

            cls = getattr(transformers, info.class_name, None)
        except ImportError:  # pragma: no cover - planning always has transformers
            cls = None
    no_split = list(getattr(cls, "_no_split_modules", None) or [])
    head_plan = getattr(cls, "_tp_plan", None) or {}
    return ParallelFacts(
        decoder_layer_class=no_split[0] if no_split else None,
        tp_plan=tuple(plan),
        head_tp=any("lm_head" in k for k in head_plan),
        experts_tp=any("experts" in k for k in plan),
    )


def nccl_available(caps: Capabilities) -> bool | None:
    """Whether torch has NCCL, asked only inside a torchrun worker on this machine (which imports torch
    anyway); None elsewhere (a profile or a plain process says nothing about NCCL)."""
    if not caps.distributed.active or caps.source != "detected" or not caps.gpus:
        return None
    try:
        import torch.distributed as dist
    except ImportError:  # pragma: no cover - cudaload needs torch to load anything
        return False
    return bool(dist.is_available() and dist.is_nccl_available())


def world(caps: Capabilities) -> tuple[int, int, bool]:
    """(world size, ranks on this node, launched): torchrun's numbers, else one process per visible GPU."""
    d = caps.distributed
    if d.active:
        assert d.world_size is not None
        return d.world_size, d.local_world_size or d.world_size, True
    return len(caps.gpus), len(caps.gpus), False


def rank_gpus_of(caps: Capabilities) -> list[Any]:
    """The GPUs this node's ranks run on: cuda:0..local_world_size-1 (and this rank's own), every visible GPU
    outside torchrun."""
    d = caps.distributed
    if not d.active:
        return list(caps.gpus)
    _, local, _ = world(caps)
    want = set(range(local)) | ({d.local_rank} if d.local_rank is not None else set())
    return [g for i, g in enumerate(caps.gpus) if i in want] or list(caps.gpus)


def launch_command(n: int, local: int, script: str = "your_script.py") -> str:
    if n > local:
        nodes = -(-n // local)
        return (
            f"torchrun --nnodes {nodes} --nproc_per_node {local} --rdzv_backend c10d "
            f"--rdzv_endpoint HOST:29500 {script}"
        )
    return f"torchrun --nproc_per_node {n} {script}"


def _divisors_of_both(a: int, b: int, limit: int) -> list[int]:
    return [k for k in range(1, limit + 1) if a % k == 0 and b % k == 0]


def _terms(**kw: int) -> dict[str, int]:
    out = {k: int(v) for k, v in kw.items() if v}
    out["total"] = sum(out.values())
    return out


def _state(t: Mapping[str, int]) -> int:
    return sum(t.get(k, 0) for k in ("weights", "gradients", "optimizer", "master_weights", "adapters"))


def _staged_host_bytes(info: Any, terms: dict[str, int], intent: str, local: int) -> int:
    """Host memory on one node when FSDP ranks load on their CPUs (weights_on_cpu): every local rank holds the
    checkpoint's weights in the dtype (load_model loads them on each rank's CPU), and accelerate's
    fsdp2_prepare_model upcasts each trainable parameter to fp32 one at a time, keeps the upcast state dict
    (original_sd) and only then moves the model to the meta device (accelerate 1.15 utils/fsdp_utils.py:815-820,
    :828, :844): for a full fine-tune 4 bytes per parameter on every rank, whatever the load dtype."""
    weights = int(terms.get("weights", 0))
    trainable = int(info.counts.total or info.summary.params) if intent == "training" else 0
    return local * max(weights, 4 * trainable)


#: Host memory one rank needs for a sharded FSDP2 load onto its GPU: the fast path's pinned staging pool
#: (cudaload.fastload.staging: at most default_threads() + 2 = 10 buffers of DEFAULT_BUFFER_BYTES, 16 MiB).
SHARDED_STAGING_BYTES = 10 * (16 << 20)


#: How the plan's reasons begin the sharded-load statements (the planner drops or rewrites them when the
#: load path cannot take the sharded loader after all: from_pretrained keywords, fast=False)
SHARDED_REASON = "each rank reads and holds only its"
SHARDED_STEPPED_ASIDE = "if the sharded load steps aside (a checkpoint the fast path cannot read exactly)"


def sharded_load_blockers(
    info: Any, chosen: str, *, intent: str, dtype: str, quantization: str | None
) -> list[str]:
    """Why the FSDP ranks of this plan cannot each read only their own shards (cudaload.fastload.sharded);
    empty when they can. What only the files tell (weights needing transformers' converters, e.g. fused MoE
    experts) makes the load step aside at load time, to the whole-model CPU load."""
    s = info.summary
    out: list[str] = []
    if chosen not in ("fsdp2", "fsdp2_offload"):
        out.append(f"{chosen} is not FSDP2")
    if intent not in ("training", "lora"):
        # LoRA is wrapped on the meta device before sharding (load_fsdp2's peft_config); QLoRA's base is
        # quantized by from_pretrained
        out.append(
            f"intent {intent}: the sharded loader builds full fine-tunes and LoRA on an unquantized base"
        )
    if dtype not in ("bfloat16", "float32"):
        out.append(f"{dtype}: the sharded loader mirrors accelerate's bf16 or fp32 FSDP2 set-up only")
    if quantization:
        out.append(f"{quantization} quantization happens inside from_pretrained")
    if not s.local_path or not s.safetensors:
        out.append("not a local safetensors checkpoint")
    if info.remote_code:
        out.append("the model needs remote code (auto_map)")
    return out


def _working_set(info: Any, bd: Breakdown, dtype: str, trainable: bool) -> int:
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
    """The memory model's reading of ``gradient_checkpointing`` (None: on; policies/memory.py breakdown)."""
    return True if gradient_checkpointing is None else gradient_checkpointing


def bd_optimizer(intent: str, optimizer: str | None, dtype: str) -> str | None:
    """The optimizer the memory model plans with (None: the intent's default, as breakdown picks it)."""
    return optimizer if optimizer is not None else default_optimizer(intent, on_gpu=dtype_bytes(dtype) < 4)


def _gib(n: int) -> str:
    return f"{n / GiB:.1f} GiB"


def choose_parallelism(
    info: Any,
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
            ""
            if ds
            else "deepspeed is not installed (pip install deepspeed, or --assume-installed deepspeed)"
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
            f"{s.name} ({s.params / 1e9:.1f} B params, intent {intent}) does not fit {n} GPUs "
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
            config["weights_on_cpu"] = True
            config["training_arguments"]["fsdp_config"]["cpu_ram_efficient_loading"] = True
            host = _staged_host_bytes(info, t, intent, local)
            config["host_bytes_per_node"] = host
            sharded = sharded_load_blockers(
                info,
                chosen,
                intent=intent,
                dtype=dtype,
                quantization=quantization,
            )
            if launched and not sharded:
                # cudaload.fastload.sharded.load_fsdp2: the ranks read their own rows of each weight onto their
                # GPUs; the whole-model CPU load stays the fallback when the fast path steps aside at load time
                config["sharded_load"] = True
                config["host_bytes_per_node_if_stepped_aside"] = host
                # the shards, in host memory under CPU offload: a full fine-tune's float32 masters (what
                # accelerate's upcast gives); LoRA's frozen base in the dtype and its float32 adapters (peft's
                # autocast_adapter_dtype; the memory model's "adapters" term)
                params = int(info.counts.total or info.summary.params)
                lora = intent == "lora"
                state = dtype_bytes(dtype) * params + int(t.get("adapters", 0)) if lora else 4 * params
                held = state // n if chosen == "fsdp2_offload" else 0
                sharded_host = local * (SHARDED_STAGING_BYTES + held)
                config["host_bytes_per_node"] = sharded_host
                where = "into host memory (CPU offload)" if held else "onto its GPU"
                what = f"{dtype} base and float32 LoRA shards" if lora else "float32 shards"
                reasons.append(
                    f"{SHARDED_REASON} 1/{n} of the weights: load_model builds the model on the "
                    "meta device"
                    + (", wraps it with LoRA (peft)" if lora else "")
                    + ", shards it with FSDP2 and reads each rank's rows of every weight from the "
                    f"safetensors files {where} (host memory ~{_gib(sharded_host)} per node: "
                    + (f"{local} ranks' {what} and " if held else "")
                    + "staging buffers)"
                )
                host_why = SHARDED_STEPPED_ASIDE
                if caps.host_memory is not None and sharded_host > caps.host_memory:
                    reasons.append(
                        f"this host has {_gib(caps.host_memory)}, less than the sharded load's "
                        f"{_gib(sharded_host)}: launch fewer ranks per node (more nodes)"
                    )
            else:
                host_why = "while the Trainer shards"
                if launched:
                    notes.append(f"no sharded loading: {'; '.join(sharded)}")
            over = caps.host_memory is not None and host > caps.host_memory
            (notes if not over or config.get("sharded_load") else reasons).append(
                f"host memory {host_why}: ~{_gib(host)} per node ({local} ranks: the weights on "
                + (
                    "each rank's CPU, and the trainable ones upcast to fp32 on every rank before sharding, "
                    "accelerate 1.15 utils/fsdp_utils.py:815-820 under mixed precision)"
                    if intent == "training"
                    else "each rank's CPU; the trainable adapters are float32 already and small)"
                )
                + (
                    f"; this host has {_gib(caps.host_memory or 0)}: launch fewer ranks per node (more nodes)"
                    + (" or train LoRA (a float32 load needs the same)" if intent == "training" else "")
                    if over
                    else ""
                )
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


def _inference(
    info: Any,
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
        from .placement import place

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


def _raise_heads(s: Any, n: int, caps: Capabilities) -> None:
    ok = _divisors_of_both(s.num_heads, s.num_kv_heads, max(n, len(caps.gpus), 8))
    raise ConfigurationError(
        f"tensor parallelism over {n} GPUs cannot split {s.name}: {s.num_heads} attention heads and "
        f"{s.num_kv_heads} KV heads are not divisible by {n}",
        fix=f"launch with --nproc_per_node in {{{', '.join(map(str, ok))}}}, or run one process with "
        "device_map='auto' (a layer split)",
    )


def _check_launch(caps: Capabilities, launched: bool, gpus: list[Any], nccl: bool | None, n: int) -> None:
    """Bad distributed input, found before any weights move."""
    if not launched:
        return
    names = {g.name for g in gpus}
    mems = {g.total_memory for g in gpus}
    if len(names) > 1 or len(mems) > 1:
        listing = ", ".join(f"cuda:{g.index} {g.name} ({g.total_memory / GiB:.0f} GiB)" for g in gpus)
        first = gpus[0]
        same = [g for g in caps.gpus if g.name == first.name and g.total_memory == first.total_memory]
        # UUIDs: CUDA_VISIBLE_DEVICES accepts them and they cannot be confused with nvidia-smi's numbering
        # (CUDA enumerates fastest first unless CUDA_DEVICE_ORDER=PCI_BUS_ID)
        keep = ",".join(g.uuid or str(g.index) for g in same)
        raise DeviceSelectionError(
            f"the ranks would run on different GPU models: {listing}; every rank steps at the slowest "
            "one's pace and gets an equal shard, so the smallest bounds them all",
            fix=f"CUDA_VISIBLE_DEVICES={keep} "
            f"torchrun --nproc_per_node {len(same)} ... (one GPU model), or one process with device_map='auto'",
        )
    if nccl is False:
        raise DependencyError(
            f"torchrun started {n} processes but this torch has no NCCL (torch.distributed.is_nccl_available() "
            "is False)",
            fix="install a CUDA build of torch for Linux from pytorch.org (its wheels include NCCL); "
            "gloo does not run collectives on GPU tensors",
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


def _settings(
    chosen: str,
    info: Any,
    facts: ParallelFacts,
    n: int,
    *,
    intent: str,
    dtype: str,
    quantization: str | None,
    seq_len: int,
    gradient_checkpointing: bool | None = None,
) -> dict[str, Any]:
    """What the chosen strategy needs: TrainingArguments keywords, from_pretrained keywords, DeepSpeed config."""
    # activation checkpointing, done the FSDP way, exactly when the per-GPU activation term assumed it
    ckpt = gc_on(gradient_checkpointing)
    if chosen == "ddp":
        return {
            "training_arguments": {
                # every parameter that requires a gradient gets one in a forward pass (a frozen LoRA base has
                # none to wait for); True would make DDP walk the autograd graph after every forward
                "ddp_find_unused_parameters": False,
            }
        }
    if chosen in ("fsdp2", "fsdp2_offload"):
        cfg: dict[str, Any] = {
            # transformers 5.17 training_args.py:673-713 (fsdp_config keys) and :2784 (version, default 2);
            # fsdp=True, not the "full_shard auto_wrap" string (deprecated, removed in 5.20: :2859-2863)
            "version": 2,
            "reshard_after_forward": True,
            "auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
            "activation_checkpointing": ckpt,
            "cpu_offload": chosen == "fsdp2_offload",
        }
        if facts.decoder_layer_class:
            cfg["transformer_layer_cls_to_wrap"] = [facts.decoder_layer_class]
        out: dict[str, Any] = {"training_arguments": {"fsdp": True, "fsdp_config": cfg}}
        if quantization == "nf4":
            # a float storage dtype lets FSDP flatten and shard the packed 4-bit weights with the rest;
            # BitsAndBytesConfig takes it as a string (transformers 5.17 utils/quantization_config.py:479-484)
            out["quantization_config"] = {"bnb_4bit_quant_storage": dtype}
        return out
    if chosen.startswith("deepspeed"):
        stage = 2 if chosen == "deepspeed_zero2" else 3
        zero: dict[str, Any] = {"stage": stage, "overlap_comm": True, "contiguous_gradients": True}
        if stage == 3:
            zero.update(
                {
                    "stage3_gather_16bit_weights_on_model_save": True,
                    "stage3_prefetch_bucket_size": "auto",
                    "stage3_param_persistence_threshold": "auto",
                    "reduce_bucket_size": "auto",
                }
            )
        if chosen == "deepspeed_zero3_offload":
            zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
            zero["offload_param"] = {"device": "cpu", "pin_memory": True}
        ds = {
            # "auto" values are filled in from TrainingArguments by transformers' HfTrainerDeepSpeedConfig
            "zero_optimization": zero,
            "bf16": {"enabled": "auto"},
            "fp16": {"enabled": "auto"},
            "train_micro_batch_size_per_gpu": "auto",
            "gradient_accumulation_steps": "auto",
            "gradient_clipping": "auto",
            "train_batch_size": "auto",
        }
        return {"training_arguments": {"deepspeed": ds}, "deepspeed_config": ds}
    if chosen in ("tp", "tp_fp8"):
        out = {"from_pretrained": {"distributed_config": {"tp_plan": "auto", "tp_size": n}}}
        if chosen == "tp_fp8":
            out["quantization_config"] = dict(FP8_CONFIG)
        return out
    if chosen == "layer_split":
        return {"from_pretrained": {"device_map": "auto"}}
    return {}


# -- TrainingArguments -------------------------------------------------------------------------------------
_CHECKPOINTING_KEYS = (
    "gradient_checkpointing",
    "gradient_checkpointing_kwargs",
    "activation_checkpointing",  # the name transformers 5.2x uses (training_args.py, deprecation loop)
    "activation_checkpointing_kwargs",
)


def parallel_training_arguments(plan: Plan) -> dict[str, Any]:
    """``TrainingArguments`` keywords for the plan's parallelism (empty for one GPU or a layer split).

    FSDP2: ``fsdp=True`` and an ``fsdp_config`` with ``version`` 2, auto-wrap by the decoder layer class and
    activation checkpointing done by FSDP; DDP: ``ddp_backend`` and ``ddp_find_unused_parameters=False``;
    DeepSpeed: the ``deepspeed`` config dict. Merge with :func:`merge_training_arguments`, which also drops
    the model-level gradient checkpointing FSDP replaces."""
    par = plan.parallelism
    if par is None or par.choice is None:
        return {}
    out = {
        k: (dict(v) if isinstance(v, dict) else v)
        for k, v in par.config.get("training_arguments", {}).items()
    }
    if out.get("fsdp") and (plan.verified or {}).get("load_path") == "fast_sharded":
        # load_model returned an FSDPModule (cudaload.fastload.sharded): accelerate hands it back as it is (1.15
        # utils/fsdp_utils.py:763-767), but first looks the wrap classes up by name (accelerator.py:1694,
        # utils/dataclasses.py:2088-2096), names fully_shard changed to FSDP<Name> (torch 2.13
        # _fully_shard/_fsdp_init.py:426-427), so it would raise; and it would wrap the layers in activation
        # checkpointing (accelerator.py:1697-1698) that the loader already applied. Nothing is left to wrap.
        cfg = dict(out["fsdp_config"])
        cfg.pop("transformer_layer_cls_to_wrap", None)
        cfg.update(
            auto_wrap_policy="NO_WRAP", activation_checkpointing=False, cpu_ram_efficient_loading=False
        )
        out["fsdp_config"] = cfg
    return out


def merge_training_arguments(base: Mapping[str, Any], plan: Plan) -> dict[str, Any]:
    """``base`` (cudaload.training_arguments) with the parallel settings on top. Under FSDP activation
    checkpointing is FSDP's: transformers warns that gradient_checkpointing adds a redundant all-gather in
    backward (training_args.py:2753-2759), so those keys are dropped."""
    extra = parallel_training_arguments(plan)
    out = dict(base)
    par = plan.parallelism
    cfg = par.config if par is not None and par.choice is not None else {}
    if cfg.get("optimizer") and "optim" in out:
        # the per-GPU numbers were planned with this optimizer on every rank
        out["optim"] = cfg["optimizer"]
    if extra.get("fsdp"):
        for k in _CHECKPOINTING_KEYS:
            out.pop(k, None)
    elif "gradient_checkpointing" in cfg:
        # DDP / DeepSpeed: model-level checkpointing as each rank's activation term assumed, under the name
        # the base arguments use (gradient_ or activation_checkpointing, by transformers version)
        name = next((k for k in ("activation_checkpointing", "gradient_checkpointing") if k in out), None)
        if name is not None:
            on = bool(cfg["gradient_checkpointing"])
            out[name] = on
            if on:
                out[f"{name}_kwargs"] = {"use_reentrant": False}
            else:
                out.pop(f"{name}_kwargs", None)
    out.update(extra)
    return out


# -- explain -----------------------------------------------------------------------------------------------
def explain_lines(par: Parallelism) -> list[str]:
    d = par.decision
    head = f"parallelism: {d.choice or 'none (no multi-process strategy fits)'} ({par.world_size} GPUs"
    head += ", launched under torchrun)" if par.launched else ")"
    lines = [head + ("  (explicit)" if d.explicit else "")]
    lines.extend(f"    because {r}" for r in d.reasons)
    for c in d.candidates:
        need = par.per_gpu_bytes(c.name)
        size = f" {need / GiB:.1f} GiB/GPU" if need is not None else ""
        mark = "*  " if c.name == d.choice else ("ok " if c.ok else "no ")
        lines.append(
            f"  - {mark}{c.name}:{size}: {'; '.join(c.reasons[1:]) if len(c.reasons) > 1 else ''}".rstrip(
                ": "
            )
        )
    chosen = par.per_gpu.get(d.choice or "")
    if chosen:
        lines.append(
            "    per GPU: "
            + ", ".join(f"{k} {v / GiB:.2f} GiB" for k, v in chosen.items() if k != "total")
            + f"; total {chosen['total'] / GiB:.2f} GiB"
            + (f" of {par.budget_per_gpu / GiB:.1f} GiB" if par.budget_per_gpu else "")
        )
    if par.launch:
        lines.append(f"    launch: {par.launch}")
    ta = par.config.get("training_arguments")
    if ta:
        lines.append("    TrainingArguments: " + ", ".join(f"{k}={v!r}" for k, v in ta.items()))
    fp = par.config.get("from_pretrained")
    if fp:
        lines.append("    from_pretrained: " + ", ".join(f"{k}={v!r}" for k, v in fp.items()))
    alt = par.config.get("deepspeed_alternative")
    if alt:
        lines.append(
            f"    DeepSpeed instead ({alt['strategy']}): TrainingArguments(deepspeed={alt['config']!r})"
        )
    ds = par.config.get("deepspeed_config")
    if ds:
        lines.append(f"    DeepSpeed config: {ds!r}")
    if par.config.get("quantization_config"):
        lines.append(f"    quantization_config: {par.config['quantization_config']!r}")
    return lines


# -- the planner's entry point -----------------------------------------------------------------------------
@dataclass(frozen=True)
class Outcome:
    """What the planner takes from the several-GPU decision: the Parallelism, and when it changes what this
    process loads (a model no single process fits, or unquantized TP instead of quantizing for one GPU) the
    fit, placement and memory to plan with instead of the fit ladder's."""

    parallelism: Parallelism | None = None
    fit: Any = None  # quantization.FitResult
    placement: Any = None  # plans.Placement
    memory: Any = None  # plans.MemoryEstimate


#: the strategies a launcher runs as one process per GPU (single and layer_split are one process)
MULTI_PROCESS = tuple(s for s in STRATEGIES if s not in ("single", "layer_split"))


def decide(
    info: Any,
    caps: Capabilities,
    fr: Any,
    nofit: DoesNotFitError | None,
    *,
    strategy: str = "auto",
    lower_latency: bool = False,
    dtype: str,
    intent: str,
    seq_len: int,
    batch_size: int,
    attn: str,
    quantization: str,
    device_map: Any,
    max_memory: Any,
    allow_offload: bool,
    optimizer: str = "auto",
    gradient_checkpointing: bool | None = None,
) -> Outcome:
    """Run :func:`choose_parallelism` with what the fit ladder found (``fr``, or the error ``nofit``).

    ``optimizer`` / ``gradient_checkpointing`` are plan()'s requests; where the fit ladder decided them
    (``fr.optimizer``, ``fr.gradient_checkpointing``), its choices are what the shards are sized for."""
    from ..plans import MemoryEstimate, Placement
    from .placement import Fit
    from .quantization import FitResult, bnb_problems, quantization_config, training_ladder

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
    single_fits: bool | None = None
    split_per_gpu: int | None = None
    if fr is None:
        single_fits = False
    else:
        pl = fr.fit.placement
        one = len(pl.devices) == 1 and pl.devices[0].startswith("cuda") and not pl.offload
        single_fits = one
        if not one and not pl.offload and all(d.startswith("cuda") for d in pl.devices):
            split_per_gpu = max(fr.fit.per_device.values())
    # the optimizer and checkpointing rungs, tried again for N processes: the fit ladder chose them for one
    # process (a layer split spreads the activations over the GPUs, a rank holds its batch's on its own GPU),
    # so its choices may not fit a rank (checkpointing off) or may cost more than needed there
    opts, gcs, _ = training_ladder(
        intent, caps, optimizer=optimizer, gradient_checkpointing=gradient_checkpointing
    )
    kw: dict[str, Any] = dict(
        intent=intent,
        dtype=dtype,
        seq_len=seq_len,
        batch_size=batch_size,
        attn=attn,
        allow_offload=allow_offload,
        facts=model_facts(info),
        strategy=strategy,
        lower_latency=lower_latency,
        nccl=nccl_available(caps),
    )
    override_q = False
    par: Parallelism | None = None
    if (
        intent == "inference"
        and deployment
        and q is not None
        and (quantization or "auto") == "auto"
        and not (fr is not None and fr.decision.explicit)
    ):
        # the ladder quantized to fit one GPU (or one process); N GPUs may hold the model unquantized as TP
        trial = choose_parallelism(info, caps, quantization=None, single_fits=False, **kw)
        if trial is not None and trial.choice in ("tp", "tp_fp8"):
            par, override_q, q = trial, True, None
    opt: str | None = opts[-1]
    gc: bool | None = gcs[-1]
    if par is None:
        # the fit ladder's order: each optimizer with checkpointing off then on, offloading strategies only
        # after every rung (and only when allowed); the last rung's answer (or error) stands when none fits
        rungs = [(o, g, False) for o in opts for g in gcs]
        if allow_offload:
            rungs.append((opts[-1], gcs[-1], True))
        for i, (o, g, off) in enumerate(rungs):
            last = i == len(rungs) - 1
            try:
                par = choose_parallelism(
                    info,
                    caps,
                    quantization=q,
                    single_fits=single_fits,
                    split_per_gpu=split_per_gpu,
                    optimizer=o,
                    gradient_checkpointing=g,
                    offload=off,
                    **kw,
                )
            except DoesNotFitError:
                if last:
                    raise
                continue
            opt, gc = o, g
            if par is None or par.choice is not None:
                break
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
            if par.choice in MULTI_PROCESS:
                # nothing fits this one process, but N processes would: say how to launch them
                raise DoesNotFitError(
                    nofit.message,
                    reasons=nofit.reasons,
                    fix=f"launch one process per GPU ({par.choice}, {(par.per_gpu_bytes() or 0) / GiB:.1f} GiB "
                    f"per GPU): {launch_command(n, world(caps)[1])}; or {nofit.fix}",
                )
            raise nofit
        return Outcome(parallelism=par)

    # this process's part of a multi-process plan, in place of the fit ladder's one-process answer
    bd = breakdown(
        info,
        dtype=dtype,
        quantization=q,
        intent=intent,
        seq_len=seq_len,
        batch_size=batch_size,
        attn=attn,
        optimizer=opt,
        gradient_checkpointing=gc,
    )
    r = (caps.distributed.local_rank or 0) if launched else 0
    rank_gpus = rank_gpus_of(caps)
    dev = f"cuda:{caps.gpus[r].index}" if r < len(caps.gpus) else "cuda:0"
    per = par.per_gpu_bytes() or 0
    if par.choice in ("tp", "tp_fp8"):
        placement = Placement(
            dev,
            (dev,),
            reasons=(
                f"tensor parallel over {n} ranks: each rank loads its 1/{n} shard onto cuda:LOCAL_RANK "
                "(from_pretrained(distributed_config=DistributedConfig(tp_plan='auto')))",
            ),
        )
    elif par.config.get("weights_on_cpu"):
        # loaded on the CPU, not onto cuda:LOCAL_RANK: the Trainer's FSDP2 setup (accelerate 1.x
        # utils/fsdp_utils.py fsdp2_prepare_model, cpu_ram_efficient_loading) moves the model to meta, shards
        # it and broadcasts rank 0's weights into each rank's shard on its GPU
        placement = Placement(
            "cpu",
            ("cpu",),
            reasons=(
                f"{par.choice}: the weights in {dtype} do not fit one GPU whole, so no rank loads them onto its "
                f"GPU ({dev} here): every rank loads them on its CPU, and the Trainer shards the model and sends "
                "each rank its part of rank 0's (fsdp_config cpu_ram_efficient_loading)",
            ),
        )
    else:
        placement = Placement(
            dev,
            (dev,),
            reasons=(
                f"{par.choice} over {n} ranks: each rank loads the weights onto cuda:LOCAL_RANK ({dev} here); "
                "the Trainer shards them and their training state",
            ),
        )
    terms = {k: v for k, v in par.per_gpu[par.choice].items() if k != "total"}
    memory = MemoryEstimate(
        terms=terms,
        total=per * len(rank_gpus),
        per_device={f"cuda:{g.index}": per for g in rank_gpus},
        budget={f"cuda:{g.index}": g.available_memory for g in rank_gpus},
        notes=(*bd.notes, f"per GPU under {par.choice} over {n} GPUs (see parallelism)"),
    )
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
    opt_dec = gc_dec = None
    if intent != "inference":
        opt_dec, gc_dec = _rank_training_decisions(
            par,
            opts,
            gcs,
            opt,
            gc,
            explicit_opt=optimizer != "auto",
            explicit_gc=gradient_checkpointing is not None,
        )
    fit_result = FitResult(
        dec,
        Fit(True, placement, dict(memory.per_device), dict(memory.budget)),
        bd,
        qcfg,
        opt_dec,
        gc_dec,
    )
    return Outcome(parallelism=par, fit=fit_result, placement=placement, memory=memory)


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
    from .memory import OPTIMIZERS

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
