"""The terms for a number of GPUs and their total (:func:`estimate`), and what of that total the caching
allocator reports as its allocated and reserved peaks."""

from __future__ import annotations

from ...model_info import ModelInfo
from ...plans.training import StepShape
from .constants import CUDA_CONTEXT_BYTES
from .shape import MemoryShape
from .terms import Breakdown, breakdown_of


def estimate(
    info: ModelInfo,
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
    step: StepShape | None = None,
) -> dict[str, int]:
    """The terms for ``devices`` GPUs (each with a CUDA context and its own activations), with ``total``.
    ``step``: a training step's shape (see :class:`MemoryShape`)."""
    shape = MemoryShape(
        dtype=dtype,
        quantization=quantization,
        intent=intent,
        seq_len=seq_len,
        batch_size=batch_size,
        attn=attn,
        optimizer=optimizer,
        gradient_checkpointing=gradient_checkpointing,
        step=step,
    )
    terms = gpu_terms(breakdown_of(info, shape), devices)
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
