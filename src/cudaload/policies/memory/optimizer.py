"""Training's optimizer: which one is planned when none is named, whether it keeps fp32 master weights, and
the bytes of its states (on the GPU, or on the host for paged states)."""

from __future__ import annotations

from ...dtypes import dtype_bytes
from ...model_info import ModelInfo
from .constants import ADAM8BIT_BYTES_PER_PARAM


def default_optimizer(intent: str, on_gpu: bool = True) -> str | None:
    """What cudaload plans when nothing else is decided: Trainer's default (adamw_torch_fused on torch >= 2.8,
    transformers 5.17 training_args.py:804-809), for QLoRA too: the QLoRA paper's paged 8-bit AdamW saves
    states, and an adapter's states are a few hundred MiB (8B, r=16: 0.33 GiB), not worth a slower step."""
    if intent == "inference":
        return None
    return "adamw_torch_fused" if on_gpu else "adamw_torch"


def master_weights(intent: str, optimizer: str | None, dtype: str) -> bool:
    """Full fine-tuning with torch AdamW keeps fp32 master weights under a half-precision compute dtype (mixed
    precision); the memory-saving optimizers are planned on half-precision weights, as people fit full
    fine-tunes with them."""
    return (
        intent == "training" and optimizer in ("adamw_torch_fused", "adamw_torch") and dtype_bytes(dtype) < 4
    )


def optimizer_state_bytes(
    info: ModelInfo, optimizer: str | None, trainable: int, param_bytes: int
) -> tuple[int, int]:
    """(GPU bytes, host bytes) of the optimizer's states for ``trainable`` parameters of ``param_bytes`` each."""
    if optimizer in ("adamw_torch_fused", "adamw_torch", None):
        return 2 * param_bytes * trainable, 0  # exp_avg, exp_avg_sq: zeros_like(param)
    if optimizer == "adamw_8bit":
        return int(ADAM8BIT_BYTES_PER_PARAM * trainable), 0
    if optimizer == "paged_adamw_8bit":
        # CUDA managed memory: on the GPU while there is room, evicted to the host under pressure
        return 0, int(ADAM8BIT_BYTES_PER_PARAM * trainable)
    if optimizer == "adafactor":
        # factored second moments: one fp32 row and one fp32 column vector per matrix (beta1=None: no exp_avg)
        s = info.summary
        mats = info.counts.linear_in_out + (s.vocab_size + s.hidden_size) * (1 + (info.counts.head > 0))
        return 4 * int(mats), 0
    if optimizer == "sgd":
        return 0, 0  # Trainer's optim="sgd": no momentum (4 bytes/param with momentum)
    raise ValueError(f"unknown optimizer {optimizer!r}")


def _largest_param(info: ModelInfo) -> int:
    s = info.summary
    inter = info.intermediate_size or 4 * s.hidden_size
    return int(max(s.vocab_size * s.hidden_size, inter * s.hidden_size, 1))
