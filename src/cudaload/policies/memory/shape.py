"""What one memory estimate is asked about: :class:`MemoryShape`, the one value the fit ladder, the
parallelism decision and the totals pass to :func:`cudaload.policies.memory.breakdown_of` in place of
``breakdown()``'s ten keywords (a rung that varies the quantization or the optimizer is
``dataclasses.replace(shape, ...)``)."""

from __future__ import annotations

from dataclasses import dataclass

from ...plans.training import StepShape


@dataclass(frozen=True)
class MemoryShape:
    """One configuration as the memory model sees it.

    ``dtype`` / ``quantization`` (None, "int8", "nf4") / ``attn``: how the weights are loaded and attention
    runs; ``intent`` ("inference", "training", "lora", "qlora"), ``seq_len`` and ``batch_size``: the work.
    Training only: ``optimizer`` (None: :func:`cudaload.policies.memory.default_optimizer`),
    ``gradient_checkpointing`` (None: on), ``gradient_accumulation_steps`` (adds no bytes: gradients persist
    across micro-steps, and the estimate counts them at the activation peak already) and ``step``
    (:class:`cudaload.plans.training.StepShape`: packed or padded tokens, the loss, LoRA dropout, QLoRA's fp32
    cast; None: a padded step of ``batch_size`` x ``seq_len`` with the plan's defaults: no dropout, no fp32
    cast, under autocast)."""

    dtype: str
    quantization: str | None
    intent: str
    seq_len: int
    batch_size: int
    attn: str = "sdpa"
    optimizer: str | None = None
    gradient_checkpointing: bool | None = None
    gradient_accumulation_steps: int = 1
    step: StepShape | None = None

    @property
    def training(self) -> bool:
        return self.intent != "inference"
