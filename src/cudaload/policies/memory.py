"""Bytes before loading, term by term.

Every constant here is named and says where it comes from. Measured figures are from the H200 machine
(torch 2.11 + cu130, transformers 5.17, bitsandbytes 0.50.2; /work/shared/device/README.md):
Qwen3-8B shape bf16 15.26 GiB allocated = peak; nf4 (double quant, bf16 compute) 5.70 allocated / 5.91
peak; int8 12.18 allocated / 12.61 peak.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .dtype import dtype_bytes

MiB = 1 << 20
GiB = 1 << 30

#: Device memory outside the tensors a model allocates: the CUDA context, cuBLAS/cuDNN handles and
#: workspaces loaded at the first matmul, and the caching allocator's reserved-but-free slack. Measured on the
#: H200 (torch 2.11 + cu130) as device memory used at a forward's peak minus the allocator's allocated peak:
#: 0.63-0.76 GiB across Qwen3 0.6B/8B in bf16 and nf4 (benchmarks/results/2026-11-29-h200/results.md).
CUDA_CONTEXT_BYTES = 700 * MiB

#: nf4: 4 bits per weight, one absmax per 64-weight block. With double quantisation the absmax is itself
#: an 8-bit value (1 byte / 64 weights) plus an fp32 scale per 256 blocks; without, an fp32 absmax per block.
NF4_BYTES_PER_PARAM = 0.5
NF4_ABSMAX_DOUBLE_QUANT = 1 / 64 + 4 / (64 * 256)
NF4_ABSMAX_PLAIN = 4 / 64

#: int8 (LLM.int8, bitsandbytes 0.50.2) as measured on the H200 with cudaload's BitsAndBytesConfig: the
#: Qwen3-8B shape allocated 8.79 GiB after loading = 6.95 G quantised parameters at ~1.0 byte (int8 weight;
#: the fp32 row scales are ~0.1%) + 1.24 G bf16 embedding/head parameters; the 0.6B shape 744 MiB (1.07).
#: (shared/device/README.md quotes 12.18 GiB for an int8 8B load made outside cudaload; we plan with what
#: cudaload's own loads allocated, measured in the same run as the other terms.)
INT8_BYTES_PER_PARAM = 1.02

#: LoRA defaults cudaload plans with (LoraConfig kwargs in the plan)
LORA_R = 16
LORA_ALPHA = 32
LORA_DROPOUT = 0.05


@dataclass(frozen=True)
class Breakdown:
    """Memory terms plus how they split: ``layer_bytes`` per decoder layer (weights + KV + training state),
    ``first_bytes`` / ``last_bytes`` what sits with the embedding / output head, ``every_device`` what each
    device needs regardless of its share (activations of the layer it runs, transient buffers)."""

    terms: dict[str, int]
    layers: int
    layer_bytes: int
    first_bytes: int
    last_bytes: int
    every_device: int
    layer_weight_bytes: int = 0
    notes: tuple[str, ...] = ()

    @property
    def model_bytes(self) -> int:
        return self.layers * self.layer_bytes + self.first_bytes + self.last_bytes


def weight_bytes(
    info: Any, dtype: str, quantization: str | None, *, double_quant: bool = True
) -> tuple[int, int, int]:
    """(total, embedding-side, head-side) bytes of the weights in ``dtype`` under ``quantization``."""
    c = info.counts
    b = dtype_bytes(dtype)
    if c.total == 0:  # no class to count (remote code): the stored size scaled to dtype
        ck = info.summary.checkpoint_dtype or "float32"
        tot = info.summary.weights_bytes * b // max(dtype_bytes(ck), 1) if info.summary.weights_bytes else 0
        return tot, 0, 0
    emb = (c.embedding + c.other) * b
    head = c.head * b
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
    return lin + emb + head, emb, head


def adapter_params(info: Any, r: int = LORA_R) -> int:
    """LoRA on every linear layer but the output head: r * (in + out) per wrapped module."""
    return int(r * info.counts.linear_in_out)


def kv_cache_bytes(info: Any, dtype: str, seq_len: int, batch_size: int) -> int:
    s = info.summary
    if not info.can_generate or s.is_encoder:
        return 0
    window = s.sliding_window or seq_len
    full = s.layers - info.sliding_layers
    tokens = full * seq_len + info.sliding_layers * min(seq_len, window)
    return int(2 * batch_size * s.num_kv_heads * s.head_dim * tokens * dtype_bytes(dtype))


def breakdown(
    info: Any,
    *,
    dtype: str,
    quantization: str | None,
    intent: str,
    seq_len: int,
    batch_size: int,
    attn: str = "sdpa",
) -> Breakdown:
    """All memory terms for one configuration, and how they distribute over a layer split."""
    s = info.summary
    b = dtype_bytes(dtype)
    L = max(s.layers, 1)
    terms: dict[str, int] = {}
    notes: list[str] = []
    wtot, wemb, whead = weight_bytes(info, dtype, quantization)
    terms["weights"] = wtot
    wlayer = max(wtot - wemb - whead, 0) // L
    if quantization:
        # bitsandbytes quantises while loading: one layer's linear weights pass through in the compute dtype
        terms["quantization_transient"] = info.counts.linear * b // L
        notes.append(
            f"weights: {quantization} for {info.counts.linear:,} linear parameters; embeddings, norms "
            f"and the output head stay in {dtype}"
        )
    training = intent != "inference"
    kv = 0 if training else kv_cache_bytes(info, dtype, seq_len, batch_size)
    terms["kv_cache"] = kv
    if kv and info.sliding_layers:
        notes.append(
            f"kv_cache: {info.sliding_layers} sliding-window layers capped at {s.sliding_window} tokens"
        )
    hidden, inter = s.hidden_size, info.intermediate_size or 4 * s.hidden_size
    tokens = batch_size * seq_len
    if not training:
        # one layer's working set during prefill, plus last-token logits in fp32 (generate keeps only those)
        act = tokens * (4 * hidden + 2 * inter) * b + batch_size * s.vocab_size * 4
        if attn == "eager":
            act += batch_size * s.num_heads * seq_len * seq_len * (b + 4)  # scores + fp32 softmax
            notes.append("activations: eager attention materialises seq_len^2 scores per head")
        terms["activations"] = act
    else:
        # gradient checkpointing (cudaload's training arguments turn it on): each layer keeps its input,
        # one layer is recomputed at a time, and the logits exist in the dtype, fp32 and as a gradient
        ckpt = L * tokens * hidden * b
        work = tokens * (8 * hidden + 4 * inter) * b
        logits = tokens * s.vocab_size * (b + 4 + 4) if info.can_generate else 0
        terms["activations"] = ckpt + work + logits
        notes.append("activations: gradient checkpointing assumed (layer inputs kept, one layer recomputed)")
    grads = opt = master = adapters = 0
    n = info.counts.total or s.params
    if intent == "training":
        grads = n * b
        opt = n * 8  # AdamW: exp_avg and exp_avg_sq in fp32
        if b < 4:
            master = n * 4
            notes.append(
                "training: fp32 master weights and AdamW states (mixed precision), 16 bytes/param with bf16"
            )
    elif intent in ("lora", "qlora"):
        ap = adapter_params(info)
        adapters = ap * 4  # PEFT keeps adapter weights in fp32 (autocast_adapter_dtype)
        grads = ap * 4
        opt = ap * 8
        notes.append(
            f"{intent}: r={LORA_R} adapters on {info.counts.linear_modules} linear modules "
            f"({ap:,} trainable parameters, fp32), base frozen"
        )
    terms["gradients"] = grads
    terms["optimizer"] = opt
    terms["master_weights"] = master
    terms["adapters"] = adapters
    frac = wlayer / wtot if wtot else 1 / L
    per_layer_train = (
        int((grads + opt + master + adapters) * frac)
        if intent == "training"
        else ((grads + opt + adapters) // L)
    )
    layer_bytes = wlayer + kv // L + per_layer_train
    train_first = int((grads + opt + master) * (wemb / wtot)) if intent == "training" and wtot else 0
    train_last = int((grads + opt + master) * (whead / wtot)) if intent == "training" and wtot else 0
    every = terms["activations"] + terms.get("quantization_transient", 0)
    # rounding residue goes with the first device so the split sums to the total
    layered = layer_bytes * L
    model_total = wtot + kv + grads + opt + master + adapters
    first = wemb + train_first
    last = whead + train_last
    first += max(model_total - layered - first - last, 0)
    return Breakdown(
        terms=terms,
        layers=L,
        layer_bytes=layer_bytes,
        first_bytes=first,
        last_bytes=last,
        every_device=every,
        layer_weight_bytes=wlayer,
        notes=tuple(notes),
    )


def estimate(
    info: Any,
    *,
    dtype: str,
    quantization: str | None,
    intent: str,
    seq_len: int,
    batch_size: int,
    attn: str = "sdpa",
    devices: int = 1,
) -> dict[str, int]:
    """The terms for ``devices`` GPUs (each with a CUDA context and its own activations), with ``total``."""
    bd = breakdown(
        info,
        dtype=dtype,
        quantization=quantization,
        intent=intent,
        seq_len=seq_len,
        batch_size=batch_size,
        attn=attn,
    )
    terms = gpu_terms(bd, devices)
    terms["total"] = sum(terms.values())
    return terms


def gpu_terms(bd: Breakdown, devices: int) -> dict[str, int]:
    """``bd``'s terms for a model spread over ``devices`` GPUs: every device runs its layers' working set
    (activations) and holds a CUDA context; the model's own bytes are split, not repeated."""
    terms = dict(bd.terms)
    terms["activations"] *= max(devices, 1)
    terms["cuda_context"] = CUDA_CONTEXT_BYTES * devices
    return terms
