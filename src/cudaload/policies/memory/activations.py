"""A training step's activations, phase by phase: what each decoder layer saves for backward (or its
checkpointed input), the fp32 loss over the vocabulary, one layer's recompute and backward, and the score
matrices of attention paths that materialise them. (Inference's working set is a few lines of
:func:`cudaload.policies.memory.terms.breakdown`.)"""

from __future__ import annotations

from dataclasses import dataclass

from ...model_info import ModelInfo
from ...plans.training import StepShape
from .constants import (
    ATTENTION_BACKWARD_ACTS,
    EAGER_BACKWARD_BYTES,
    EAGER_SAVED_FP32,
    FP32_SCORES_BACKWARD_BYTES,
    LOSS_BYTES_PER_LOGIT,
    GiB,
    chunk_rows,
)


def sdpa_math(info: ModelInfo, act_bytes: int) -> bool:
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
    #: a full fine-tune's output-head gradient, alive from the start of backward with every checkpointed input:
    #: without it, full Qwen3-0.6B (tied) at 39,936 tokens on a capped H100 peaked 0.55 GiB above the phases'
    #: 6.29 GiB (benchmarks/results/2026-12-07-s20/gpu1), where backward's start is the peak
    head_grad: int = 0

    def peak(self, grads: int, step: int, accumulate: bool) -> tuple[int, int]:
        """(activation bytes, optimizer-step excess) so that weights + states + gradients + both is the peak.

        Without accumulation the gradients do not exist during the forward (zero_grad(set_to_none=True), as
        Trainer calls it) and grow while backward frees the kept activations, so the step's peak is the
        largest of: forward end (cache + kept + loss), backward start (kept + one layer + the head's gradient),
        backward end (gradients + one layer), optimizer step (gradients + its temporaries). With accumulation
        the gradients persist through the next micro-step's forward and add to every phase (the head's among
        them)."""
        fwd = self.cache + self.kept + self.loss
        bwd = max(self.kept, 0) + self.layer
        if accumulate:
            act = max(fwd, bwd, self.layer + self.grads_end)
            return act, max(step - act, 0)
        # backward end sums one layer and the tied embedding's gradient, although autograd frees the first layer's
        # recompute before the embedding's backward: with max(layer, grads_end) the four full 0.6B fit boundaries
        # (benchmarks/results/2026-12-07-h100 gpu9, 2026-12-07-s19 and -s20 gpu1) come out 4-5% under their
        # measured peaks, with the sum 1.13 over at 13,056 tokens and 0.96-0.99 at the others (docs/limits.md)
        top = max(fwd, bwd + self.head_grad, grads + self.layer + self.grads_end)
        act = max(top - grads, 0)
        return act, max(grads + step - top, 0)


def adapter_input_bytes(act_bytes: int, step: StepShape, kbit: bool = False) -> tuple[float, bool]:
    """Bytes PEFT's LoRA keeps per element of each adapted layer's input, and whether the adapters share the
    inputs the layer keeps anyway.

    PEFT casts the input to the adapter's dtype before the adapter (peft 0.21 tuners/lora/layer.py:1100,
    ``_cast_input_dtype``), and the adapters are fp32 (``autocast_adapter_dtype``). On a bf16 stream that cast
    is a new fp32 tensor per adapter: kept by the fp32 ``lora_A`` (4 bytes), or under bf16 autocast (Trainer
    with ``bf16=True``, through accelerate's ``prepare_model``) cast back to a bf16 copy that ``lora_A`` keeps
    (2 bytes). Dropout > 0 adds its output in place of the input and a 1-byte mask. On an fp32 stream (QLoRA
    with peft's fp32 cast) the cast is a no-op: without dropout the adapters keep the same tensors as the
    layer. PEFT's bitsandbytes layers (``kbit``) cast only outside autocast (peft 0.21 tuners/lora/bnb.py:543-546,
    ``requires_conversion = not torch.is_autocast_enabled()``): under autocast they share the inputs too
    (benchmarks/results/2026-12-03-h200/README.md, "Memory"), as do the plain LoRA layers cudaload wraps
    (``step.cast_outside_autocast``: the same rule, :func:`cudaload.policies.training.choose_adapter_cast`)."""
    if act_bytes >= 4 or ((kbit or step.cast_outside_autocast) and step.autocast):
        return (5.0 if act_bytes >= 4 else 3.0, False) if step.lora_dropout > 0 else (0.0, True)
    kept = 2.0 if step.autocast else 4.0
    return kept + (1.0 if step.lora_dropout > 0 else 0.0), False


def compiled_saving_per_token(info: ModelInfo, *, intent: str, step: StepShape, act_bytes: int) -> int:
    """Bytes one decoder layer saves for backward per token fewer when it runs compiled (what a step with
    ``compiled_layers`` keeps fewer; ``step``'s other fields say whether the adapters share inputs): inductor's partitioner recomputes pointwise results in backward rather than keep
    them (torch 2.13 _functorch/partitioners.py:3725 ``min_cut_rematerialization_partition``, pointwise ops
    recomputable at :2959). With LoRA adapters that share the layer's inputs (no dropout) on a bf16 stream, the
    MLP's activation and its product are recomputed from gate and up: 2 x intermediate in the activations'
    dtype. Measured on the H100 (benchmarks/results/2026-12-07-h100 gpu5 and gpu8, Qwen3-8B shape, packed chat
    steps, the largest of 4,579 tokens): the compiled LoRA and QLoRA steps allocated 31.66 and 31.64 GB above
    their weights against the eager step's 40.13, 51.3 KB per token per layer = 2.09 x 12,288 x 2 bytes. Other
    configurations (dropout, an fp32 stream, a full fine-tune) are not measured: 0, the eager figure, which is
    the safe side."""
    if intent not in ("lora", "qlora") or act_bytes >= 4:
        return 0
    _, shared = adapter_input_bytes(act_bytes, step, kbit=intent == "qlora")
    return 2 * act_bytes * _Dims.of(info).inter if shared else 0


def compiled_layers_saving(
    info: ModelInfo, *, intent: str, step: StepShape, act_bytes: int, gradient_checkpointing: bool
) -> int:
    """Bytes the step's activations hold fewer at its peak with compiled decoder layers than with eager ones:
    :func:`compiled_saving_per_token` over the step's tokens in every layer that keeps its saved tensors (a
    checkpointed layer keeps only its input)."""
    per_token = compiled_saving_per_token(info, intent=intent, step=step, act_bytes=act_bytes)
    layers = max(info.summary.layers, 1)
    kept = layers - (step.checkpointed_layers(layers) if gradient_checkpointing else 0)
    return per_token * step.tokens * kept


@dataclass(frozen=True)
class _Dims:
    """A decoder layer's widths, as the per-token terms read them."""

    hidden: int
    inter: int  # the MLP's intermediate size
    q: int  # the query heads' width
    kv: int  # the key/value heads' width

    @classmethod
    def of(cls, info: ModelInfo) -> _Dims:
        s = info.summary
        h = s.hidden_size
        return cls(
            h,
            info.intermediate_size or 4 * h,
            s.num_heads * s.head_dim or h,
            s.num_kv_heads * s.head_dim or h,
        )


@dataclass(frozen=True)
class _LayerBytes:
    """One decoder layer's activations for the whole step: ``saved`` for backward, its backward's transients,
    ``one_layer`` (one layer's recompute and backward at their peak) and ``mask_kept`` (made once per forward and
    read by every layer)."""

    saved: int
    backward: int
    one_layer: int
    mask_kept: int = 0


def _saved_per_token(
    info: ModelInfo, d: _Dims, *, intent: str, step: StepShape, a: int, r: int, attn: str
) -> int:
    """Bytes one layer saves for backward per token, before any attention scores."""
    h, inter, q, kv = d.hidden, d.inter, d.q, d.kv
    if intent in ("lora", "qlora"):
        # frozen base: autograd saves an operand only for the gradient of another operand that requires grad,
        # so a frozen nn.Linear keeps no input and a frozen RMSNorm weight keeps no output. Each RMSNorm keeps
        # its fp32 input; the MLP keeps gate, up and act(gate) (SiLU's and the product's inputs) but not the
        # product, which only the frozen down_proj reads. Calibrated on the H200's peaks
        # (benchmarks/results/2026-12-01-h200/run1-memtrain, and 2026-12-03-h200/README.md "Memory").
        layer = 2 * 4 * h + a * (3 * q + 3 * kv) + 3 * a * inter
        per_elem, shared = adapter_input_bytes(a, step, kbit=intent == "qlora")
        if shared:
            # the adapters read the norms' outputs (shared by q/k/v and by gate/up) and the product, which the
            # frozen layers alone would not keep; o_proj's input is the attention output, kept already
            layer += a * (2 * h + inter)
        else:
            # one copy per adapted layer: q, k, v, gate, up read h each, o_proj q, down_proj inter
            layer += int(per_elem * (5 * h + q + inter))
        if step.compiled_layers:
            layer -= compiled_saving_per_token(info, intent=intent, step=step, act_bytes=a)
    else:
        layer = 2 * (4 * h + r * h) + a * (3 * q + 3 * kv) + 4 * a * inter
    if info.counts.qk_norms and a < 4:
        # a q/k RMSNorm (Qwen3, Gemma3, OLMo2...) keeps its fp32 input where the terms above count the
        # projection's output in the activations' dtype (benchmarks/results/2026-12-03-h200/README.md, "Memory")
        layer += (4 - a) * (q + kv)
    if _packed_sdpa(info, step, attn, a) and kv < q:
        layer += a * 2 * (q - kv)  # the repeated key/value heads sdpa keeps
    return layer


def _packed_sdpa(info: ModelInfo, step: StepShape, attn: str, a: int) -> bool:
    """A packed row under sdpa's fused kernels (transformers' block-diagonal mask, no scores)."""
    return step.packed and attn == "sdpa" and not sdpa_math(info, a)


def _layer_bytes(
    info: ModelInfo, d: _Dims, *, step: StepShape, layer: int, a: int, r: int, attn: str
) -> tuple[_LayerBytes, list[str]]:
    """One layer's activations over the step's tokens, with the score matrices or bias its attention keeps."""
    s = info.summary
    tokens = step.tokens
    layer_saved = tokens * layer
    backward = tokens * (2 * a * d.inter + 4 * r * d.hidden)
    if step.packed:
        scores = s.num_heads * tokens * tokens
    else:
        scores = step.sequences * s.num_heads * step.longest * step.longest
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
            layer_saved + tokens * (2 * a * d.inter + 4 * r * d.hidden),
            tokens * ATTENTION_BACKWARD_ACTS * a * (3 * d.q + 3 * d.kv) + scores * (saved + score_bwd),
        )
        how = (
            "eager attention" if attn == "eager" else "sdpa's math kernel (fp32 q/k/v with grouped kv heads)"
        )
        rows = f"one packed row of {tokens}" if step.packed else f"{step.longest}"
        note = (
            f"activations: {how} keeps {s.num_heads} x {rows}^2 scores per layer "
            f"({saved} bytes each), {scores * saved / GiB:.2f} GiB a layer"
        )
        return _LayerBytes(layer_saved, backward, one_layer), [note]
    if _packed_sdpa(info, step, attn, a):
        bias = tokens * (-(-tokens // 16) * 16) * a
        note = (
            f"activations: sdpa on a packed row keeps a {tokens} x {tokens} attention bias per layer "
            f"({bias / GiB:.2f} GiB each): flash attention's varlen kernels need none"
        )
        # the boolean mask, made once per forward and read by every layer
        return _LayerBytes(layer_saved + bias, backward, one_layer + bias, tokens * tokens), [note]
    return _LayerBytes(layer_saved, backward, one_layer), []


def _loss_bytes(info: ModelInfo, step: StepShape, a: int, head_trains: bool = False) -> tuple[int, str]:
    """The loss's bytes at the forward's end, and how the notes say it. ``head_trains``: the output head has a
    gradient (full fine-tuning), which a fused loss computes in its forward."""
    s = info.summary
    if not info.can_generate:
        loss = 0
    elif step.fused_loss:
        # Liger's fused linear cross-entropy (liger-kernel 0.8.5 ops/fused_linear_cross_entropy.py:103-108):
        # the gradient of its input (tokens x hidden) and one chunk of logits sized to about the same; cudaload's
        # chunked loss keeps the same gradient, and its chunk (at least CHUNK_MIN_ROWS rows) holds the chunk's
        # logits in the head's dtype, their fp32 copy and the fp32 gradient: the larger of the two is planned, so
        # the plan holds whichever of them the loss decision takes
        liger = 2 * step.tokens * s.hidden_size * a
        rows = chunk_rows(step.tokens, s.hidden_size, s.vocab_size) if s.vocab_size > 0 else 0
        chunked = step.tokens * s.hidden_size * a + rows * s.vocab_size * LOSS_BYTES_PER_LOGIT
        loss = max(liger, chunked)
        if head_trains:
            # a head that trains gets its gradient in the loss's forward (a vocab x hidden buffer in the head's
            # dtype, liger 0.8.5 ops/fused_linear_cross_entropy.py:114-117, cudaload's the same), alive from the
            # forward's end until the backward hands it on: before the optimizer's gradients exist
            loss += s.vocab_size * s.hidden_size * a
    else:
        loss = step.tokens * s.vocab_size * LOSS_BYTES_PER_LOGIT
    what_loss = (
        f"a fused loss {loss / GiB:.2f} GiB (no fp32 logits over the step)"
        if step.fused_loss
        else f"the fp32 loss over {s.vocab_size} logits {loss / GiB:.2f} GiB"
    )
    return loss, what_loss


def training_activations(
    info: ModelInfo,
    *,
    intent: str,
    step: StepShape,
    act_bytes: int,
    resid_bytes: int,
    attn: str,
    gradient_checkpointing: bool,
    autocast_copies: int = 0,
) -> tuple[TrainingPhases, list[str]]:
    """The step's activation phases and the notes that say how.

    Saved per layer and token (no checkpointing): the two RMSNorms' fp32 inputs and their outputs, q/k/v,
    the rotated q/k and the attention output, the MLP's gate, up, activation and product, and with LoRA what
    each adapter keeps of its layer's input (:func:`adapter_input_bytes`). With gradient checkpointing
    (transformers checkpoints every decoder layer, non-reentrant) each layer keeps only its input and one layer
    at a time is recomputed; with ``step.checkpoint_every = n > 1`` only every n-th layer is checkpointed and the
    others keep every saved tensor.

    ``step.tokens`` sets every per-token term. Attention scores are materialised per sequence in a padded
    step (``sequences x longest^2``) and over the whole row in a packed one (one row of ``tokens``: eager, or
    sdpa's math path); a packed step under sdpa's fused kernels keeps a ``tokens x tokens`` bias per layer
    instead (transformers' block-diagonal mask, which torch converts to the query's dtype for the
    memory-efficient kernel and saves for backward), and the key/value heads repeated to the query heads
    (transformers' sdpa_attention repeats them whenever a mask is passed: integrations/sdpa_attention.py
    ``use_gqa_in_sdpa`` in 5.17); flash attention's varlen kernels keep neither."""
    d = _Dims.of(info)
    a, r = act_bytes, resid_bytes
    layer = _saved_per_token(info, d, intent=intent, step=step, a=a, r=r, attn=attn)
    lb, notes = _layer_bytes(info, d, step=step, layer=layer, a=a, r=r, attn=attn)
    loss, what_loss = _loss_bytes(info, step, a, head_trains=intent == "training")
    ph, how = _phases(info, step, lb, loss, what_loss, gradient_checkpointing, r, autocast_copies)
    notes.append(how)
    if autocast_copies:
        notes.append(
            f"activations: bf16 autocast caches a copy of every weight until the forward ends "
            f"({autocast_copies / GiB:.2f} GiB)"
        )
    return ph, notes


def _phases(
    info: ModelInfo,
    step: StepShape,
    lb: _LayerBytes,
    loss: int,
    what_loss: str,
    gradient_checkpointing: bool,
    r: int,
    autocast_copies: int,
) -> tuple[TrainingPhases, str]:
    """The step's phases as checkpointing keeps the layers (none, every n-th, every one), and the note saying so."""
    L = max(info.summary.layers, 1)
    inputs = step.tokens * info.summary.hidden_size * r  # one checkpointed layer's input
    c = step.checkpointed_layers(L) if gradient_checkpointing else 0
    if gradient_checkpointing and c < L:
        # partial (every n-th layer, transformers' every_n_layers): the checkpointed layers keep their input, the
        # others every saved tensor; backward recomputes one checkpointed layer at a time (its transient is the
        # full form's), which at c = L is the full form below and at c = 0 the form without checkpointing
        ph = TrainingPhases(
            c * inputs + (L - c) * lb.saved + lb.mask_kept, loss, lb.one_layer, autocast_copies
        )
        return ph, (
            f"activations: gradient checkpointing of every {step.checkpoint_every} layers: {c} layer inputs and "
            f"{L - c} layers' saved tensors {ph.kept / GiB:.2f} GiB, {what_loss}, one layer recomputed with its "
            f"backward {ph.layer / GiB:.2f} GiB"
        )
    if gradient_checkpointing:
        ph = TrainingPhases(L * inputs + lb.mask_kept, loss, lb.one_layer, autocast_copies)
        return ph, (
            f"activations: gradient checkpointing: {L} layer inputs {ph.kept / GiB:.2f} GiB, {what_loss}, "
            f"one layer recomputed with its backward {ph.layer / GiB:.2f} GiB"
        )
    ph = TrainingPhases(L * lb.saved + lb.mask_kept, loss, lb.backward, autocast_copies)
    return ph, (
        f"activations: no gradient checkpointing: every layer's saved tensors {ph.kept / GiB:.2f} GiB, "
        f"{what_loss}"
    )
