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
        return _error("memory", where, text)
    if _is(exc, _classes("safetensors", "SafetensorError")):
        return _error("corrupt", where, text)
    gated = _classes("huggingface_hub.errors", "GatedRepoError")
    if _is(exc, _not_found_classes()) and not _is(exc, gated):
        return _error("not_found", where, text)
    if isinstance(exc, ImportError):
        return _error("package", where, text)
    # out of memory outside torch's caching allocator (a CUDA library's own allocation, NCCL, a kernel
    # package) arrives as a plain RuntimeError with only this text
    if "out of memory" in low:
        return _error("memory", where, text)
    # a safetensors error re-raised by other code without ``from`` keeps only safetensors' words
    if "safetensor" in low or ("header" in low and "deserializ" in low) or "incomplete metadata" in low:
        return _error("corrupt", where, text)
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
        return _error("not_found", where, text)
    return _error("other", where, text)


#: each failure cudaload names: its error class, the message after ``where``, and the fix
_KINDS: dict[str, tuple[type[CudaloadError], str, str]] = {
    "memory": (
        DoesNotFitError,
        " ran out of GPU memory",
        "quantize (quantization='nf4'), shorten seq_len, add GPUs, or free memory held by other processes",
    ),
    "corrupt": (
        CheckpointError,
        ": the checkpoint is corrupt or truncated",
        "re-download or re-save the checkpoint (a partial download leaves truncated .safetensors files)",
    ),
    "not_found": (
        ModelNotFoundError,
        ": model files not found",
        "check the path, or download the model once with network access (it is then used offline)",
    ),
    "package": (
        DependencyError,
        " needs a package that is missing or broken",
        "install the package named above, or choose another option",
    ),
    "other": (LoadError, " failed", "see the reason above; rerun with -v for the plan"),
}


def _error(kind: str, where: str, text: str) -> CudaloadError:
    cls, what, fix = _KINDS[kind]
    return cls(f"{where}{what}", reasons=[text], fix=fix)


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
