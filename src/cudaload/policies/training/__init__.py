"""Training decisions: how each optimizer step is laid out and computed, for speed as well as fit.

* **batch layout** (:func:`choose_layout`): ``packed`` -- a step's sequences concatenated into one row,
  position ids restarting at each sequence, so no padding is computed -- where the attention keeps the
  sequences apart without materialising scores over the whole row (flash attention's varlen kernels, told the
  boundaries once per step; sdpa or flex_attention with transformers' block-diagonal mask); else ``padded``,
  grouped by length where the batch holds several sequences.
* **tokens per step** (:func:`plan_step`): at most ``batch_size`` sequences and at most ``tokens_per_step``
  real tokens a step. The bound is what memory is planned for, so a step of long sequences never runs out of
  memory; it is the largest that fits without gradient checkpointing, down to what typical instruction data
  puts in ``batch_size`` sequences, before the fused loss and then checkpointing are tried.
* **activation checkpointing**: off where some bound fits without it; else *partial* (only every n-th decoder
  layer checkpointed, transformers' ``every_n_layers``; the largest n that fits, the least recompute) before
  checkpointing every layer (:func:`partial_problems` says where partial cannot run).
* **the loss**: transformers' (fp32 logits over the vocabulary), or Liger's fused linear cross-entropy where
  only it makes the step fit without checkpointing (measured slower where memory was not short).
* **LoRA dropout** (:func:`choose_lora_dropout`) and **QLoRA's k-bit preparation** (:func:`choose_kbit_upcast`).

Each is a :class:`~cudaload.plans.decision.Decision` with its candidates, like every other policy; the fits are
probed through a function the planner passes in (pure arithmetic: :func:`cudaload.policies.quantization.fit`).
Measured training throughput (:class:`TrainingFacts`, shipped in the priors file) ranks the attention
backends for training in :mod:`cudaload.policies.attention.choice`.

Where each part lives: :mod:`.step` (:func:`plan_step`, :func:`base_step`, :func:`plan_for_ranks`), :mod:`.ladder`
(the walk over the rungs), :mod:`.bounds` (the step bounds and the ``tokens_per_step`` decision), :mod:`.loss`,
:mod:`.checkpointing`, :mod:`.layout`, :mod:`.adapters` (LoRA dropout, QLoRA's preparation, the adapters' input
cast). Their public names are re-exported here.
"""

from __future__ import annotations

from ..training_facts import TrainingFacts, training_facts_for
from .adapters import choose_adapter_cast, choose_kbit_upcast, choose_lora_dropout
from .bounds import ALIGN, DEFAULT_SEQUENCES, TYPICAL_FILL, step_bounds
from .checkpointing import OFFLOAD_WHY, PARTIAL_CHECKPOINTING_SINCE, partial_problems
from .ladder import EVERY, OFF, Attempt, FitProbe
from .layout import RequestedLayout, boundaries_for, choose_layout, packing_blockers, packing_costs
from .loss import RequestedLoss, liger_problems
from .step import StepChoice, base_step, plan_for_ranks, plan_step

__all__ = [
    "ALIGN",
    "DEFAULT_SEQUENCES",
    "EVERY",
    "OFF",
    "OFFLOAD_WHY",
    "PARTIAL_CHECKPOINTING_SINCE",
    "TYPICAL_FILL",
    "Attempt",
    "FitProbe",
    "RequestedLayout",
    "RequestedLoss",
    "StepChoice",
    "TrainingFacts",
    "base_step",
    "boundaries_for",
    "choose_adapter_cast",
    "choose_kbit_upcast",
    "choose_layout",
    "choose_lora_dropout",
    "liger_problems",
    "packing_blockers",
    "packing_costs",
    "partial_problems",
    "plan_for_ranks",
    "plan_step",
    "step_bounds",
    "training_facts_for",
]
