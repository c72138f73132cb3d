"""Bytes before loading, term by term.

The figures the model rests on are named constants, each saying where it comes from (a measurement on the
H200, or the file and line of the library whose behaviour it follows); the functions add them up per term,
and :func:`breakdown` says how the terms distribute over a layer split (what
:mod:`cudaload.policies.placement` and :mod:`cudaload.policies.parallelism` divide among devices).

Where each part lives:

* :mod:`.constants`: the named figures and their provenance (the CUDA context, int8 / nf4 bytes per weight,
  8-bit optimizer states, the loss per logit, the allocator's slack, eager and math-path attention scores,
  Adafactor's step, the tied embedding's gradient), the optimizers cudaload plans with, the LoRA defaults.
* :mod:`.weights`: ``param_split`` (where each parameter lives: decoder layer, embedding side, output head),
  ``weight_bytes`` (in the load dtype or under int8 / nf4), ``adapter_params`` (LoRA's trainable count).
* :mod:`.kv_cache`: ``kv_cache_bytes`` (full-attention and sliding-window layers).
* :mod:`.optimizer`: ``default_optimizer``, ``master_weights`` (fp32 master copy or not),
  ``optimizer_state_bytes`` (GPU and host bytes of the states).
* :mod:`.activations`: a training step's activations by phase, ``TrainingPhases`` and
  ``training_activations``, ``compiled_layers_saving`` (what compiled decoder layers keep fewer), and ``sdpa_math`` (when torch's sdpa materialises the scores).
* :mod:`.shape`: :class:`MemoryShape`, one configuration as the memory model sees it (dtype, quantization,
  intent, the work, attention, the training settings): what :func:`breakdown_of` takes.
* :mod:`.terms`: :class:`Breakdown`, :func:`breakdown_of` and :func:`breakdown` (the same, as keywords), every term for one configuration and how it
  splits per layer, with the embedding, with the head and on every device (inference's working set is
  computed there).
* :mod:`.totals`: ``gpu_terms`` and ``estimate`` (the terms for a number of GPUs, with the total),
  ``allocated_bytes`` and ``reserved_bytes`` (what the caching allocator reports of that total).

A test that patches a constant patches it in the module that reads it (``LOSS_BYTES_PER_LOGIT`` in
:mod:`.activations`); the names here are re-exports.
"""

from __future__ import annotations

from .activations import TrainingPhases, compiled_layers_saving, sdpa_math, training_activations
from .constants import (
    ADAFACTOR_STEP_FP32_COPIES,
    ADAM8BIT_BYTES_PER_PARAM,
    ALLOCATOR_SLACK_PER_LOGIT,
    ATTENTION_BACKWARD_ACTS,
    BNB_OPTIMIZERS,
    CHUNKED_SLACK_PER_LOGIT,
    CUDA_CONTEXT_BYTES,
    EAGER_BACKWARD_BYTES,
    EAGER_SAVED_FP32,
    FP32_SCORES_BACKWARD_BYTES,
    INT8_BYTES_PER_PARAM,
    LORA_ALPHA,
    LORA_DROPOUT,
    LORA_R,
    LOSS_BYTES_PER_LOGIT,
    NF4_ABSMAX_DOUBLE_QUANT,
    NF4_ABSMAX_PLAIN,
    NF4_BYTES_PER_PARAM,
    OPTIMIZERS,
    TIED_GRAD_EXTRA_BYTES,
    GiB,
    MiB,
)
from .kv_cache import kv_cache_bytes
from .optimizer import default_optimizer, master_weights, optimizer_state_bytes
from .shape import MemoryShape
from .terms import Breakdown, breakdown, breakdown_of
from .totals import allocated_bytes, estimate, gpu_terms, reserved_bytes
from .weights import Split, adapter_params, param_split, weight_bytes

__all__ = [
    "ADAFACTOR_STEP_FP32_COPIES",
    "ADAM8BIT_BYTES_PER_PARAM",
    "ALLOCATOR_SLACK_PER_LOGIT",
    "ATTENTION_BACKWARD_ACTS",
    "BNB_OPTIMIZERS",
    "CHUNKED_SLACK_PER_LOGIT",
    "CUDA_CONTEXT_BYTES",
    "EAGER_BACKWARD_BYTES",
    "EAGER_SAVED_FP32",
    "FP32_SCORES_BACKWARD_BYTES",
    "INT8_BYTES_PER_PARAM",
    "LORA_ALPHA",
    "LORA_DROPOUT",
    "LORA_R",
    "LOSS_BYTES_PER_LOGIT",
    "NF4_ABSMAX_DOUBLE_QUANT",
    "NF4_ABSMAX_PLAIN",
    "NF4_BYTES_PER_PARAM",
    "OPTIMIZERS",
    "TIED_GRAD_EXTRA_BYTES",
    "Breakdown",
    "GiB",
    "MemoryShape",
    "MiB",
    "Split",
    "TrainingPhases",
    "adapter_params",
    "allocated_bytes",
    "breakdown",
    "breakdown_of",
    "compiled_layers_saving",
    "default_optimizer",
    "estimate",
    "gpu_terms",
    "kv_cache_bytes",
    "master_weights",
    "optimizer_state_bytes",
    "param_split",
    "reserved_bytes",
    "sdpa_math",
    "training_activations",
    "weight_bytes",
]
