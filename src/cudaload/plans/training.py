"""The training section of a Plan: how each optimizer step is laid out and computed, pure data.

It sits beside :mod:`cudaload.plans.plan` and below every policy, as :mod:`cudaload.plans.serving` does:
:mod:`cudaload.policies.training` decides the values, ``Plan`` holds and (de)serialises them, and
:mod:`cudaload.train.arguments` turns them into what a trainer takes (arguments, the collator, the packed data set).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .decision import Decision

#: the batch layouts cudaload plans
LAYOUTS = ("packed", "padded")
#: how a packed step tells the attention where its sequences start: ``cu_seq_lens`` (computed once per step by
#: the collator and passed to every layer: flash attention's varlen kernels) or ``position_ids`` (transformers
#: finds the boundaries from the restarting position ids and builds a block-diagonal mask: sdpa, flex, eager)
BOUNDARIES = ("cu_seq_lens", "position_ids")
#: the losses cudaload plans: transformers' own (fp32 logits over the vocabulary), Liger's fused linear
#: cross-entropy or cudaload's chunked loss (:mod:`cudaload.execute.chunked_loss`; both compute the logits chunk by
#: chunk, never whole)
LOSSES = ("transformers", "liger", "cudaload_chunked")


@dataclass(frozen=True)
class StepShape:
    """One optimizer step's work, as the memory model sees it.

    ``tokens``: the most tokens a step computes (packed: real tokens, at most the plan's ``tokens_per_step``;
    padded: ``sequences x longest``); ``sequences``: at most this many sequences a step; ``longest``: the
    longest sequence. ``packed``: the sequences are concatenated into one row (the attention keeps them
    apart). ``fused_loss``: a fused loss (Liger's fused linear cross-entropy or cudaload's chunked
    loss) instead of transformers' loss over fp32 logits. ``chunked_loss``: that fused loss, where taken, is
    cudaload's chunked loss rather than Liger's (the allocator's slack differs; read only with ``fused_loss``).
    ``lora_dropout``: PEFT's dropout on every adapted layer's input (a copy of each input kept for backward
    when > 0). ``kbit_upcast``: QLoRA's fp32 cast of every non-4-bit parameter (peft's
    ``prepare_model_for_kbit_training``), which makes the residual stream and activations fp32. ``autocast``:
    the forward runs under bf16/fp16 autocast, as ``Trainer(bf16=True)`` runs it (accelerate wraps the model's
    forward: accelerate/accelerator.py ``prepare_model``, ``get_mixed_precision_context_manager``).
    ``cast_outside_autocast``: the LoRA layers skip PEFT's copy of their input to fp32 under autocast (the plan's
    ``adapter_cast`` decision): the adapters keep the tensors the layer keeps anyway. ``checkpoint_every``: with
    gradient checkpointing on, only every n-th decoder layer is checkpointed (transformers'
    ``gradient_checkpointing_enable(every_n_layers=n)``: the layers whose index is a multiple of n, from 0), the
    others keep their activations; 1 (every layer) is the usual full checkpointing, and the value is read only
    where checkpointing is on (the plan's ``gradient_checkpointing`` decision ``partial``). ``compiled_layers``:
    the decoder layers run compiled (``training_setup``'s compiled layers), so inductor decides what backward
    keeps; a plan's own step is always eager (False): the layers run eager wherever the data set does not repay
    the compile, so the fit is sized for that."""

    tokens: int
    sequences: int
    longest: int
    packed: bool = False
    fused_loss: bool = False
    lora_dropout: float = 0.0
    kbit_upcast: bool = False
    autocast: bool = True
    #: LoRA's rank (the adapters' parameters and optimizer states scale with it); cudaload's default, 16
    lora_r: int = 16
    cast_outside_autocast: bool = False
    checkpoint_every: int = 1
    compiled_layers: bool = False
    chunked_loss: bool = False

    def __post_init__(self) -> None:
        if self.checkpoint_every < 1:
            raise ValueError(f"checkpoint_every must be >= 1 (every n-th layer), not {self.checkpoint_every}")

    def checkpointed_layers(self, layers: int) -> int:
        """How many of ``layers`` decoder layers are checkpointed with checkpointing on: those whose index is a
        multiple of ``checkpoint_every`` (transformers 5.17 modeling_utils.py:3198-3200, ``layer_index %
        every_n_layers == 0``)."""
        return -(-max(layers, 1) // self.checkpoint_every)

    @classmethod
    def padded(cls, batch_size: int, seq_len: int, **kw: Any) -> StepShape:
        """A padded step of ``batch_size`` sequences of ``seq_len`` tokens (the other fields as keywords)."""
        return cls(batch_size * seq_len, batch_size, seq_len, **kw)

    def to_dict(self) -> dict[str, Any]:
        return {
            "tokens": self.tokens,
            "sequences": self.sequences,
            "longest": self.longest,
            "packed": self.packed,
            "fused_loss": self.fused_loss,
            "lora_dropout": self.lora_dropout,
            "kbit_upcast": self.kbit_upcast,
            "autocast": self.autocast,
            "lora_r": self.lora_r,
            "cast_outside_autocast": self.cast_outside_autocast,
            "checkpoint_every": self.checkpoint_every,
            "compiled_layers": self.compiled_layers,
            "chunked_loss": self.chunked_loss,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> StepShape:
        return cls(
            tokens=int(d["tokens"]),
            sequences=int(d["sequences"]),
            longest=int(d["longest"]),
            packed=bool(d.get("packed", False)),
            fused_loss=bool(d.get("fused_loss", False)),
            lora_dropout=float(d.get("lora_dropout", 0.0)),
            kbit_upcast=bool(d.get("kbit_upcast", False)),
            autocast=bool(d.get("autocast", True)),
            lora_r=int(d.get("lora_r", 16)),
            cast_outside_autocast=bool(d.get("cast_outside_autocast", False)),
            # plans saved before partial checkpointing: every layer where checkpointing is on
            checkpoint_every=int(d.get("checkpoint_every", 1)),
            compiled_layers=bool(d.get("compiled_layers", False)),
            # plans saved before it: Liger's slack (the larger), whichever fused loss they took
            chunked_loss=bool(d.get("chunked_loss", False)),
        )


@dataclass(frozen=True)
class TrainingPlan:
    """How to train fast: each decision with its candidates and reasons, and what the plan expects of the data.

    ``layout``: ``packed`` (each step's sequences concatenated into one row, no padding computed) or
    ``padded``; ``tokens_per_step``: the decision on the most real tokens one step may hold (its choice a
    number as text); ``loss``: ``transformers``, ``liger`` or ``cudaload_chunked``; ``lora_dropout``, ``kbit_upcast`` and ``adapter_cast`` for
    adapters (None where they do not apply). ``step`` is the shape memory was planned for; ``boundaries``
    how a packed step marks its sequences (:data:`BOUNDARIES`); ``group_by_length``: padded batches of similar
    lengths (less padding); ``assumed``: what the plan took for granted about the data because it was not
    declared."""

    layout: Decision
    tokens_per_step: Decision
    loss: Decision
    step: StepShape
    boundaries: str | None = None
    group_by_length: bool = False
    lora_dropout: Decision | None = None
    kbit_upcast: Decision | None = None
    #: PEFT's fp32 copy of each adapted input: ``outside-autocast`` (skipped under autocast) or ``peft``
    adapter_cast: Decision | None = None
    assumed: tuple[str, ...] = ()
    notes: tuple[str, ...] = field(default_factory=tuple)
    #: the model trains as a causal LM (token labels, shifted by the model): cudaload's collators apply; a
    #: classifier or seq2seq model keeps its own labels and transformers' collators
    causal_lm: bool = True
    #: each decoder layer compiled (``layers``) or not (``off``), as planned; :func:`cudaload.training_setup`
    #: decides with the data (cudaload.policies.training.compile)
    layer_compile: Decision | None = None
    #: the tokens (one epoch of the data set) that repay the compile, where ``layer_compile`` is ``layers``
    layer_compile_payback_tokens: int | None = None
    #: a packed step's sequences: ``fill`` (as many as the token bound takes) or ``batch_size`` (at most
    #: ``step.sequences``); None where padded, and in plans saved before it (at most ``step.sequences``)
    sequences_per_step: Decision | None = None

    @property
    def fills_steps(self) -> bool:
        """Whether a packed step holds as many sequences as its token bound takes (not at most ``step.sequences``)."""
        return (
            self.packed and self.sequences_per_step is not None and self.sequences_per_step.choice == "fill"
        )

    @property
    def packed(self) -> bool:
        return self.layout.choice == "packed"

    def expects(self) -> dict[str, int]:
        """What the plan expects of the data: the longest sequence, the most sequences and tokens a step (a
        filled step: as many sequences as it has tokens, the most a step can hold)."""
        return {
            "longest_sequence": self.step.longest,
            "sequences_per_step": self.step.tokens if self.fills_steps else self.step.sequences,
            "tokens_per_step": self.step.tokens,
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            "layout": self.layout.to_dict(),
            "tokens_per_step": self.tokens_per_step.to_dict(),
            "loss": self.loss.to_dict(),
            "step": self.step.to_dict(),
            "boundaries": self.boundaries,
            "group_by_length": self.group_by_length,
            "lora_dropout": self.lora_dropout.to_dict() if self.lora_dropout else None,
            "kbit_upcast": self.kbit_upcast.to_dict() if self.kbit_upcast else None,
            "adapter_cast": self.adapter_cast.to_dict() if self.adapter_cast else None,
            "assumed": list(self.assumed),
            "notes": list(self.notes),
            "causal_lm": self.causal_lm,
            "layer_compile": self.layer_compile.to_dict() if self.layer_compile else None,
            "layer_compile_payback_tokens": self.layer_compile_payback_tokens,
            "sequences_per_step": self.sequences_per_step.to_dict() if self.sequences_per_step else None,
            "expects": self.expects(),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TrainingPlan:
        return cls(
            layout=Decision.from_dict(d["layout"]),
            tokens_per_step=Decision.from_dict(d["tokens_per_step"]),
            loss=Decision.from_dict(d["loss"]),
            step=StepShape.from_dict(d["step"]),
            boundaries=d.get("boundaries"),
            group_by_length=bool(d.get("group_by_length", False)),
            lora_dropout=Decision.from_dict(d["lora_dropout"]) if d.get("lora_dropout") else None,
            kbit_upcast=Decision.from_dict(d["kbit_upcast"]) if d.get("kbit_upcast") else None,
            adapter_cast=Decision.from_dict(d["adapter_cast"]) if d.get("adapter_cast") else None,
            assumed=tuple(d.get("assumed", ())),
            notes=tuple(d.get("notes", ())),
            causal_lm=bool(d.get("causal_lm", True)),
            # plans saved before the compiled layers: none planned
            layer_compile=Decision.from_dict(d["layer_compile"]) if d.get("layer_compile") else None,
            layer_compile_payback_tokens=d.get("layer_compile_payback_tokens"),
            # plans saved before it: at most step.sequences a step
            sequences_per_step=Decision.from_dict(d["sequences_per_step"])
            if d.get("sequences_per_step")
            else None,
        )

    def explain_lines(self) -> list[str]:
        """The training section of ``Plan.explain()``: the batch layout and step size, the loss, the adapters'
        settings, what was assumed."""
        s = self.step
        head = (
            f"as many sequences as fit {s.tokens:,} tokens a step, "
            if self.fills_steps
            else f"at most {s.sequences} sequences and {s.tokens:,} tokens a step, "
        ) + f"each sequence up to {s.longest:,} tokens"
        if self.packed and self.boundaries:
            head += f"; sequence boundaries by {self.boundaries}"
        lines = self.layout.explain_lines("batch layout")
        lines.insert(1, f"    {head}")
        # said with the layout they are about, not after the last decision of the section
        lines[2:2] = [*(f"    assumed: {a}" for a in self.assumed), *(f"    note: {n}" for n in self.notes)]
        lines += self.tokens_per_step.explain_lines("tokens per step")
        if self.sequences_per_step is not None:
            lines += self.sequences_per_step.explain_lines("sequences per step")
        lines += self.loss.explain_lines("loss")
        if self.lora_dropout is not None:
            lines += self.lora_dropout.explain_lines("LoRA dropout")
        if self.kbit_upcast is not None:
            lines += self.kbit_upcast.explain_lines("k-bit preparation")
        if self.adapter_cast is not None:
            lines += self.adapter_cast.explain_lines("adapter input cast")
        if self.layer_compile is not None:
            lines += self.layer_compile.explain_lines("compiled layers")
        return lines
