"""What a failed attempt leaves behind: its GPU memory released, its exception translated into cudaload's."""

from __future__ import annotations

import gc

from ..errors import (
    CheckpointError,
    CudaloadError,
    DependencyError,
    DoesNotFitError,
    LoadError,
    ModelNotFoundError,
)


def _gpu_memory_snapshot() -> dict[int, int]:
    import torch

    if not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return {}
    return {i: torch.cuda.memory_allocated(i) for i in range(torch.cuda.device_count())}


def _release_memory() -> None:
    """Drop what a failed attempt left: unreachable tensors, then the allocator's cached blocks."""
    import torch

    gc.collect()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def _translate(exc: BaseException, where: str) -> CudaloadError:
    """A dependency's exception as cudaload's; carries the text, not the traceback (which pins tensors)."""
    if isinstance(exc, CudaloadError):
        exc.__traceback__ = None
        return exc
    text = f"{type(exc).__name__}: {exc}"
    low = text.lower()
    name = type(exc).__name__
    if name == "OutOfMemoryError" or "out of memory" in low:
        return DoesNotFitError(
            f"{where} ran out of GPU memory",
            reasons=[text],
            fix="quantize (quantization='nf4'), shorten seq_len, add GPUs, or free memory held by other processes",
        )
    if "safetensor" in low or ("header" in low and "deserializ" in low) or "incomplete metadata" in low:
        return CheckpointError(
            f"{where}: the checkpoint is corrupt or truncated",
            reasons=[text],
            fix="re-download or re-save the checkpoint (a partial download leaves truncated .safetensors files)",
        )
    if "unrecognized model" in low or ("model_type" in low and "key" in low):
        # transformers' message lists every model type it knows (~10 KB): keep the line that names this one
        import re

        m = re.search(r"model_type[\"']?\s*[:=]?\s*['\"]?([\w.-]+)|identifier:?\s*['\"]?([\w.-]+)", text)
        mtype = next((str(g) for g in (m.groups() if m else ()) if g), None)
        if mtype:
            import transformers
            from transformers.models.auto import configuration_auto

            known = configuration_auto.CONFIG_MAPPING_NAMES  # type: ignore[attr-defined]

            from ..errors import unknown_model_type

            err = unknown_model_type(mtype, known, transformers.__version__)
            err.message = f"{where}: {err.message}"
            return err
        return CheckpointError(
            f"{where}: unknown model type",
            reasons=[text[:300]],
            fix="upgrade transformers, or check config.json's model_type",
        )
    if isinstance(exc, (FileNotFoundError, OSError)) and (
        "does not appear to have" in low
        or "no such file" in low
        or "not a valid model identifier" in low
        or "can't load" in low
        or "offline" in low
    ):
        return ModelNotFoundError(
            f"{where}: model files not found",
            reasons=[text],
            fix="check the path, or download the model once with network access (it is then used offline)",
        )
    if isinstance(exc, ImportError):
        return DependencyError(
            f"{where} needs a package that is missing or broken",
            reasons=[text],
            fix="install the package named above, or choose another option",
        )
    return LoadError(
        f"{where} failed", reasons=[text], fix="see the reason above; rerun with -v for the plan"
    )
