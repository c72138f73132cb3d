"""What a failed attempt leaves behind: its GPU memory released, its exception translated into cudaload's."""

from __future__ import annotations

import gc
import sys

from ..errors import (
    CheckpointError,
    CudaloadError,
    DependencyError,
    DoesNotFitError,
    LoadError,
    ModelNotFoundError,
)


def gpu_memory_snapshot() -> dict[int, int]:
    import torch

    if not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return {}
    return {i: torch.cuda.memory_allocated(i) for i in range(torch.cuda.device_count())}


def release_memory() -> None:
    """Drop what a failed attempt left: unreachable tensors, then the allocator's cached blocks."""
    import torch

    gc.collect()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def _classes(module: str, *names: str) -> tuple[type[BaseException], ...]:
    """The exception classes ``names`` of ``module`` where that module is imported: an exception of a module never
    imported cannot have been raised, so nothing is imported here and this module stays cheap to import."""
    mod = sys.modules.get(module)
    found = (getattr(mod, n, None) for n in names)
    return tuple(c for c in found if isinstance(c, type) and issubclass(c, BaseException))


def _chain(exc: BaseException) -> list[BaseException]:
    """``exc`` and the exceptions it was raised from (``raise ... from e``): transformers re-raises the Hub's
    errors as a plain ``OSError`` from the Hub's own (5.17-5.25 utils/hub.py ``cached_files``)."""
    out: list[BaseException] = []
    cur: BaseException | None = exc
    while cur is not None and cur not in out and len(out) < 8:
        out.append(cur)
        cur = cur.__cause__
    return out


def _is(exc: BaseException, classes: tuple[type[BaseException], ...]) -> bool:
    return bool(classes) and any(isinstance(e, classes) for e in _chain(exc))


def _not_found_classes() -> tuple[type[BaseException], ...]:
    """What says the model's files are not there: a missing file, and the Hub's repository, file and offline
    errors. A gated repository (a ``RepositoryNotFoundError``) and a revision that does not exist are other
    failures: they stay the generic load error, as their text never matched below."""
    hub = _classes(
        "huggingface_hub.errors",
        "RepositoryNotFoundError",
        "EntryNotFoundError",
        "LocalEntryNotFoundError",
        "OfflineModeIsEnabled",
    )
    return (FileNotFoundError, *hub)


def translate(exc: BaseException, where: str) -> CudaloadError:
    """A dependency's exception as cudaload's; carries the text, not the traceback (which pins tensors).

    Mapped by the exception's class (or the class it was raised from) where the dependency has one; the text
    is matched only for what arrives as a generic class, each fallback saying why."""
    if isinstance(exc, CudaloadError):
        exc.__traceback__ = None
        return exc
    text = f"{type(exc).__name__}: {exc}"
    low = text.lower()
    if _is(exc, _classes("torch", "OutOfMemoryError") + _classes("torch.cuda", "OutOfMemoryError")):
        return _out_of_memory(where, text)
    if _is(exc, _classes("safetensors", "SafetensorError")):
        return _corrupt(where, text)
    gated = _classes("huggingface_hub.errors", "GatedRepoError")
    if _is(exc, _not_found_classes()) and not _is(exc, gated):
        return _not_found(where, text)
    if isinstance(exc, ImportError):
        return _missing_package(where, text)
    # out of memory outside torch's caching allocator (a CUDA library's own allocation, NCCL, a kernel
    # package) arrives as a plain RuntimeError with only this text
    if "out of memory" in low:
        return _out_of_memory(where, text)
    # a safetensors error re-raised by other code without ``from`` keeps only safetensors' words
    if "safetensor" in low or ("header" in low and "deserializ" in low) or "incomplete metadata" in low:
        return _corrupt(where, text)
    # transformers has no class for an unknown model type: a ValueError (or the KeyError of its mapping)
    # whose text names it (5.17-5.25 models/auto/configuration_auto.py ``AutoConfig``)
    if "unrecognized model" in low or ("model_type" in low and "key" in low):
        return _unknown_model_type(where, text)
    # transformers raises its own "not found" as a plain OSError with no class of its own (5.17-5.25
    # utils/hub.py ``cached_files``: "does not appear to have a file named", "Can't load ...")
    if isinstance(exc, OSError) and (
        "does not appear to have" in low
        or "no such file" in low
        or "not a valid model identifier" in low
        or "can't load" in low
        or "offline" in low
    ):
        return _not_found(where, text)
    return LoadError(
        f"{where} failed", reasons=[text], fix="see the reason above; rerun with -v for the plan"
    )


def _out_of_memory(where: str, text: str) -> CudaloadError:
    return DoesNotFitError(
        f"{where} ran out of GPU memory",
        reasons=[text],
        fix="quantize (quantization='nf4'), shorten seq_len, add GPUs, or free memory held by other processes",
    )


def _corrupt(where: str, text: str) -> CudaloadError:
    return CheckpointError(
        f"{where}: the checkpoint is corrupt or truncated",
        reasons=[text],
        fix="re-download or re-save the checkpoint (a partial download leaves truncated .safetensors files)",
    )


def _not_found(where: str, text: str) -> CudaloadError:
    return ModelNotFoundError(
        f"{where}: model files not found",
        reasons=[text],
        fix="check the path, or download the model once with network access (it is then used offline)",
    )


def _missing_package(where: str, text: str) -> CudaloadError:
    return DependencyError(
        f"{where} needs a package that is missing or broken",
        reasons=[text],
        fix="install the package named above, or choose another option",
    )


def _unknown_model_type(where: str, text: str) -> CudaloadError:
    """transformers' message lists every model type it knows (~10 KB): keep the line that names this one."""
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
