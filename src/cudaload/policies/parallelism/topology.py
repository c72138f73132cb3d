"""Who runs where: the strategies, the model's parallel facts, torchrun's world and the GPUs its ranks run on,
and the checks that reject bad distributed input before any weights move."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from ...capabilities import Capabilities
from ...errors import ConfigurationError, DependencyError, DeviceSelectionError
from ...model_info import ModelInfo, ModelSummary
from ..memory import GiB

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
#: ``parallelism=`` as the request hands it on (cudaload.request checks it is one of :data:`REQUESTS`)
RequestedParallelism = Literal["auto", "single", "ddp", "fsdp2", "deepspeed", "tp", "layer_split"]


@dataclass(frozen=True)
class ParallelFacts:
    """What sharding needs to know about the model class (plain data, so policies and tests stay pure)."""

    decoder_layer_class: str | None = None  # the unit FSDP wraps (the model class's _no_split_modules)
    tp_plan: tuple[str, ...] = ()  # keys of the config's base_model_tp_plan (empty: no tensor parallelism)
    head_tp: bool = False  # the model class's _tp_plan shards the output head too
    experts_tp: bool = False  # the plan shards MoE experts (their 3-D weights are split too)


def model_facts(info: ModelInfo) -> ParallelFacts:
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


def _divisors_of_both(a: int, b: int, limit: int) -> list[int]:
    return [k for k in range(1, limit + 1) if a % k == 0 and b % k == 0]


def _raise_heads(s: ModelSummary, n: int, caps: Capabilities) -> None:
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
