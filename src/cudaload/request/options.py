"""One option each: its type, range or name checked, the closest valid name shown, and the value normalised as the
policies read it."""

from __future__ import annotations

import math
import numbers
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from .. import _env
from ..errors import SYNONYMS, ConfigurationError, InvalidChoiceError, close_names
from ..plans.decode import DECODE_MODES
from ..plans.training import LAYOUTS, LOSSES

if TYPE_CHECKING:
    from ..policies.quant_methods import RequestedQuantization
    from ..tuning.timings import Timings

ENTRIES = ("plan", "load_model", "tune")
TRAINING_INTENTS = ("training", "lora", "qlora")
BATCH_LAYOUTS = ("auto", *LAYOUTS)
TRAINING_LOSSES = ("auto", *LOSSES)
#: how generate() decodes (cudaload.policies.decode): decided from the declared work, or asked for
DECODES = ("auto", *DECODE_MODES)
#: the quantization names (case-insensitive; "no" / "off" mean "none"), as policies.quant_methods reads them
QUANTIZATIONS = ("auto", "none", "int8", "nf4")
_QUANTIZATION_SPELLINGS = (*QUANTIZATIONS, "no", "off")
#: dtype names policies.dtype.normalize_dtype accepts, shown when one is not
_DTYPE_NAMES = ("auto", "bfloat16", "bf16", "float16", "fp16", "float32", "fp32")
_CLASS_NAME = re.compile(r"^[A-Za-z_]\w*$")


def closest(word: str, names: tuple[str, ...] | list[str]) -> list[str]:
    """The names closest to ``word``, best first: :func:`~cudaload.errors.close_names`, else a looser match on
    the letters and digits alone ("flash3" -> flash_attention_3)."""
    close = close_names(word, names, n=3)
    if close:
        return close
    import difflib

    def bare(s: str) -> str:
        return re.sub(r"[^a-z0-9]", "", s.lower())

    scored = sorted(
        ((difflib.SequenceMatcher(None, bare(word), bare(n)).ratio(), n) for n in names), key=lambda t: -t[0]
    )
    return [n for score, n in scored[:3] if score >= 0.4]


def _unknown(
    name: str,
    value: Any,
    names: tuple[str, ...],
    what: str,
    error: type[ConfigurationError] = ConfigurationError,
) -> ConfigurationError:
    close = closest(str(value), names)
    # a word with two meanings ("finetune": a full fine-tune or adapters) names both
    meant = [s for s in SYNONYMS.get(str(value).strip().lower(), ()) if s in names]
    if len(meant) > 1:
        options = " or ".join(f"{name}={m!r}" for m in meant)
        return error(
            f"{name}={value!r} is not {what}; did you mean {' or '.join(repr(m) for m in meant)}?",
            fix=f"use {options} (one of: {', '.join(names)})",
        )
    hint = f"; did you mean {close[0]!r}?" if close else ""
    first = close[0] if close else names[0]
    return error(
        f"{name}={value!r} is not {what}{hint}",
        fix=f"use {name}={first!r} (one of: {', '.join(names)})",
    )


def choice(
    name: str, value: Any, names: tuple[str, ...], *, error: type[ConfigurationError] = ConfigurationError
) -> str:
    if not isinstance(value, str):
        raise error(
            f"{name}={value!r} is not a name", fix=f"use {name}={names[0]!r} (one of: {', '.join(names)})"
        )
    if value not in names:
        raise _unknown(name, value, names, f"a valid {name}", error)
    return value


def lowered_or_auto(value: str | None) -> str:
    return (value or "auto").strip().lower()


def lowercase_choice(name: str, value: Any, names: tuple[str, ...]) -> str | None:
    """A name read as policies.training reads it: None is "auto", case and spaces do not count."""
    if value is None or (isinstance(value, str) and lowered_or_auto(value) in names):
        return value  # type: ignore[no-any-return]
    raise _unknown(name, value, names, f"a {name} cudaload plans")


def positive_int(name: str, value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        if int(value) >= 1:
            return int(value)
        raise ConfigurationError(
            f"{name}={value!r} must be 1 or more", fix=f"pass {name}=1 or more (or leave it out)"
        )
    example, note = _EXAMPLES.get(name, 1), ""
    if isinstance(value, bool):
        example = 1  # True is 1 to Python: that is what was meant, if anything
    elif (isinstance(value, float) and math.isfinite(value) and value >= 1) or (
        isinstance(value, str) and value.strip().isdigit() and int(value) >= 1
    ):
        example = int(value)
    elif isinstance(value, str) and _SHORTHAND.match(value):
        # "2k" is 2000 to some and 2048 to others: not read either way, the fix says both
        m = _SHORTHAND.match(value)
        assert m is not None
        n, unit = float(m.group(1)), m.group(2).lower()
        scale = {"k": (1000, 1024), "m": (1000**2, 1024**2)}[unit]
        example = int(n * scale[1])
        note = f" ({value!r} could be {int(n * scale[0])} or {example}: write the number)"
    what = {"seq_len": "tokens", "new_tokens": "tokens", "tokens_per_step": "tokens"}.get(name, "")
    raise ConfigurationError(
        f"{name}={value!r} must be a whole number"
        + (f" of {what}" if what else "")
        + (" (True is not a number here)" if isinstance(value, bool) else "")
        + note,
        fix=f"pass an integer{f' number of {what}' if what else ''}, 1 or more: e.g. {name}={example}; or leave "
        "it out",
    )


#: what the fix of a number that is not one shows, per option: a value a caller would write
_EXAMPLES = {
    "seq_len": 2048,
    "batch_size": 1,
    "new_tokens": 256,
    "generate_calls": 1,
    "tokens_per_step": 16384,
}
#: "2k", "4K", "1.5k", "1m": a size in shorthand
_SHORTHAND = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kKmM])\s*$")


def flag(name: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if type(value).__name__ == "bool_":  # numpy's
        return bool(value)
    raise ConfigurationError(
        f"{name}={value!r} must be True or False", fix=f"pass {name}=True or {name}=False"
    )


def tristate(name: str, value: Any) -> bool | None:
    if value is None or isinstance(value, bool):
        return value
    raise ConfigurationError(
        f"{name}={value!r} must be True, False or None (auto)",
        fix=f"pass {name}=True, {name}=False, or {name}=None to let cudaload decide",
    )


def attention_name(value: Any) -> str:
    """``value`` as an ``attn=`` name cudaload plans ("auto" or an attention implementation), stripped; an
    :class:`~cudaload.errors.InvalidChoiceError` naming the closest one otherwise."""
    from ..policies.attention.names import ALL_NAMES

    names = ("auto", *ALL_NAMES)
    if not isinstance(value, str):
        raise InvalidChoiceError(
            f"attn={value!r} is not a name", fix=f"use attn='auto' or one of: {', '.join(ALL_NAMES)}"
        )
    name = value.strip()
    if name not in names:
        close = closest(name, names)
        raise InvalidChoiceError(
            f"attn={value!r} is not an attention implementation cudaload plans"
            + (f"; did you mean {close[0]!r}?" if close else ""),
            fix="use attn='auto' (cudaload picks)"
            + (f" or attn={close[0]!r}" if close else "")
            + f" (one of: {', '.join(ALL_NAMES)})",
        )
    return name


def check_dtype(value: Any) -> str:
    text = str(value)
    if isinstance(value, str) and text.strip().lower() == "auto":
        return "auto"
    from ..policies.dtype import normalize_dtype

    try:
        normalize_dtype(text)
    except InvalidChoiceError:
        raise _unknown(
            "dtype", value, _DTYPE_NAMES, "a dtype cudaload loads in", InvalidChoiceError
        ) from None
    return text


def check_quantization(value: Any) -> str | None:
    if value is None:
        return None  # policies.quantization reads None as "auto"
    if isinstance(value, str) and value.strip().lower() in _QUANTIZATION_SPELLINGS:
        return value
    four_bit = isinstance(value, str) and "4" in value
    close = closest(str(value), QUANTIZATIONS) if isinstance(value, str) and not four_bit else []
    raise InvalidChoiceError(
        f"quantization={value!r} is not one cudaload plans"
        + (f"; did you mean {close[0]!r}?" if close else "")
        + ("; its 4-bit form is 'nf4' (bitsandbytes NF4, double quantization)" if four_bit else ""),
        fix="use quantization='auto', 'none', 'int8' or 'nf4'",
    )


#: each spelling check_quantization accepts (lowered, stripped), as the name the policies read
_QUANTIZATION_NAMES: dict[str, RequestedQuantization] = {
    "auto": "auto",
    "none": "none",
    "no": "none",
    "off": "none",
    "int8": "int8",
    "nf4": "nf4",
}


def quantization_name(value: str | None) -> RequestedQuantization:
    """A ``quantization=`` :func:`check_quantization` passed, as the policies read it: None is "auto", case and
    spaces do not count, "no" / "off" are "none"."""
    return _QUANTIZATION_NAMES[lowered_or_auto(value)]


def check_optimizer(value: Any) -> str | None:
    if value is None:
        return None  # read as "auto" (policies.quantization.training_ladder)
    from ..policies.memory import OPTIMIZERS

    names = ("auto", *OPTIMIZERS)
    if not isinstance(value, str) or value.strip().lower() not in names:
        raise _unknown("optimizer", value, names, "an optimizer cudaload plans", InvalidChoiceError)
    return value


def check_parallelism(value: Any) -> str:
    from ..policies.parallelism import REQUESTS

    return choice("parallelism", value, tuple(REQUESTS))


def _names(name: str, value: Any, example: str) -> tuple[str, ...]:
    """A sequence of names. One string is refused: iterated, it is one name per character."""
    if value is None:
        return ()
    if isinstance(value, str):
        parts = [p.strip() for p in value.split(",") if p.strip()]
        raise ConfigurationError(
            f"{name}={value!r} is one string, not a list of names: it would be read character by character",
            fix=f"pass a list: {name}={parts or [example]!r}",
        )
    if isinstance(value, Mapping) or not hasattr(value, "__iter__"):
        raise ConfigurationError(
            f"{name}={value!r} is not a list of names", fix=f"pass a list: {name}=[{example!r}]"
        )
    items = tuple(value)
    bad = [v for v in items if not isinstance(v, str) or not v.strip()]
    if bad:
        raise ConfigurationError(
            f"{name} holds {bad[0]!r}, which is not a name", fix=f"pass names only: {name}=[{example!r}]"
        )
    return items


def check_trust_kernels(value: Any) -> tuple[str, ...]:
    entries = tuple(e.strip() for e in _names("trust_kernels", value, "kernels-community/*"))
    for e in entries:
        if not _env.trust_entry_ok(e):
            raise ConfigurationError(
                f"trust_kernels entry {e!r} is not a Hub kernel repo (org/name), a publisher (org/*) or '*'",
                fix="pass e.g. trust_kernels=['kernels-community/*'] or ['kernels-community/flash-attn2']",
            )
    return entries


#: packages the policies read that detection does not probe (policies/parallelism/per_gpu.py reads
#: caps.usable("deepspeed")): assumable, never found
_READ_NOT_PROBED = ("deepspeed",)


def package_names(name: str, value: Any) -> list[str]:
    """``assume_installed`` / ``assume_missing`` as cudaload's package names. A name no policy reads would
    change nothing without a word (``flash-atn``): refused with the close ones."""
    from ..detection.packages import check_names

    out = []
    for raw in _names(name, value, "bitsandbytes"):
        key = raw.strip().lower()
        out.extend([key] if key in _READ_NOT_PROBED else check_names([raw]))
    return list(dict.fromkeys(out))


def check_model_class(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, type):
        raise ConfigurationError(
            f"model_class={value.__name__} is a class; cudaload takes its name",
            fix=f"pass model_class={value.__name__!r}",
        )
    if not isinstance(value, str) or not _CLASS_NAME.match(value):
        raise ConfigurationError(
            f"model_class={value!r} is not a transformers class name",
            fix="pass a name such as model_class='AutoModelForCausalLM'",
        )
    return value


def check_task(value: Any) -> str | None:
    if value is None:
        return None
    from ..auto_classes import AUTO_CLASSES

    return choice("task", value, tuple(sorted(AUTO_CLASSES)))


def check_revision(value: Any) -> str | None:
    if value is None or (isinstance(value, str) and value.strip()):
        return value
    raise ConfigurationError(
        f"revision={value!r} is not a branch, tag or commit",
        fix="pass revision='main' (or a commit hash), or leave it out",
    )


def check_prefetch(value: Any) -> bool | str:
    from .prefetch_modes import MODES, REMOVED_MODES

    if value is True or value is False or (isinstance(value, str) and value in MODES):
        return value  # type: ignore[no-any-return]
    removed = REMOVED_MODES.get(value) if isinstance(value, str) else None
    raise ConfigurationError(
        f"prefetch={value!r} is not a prefetch mode" + (f": {removed}" if removed else ""),
        fix=f"use prefetch=True (reads the files), False or one of {', '.join(repr(m) for m in MODES)}",
    )


def positive_seconds(name: str, value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        seconds = float(value)
        if math.isfinite(seconds) and seconds > 0:
            return seconds
    raise ConfigurationError(
        f"{name}={value!r} must be a number of seconds above 0",
        fix=f"pass {name}=120 (seconds), or leave it out",
    )


def check_timings(value: Any) -> Timings | None:
    if value is None:
        return None
    from ..tuning.timings import Timings

    if not isinstance(value, Timings):
        raise ConfigurationError(
            f"timings={type(value).__name__} is not a cudaload.tuning.Timings",
            fix="pass a measurement from cudaload.tuning.lookup() or tune(), or leave timings= out",
        )
    return value
