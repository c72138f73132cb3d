"""The weights' bytes: where each parameter lives (decoder layer, embedding side, output head) and what it
takes in the load dtype or under int8 / nf4; the LoRA adapters' parameter count."""

from __future__ import annotations

from dataclasses import dataclass

from ...dtypes import dtype_bytes
from ...model_info import ModelInfo
from .constants import (
    INT8_BYTES_PER_PARAM,
    LORA_R,
    NF4_ABSMAX_DOUBLE_QUANT,
    NF4_ABSMAX_PLAIN,
    NF4_BYTES_PER_PARAM,
)


@dataclass(frozen=True)
class Split:
    """Parameters by where a device_map puts them: per decoder layer (linear / the rest: norms and fused
    3-D expert tensors) and outside the layers (embedding side, output head)."""

    layer_linear: float
    layer_other: float
    outside_other: int
    embedding: int
    head: int


def param_split(info: ModelInfo) -> Split:
    """Where each parameter lives. ``counts.per_layer`` is exact (one- and two-layer builds); every
    ``nn.Linear`` but the head is taken to sit in a decoder layer, so the rest of a layer -- norms, and the
    fused 3-D expert tensors of transformers 5 MoE models (MixtralExperts.gate_up_proj / down_proj,
    modeling_mixtral.py:65-66 in 5.17) -- is ``per_layer`` minus its linear share. Before this split those
    expert bytes were counted with the embedding and all landed on the first GPU."""
    c = info.counts
    L = max(info.summary.layers, 1)
    lin = c.linear / L
    other = max(c.per_layer - lin, 0.0) if c.per_layer else 0.0
    outside = max(c.other - int(other * L), 0)
    return Split(lin, other, outside, c.embedding, c.head)


def weight_bytes(
    info: ModelInfo,
    dtype: str,
    quantization: str | None,
    *,
    double_quant: bool = True,
    other_bytes: int | None = None,
) -> tuple[int, int, int]:
    """(total, embedding-side, head-side) bytes of the weights in ``dtype`` under ``quantization``.
    ``other_bytes``: bytes per parameter of what is not quantized (fp32 after prepare_model_for_kbit_training)."""
    c = info.counts
    b = dtype_bytes(dtype)
    ob = other_bytes or b
    if c.total == 0:  # no class to count (remote code): the stored size scaled to dtype
        ck = info.summary.checkpoint_dtype or "float32"
        tot = info.summary.weights_bytes * b // max(dtype_bytes(ck), 1) if info.summary.weights_bytes else 0
        return tot, 0, 0
    sp = param_split(info)
    emb = (c.embedding + sp.outside_other) * ob
    head = c.head * ob
    layered_other = (c.other - sp.outside_other) * ob
    if quantization == "nf4":
        per = NF4_BYTES_PER_PARAM + (NF4_ABSMAX_DOUBLE_QUANT if double_quant else NF4_ABSMAX_PLAIN)
        lin = int(c.linear * per)
    elif quantization == "int8":
        lin = int(c.linear * INT8_BYTES_PER_PARAM)
    else:
        lin = c.linear * b
        s = info.summary
        if s.weights_source == "safetensors" and s.weights_bytes and s.checkpoint_dtype:
            # the headers are the truth for what is stored; rescale to the load dtype
            stored = s.weights_bytes * b // max(dtype_bytes(s.checkpoint_dtype), 1)
            return stored, emb, head
    return lin + layered_other + emb + head, emb, head


def adapter_params(info: ModelInfo, r: int = LORA_R) -> int:
    """LoRA on every linear layer but the output head: r * (in + out) per wrapped module."""
    return int(r * info.counts.linear_in_out)
