"""How big the plan is and where it goes: the fit ladder (quantization, placement, the optimizer and checkpointing
rungs), for training the step's layout and bound (cudaload.policies.training), and on several GPUs the
parallelism decision, which may rescue a model no single process fits; then the memory estimate."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from ..capabilities import Capabilities
from ..errors import DoesNotFitError
from ..model_info import ModelInfo
from ..plans.decision import Decision
from ..plans.plan import MemoryEstimate, Parallelism, Placement
from ..plans.training import StepShape, TrainingPlan
from ..policies.decode_facts import QuantDecodeCost
from ..policies.dtype import dtype_bytes
from ..policies.memory import LORA_R, compiled_layers_saving, gpu_terms
from ..policies.parallelism import decide as decide_parallelism
from ..policies.quantization import FitResult, fit
from ..policies.training import (
    DEFAULT_SEQUENCES,
    TYPICAL_FILL,
    RequestedLayout,
    RequestedLoss,
    StepChoice,
    base_step,
    choose_adapter_cast,
    choose_kbit_upcast,
    choose_layout,
    choose_lora_dropout,
    plan_for_ranks,
    plan_step,
    step_bounds,
)
from ..policies.training.compile import choose_layer_compile
from ..request import Request
from ..tuning import load_layer_compile_facts
from ..units import byte_size
from .choices import base_intent
from .sections import sdpa_family
from .work import WorkSize

TRAINING = ("training", "lora", "qlora")


@dataclass(frozen=True)
class TrainingSizing:
    """The training ladder's choice, or the error where no single process fits; ``for_ranks(step)`` is the
    section for the step a parallelism decision sizes its ranks with instead. ``batch_size`` (the sequences a
    step holds) and ``step`` (the shape memory is planned for) are what the parallelism decision sizes its
    shards with."""

    choice: StepChoice | None
    for_ranks: Callable[[StepShape], TrainingPlan]
    error: DoesNotFitError | None
    batch_size: int
    step: StepShape


@dataclass(frozen=True)
class FitAsk:
    """What the sizing asks each fit ladder it runs (:func:`cudaload.policies.quantization.fit`, the training
    step's probes, the parallelism decision): the configuration (``dtype``, ``intent``, ``seq_len``,
    ``batch_size``, ``attn`` as the memory model knows it) and the request, whose quantization, placement and
    training wishes every ladder reads. A step that sizes something else makes its own
    (``dataclasses.replace``); none writes to it."""

    dtype: str
    intent: str
    seq_len: int
    batch_size: int
    attn: str | None
    request: Request

    def kwargs(self, **changed: Any) -> dict[str, Any]:
        """``fit``'s keywords (the parallelism decision takes the same), ``changed`` replacing or adding some."""
        r = self.request
        return {
            "dtype": self.dtype,
            "intent": self.intent,
            "seq_len": self.seq_len,
            "batch_size": self.batch_size,
            "attn": self.attn,
            "quantization": r.quantization,
            "device_map": r.device_map,
            "max_memory": r.max_memory,
            "allow_offload": r.allow_offload,
            "optimizer": r.optimizer,
            "gradient_checkpointing": r.gradient_checkpointing,
            **changed,
        }


@dataclass(frozen=True)
class Sized:
    """The fit ladder's result (``fit``), the training section's choice, the parallelism, where the weights go,
    the memory estimate, and the batch size planned (a packed step's sequences when none was declared)."""

    fit: FitResult
    training: TrainingPlan | None
    parallelism: Parallelism | None
    placement: Placement
    memory: MemoryEstimate
    batch_size: int

    @property
    def gpu_devices(self) -> list[str]:
        return [d for d in self.fit.fit.per_device if d.startswith("cuda")]


def size(
    req: Request,
    info: ModelInfo,
    caps: Capabilities,
    dtype: str,
    at: Decision,
    work: WorkSize,
    *,
    decode_cost: QuantDecodeCost | None = None,
    chunked_blocker: str | None = None,
) -> Sized:
    """``decode_cost``: the quantized rungs' decode speed the inference ladder states and weighs
    (:func:`cudaload.policies.quantization.fit`). ``chunked_blocker``: why the training ladder may not take
    cudaload's chunked loss (set when a first sizing took it with a parallelism that shards the head: sized
    again without it)."""
    intent = base_intent(req.intent)
    ask = FitAsk(
        dtype,
        intent,
        work.seq_len,
        # serving: one longest request must fit beside the weights; the paged cache for the rest is the serving
        # section's (transformers queues what does not fit at once)
        1 if req.intent == "serving" else work.batch_size,
        # cudaload's sdpa variants run sdpa's kernels and masks: the memory model's sdpa
        sdpa_family(at.choice),
        req,
    )
    fr: FitResult | None = None
    training: TrainingSizing | None = None
    nofit: DoesNotFitError | None = None
    try:
        if intent in TRAINING:
            training = _training(
                info,
                caps,
                ask,
                intent=req.intent,
                attn=str(ask.attn or at.choice),
                batch_declared=work.declared_batch is not None,
                batch_layout=req.batch_layout,
                tokens_per_step=req.tokens_per_step,
                lora=req.lora,
                loss=req.loss,
                assumed=work.assumed,
                chunked_blocker=chunked_blocker,
            )
            if training.error is not None:
                raise training.error
            assert training.choice is not None
            fr = training.choice.fit
        else:
            fr = fit(info, caps, **ask.kwargs(decode_cost=decode_cost))
    except DoesNotFitError as e:
        nofit = e
    # several GPUs (torchrun ranks, or a profile's N GPUs): DDP / FSDP2 / TP / layer split; may rescue a
    # model that no single process fits, or replace a quantization chosen only to fit one rank's GPU
    # the training section sized the step the ranks run (an assumed batch may have grown or shrunk)
    ranks = replace(ask, batch_size=training.batch_size) if training is not None else ask
    pd = decide_parallelism(
        info,
        caps,
        fr,
        nofit,
        strategy=req.parallelism,
        lower_latency=req.lower_latency,
        **ranks.kwargs(**({"step": training.step} if training is not None else {})),
    )
    par = pd.parallelism
    if (
        training is not None
        and training.choice is not None
        and training.choice.plan.loss.choice == "cudaload_chunked"
        and par is not None
        and par.world_size > 1
        and par.choice not in CHUNKED_LOSS_PARALLEL
        and chunked_blocker is None
    ):
        # the chunked loss reads the output head's weight in the causal LM's forward, outside the head's own:
        # FSDP2, DeepSpeed ZeRO-3 and tensor parallelism gather or split it in hooks that forward would skip.
        # DDP keeps a whole replica (checked on the CPU with gloo). Sized again without it: the ranks' memory is
        # then planned for the loss they will run
        why = (
            f"{par.choice} shards the model's parameters; the chunked loss reads the output head's weight outside "
            "the head's own forward, past the hooks that gather it (DDP only)"
        )
        return size(req, info, caps, dtype, at, work, decode_cost=decode_cost, chunked_blocker=why)
    if pd.fit is not None:
        fr = pd.fit
    assert fr is not None
    placement = pd.placement or fr.fit.placement
    assert placement is not None
    memory = pd.memory or _memory(fr)
    batch = ranks.batch_size if intent in TRAINING else work.batch_size
    section = None
    if training is not None:
        # no single process fits: the ranks run the step the parallelism decision sized them with
        section = training.choice.plan if training.choice is not None else training.for_ranks(training.step)
        causal = (
            info.auto_class == "AutoModelForCausalLM" and info.can_generate and not info.summary.is_encoder
        )
        compiled, payback = choose_layer_compile(
            caps,
            load_layer_compile_facts(),
            intent=intent,
            layout=section.layout.choice or "padded",
            attention=str(ask.attn or at.choice),
            parallel=pd.parallelism is not None and pd.parallelism.world_size > 1,
            remote_code=info.remote_code,
            causal_lm=causal,
            moe=info.summary.is_moe,
            checkpointing=fr.gradient_checkpointing is not None and fr.gradient_checkpointing.choice != "off",
        )
        if compiled.choice == "layers":
            compiled = _with_compiled_memory(compiled, info, intent, section, dtype, fr)
        section = replace(
            section, causal_lm=causal, layer_compile=compiled, layer_compile_payback_tokens=payback
        )
        gc = fr.gradient_checkpointing
        if section.step.checkpoint_every != 1 and (gc is None or gc.choice != "partial"):
            # a multi-process plan decided checkpointing for its ranks (off / every layer): the step says so
            section = replace(section, step=replace(section.step, checkpoint_every=1))
    return Sized(fr, section, pd.parallelism, placement, memory, batch)


def _with_compiled_memory(
    compiled: Decision, info: ModelInfo, intent: str, section: TrainingPlan, dtype: str, fr: FitResult
) -> Decision:
    """The compiled-layers decision with what compiling does to the step's peak: the plan stays sized for eager
    layers (training_setup runs them eager where the data set does not repay the compile, and a failed compile
    runs eager), so the memory the compiled step does not use is said here, not planned on."""
    kbit = section.kbit_upcast is not None and section.kbit_upcast.choice == "fp32"
    gc = fr.gradient_checkpointing is not None and fr.gradient_checkpointing.choice != "off"
    saved = compiled_layers_saving(
        info,
        intent=intent,
        step=section.step,
        act_bytes=4 if kbit else dtype_bytes(dtype),
        gradient_checkpointing=gc,
    )
    if saved <= 0:
        note = (
            "memory: planned as for eager layers (what inductor keeps for backward is measured only for "
            "LoRA / QLoRA without dropout on a bf16 stream)"
        )
    else:
        note = (
            f"memory: compiled, the step's peak is ~{byte_size(saved)} below the plan's (inductor recomputes "
            "the MLP's activation and product in backward instead of keeping them); the plan is sized for eager "
            "layers, which run where the data set does not repay the compile"
        )
    return replace(compiled, reasons=(*compiled.reasons, note))


def _memory(fr: FitResult) -> MemoryEstimate:
    gpu_devs = [d for d in fr.fit.per_device if d.startswith("cuda")]
    per_device = dict(fr.fit.per_device)
    return MemoryEstimate(
        terms=gpu_terms(fr.breakdown, len(gpu_devs)),
        total=sum(per_device.values()),
        per_device=per_device,
        budget=dict(fr.fit.budget),
        notes=fr.breakdown.notes,
    )


def _training(
    info: ModelInfo,
    caps: Capabilities,
    ask: FitAsk,
    *,
    intent: str,
    attn: str,
    batch_declared: bool,
    batch_layout: RequestedLayout,
    tokens_per_step: int | None,
    lora: Mapping[str, Any] | None,
    loss: RequestedLoss,
    assumed: Sequence[str],
    chunked_blocker: str | None = None,
) -> TrainingSizing:
    """The training section: layout, then the step bound, loss and checkpointing through the fit ladder
    (cudaload.policies.training.plan_step). The sequences a step holds and the step's shape the parallelism
    decision sizes its shards with come back in the result."""
    kbit = choose_kbit_upcast(intent, ask.dtype, "nf4" if intent == "qlora" else None)
    act_bytes = 4 if kbit is not None and kbit.choice == "fp32" else dtype_bytes(ask.dtype)
    layout = choose_layout(info, attn, act_bytes, batch_layout)
    notes = list(assumed)
    batch = ask.batch_size
    if not batch_declared:
        batch, note = _assumed_sequences(ask.seq_len, tokens_per_step, layout.choice == "packed")
        notes.append(note)
    dropout = choose_lora_dropout(intent, lora)
    r = int((lora or {}).get("r", LORA_R))
    cast = choose_adapter_cast(intent, ask.dtype, kbit)
    base = base_step(layout, batch, ask.seq_len, dropout, kbit, lora_r=r, adapter_cast=cast)
    least_step = _least_step(base, tokens_per_step, batch_declared)

    def probe(step: StepShape, gc: bool | None) -> FitResult:
        return fit(info, caps, **ask.kwargs(batch_size=batch, gradient_checkpointing=gc, step=step))

    def for_ranks(step: StepShape) -> TrainingPlan:
        return plan_for_ranks(
            step,
            layout=layout,
            attn=attn,
            lora_dropout=dropout,
            kbit_upcast=kbit,
            assumed=notes,
            adapter_cast=cast,
        )

    try:
        choice = plan_step(
            probe,
            info=info,
            caps=caps,
            layout=layout,
            attn=attn,
            base=base,
            tokens_per_step=tokens_per_step,
            loss=loss,
            gradient_checkpointing=ask.request.gradient_checkpointing,
            lora_dropout=dropout,
            kbit_upcast=kbit,
            assumed=notes,
            sequences_declared=batch_declared,
            adapter_cast=cast,
            chunked_blocker=chunked_blocker,
        )
    except DoesNotFitError as e:
        return TrainingSizing(None, for_ranks, e, batch, least_step)
    # the parallelism decision sizes ranks with its own checkpointing rungs (off / every layer): never partial
    step = replace(choice.step, checkpoint_every=1)
    if not choice.step.packed:
        batch = choice.step.sequences  # an assumed padded batch may have shrunk
    return TrainingSizing(choice, for_ranks, None, batch, step)


#: the parallelism under which cudaload's chunked loss runs: DDP's ranks each hold the whole model
CHUNKED_LOSS_PARALLEL = ("ddp",)


def _assumed_sequences(seq_len: int, tokens_per_step: int | None, packed: bool = False) -> tuple[int, str]:
    """The sequences a step is sized for where no batch was declared, and the note that says so: Trainer's
    default; with a declared tokens_per_step, enough sequences a step to fill it. A packed step is then filled
    with as many sequences as its token bound takes (the ``sequences_per_step`` decision)."""
    filled = -(-tokens_per_step // max(1, int(seq_len * TYPICAL_FILL))) if tokens_per_step else 0
    batch = max(DEFAULT_SEQUENCES, filled)
    why = (
        "enough to fill tokens_per_step"
        if filled > DEFAULT_SEQUENCES
        else "Trainer's default per_device_train_batch_size"
    )
    if packed:
        note = (
            f"the step's token bound sized for {batch} sequences ({why}); each step then holds as many "
            "sequences as the bound takes (declare batch_size= to cap them)"
        )
    else:
        note = f"at most {batch} sequences a step ({why}; declare batch_size=)"
    return batch, note


def _least_step(base: StepShape, tokens_per_step: int | None, batch_declared: bool) -> StepShape:
    """What the parallelism decision sizes shards with if no single process fits (replaced by the step the
    ladder chose where one does): a packed step at the training ladder's smallest bound, each rank running its
    own steps."""
    least = base.tokens
    if tokens_per_step is None and not batch_declared:
        least = base.longest  # an assumed batch may shrink to one sequence (plan_step does the same)
    elif base.packed:
        least = min(step_bounds(base.sequences, base.longest, tokens_per_step))
    return replace(
        base,
        tokens=least,
        longest=min(base.longest, least),
        sequences=base.sequences if base.packed else max(1, least // base.longest),
    )
