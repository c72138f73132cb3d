"""A training step's activations, phase by phase: what each decoder layer saves for backward (or its
checkpointed input), the fp32 loss over the vocabulary, one layer's recompute and backward, and the score
matrices of attention paths that materialise them. (Inference's working set is a few lines of
:func:`cudaload.policies.memory.terms.breakdown`.)"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .constants import (
    ATTENTION_BACKWARD_ACTS,
    EAGER_BACKWARD_BYTES,
    EAGER_SAVED_FP32,
    FP32_SCORES_BACKWARD_BYTES,
    LOSS_BYTES_PER_LOGIT,
    GiB,
)


def sdpa_math(info: Any, act_bytes: int) -> bool:
    """Whether torch's sdpa runs its score-materialising math path for activations of ``act_bytes``."""
    s = info.summary
    return act_bytes >= 4 and 0 < s.num_kv_heads < s.num_heads


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
