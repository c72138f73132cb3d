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

``choose_for`` is pure: the configuration as one :class:`cudaload.policies.memory.MemoryShape`, what was asked as
a :class:`ParallelAsk`, what the fit ladder found as a :class:`LadderFit` (``choose_parallelism`` takes the same
as keywords). The model's parallel facts (:class:`ParallelFacts`, read from the config and
model classes by :func:`model_facts`) and whether NCCL is available come in as data. The per-GPU terms reuse
:func:`cudaload.policies.memory.breakdown` (weights, gradients, optimizer, master weights, adapters,
activations, KV cache); only what sharding changes is computed here.

The modules, each using only those listed before it:

- ``topology``: the strategies, the model's parallel facts, torchrun's world and the GPUs its ranks run on,
  and the checks on bad distributed input;
- ``per_gpu``: the per-GPU memory model of every strategy, term by term;
- ``sharded_load``: where FSDP2 ranks load weights that fit no GPU whole, and the host memory that needs;
- ``launch``: the torchrun command and the TrainingArguments / from_pretrained / DeepSpeed settings;
- ``choose``: :func:`choose_for` / :func:`choose_parallelism`, the choice among them with every candidate and the reasons;
- ``planning``: :func:`decide`, the planner's entry point (this process's part of a multi-process plan).
"""

from __future__ import annotations

from .choose import LadderFit, ParallelAsk, choose_for, choose_parallelism
from .launch import launch_command, merge_training_arguments, parallel_training_arguments
from .per_gpu import (
    DDP_BUCKET_COPIES,
    FP8_BYTES_PER_PARAM,
    FP8_CONFIG,
    NCCL_BYTES,
    REPLICA_HEADROOM,
    bd_optimizer,
    check_rank_memory,
    gc_on,
)
from .planning import MULTI_PROCESS, Outcome, decide
from .sharded_load import SHARDED_REASON, SHARDED_STAGING_BYTES, SHARDED_STEPPED_ASIDE, sharded_load_blockers
from .topology import (
    REQUESTS,
    STRATEGIES,
    ParallelFacts,
    RequestedParallelism,
    model_facts,
    nccl_available,
    rank_gpus_of,
    world,
)

__all__ = [
    "DDP_BUCKET_COPIES",
    "FP8_BYTES_PER_PARAM",
    "FP8_CONFIG",
    "MULTI_PROCESS",
    "NCCL_BYTES",
    "REPLICA_HEADROOM",
    "REQUESTS",
    "SHARDED_REASON",
    "SHARDED_STAGING_BYTES",
    "SHARDED_STEPPED_ASIDE",
    "STRATEGIES",
    "LadderFit",
    "Outcome",
    "ParallelAsk",
    "ParallelFacts",
    "RequestedParallelism",
    "bd_optimizer",
    "check_rank_memory",
    "choose_for",
    "choose_parallelism",
    "decide",
    "gc_on",
    "launch_command",
    "merge_training_arguments",
    "model_facts",
    "nccl_available",
    "parallel_training_arguments",
    "rank_gpus_of",
    "sharded_load_blockers",
    "world",
]
