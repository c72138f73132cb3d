"""Where FSDP2 ranks load the weights when they fit no GPU whole: each rank reading only its own shards
(cudaload.fastload.sharded), or the whole model on every rank's CPU while the Trainer shards it, and the host
memory either needs."""

from __future__ import annotations

from typing import Any

from ...capabilities import Capabilities
from ...dtypes import dtype_bytes
from ...model_info import ModelInfo
from .per_gpu import _gib


def _staged_host_bytes(info: ModelInfo, terms: dict[str, int], intent: str, local: int) -> int:
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
    info: ModelInfo, chosen: str, *, intent: str, dtype: str, quantization: str | None
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


def _weights_on_cpu(
    config: dict[str, Any],
    reasons: list[str],
    notes: list[str],
    info: ModelInfo,
    caps: Capabilities,
    t: dict[str, int],
    *,
    chosen: str,
    n: int,
    local: int,
    launched: bool,
    intent: str,
    dtype: str,
    quantization: str | None,
) -> None:
    """FSDP2 whose weights (``t``, the breakdown's terms) fit no GPU whole: the ranks load on their CPUs, or
    each reads only its own shards when the sharded loader can; adds the settings to ``config`` and what the
    host holds to ``reasons`` / ``notes``."""
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
