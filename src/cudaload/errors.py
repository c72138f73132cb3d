"""cudaload's one error tree.

Every error cudaload raises is a :class:`CudaloadError`, and each class also subclasses the builtin
exception callers already catch (``ValueError``, ``FileNotFoundError``, ``ImportError``, ``MemoryError``,
``RuntimeError``), so code written against plain ``from_pretrained`` keeps working. Each message ends with
the fix.

    CudaloadError
    ├── ConfigurationError (ValueError)       bad option, bad environment variable, bad profile
    │   ├── InvalidChoiceError                an explicit choice (attn, dtype, quantization) is not valid here
    │   └── DeviceSelectionError              CUDA_VISIBLE_DEVICES / device index that matches no GPU
    ├── ModelNotFoundError (FileNotFoundError) path missing, Hub id not cached while offline
    ├── CheckpointError (ValueError)           corrupt or truncated safetensors, unknown model type
    │   └── CheckpointCoverageError (+ LoadError) its tensors do not cover the model (missing, extra, reshaped)
    ├── DependencyError (ImportError)          an optional package is missing, broken or out of range
    ├── DoesNotFitError (MemoryError)          nothing in the fit ladder fits; says what would
    └── LoadError (RuntimeError)               transformers failed, or verification found a mismatch
        └── VerificationError                  the loaded model is not what the plan said

    CudaloadWarning (UserWarning)              a legal input that is probably not what was meant
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence


class CudaloadError(Exception):
    """Base of every cudaload error. ``fix`` says what to do; ``reasons`` lists the detailed causes."""

    def __init__(self, message: str, *, fix: str | None = None, reasons: Sequence[str] = ()) -> None:
        self.message = message
        self.fix = fix
        self.reasons = tuple(reasons)
        super().__init__(self._render())

    def _render(self) -> str:
        parts = [self.message]
        parts.extend(f"  - {r}" for r in self.reasons)
        if self.fix:
            parts.append(f"Fix: {self.fix}")
        return "\n".join(parts)

    def __str__(self) -> str:
        return self._render()


class ConfigurationError(CudaloadError, ValueError):
    """An option, environment variable or profile is invalid."""


class InvalidChoiceError(ConfigurationError):
    """An explicit choice cannot be honoured on this machine; ``reasons`` says why."""


class DeviceSelectionError(ConfigurationError):
    """``CUDA_VISIBLE_DEVICES`` or a requested device matches no GPU."""


class ModelNotFoundError(CudaloadError, FileNotFoundError):
    """The model path does not exist, or a Hub id is not in the local cache while offline."""


class CheckpointError(CudaloadError, ValueError):
    """The checkpoint or config is unreadable: corrupt, truncated, or of an unknown model type."""


class DependencyError(CudaloadError, ImportError):
    """An optional dependency is missing, its compiled part does not load, or its version is out of range."""


class DoesNotFitError(CudaloadError, MemoryError):
    """The model does not fit the machine under any allowed option. ``suggestions``: the alternatives the
    ``fix`` names, as structured values (cudaload.policies.quantization.Suggestion), each checked to fit."""

    def __init__(
        self,
        message: str,
        *,
        fix: str | None = None,
        reasons: Sequence[str] = (),
        suggestions: Sequence[object] = (),
    ) -> None:
        self.suggestions = tuple(suggestions)
        super().__init__(message, fix=fix, reasons=reasons)


class LoadError(CudaloadError, RuntimeError):
    """Loading failed inside transformers (translated), or after loading the model was unusable."""


class VerificationError(LoadError):
    """The loaded model differs from the plan (device, dtype, attention, offloaded modules)."""


class CheckpointCoverageError(CheckpointError, LoadError):
    """The checkpoint's tensors do not cover the model: some are missing (they would be randomly initialised),
    have no place in the model's architecture, or have another shape. ``missing``, ``unexpected`` and
    ``mismatched`` name them (model names, as transformers reports them). The fix names ``new_weights=``, the
    keyword for weights meant to be new (:mod:`cudaload.checkpoint_coverage`).

    Also a :class:`LoadError` (a ``RuntimeError``): ``from_pretrained`` raises ``RuntimeError`` for mismatched
    shapes, and code that catches it keeps working."""

    def __init__(
        self,
        message: str,
        *,
        fix: str | None = None,
        reasons: Sequence[str] = (),
        missing: Sequence[str] = (),
        unexpected: Sequence[str] = (),
        mismatched: Sequence[str] = (),
    ) -> None:
        self.missing = tuple(missing)
        self.unexpected = tuple(unexpected)
        self.mismatched = tuple(mismatched)
        super().__init__(message, fix=fix, reasons=reasons)


class CudaloadWarning(UserWarning):
    """A legal input that is probably not what was meant: a context longer than the model's, a device that is
    not there, an option with no effect in this call. Warned once, at the request (:mod:`cudaload.request`);
    the message ends with what to do. ``warnings.simplefilter("error", CudaloadWarning)`` makes them errors."""


#: words users type for a name cudaload spells otherwise, meant before any spelling that merely looks alike
#: ("finetune" is closer in letters to "inference" than to "training"; "rank" to "rank_pattern" than to "r").
#: A synonym counts only where its names are among the names asked about.
SYNONYMS: dict[str, tuple[str, ...]] = {
    # intent=
    "finetune": ("training", "lora"),
    "fine-tune": ("training", "lora"),
    "fine_tune": ("training", "lora"),
    "fine-tuning": ("training", "lora"),
    "finetuning": ("training", "lora"),
    "sft": ("training", "lora"),
    "train": ("training",),
    "full": ("training",),
    "peft": ("lora",),
    "adapter": ("lora",),
    "adapters": ("lora",),
    "4bit": ("qlora",),
    "serve": ("serving",),
    "server": ("serving",),
    "vllm": ("serving",),
    "infer": ("inference",),
    "generate": ("inference",),
    "generation": ("inference",),
    "eval": ("inference",),
    "predict": ("inference",),
    # lora={...}: LoraConfig's names
    "rank": ("r",),
    "lora_r": ("r",),
    "lora_rank": ("r",),
    "alpha": ("lora_alpha",),
    "dropout": ("lora_dropout",),
    "target": ("target_modules",),
    "targets": ("target_modules",),
    "modules": ("target_modules",),
    "target_module": ("target_modules",),
}


def close_names(word: str, known: Iterable[str], n: int = 5) -> list[str]:
    """Up to ``n`` names in ``known`` close to ``word``, best first: its :data:`SYNONYMS` first, then
    difflib's (ratio >= 0.6) and names that contain it: what an error about an unknown name shows instead of
    the whole list."""
    import difflib

    names = sorted(set(known))
    lowered = {k.lower(): k for k in names}
    meant = [s for s in SYNONYMS.get(word.strip().lower(), ()) if s in lowered]
    hits = meant + [
        h for h in difflib.get_close_matches(word.lower(), list(lowered), n=n, cutoff=0.6) if h not in meant
    ]
    # a prefix or substring match ("qwen" -> qwen2, qwen3...) counts too: difflib ranks short words low
    hits += [k for k in lowered if word and word.lower() in k and k not in hits]
    return [lowered[h] for h in hits[:n]]


def unknown_model_type(model_type: str, known: Iterable[str], transformers_version: str) -> CheckpointError:
    """The error for a config whose ``model_type`` this transformers does not know: one line with the close
    names (transformers' own message lists every model type, ~10 KB)."""
    close = close_names(model_type, known)
    hint = f"; close names: {', '.join(close)}" if close else ""
    return CheckpointError(
        f"unknown model type {model_type!r} for transformers {transformers_version}{hint}",
        fix="correct model_type in config.json, or upgrade transformers if the model is newer than it",
    )
