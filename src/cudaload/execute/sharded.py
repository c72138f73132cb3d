"""An FSDP rank's load: the weights on its CPU when they fit no GPU whole, or only its own shards (FSDP2)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from .. import _env
from ..plans.plan import Placement, Plan
from .adapters import lora_config
from .from_pretrained import BUILD_LOCK, _torch_dtype


def fsdp_weights_on_cpu(plan: Plan) -> bool:
    par = plan.parallelism
    return bool(par is not None and par.launched and par.config.get("weights_on_cpu"))


#: Why an FSDP rank whose weights fit no GPU whole loads them plainly on its CPU, not through transformers' own
#: FSDP loading (is_fsdp_enabled: a process group plus ACCELERATE_USE_FSDP and FSDP_CPU_RAM_EFFICIENT_LOADING,
#: 5.17 distributed/fsdp.py:41-47). That path reads the checkpoint on every rank too and in 5.17-5.22 then
#: writes zeros over it on all but each node's local rank 0 (modeling_utils.py:4718-4724): no host memory saved
#: (zeros_like writes its pages), and a Trainer built without cpu_ram_efficient_loading would shard those zeros
#: and train them without a word. From 5.23 it keeps the weights on every rank, as this does on every version.
STAGED_NOTE = (
    "FSDP: the weights fit no GPU whole, so this rank loaded them on its CPU (every rank holds them); the Trainer "
    "shards the model onto the GPUs, and with training_arguments(plan)'s cpu_ram_efficient_loading accelerate "
    "sends each rank its part of rank 0's weights"
)


def fsdp_sharded(plan: Plan) -> bool:
    """The plan's FSDP2 ranks each read only their own shards (cudaload.fastload.sharded.load_fsdp2)."""
    par = plan.parallelism
    return bool(
        fsdp_weights_on_cpu(plan)
        and par
        and par.config.get("sharded_load")
        and plan.load_path.choice == "fast"
    )


def load_sharded(plan: Plan, auto_class: str, passthrough: Mapping[str, Any], notes: list[str]) -> Any:
    """load_fsdp2 as the Trainer's FSDP2 set-up would have left the model: under bf16, float32 master
    parameters (accelerate 1.15 utils/fsdp_utils.py:815-820 upcasts the trainable ones) computed in bf16
    (the MixedPrecisionPolicy accelerate builds from mixed_precision, utils/dataclasses.py:2135-2143), because
    fsdp2_prepare_model hands an FSDPModule back untouched (utils/fsdp_utils.py:763-767). For intent "lora" the
    PeftModel is built before sharding and is the FSDPModule: a frozen base in the plan's dtype, float32 LoRA
    weights computed in bf16 (FSDP2 wants one original dtype among a unit's trainable parameters only, torch
    2.13 _fully_shard/_fsdp_param_group.py:276-286; with param_dtype set every all-gather input is cast to it,
    and an all-gather of mixed input dtypes goes as bytes, _fsdp_collectives.py:789-800). What it did is
    appended to ``notes`` (also when the load then steps aside)."""
    import torch
    import torch.distributed as dist

    from ..fastload import StepAside

    cuda = torch.cuda.is_available()
    local = _env.launch().local_rank or 0  # checked when the request was built (_env.check_all)
    if cuda:
        torch.cuda.set_device(local)
    created = not dist.is_initialized()
    if created:
        backend = "nccl" if cuda else "gloo"
        # env://: torchrun's RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT. device_id binds NCCL to this rank's GPU:
        # the communicator is formed now (a broken NCCL set-up fails here, not in the first collective) and
        # barriers know their device (torch 2.13 distributed_c10d.py:1741-1750, :5311-5332)
        device_id = torch.device("cuda", local) if cuda else None
        dist.init_process_group(backend, device_id=device_id)
        notes.append(f"initialised the default process group ({backend}) from torchrun's environment")
    try:
        return _load_fsdp2_for_plan(plan, auto_class, passthrough, notes, local, cuda)
    except StepAside:
        raise  # every rank steps aside alike (load_fsdp2's votes): the whole-model load still needs the group
    except BaseException:
        # every rank fails alike (load_fsdp2's votes): a group started here is not left behind for a caller that
        # catches the error (torch warns at exit about a group never destroyed)
        if created and dist.is_initialized():
            dist.destroy_process_group()
        raise


def _load_fsdp2_for_plan(
    plan: Plan, auto_class: str, passthrough: Mapping[str, Any], notes: list[str], local: int, cuda: bool
) -> Any:
    import torch
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy

    from ..fastload.sharded import load_fsdp2
    from .adapters import get_peft_model_checked

    want = plan.dtype.choice or "float32"
    # LoRA: the frozen base stays in the plan's dtype (what load_model's whole-model path loads and accelerate
    # leaves alone: it upcasts trainable parameters only, 1.15 utils/fsdp_utils.py:816-820), the adapters are
    # float32 (peft's autocast_adapter_dtype). A full fine-tune: float32 masters, as accelerate's upcast gives.
    lora = plan.intent == "lora"
    peft_config = lora_config(plan) if lora else None
    policy = None
    if want != "float32":
        bf = _torch_dtype(want)
        policy = MixedPrecisionPolicy(param_dtype=bf, reduce_dtype=bf, output_dtype=bf)
    # fsdp2_offload: fsdp_config cpu_offload, which accelerate turns into CPUOffloadPolicy() (1.15
    # utils/dataclasses.py:2184-2189); pinning needs CUDA
    par = plan.parallelism
    offload = CPUOffloadPolicy(pin_memory=cuda) if par is not None and par.choice == "fsdp2_offload" else None
    fsdp_config = dict((par.config.get("training_arguments") or {}).get("fsdp_config") or {}) if par else {}
    path = plan.model.local_path or plan.model.name
    with BUILD_LOCK:
        model = load_fsdp2(
            path,
            dtype=_torch_dtype(want) if lora else torch.float32,
            auto_class=auto_class,
            device=f"cuda:{local}" if cuda else "cpu",
            mp_policy=policy,
            offload_policy=offload,
            # what fsdp_config asks accelerate for; training_arguments(plan) then leaves it out
            activation_checkpointing=bool(fsdp_config.get("activation_checkpointing")),
            peft_config=peft_config,
            wrap_peft=get_peft_model_checked,
            attn_implementation=plan.attention.choice,
            **passthrough,
        )
    info = model.cudaload_fastload
    notes.append(
        f"FSDP2: this rank read {info['bytes'] / 1e9:.3f} of {info['checkpoint_bytes'] / 1e9:.3f} GB (its rows of "
        f"each weight, 1/{info['sharded']['world']}) onto {info['device']}; "
        + (
            f"LoRA ({info['sharded']['lora_tensors']} float32 adapter tensors, peft's initialisation, rank 0's "
            f"draw) on the frozen {want} base, wrapped by peft before sharding"
            if lora
            else "float32 master parameters"
        )
        + (f", computed in {want} (MixedPrecisionPolicy)" if policy is not None else "")
        + ("; the shards stay in host memory (CPUOffloadPolicy)" if offload is not None else "")
    )
    return model


def placed_shards(plan: Plan, loaded: Any) -> Plan:
    """The plan placed the weights on the CPU for the whole-model fallback; after a sharded load they are this
    rank's shards, on its device (or in host memory under fsdp2_offload)."""
    dev = str(loaded.cudaload_fastload["device"])
    offloaded = plan.parallelism is not None and plan.parallelism.choice == "fsdp2_offload"
    where = f"in host memory (computed on {dev})" if offloaded and dev != "cpu" else f"on {dev}"
    return replace(
        plan,
        placement=Placement(
            dev,
            tuple(dict.fromkeys((dev, "cpu") if offloaded else (dev,))),
            offload=offloaded,
            reasons=(f"FSDP2: this rank's shards of every weight {where} (cudaload.fastload.sharded)",),
        ),
    )
