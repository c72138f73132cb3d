"""Every memory term for one configuration (weights, quantization transient, KV cache, activations,
gradients, optimizer states and step, master weights, adapters, allocator slack) and how they distribute over
a layer split: :class:`Breakdown`, :func:`breakdown_of` (one :class:`MemoryShape`) and :func:`breakdown`
(the same, as keywords).

:func:`breakdown_of` runs one helper per step: the settings the shape resolves to (:func:`_resolve`), the
weights (:func:`_weights`), the KV cache, the activations (inference's working set, or a training step's
phases), the training state (:func:`_training_state`), the step's peak (:func:`_training_peak`), and where
each term lives in a split (:func:`_split`)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ...dtypes import dtype_bytes
from ...model_info import ModelInfo
from ...plans.training import StepShape
from .activations import TrainingPhases, training_activations
from .constants import (
    ADAFACTOR_STEP_FP32_COPIES,
    ALLOCATOR_SLACK_PER_LOGIT,
    CHUNKED_SLACK_PER_LOGIT,
    TIED_GRAD_EXTRA_BYTES,
    GiB,
)
from .kv_cache import kv_cache_bytes
from .optimizer import _largest_param, default_optimizer, master_weights, optimizer_state_bytes
from .shape import MemoryShape
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


@dataclass(frozen=True)
class _Resolved:
    """What a shape's defaults resolve to before any term is counted."""

    b: int  # bytes per element of the dtype
    layers: int
    optimizer: str | None
    checkpointing: bool
    step: StepShape
    #: QLoRA with peft's fp32 cast of every non-4-bit parameter
    kbit_prepared: bool
    #: bytes of a parameter that stays unquantized (fp32 once kbit-prepared)
    other_bytes: int
    #: fp32 master weights under mixed precision
    master: bool


@dataclass(frozen=True)
class _Weights:
    total: int
    embedding: int
    head: int
    layer: int  # one decoder layer's
    transient: int | None  # quantization's transient (None: not quantized)
    notes: tuple[str, ...]


@dataclass(frozen=True)
class _State:
    """Training state: gradients, optimizer states (on the GPU and paged to the host), master weights, adapters."""

    grads: int = 0
    opt: int = 0
    master: int = 0
    adapters: int = 0
    host: int = 0
    notes: tuple[str, ...] = ()

    @property
    def total(self) -> int:
        return self.grads + self.opt + self.master


@dataclass(frozen=True)
class _Peak:
    """A training step's peak: activations, the optimizer step's transient and the activations kept per layer."""

    activations: int
    optimizer_step: int
    layer_activations: int
    notes: tuple[str, ...]


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
    """All memory terms for one configuration, and how they distribute over a layer split: :func:`breakdown_of`
    with the :class:`MemoryShape` these keywords describe (see there for what each means)."""
    shape = MemoryShape(
        dtype=dtype,
        quantization=quantization,
        intent=intent,
        seq_len=seq_len,
        batch_size=batch_size,
        attn=attn,
        optimizer=optimizer,
        gradient_checkpointing=gradient_checkpointing,
        gradient_accumulation_steps=gradient_accumulation_steps,
        step=step,
    )
    return breakdown_of(info, shape)


def breakdown_of(info: ModelInfo, shape: MemoryShape) -> Breakdown:
    """All memory terms for ``shape``, and how they distribute over a layer split."""
    r = _resolve(info, shape)
    w = _weights(info, shape, r)
    terms: dict[str, int] = {"weights": w.total}
    if w.transient is not None:
        terms["quantization_transient"] = w.transient
    terms["kv_cache"], kv_notes = _kv_cache(info, shape)
    notes = [*w.notes, *kv_notes]
    state = _State()
    act_layer = 0
    if not shape.training:
        terms["activations"], eager_notes = _inference_activations(info, shape, r)
        notes.extend(eager_notes)
        terms["optimizer_step"] = 0
    else:
        phases, act_notes = _training_phases(info, shape, r)
        state = _training_state(info, shape, r)
        peak = _training_peak(info, shape, r, phases, state)
        notes.extend((*act_notes, *state.notes, *peak.notes))
        terms["optimizer_step"] = peak.optimizer_step
        terms["activations"] = peak.activations
        act_layer = peak.layer_activations
    terms["gradients"] = state.grads
    terms["optimizer"] = state.opt
    terms["master_weights"] = state.master
    terms["adapters"] = state.adapters
    # the caching allocator's reserved-but-unusable bytes at a training step's peak (ALLOCATOR_SLACK_PER_LOGIT)
    # kept per logit with Liger's fused loss too, though it holds no vocabulary-wide tensor: measured so on the
    # H200 (benchmarks/results/2026-12-03-h200/README.md, the run that ran out of memory); less with cudaload's
    # chunked loss under full checkpointing, where capped cards measured it (CHUNKED_SLACK_PER_LOGIT)
    terms["allocator_slack"] = (
        int(r.step.tokens * info.summary.vocab_size * _slack_per_logit(r))
        if shape.training and info.can_generate
        else 0
    )
    layer_bytes, first, last = _split(info, shape.intent, r, w, state, terms["kv_cache"], act_layer)
    every = (
        terms["activations"]
        - act_layer * r.layers
        + terms.get("quantization_transient", 0)
        + terms["optimizer_step"]
        + terms["allocator_slack"]
    )
    return Breakdown(
        terms=terms,
        layers=r.layers,
        layer_bytes=layer_bytes,
        first_bytes=first,
        last_bytes=last,
        every_device=every,
        layer_weight_bytes=w.layer,
        notes=tuple(notes),
        host_bytes=state.host,
        layer_activation_bytes=act_layer,
    )


def _resolve(info: ModelInfo, shape: MemoryShape) -> _Resolved:
    b = dtype_bytes(shape.dtype)
    optimizer = shape.optimizer
    if shape.training and optimizer is None:
        optimizer = default_optimizer(shape.intent, on_gpu=b < 4)
    step = shape.step if shape.step is not None else StepShape.padded(shape.batch_size, shape.seq_len)
    # peft's prepare_model_for_kbit_training (peft 0.21 utils/other.py:203-209) casts every parameter that is
    # not 4-bit -- embeddings, norms, the output head, fused expert tensors -- to fp32 (where the plan runs it)
    kbit_prepared = shape.intent == "qlora" and shape.quantization is not None and step.kbit_upcast
    return _Resolved(
        b=b,
        layers=max(info.summary.layers, 1),
        optimizer=optimizer,
        checkpointing=True if shape.gradient_checkpointing is None else shape.gradient_checkpointing,
        step=step,
        kbit_prepared=kbit_prepared,
        other_bytes=4 if kbit_prepared else b,
        master=master_weights(shape.intent, optimizer, shape.dtype),
    )


def _weights(info: ModelInfo, shape: MemoryShape, r: _Resolved) -> _Weights:
    """The weights in total, with the embedding, with the head and per decoder layer; quantized, the transient
    of one layer's linear weights and notes on what stays unquantized."""
    s = info.summary
    L = r.layers
    wtot, wemb, whead = weight_bytes(info, shape.dtype, shape.quantization, other_bytes=r.other_bytes)
    wlayer = max(wtot - wemb - whead, 0) // L
    if not shape.quantization:
        return _Weights(wtot, wemb, whead, wlayer, None, ())
    quantization, ob = shape.quantization, r.other_bytes
    kept_in = "float32" if r.kbit_prepared else shape.dtype
    # bitsandbytes quantises while loading: one layer's linear weights pass through in the compute dtype
    transient = info.counts.linear * r.b // L
    sp = param_split(info)
    unq = int(sp.layer_other * L) + sp.outside_other + sp.embedding + sp.head
    experts = s.is_moe and sp.layer_other * L > 1e6 * L
    what = "embeddings, norms and the output head"
    if experts:
        what = "embeddings, norms, the output head and the fused 3-D expert tensors"
    notes = [
        f"weights: {quantization} for {info.counts.linear:,} nn.Linear parameters; {unq:,} parameters "
        f"({unq * ob / GiB:.2f} GiB) stay in {kept_in}: {what} "
        "(transformers' bitsandbytes integration replaces only nn.Linear / Conv1D modules, "
        "integrations/bitsandbytes.py:189 in 5.17 to 5.24)"
    ]
    if experts:
        notes.append(
            f"weights: {int(sp.layer_other * L) * ob / GiB:.2f} GiB of MoE expert weights (fused 3-D "
            f"parameters) are not quantized and stay {kept_in}"
        )
    if r.kbit_prepared:
        notes.append(
            "qlora: prepare_model_for_kbit_training casts the non-4-bit parameters to fp32, so the residual "
            "stream, every activation (bitsandbytes returns its input's dtype) and the logits are fp32 too"
        )
    return _Weights(wtot, wemb, whead, wlayer, transient, tuple(notes))


def _kv_cache(info: ModelInfo, shape: MemoryShape) -> tuple[int, tuple[str, ...]]:
    """Inference's KV cache (training keeps none)."""
    kv = 0 if shape.training else kv_cache_bytes(info, shape.dtype, shape.seq_len, shape.batch_size)
    if kv and info.sliding_layers:
        return kv, (
            f"kv_cache: {info.sliding_layers} sliding-window layers capped at {info.summary.sliding_window} tokens",
        )
    return kv, ()


def _inference_activations(info: ModelInfo, shape: MemoryShape, r: _Resolved) -> tuple[int, tuple[str, ...]]:
    """One layer's working set during prefill, plus last-token logits in fp32 (generate keeps only those)."""
    s = info.summary
    hidden, inter = s.hidden_size, info.intermediate_size or 4 * s.hidden_size
    tokens = shape.batch_size * shape.seq_len
    act = tokens * (4 * hidden + 2 * inter) * r.b + shape.batch_size * s.vocab_size * 4
    if shape.attn != "eager":
        return act, ()
    act += shape.batch_size * s.num_heads * shape.seq_len * shape.seq_len * (3 * r.b + 4)
    return act, ("activations: eager attention materialises seq_len^2 scores per head",)


def _training_phases(info: ModelInfo, shape: MemoryShape, r: _Resolved) -> tuple[TrainingPhases, list[str]]:
    """A training step's activations by phase (:func:`training_activations`), in the dtypes the step runs."""
    n = info.counts.total or info.summary.params
    return training_activations(
        info,
        intent=shape.intent,
        step=r.step,
        # QLoRA: bitsandbytes' Linear4bit computes in bf16 but returns its input's dtype (bitsandbytes 0.50.2
        # nn/modules.py:626,637, ``.to(inp_dtype)``), and the input is the fp32 norms' output,
        # so every activation is fp32 (benchmarks/results/2026-12-01-h200/run1-memtrain: 8B QLoRA without checkpointing at 2048 tokens
        # peaked 59.9 GiB, 0.64 of the estimate with bf16 activations)
        act_bytes=4 if r.kbit_prepared else r.b,
        resid_bytes=4 if (r.kbit_prepared or r.master) else r.b,
        attn=shape.attn,
        gradient_checkpointing=r.checkpointing,
        autocast_copies=n * r.b if r.master else 0,
    )


def _training_state(info: ModelInfo, shape: MemoryShape, r: _Resolved) -> _State:
    """Full fine-tuning: every parameter's gradient, optimizer states and (mixed precision) master weights;
    LoRA / QLoRA: the fp32 adapters with theirs, the base frozen."""
    optimizer = r.optimizer
    if shape.intent == "training":
        n = info.counts.total or info.summary.params
        pb = 4 if r.master else r.b
        grads = n * pb  # gradients take the parameters' dtype
        opt, host = optimizer_state_bytes(info, optimizer, n, pb)
        if r.master:
            # mixed precision as Trainer runs it on an fp32 model: the fp32 weights are the master copy
            # (weights in the dtype + the rest of fp32 here), fp32 gradients and fp32 AdamW states
            note = (
                f"training: {optimizer}: fp32 master weights, fp32 gradients and fp32 AdamW states (mixed "
                "precision), 16 bytes/param"
            )
            return _State(grads, opt, n * (4 - r.b), 0, host, (note,))
        note = (
            f"training: {optimizer} on {shape.dtype} weights: {r.b} B weights + {r.b} B gradients + "
            f"{(opt + host) / max(n, 1):.2f} B optimizer states per parameter"
        )
        return _State(grads, opt, 0, 0, host, (note,))
    if shape.intent in ("lora", "qlora"):
        ap = adapter_params(info, r=r.step.lora_r)
        opt, host = optimizer_state_bytes(info, optimizer, ap, 4)
        note = (
            f"{shape.intent}: r={r.step.lora_r} adapters on {info.counts.linear_modules} linear modules "
            f"({ap:,} trainable parameters, fp32), base frozen; optimizer {optimizer}"
        )
        # PEFT keeps adapter weights in fp32 (autocast_adapter_dtype), and so their gradients
        return _State(grads=ap * 4, opt=opt, adapters=ap * 4, host=host, notes=(note,))
    return _State()


def _training_peak(
    info: ModelInfo, shape: MemoryShape, r: _Resolved, phases: TrainingPhases, state: _State
) -> _Peak:
    """The step's peak over its phases, with the optimizer step's transient and the tied embedding's gradient."""
    s = info.summary
    optimizer = r.optimizer
    notes: list[str] = []
    opt_step = 0
    if optimizer == "adamw_torch":
        # foreach AdamW: torch._foreach_sqrt(exp_avg_sqs) copies every second moment during step()
        opt_step = state.opt // 2
    elif optimizer == "adafactor" and shape.intent == "training":
        opt_step = ADAFACTOR_STEP_FP32_COPIES * 4 * _largest_param(info)
    if state.host:
        notes.append(
            f"optimizer: {optimizer} keeps {state.host / GiB:.2f} GiB of states in CUDA managed memory, "
            "paged to host memory under pressure (not counted on the GPU)"
        )
    accumulate = shape.gradient_accumulation_steps > 1
    if accumulate:
        notes.append(
            f"gradients persist across {shape.gradient_accumulation_steps} micro-steps: they add to the forward"
        )
    if shape.intent == "training" and s.tied_embeddings:
        tied = TIED_GRAD_EXTRA_BYTES * s.vocab_size * s.hidden_size
        phases = dataclasses.replace(phases, grads_end=tied)
        notes.append(
            f"gradients: the tied embedding's gradient arrives last and is accumulated into the head's: "
            f"{tied / GiB:.2f} GiB with every other gradient alive"
        )
    if shape.intent == "training" and info.can_generate and s.vocab_size > 0 and s.hidden_size > 0:
        # the output head's gradient exists from the start of backward (the head's backward runs first; a fused
        # loss made it in its forward) while every checkpointed input is still alive: the gradients' own dtype
        n = max(info.counts.total or s.params, 1)
        phases = dataclasses.replace(phases, head_grad=state.grads * s.vocab_size * s.hidden_size // n)
    act, step_bytes = phases.peak(state.grads, opt_step, accumulate)
    # what a split keeps per layer: its checkpointed inputs (never more than the phase peak)
    return _Peak(act, step_bytes, min(phases.kept, act) // r.layers, tuple(notes))


def _slack_per_logit(r: _Resolved) -> float:
    """The allocator's slack per logit of the step: CHUNKED_SLACK_PER_LOGIT where cudaload's chunked loss runs
    with every layer checkpointed (the only setting measured at capped-card boundaries), else
    ALLOCATOR_SLACK_PER_LOGIT."""
    s = r.step
    chunked = s.fused_loss and s.chunked_loss and r.checkpointing and s.checkpoint_every == 1
    return CHUNKED_SLACK_PER_LOGIT if chunked else ALLOCATOR_SLACK_PER_LOGIT


def _split(
    info: ModelInfo, intent: str, r: _Resolved, w: _Weights, state: _State, kv: int, act_layer: int
) -> tuple[int, int, int]:
    """(per decoder layer, with the embedding, with the head): training state per parameter is attributed
    where the parameter lives; the rounding residue goes with the first device so the split sums to the
    total."""
    L = r.layers
    n = info.counts.total or info.summary.params
    per_param = state.total / n if intent == "training" and n else 0.0
    split = param_split(info) if info.counts.total else None
    if intent == "training" and split is not None:
        layer_params = split.layer_linear + split.layer_other
        per_layer_train = int(layer_params * per_param)
        train_first = int((split.embedding + split.outside_other) * per_param)
        train_last = int(split.head * per_param)
    elif intent == "training":
        frac = w.layer / w.total if w.total else 1 / L
        per_layer_train = int(state.total * frac)
        train_first = int(state.total * (w.embedding / w.total)) if w.total else 0
        train_last = int(state.total * (w.head / w.total)) if w.total else 0
    else:
        per_layer_train = (state.grads + state.opt + state.adapters) // L
        train_first = train_last = 0
    layer_bytes = w.layer + kv // L + per_layer_train + act_layer
    model_total = w.total + kv + state.grads + state.opt + state.master + state.adapters + act_layer * L
    first = w.embedding + train_first
    last = w.head + train_last
    first += max(model_total - layer_bytes * L - first - last, 0)
    return layer_bytes, first, last
