"""How the chosen strategy runs: the torchrun command, and the TrainingArguments / from_pretrained keywords and
DeepSpeed config it needs. The parallelism section of ``Plan.explain()`` is
:meth:`cudaload.plans.Parallelism.explain_lines`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ...model_info import ModelInfo
from ...plans.plan import Plan
from .per_gpu import FP8_CONFIG, gc_on
from .topology import ParallelFacts


def launch_command(n: int, local: int, script: str = "your_script.py") -> str:
    if n > local:
        nodes = -(-n // local)
        return (
            f"torchrun --nnodes {nodes} --nproc_per_node {local} --rdzv_backend c10d "
            f"--rdzv_endpoint HOST:29500 {script}"
        )
    return f"torchrun --nproc_per_node {n} {script}"


def _settings(
    chosen: str,
    info: ModelInfo,
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
