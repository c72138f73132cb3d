"""Every memory term for one configuration (weights, quantization transient, KV cache, activations,
gradients, optimizer states and step, master weights, adapters, allocator slack) and how they distribute over
a layer split: :class:`Breakdown` and :func:`breakdown`."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ...dtypes import dtype_bytes
from ...model_info import ModelInfo
from ...training_plan import StepShape
from .activations import training_activations
from .constants import (
    ADAFACTOR_STEP_FP32_COPIES,
    ALLOCATOR_SLACK_PER_LOGIT,
    TIED_GRAD_EXTRA_BYTES,
    GiB,
)
from .kv_cache import kv_cache_bytes
from .optimizer import _largest_param, default_optimizer, master_weights, optimizer_state_bytes
from .weights import adapter_params, param_split, weight_bytes


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


def breakdown(
    info: ModelInfo,
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
    step: StepShape | None = None,
) -> Breakdown:
    """All memory terms for one configuration, and how they distribute over a layer split.

    Training: ``optimizer`` (None: :func:`default_optimizer`), ``gradient_checkpointing`` (None: on), and
    ``gradient_accumulation_steps``: gradients persist across micro-steps, which the estimate already assumes
    (they are counted at the activation peak), so accumulation adds no bytes -- it is the way to grow the
    effective batch without growing the activations.

    ``step``: a training step's shape (:class:`cudaload.training_plan.StepShape`: packed or padded tokens, the
    loss, LoRA dropout, QLoRA's fp32 cast); None is a padded step of ``batch_size`` x ``seq_len`` with the
    plan's defaults (no dropout, no fp32 cast, under autocast)."""
    s = info.summary
    b = dtype_bytes(dtype)
    L = max(s.layers, 1)
    terms: dict[str, int] = {}
    notes: list[str] = []
    training = intent != "inference"
    if training and optimizer is None:
        optimizer = default_optimizer(intent, on_gpu=b < 4)
    gc_on = True if gradient_checkpointing is None else gradient_checkpointing
    if step is None:
        step = StepShape.padded(batch_size, seq_len)
    # peft's prepare_model_for_kbit_training (peft 0.21 utils/other.py:203-209) casts every parameter that is
    # not 4-bit -- embeddings, norms, the output head, fused expert tensors -- to fp32 (where the plan runs it)
    kbit_prepared = intent == "qlora" and quantization is not None and step.kbit_upcast
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
            step=step,
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
    grads = opt = mw = adapters = host = opt_step = 0
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
        ap = adapter_params(info, r=step.lora_r)
        adapters = ap * 4  # PEFT keeps adapter weights in fp32 (autocast_adapter_dtype)
        grads = ap * 4
        opt, host = optimizer_state_bytes(info, optimizer, ap, 4)
        notes.append(
            f"{intent}: r={step.lora_r} adapters on {info.counts.linear_modules} linear modules "
            f"({ap:,} trainable parameters, fp32), base frozen; optimizer {optimizer}"
        )
    if training:
        if optimizer == "adamw_torch":
            # foreach AdamW: torch._foreach_sqrt(exp_avg_sqs) copies every second moment during step()
            opt_step = opt // 2
        elif optimizer == "adafactor" and intent == "training":
            opt_step = ADAFACTOR_STEP_FP32_COPIES * 4 * _largest_param(info)
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
        act, terms["optimizer_step"] = phases.peak(grads, opt_step, accumulate)
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
    # kept per logit with Liger's fused loss too, though it holds no vocabulary-wide tensor: measured so on the
    # H200 (benchmarks/results/2026-12-03-h200/README.md, the run that ran out of memory)
    terms["allocator_slack"] = (
        int(step.tokens * s.vocab_size * ALLOCATOR_SLACK_PER_LOGIT) if training and info.can_generate else 0
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
