"""Bytes before loading, term by term.

Every constant here is named and says where it comes from. Measured figures are from the H200 machine
(torch 2.11 + cu130, transformers 5.17, bitsandbytes 0.50.2; /work/shared/device/README.md):
Qwen3-8B shape bf16 15.26 GiB allocated = peak; nf4 (double quant, bf16 compute) 5.70 allocated / 5.91
peak; int8 12.18 allocated / 12.61 peak.
"""

from __future__ import annotations

import dataclasses
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

#: 8-bit optimizer states (bitsandbytes 0.50.2 Optimizer2State, optim_bits=8): exp_avg and exp_avg_sq as uint8
#: plus one fp32 absmax per 256-value block for each (blockwise quantization; bitsandbytes/optim/optimizer.py).
#: Parameters under 4096 elements keep 32-bit states (min_8bit_size): norms, negligible.
ADAM8BIT_BYTES_PER_PARAM = 2 + 2 * 4 / 256

#: The loss over the full vocabulary, per logit, as transformers 5.17 computes it (loss/loss_utils.py:59
#: ``logits = logits.float()``, then cross_entropy): the logits in the head's dtype, their fp32 copy, the
#: fp32 log-softmax that cross_entropy saves, and in backward its fp32 gradient; the forward and the backward
#: phases each hold about three of these (bf16 head: 2 + 4 + 4 forward, 4 + 4 + 4 backward): 12 bytes.
LOSS_BYTES_PER_LOGIT = 12

#: The caching allocator's reserved-but-unusable bytes at a training step's peak, per logit of the step (batch
#: x seq_len x vocab). The loss's fp32 logit tensors are the step's largest allocations; once freed, their
#: segments are split for the backward's smaller tensors and cannot be returned while any part is in use.
#: Measured on the H200 on emulated 24/48/80 GiB cards (the allocator capped with
#: set_per_process_memory_fraction, so it frees cached segments before it fails): at the longest seq_len that
#: trained, reserved minus allocated was 2.3 / 2.4 / 1.5 bytes per logit for 8B QLoRA (run1-memtrain) and
#: 2.8 / 1.0 / 1.5 for 0.6B full fine-tuning with fused AdamW (run7-memtrain2); the shortest that failed did so
#: on a block the fragmented cache could not give. Fitted to those six boundaries with the other terms as they
#: are: 2.25 plans them at 1.00 / 1.00 / 0.98 and 1.00 / 0.90 / 0.94 of the measured longest and never past it
#: (3.0 planned the 0.6B 48 GiB card at 0.86; 2.0 planned its 24 GiB card 3% past the boundary, at a length
#: that failed). See benchmarks/compare_memory_train.py.
ALLOCATOR_SLACK_PER_LOGIT = 2.25

#: Eager attention materialises per layer and head a seq_len x seq_len score matrix. Inference: the scores,
#: the masked scores, the fp32 softmax and its copy in the dtype (the H200 measured 28.4 vs 19.2 GiB for
#: eager vs sdpa at batch 8 x 2048 on the Qwen3-8B shape: 9.2 bytes per element; 3 x 2 + 4 = 10 planned).
#: Training keeps the fp32 softmax and the dtype copy of every layer for backward (6 bytes per element
#: with bf16), and the layer being differentiated needs its gradients (2 + 4 + 4 + 2 bytes).
EAGER_SAVED_FP32 = 4
EAGER_BACKWARD_BYTES = 12

#: torch's sdpa has no fused kernel for fp32 q/k/v with grouped kv heads (enable_gqa, which transformers'
#: sdpa_attention passes when there is no mask, use_gqa_in_sdpa): flash and cuDNN attention take only fp16/bf16
#: (aten/src/ATen/native/transformers/cuda/sdp_utils.cpp, check_dtypes_low_precision), and the memory-efficient
#: kernel is listed there with check_batch_size_and_num_heads_dense<false /*supports_grouped_query_attention*/>
#: (the torch 2.x source; a later release may admit GQA there: the measurement below, not that source, is what
#: this term rests on), so sdpa falls back to its math path, which materialises the scores like eager
#: attention. QLoRA runs exactly that: prepare_model_for_kbit_training's fp32 norms make the residual stream fp32
#: and bitsandbytes' Linear4bit returns its input's dtype (bitsandbytes 0.50.2 nn/modules.py:626,637). Measured
#: on the H200 (benchmarks/results/2026-12-01-h200/run1-memtrain/results.json), Qwen3-8B QLoRA, checkpointing on,
#: sdpa: the peak grows by 16.08 bytes per head and score of the one layer recomputed (least squares over ten
#: points of 3328-11264 tokens, see ATTENTION_BACKWARD_ACTS): the fp32 softmax kept (4) and in backward three
#: fp32 score-sized tensors at once (the probabilities' gradient, the scores' gradient and the math path's
#: own temporary: 12); without checkpointing the fit over batch 1 x 512 / 2048 and 4 x 512 gives 4.0 bytes per
#: score and layer kept (the softmax), as EAGER_SAVED_FP32 says.
#: bf16 LoRA at 8192 x 1 and 2048 x 4 peaked the same (32.10 / 32.09 GiB): flash attention, no such term.
FP32_SCORES_BACKWARD_BYTES = 12
#: The attention's backward with materialised scores: q/k/v, the rotated q/k and the output (3q + 3kv in the
#: activations' dtype) and as many gradients; the MLP's saved tensors are already freed then. The same run's
#: ten QLoRA points of 3328-11264 tokens (checkpointing on, batch 1; 76.8 GiB at 11264) fit, above the
#: checkpointed inputs, 107 KiB per token and 16.08 bytes per head and score (residuals under 0.03 GiB):
#: 120 KiB and 4 + 12 bytes here.
ATTENTION_BACKWARD_ACTS = 2


def sdpa_math(info: Any, act_bytes: int) -> bool:
    """Whether torch's sdpa runs its score-materialising math path for activations of ``act_bytes``."""
    s = info.summary
    return act_bytes >= 4 and 0 < s.num_kv_heads < s.num_heads


#: Adafactor (transformers 5.17 optimization.py:1221-1276) steps each parameter with fp32 temporaries: the
#: gradient in fp32 (1220-1221), the parameter in fp32 for bf16 weights (1252-1254), and ``update = (grad**2)
#: + eps`` (1261), where ``grad**2`` and the sum are alive together (the later ``update`` reassignments hold
#: two at once too): four fp32 copies of the largest parameter (the embedding or output head) at the step's
#: peak. Measured on the H200 (benchmarks/results/2026-12-01-h200/run7-memtrain2): the step added 9.29 GiB
#: above weights + gradients for the Qwen3-8B shape (4.0 x its 2.32 GiB fp32 embedding) and 2.44 GiB for the
#: 0.6B shape (4.2 x 0.58 GiB).
ADAFACTOR_STEP_FP32_COPIES = 4

#: Tied input embedding and output head, every parameter trained: the head's gradient is the tied weight's
#: ``.grad`` from the start of backward, and the embedding's dense gradient (vocab x hidden) arrives at its
#: end, when every other gradient exists, and is accumulated into it. Measured on the H200 (run7-memtrain2,
#: Qwen3-0.6B shape, tied, 512 tokens, where this phase is the peak): with bf16 weights sgd, paged 8-bit AdamW
#: and 8-bit AdamW peaked 0.66-0.70 GiB above weights + gradients + optimizer states + one layer, with fp32
#: master weights (fused AdamW) 0.58 GiB: about one fp32 vocab x hidden matrix (0.58 GiB) whatever the
#: weights' dtype, plus transients already counted. The untied Qwen3-8B shape peaked at exactly weights +
#: gradients (sgd: 30.58 = 15.32 + 15.26 GiB): no such term. Bytes per vocab x hidden element.
TIED_GRAD_EXTRA_BYTES = 4

#: Optimizers cudaload plans with, in transformers' TrainingArguments(optim=...) vocabulary.
OPTIMIZERS = ("adamw_torch_fused", "adamw_torch", "adamw_8bit", "paged_adamw_8bit", "adafactor", "sgd")
#: Those that need bitsandbytes.
BNB_OPTIMIZERS = ("adamw_8bit", "paged_adamw_8bit")

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
    #: bytes kept outside the GPU (paged optimizer states in CUDA managed memory evicted to the host)
    host_bytes: int = 0
    #: activations kept per decoder layer (checkpointed inputs, or every saved tensor without checkpointing):
    #: they live with the layer's device in a split; the rest of ``terms["activations"]`` is every device's
    layer_activation_bytes: int = 0

    @property
    def model_bytes(self) -> int:
        return self.layers * self.layer_bytes + self.first_bytes + self.last_bytes


@dataclass(frozen=True)
class Split:
    """Parameters by where a device_map puts them: per decoder layer (linear / the rest: norms and fused
    3-D expert tensors) and outside the layers (embedding side, output head)."""

    layer_linear: float
    layer_other: float
    outside_other: int
    embedding: int
    head: int


def param_split(info: Any) -> Split:
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
    info: Any,
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


def default_optimizer(intent: str, on_gpu: bool = True) -> str | None:
    """What cudaload plans when nothing else is decided: Trainer's default (adamw_torch_fused on torch >= 2.8,
    transformers 5.17 training_args.py:804-809), the QLoRA paper's paged 8-bit AdamW for qlora."""
    if intent == "inference":
        return None
    if intent == "qlora":
        return "paged_adamw_8bit"
    return "adamw_torch_fused" if on_gpu else "adamw_torch"


def master_weights(intent: str, optimizer: str | None, dtype: str) -> bool:
    """Full fine-tuning with torch AdamW keeps fp32 master weights under a half-precision compute dtype (mixed
    precision); the memory-saving optimizers are planned on half-precision weights, as people fit full
    fine-tunes with them."""
    return (
        intent == "training" and optimizer in ("adamw_torch_fused", "adamw_torch") and dtype_bytes(dtype) < 4
    )


def optimizer_state_bytes(
    info: Any, optimizer: str | None, trainable: int, param_bytes: int
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


def _largest_param(info: Any) -> int:
    s = info.summary
    inter = info.intermediate_size or 4 * s.hidden_size
    return int(max(s.vocab_size * s.hidden_size, inter * s.hidden_size, 1))


@dataclass(frozen=True)
class TrainingPhases:
    """Activation bytes of one training step by phase. ``kept``: what the forward leaves for backward (every
    layer's checkpointed input, or every saved tensor without checkpointing); ``loss``: the fp32 loss over the
    vocabulary (forward end / backward start); ``layer``: one layer's recompute and backward transients;
    ``cache``: bf16 autocast copies of the weights, alive until the forward ends."""

    kept: int
    loss: int
    layer: int
    cache: int = 0
    #: alive with every gradient at the end of backward (a tied embedding's incoming gradient, TIED_GRAD_...)
    grads_end: int = 0

    def peak(self, grads: int, step: int, accumulate: bool) -> tuple[int, int]:
        """(activation bytes, optimizer-step excess) so that weights + states + gradients + both is the peak.

        Without accumulation the gradients do not exist during the forward (zero_grad(set_to_none=True), as
        Trainer calls it) and grow while backward frees the kept activations, so the step's peak is the
        largest of: forward end (cache + kept + loss), backward start (kept + loss), backward end (gradients +
        one layer), optimizer step (gradients + its temporaries). With accumulation the gradients persist
        through the next micro-step's forward and add to every phase."""
        fwd = self.cache + self.kept + self.loss
        bwd = max(self.kept, 0) + self.layer
        if accumulate:
            act = max(fwd, bwd, self.layer + self.grads_end)
            return act, max(step - act, 0)
        top = max(fwd, bwd, grads + self.layer + self.grads_end)
        act = max(top - grads, 0)
        return act, max(grads + step - top, 0)


def training_activations(
    info: Any,
    *,
    intent: str,
    seq_len: int,
    batch_size: int,
    act_bytes: int,
    resid_bytes: int,
    attn: str,
    gradient_checkpointing: bool,
    autocast_copies: int = 0,
) -> tuple[TrainingPhases, list[str]]:
    """The step's activation phases and the notes that say how.

    Saved per layer and token (no checkpointing): the two RMSNorms' fp32 inputs and their outputs, q/k/v,
    the rotated q/k and the attention output, the MLP's gate, up, activation and product, and with LoRA each
    wrapped module's dropout output in fp32 (PEFT casts the input to the adapter's dtype) and its mask. With
    gradient checkpointing (transformers checkpoints every decoder layer, non-reentrant) each layer keeps only
    its input and one layer at a time is recomputed."""
    s = info.summary
    L = max(s.layers, 1)
    h = s.hidden_size
    inter = info.intermediate_size or 4 * h
    q = s.num_heads * s.head_dim or h
    kv = s.num_kv_heads * s.head_dim or h
    a, r = act_bytes, resid_bytes
    tokens = batch_size * seq_len
    if intent in ("lora", "qlora"):
        # frozen base: autograd saves an operand only for the gradient of another operand that requires grad,
        # so a frozen nn.Linear keeps no input and a frozen RMSNorm weight keeps no output. Each RMSNorm keeps
        # its fp32 input; the MLP keeps gate, up and act(gate) (SiLU's and the product's inputs) but not the
        # product, which only the frozen down_proj reads (the adapter reads its own dropout copy). Without
        # checkpointing the H200 measured 332.5 KB per token and layer for 8B LoRA (bf16) and 433.0 KB for
        # QLoRA (fp32) (benchmarks/results/2026-12-01-h200/run1-memtrain/results.json, least squares over
        # 5 and 3 points, the loss at LOSS_BYTES_PER_LOGIT): 321.5 and 426.0 KB here; with the norms' outputs
        # and the product counted (full fine-tuning, below) it was 362.5 and 507.9 KB.
        layer = 2 * 4 * h + a * (3 * q + 3 * kv) + 3 * a * inter
        layer += 5 * (5 * h + q + inter)  # fp32 dropout output + bool mask on each of the 7 wrapped inputs
    else:
        layer = 2 * (4 * h + r * h) + a * (3 * q + 3 * kv) + 4 * a * inter
    layer_saved = tokens * layer
    backward = tokens * (2 * a * inter + 4 * r * h)
    scores = batch_size * s.num_heads * seq_len * seq_len
    notes = []
    #: one layer's recompute + backward; with materialised scores its peak is the larger of the MLP's backward
    #: (every saved tensor of the layer alive) and the attention's (the MLP's freed, the scores' gradients live)
    one_layer = layer_saved + backward
    if attn == "eager" or (attn == "sdpa" and sdpa_math(info, a)):
        # in fp32 (QLoRA's fp32 stream) the softmax is already fp32: no copy in the dtype; in bf16 see
        # EAGER_BACKWARD_BYTES, in fp32 FP32_SCORES_BACKWARD_BYTES
        saved = EAGER_SAVED_FP32 + (a if a < 4 else 0)
        score_bwd = EAGER_BACKWARD_BYTES if a < 4 else FP32_SCORES_BACKWARD_BYTES
        layer_saved += scores * saved
        backward += scores * score_bwd
        one_layer = max(
            layer_saved + tokens * (2 * a * inter + 4 * r * h),
            tokens * ATTENTION_BACKWARD_ACTS * a * (3 * q + 3 * kv) + scores * (saved + score_bwd),
        )
        how = (
            "eager attention" if attn == "eager" else "sdpa's math kernel (fp32 q/k/v with grouped kv heads)"
        )
        notes.append(
            f"activations: {how} keeps {s.num_heads} x {seq_len}^2 scores per layer "
            f"({saved} bytes each), {scores * saved / GiB:.2f} GiB a layer"
        )
    loss = tokens * s.vocab_size * LOSS_BYTES_PER_LOGIT if info.can_generate else 0
    if gradient_checkpointing:
        ph = TrainingPhases(L * tokens * h * r, loss, one_layer, autocast_copies)
        notes.append(
            f"activations: gradient checkpointing: {L} layer inputs {ph.kept / GiB:.2f} GiB, the fp32 loss over "
            f"{s.vocab_size} logits {loss / GiB:.2f} GiB, one layer recomputed with its backward "
            f"{ph.layer / GiB:.2f} GiB"
        )
    else:
        ph = TrainingPhases(L * layer_saved, loss, backward, autocast_copies)
        notes.append(
            f"activations: no gradient checkpointing: every layer's saved tensors {ph.kept / GiB:.2f} GiB, the "
            f"fp32 loss over {s.vocab_size} logits {loss / GiB:.2f} GiB"
        )
    if autocast_copies:
        notes.append(
            f"activations: bf16 autocast caches a copy of every weight until the forward ends "
            f"({autocast_copies / GiB:.2f} GiB)"
        )
    return ph, notes


def breakdown(
    info: Any,
    *,
    dtype: str,
    quantization: str | None,
    intent: str,
    seq_len: int,
    batch_size: int,
    attn: str = "sdpa",
    optimizer: str | None = None,
    gradient_checkpointing: bool | None = None,
    gradient_accumulation_steps: int = 1,
) -> Breakdown:
    """All memory terms for one configuration, and how they distribute over a layer split.

    Training: ``optimizer`` (None: :func:`default_optimizer`), ``gradient_checkpointing`` (None: on), and
    ``gradient_accumulation_steps``: gradients persist across micro-steps, which the estimate already assumes
    (they are counted at the activation peak), so accumulation adds no bytes -- it is the way to grow the
    effective batch without growing the activations."""
    s = info.summary
    b = dtype_bytes(dtype)
    L = max(s.layers, 1)
    terms: dict[str, int] = {}
    notes: list[str] = []
    training = intent != "inference"
    if training and optimizer is None:
        optimizer = default_optimizer(intent, on_gpu=b < 4)
    gc_on = True if gradient_checkpointing is None else gradient_checkpointing
    # peft's prepare_model_for_kbit_training (peft 0.21 utils/other.py:203-209) casts every parameter that is
    # not 4-bit -- embeddings, norms, the output head, fused expert tensors -- to fp32
    kbit_prepared = intent == "qlora" and quantization is not None
    ob = 4 if kbit_prepared else b
    wtot, wemb, whead = weight_bytes(info, dtype, quantization, other_bytes=ob)
    terms["weights"] = wtot
    wlayer = max(wtot - wemb - whead, 0) // L
    if quantization:
        # bitsandbytes quantises while loading: one layer's linear weights pass through in the compute dtype
        terms["quantization_transient"] = info.counts.linear * b // L
        sp = param_split(info)
        unq = int(sp.layer_other * L) + sp.outside_other + sp.embedding + sp.head
        what = "embeddings, norms and the output head"
        if s.is_moe and sp.layer_other * L > 1e6 * L:
            what = "embeddings, norms, the output head and the fused 3-D expert tensors"
        notes.append(
            f"weights: {quantization} for {info.counts.linear:,} nn.Linear parameters; {unq:,} parameters "
            f"({unq * ob / GiB:.2f} GiB) stay in {'float32' if kbit_prepared else dtype}: {what} "
            "(transformers' bitsandbytes integration replaces only nn.Linear / Conv1D modules, "
            "integrations/bitsandbytes.py:189 in 5.17 to 5.24)"
        )
        if s.is_moe and sp.layer_other * L > 1e6 * L:
            notes.append(
                f"weights: {int(sp.layer_other * L) * ob / GiB:.2f} GiB of MoE expert weights (fused 3-D "
                f"parameters) are not quantized and stay {'float32' if kbit_prepared else dtype}"
            )
        if kbit_prepared:
            notes.append(
                "qlora: prepare_model_for_kbit_training casts the non-4-bit parameters to fp32, so the residual "
                "stream, every activation (bitsandbytes returns its input's dtype) and the logits are fp32 too"
            )
    kv = 0 if training else kv_cache_bytes(info, dtype, seq_len, batch_size)
    terms["kv_cache"] = kv
    if kv and info.sliding_layers:
        notes.append(
            f"kv_cache: {info.sliding_layers} sliding-window layers capped at {s.sliding_window} tokens"
        )
    hidden, inter = s.hidden_size, info.intermediate_size or 4 * s.hidden_size
    tokens = batch_size * seq_len
    n = info.counts.total or s.params
    master = master_weights(intent, optimizer, dtype)
    act_layer = 0
    if not training:
        # one layer's working set during prefill, plus last-token logits in fp32 (generate keeps only those)
        act = tokens * (4 * hidden + 2 * inter) * b + batch_size * s.vocab_size * 4
        if attn == "eager":
            act += batch_size * s.num_heads * seq_len * seq_len * (3 * b + 4)
            notes.append("activations: eager attention materialises seq_len^2 scores per head")
        terms["activations"] = act
    else:
        resid = 4 if (kbit_prepared or master) else b
        phases, act_notes = training_activations(
            info,
            intent=intent,
            seq_len=seq_len,
            batch_size=batch_size,
            # QLoRA: bitsandbytes' Linear4bit computes in bf16 but returns its input's dtype (bitsandbytes 0.50.2
            # nn/modules.py:626,637, ``.to(inp_dtype)``), and the input is the fp32 norms' output,
            # so every activation is fp32 (H200 run1-memtrain: 8B QLoRA without checkpointing at 2048 tokens
            # peaked 59.9 GiB, 0.64 of the estimate with bf16 activations)
            act_bytes=4 if kbit_prepared else b,
            resid_bytes=resid,
            attn=attn,
            gradient_checkpointing=gc_on,
            autocast_copies=n * b if master else 0,
        )
        notes.extend(act_notes)
    grads = opt = mw = adapters = host = step = 0
    if intent == "training":
        pb = 4 if master else b
        grads = n * pb  # gradients take the parameters' dtype
        opt, host = optimizer_state_bytes(info, optimizer, n, pb)
        if master:
            # mixed precision as Trainer runs it on an fp32 model: the fp32 weights are the master copy
            # (weights in the dtype + the rest of fp32 here), fp32 gradients and fp32 AdamW states
            mw = n * (4 - b)
            notes.append(
                f"training: {optimizer}: fp32 master weights, fp32 gradients and fp32 AdamW states (mixed "
                "precision), 16 bytes/param"
            )
        else:
            notes.append(
                f"training: {optimizer} on {dtype} weights: {b} B weights + {b} B gradients + "
                f"{(opt + host) / max(n, 1):.2f} B optimizer states per parameter"
            )
    elif intent in ("lora", "qlora"):
        ap = adapter_params(info)
        adapters = ap * 4  # PEFT keeps adapter weights in fp32 (autocast_adapter_dtype)
        grads = ap * 4
        opt, host = optimizer_state_bytes(info, optimizer, ap, 4)
        notes.append(
            f"{intent}: r={LORA_R} adapters on {info.counts.linear_modules} linear modules "
            f"({ap:,} trainable parameters, fp32), base frozen; optimizer {optimizer}"
        )
    if training:
        if optimizer == "adamw_torch":
            # foreach AdamW: torch._foreach_sqrt(exp_avg_sqs) copies every second moment during step()
            step = opt // 2
        elif optimizer == "adafactor" and intent == "training":
            step = ADAFACTOR_STEP_FP32_COPIES * 4 * _largest_param(info)
        if host:
            notes.append(
                f"optimizer: {optimizer} keeps {host / GiB:.2f} GiB of states in CUDA managed memory, "
                "paged to host memory under pressure (not counted on the GPU)"
            )
        accumulate = gradient_accumulation_steps > 1
        if accumulate:
            notes.append(
                f"gradients persist across {gradient_accumulation_steps} micro-steps: they add to the forward"
            )
        if intent == "training" and s.tied_embeddings:
            tied = TIED_GRAD_EXTRA_BYTES * s.vocab_size * hidden
            phases = dataclasses.replace(phases, grads_end=tied)
            notes.append(
                f"gradients: the tied embedding's gradient arrives last and is accumulated into the head's: "
                f"{tied / GiB:.2f} GiB with every other gradient alive"
            )
        act, terms["optimizer_step"] = phases.peak(grads, step, accumulate)
        terms["activations"] = act
        # what a split keeps per layer: its checkpointed inputs (never more than the phase peak)
        act_layer = min(phases.kept, act) // L
    else:
        terms["optimizer_step"] = 0
    terms["gradients"] = grads
    terms["optimizer"] = opt
    terms["master_weights"] = mw
    terms["adapters"] = adapters
    # the caching allocator's reserved-but-unusable bytes at a training step's peak (ALLOCATOR_SLACK_PER_LOGIT)
    terms["allocator_slack"] = (
        int(batch_size * seq_len * s.vocab_size * ALLOCATOR_SLACK_PER_LOGIT)
        if training and info.can_generate
        else 0
    )
    # training state per parameter, attributed where the parameter lives
    per_param = (grads + opt + mw) / n if intent == "training" and n else 0.0
    split = param_split(info) if info.counts.total else None
    if intent == "training" and split is not None:
        layer_params = split.layer_linear + split.layer_other
        per_layer_train = int(layer_params * per_param)
        train_first = int((split.embedding + split.outside_other) * per_param)
        train_last = int(split.head * per_param)
    elif intent == "training":
        frac = wlayer / wtot if wtot else 1 / L
        per_layer_train = int((grads + opt + mw) * frac)
        train_first = int((grads + opt + mw) * (wemb / wtot)) if wtot else 0
        train_last = int((grads + opt + mw) * (whead / wtot)) if wtot else 0
    else:
        per_layer_train = (grads + opt + adapters) // L
        train_first = train_last = 0
    layer_bytes = wlayer + kv // L + per_layer_train + act_layer
    every = (
        terms["activations"]
        - act_layer * L
        + terms.get("quantization_transient", 0)
        + terms["optimizer_step"]
        + terms["allocator_slack"]
    )
    # rounding residue goes with the first device so the split sums to the total
    layered = layer_bytes * L
    model_total = wtot + kv + grads + opt + mw + adapters + act_layer * L
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
        host_bytes=host,
        layer_activation_bytes=act_layer,
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
    optimizer: str | None = None,
    gradient_checkpointing: bool | None = None,
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
        optimizer=optimizer,
        gradient_checkpointing=gradient_checkpointing,
    )
    terms = gpu_terms(bd, devices)
    terms["total"] = sum(terms.values())
    return terms


def gpu_terms(bd: Breakdown, devices: int) -> dict[str, int]:
    """``bd``'s terms for a model spread over ``devices`` GPUs: every device runs its layers' working set
    (activations) and holds a CUDA context; the model's own bytes are split, not repeated."""
    terms = dict(bd.terms)
    layered = bd.layer_activation_bytes * bd.layers
    terms["activations"] = layered + (terms["activations"] - layered) * max(devices, 1)
    terms["optimizer_step"] = terms.get("optimizer_step", 0) * max(devices, 1)
    terms["allocator_slack"] = terms.get("allocator_slack", 0) * max(devices, 1)
    terms["cuda_context"] = CUDA_CONTEXT_BYTES * devices
    return terms


def allocated_bytes(terms: dict[str, int]) -> int:
    """The caching allocator's allocated peak (``torch.cuda.max_memory_allocated``) for ``terms`` (from
    :func:`estimate`): the total less what is outside the tensors (the CUDA context, the allocator's slack)."""
    return terms["total"] - terms["cuda_context"] - terms.get("allocator_slack", 0)


def reserved_bytes(terms: dict[str, int]) -> int:
    """The caching allocator's reserved peak (``torch.cuda.max_memory_reserved``) for ``terms``."""
    return terms["total"] - terms["cuda_context"]
