"""What the user typed, as the library's values: each flag's value type (refused by argparse with the request's
own words), the hardware to describe or plan for, and the :class:`~cudaload.request.Request` a command makes."""

from __future__ import annotations

import argparse
import re
import sys
import warnings
from typing import TYPE_CHECKING, Any

from ...errors import CudaloadError, CudaloadWarning
from .flags import as_flags

if TYPE_CHECKING:
    from ...capabilities import Capabilities
    from ...request import Request

#: the CLI's spelling of a keyword that takes True / False / None (auto)
ON_OFF: dict[str, bool | None] = {"auto": None, "on": True, "off": False}


def comma_list(value: str) -> list[str]:
    """``a, b,,c`` -> ``["a", "b", "c"]``."""
    return [v.strip() for v in value.split(",") if v.strip()]


def positive_int(value: str) -> int:
    """A whole number, 1 or more (``2k`` is refused with both of its readings)."""
    try:
        n = int(value)
    except ValueError:
        short = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kKmM])\s*", value)
        if short:
            # "2k" is 2000 to some and 2048 to others (the request reads neither: cudaload.request._positive_int)
            x = float(short.group(1))
            scale = {"k": (1000, 1024), "m": (1000**2, 1024**2)}[short.group(2).lower()]
            raise argparse.ArgumentTypeError(
                f"{value!r} is not a whole number: write it out ({int(x * scale[1])} or {int(x * scale[0])})"
            ) from None
        raise argparse.ArgumentTypeError(f"{value!r} is not a whole number") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"{value} must be 1 or more")
    return n


def intent(value: str) -> str:
    """``--intent``: a name from cudaload.plans.INTENTS, or the request's refusal, which knows the words users type
    for them (``finetune``, ``serve``: cudaload.errors.SYNONYMS)."""
    from ...plans.plan import INTENTS
    from ...request import _choice

    try:
        return _choice("intent", value, INTENTS)
    except CudaloadError as e:
        raise argparse.ArgumentTypeError(as_flags(e.message + (f" ({e.fix})" if e.fix else ""))) from None


def packages(value: str) -> list[str]:
    """``--assume-installed`` / ``--assume-missing``: package names as the request spells them."""
    from ...request import package_names

    try:
        return package_names("--assume-installed", comma_list(value))
    except CudaloadError as e:
        raise argparse.ArgumentTypeError(e.message + (f" ({e.fix})" if e.fix else "")) from None


def hardware_help(verb: str) -> str:
    """The help of ``--hardware``, for the subcommands that take it."""
    return (
        f"{verb} this hardware instead of the machine you are on: a profile name (H100, 8xA100-80GB...; "
        "see `cudaload profiles`) or a snapshot file from `cudaload env --json`"
    )


def hardware(spec: str | None) -> Capabilities:
    """``--hardware``: this machine (None), a profile name or a snapshot file."""
    if spec is None:
        from ...detection import detect

        return detect()
    from ...profiles import hardware as named

    return named(spec)


def checked_request(model: str, entry: str, **options: Any) -> Request:
    """The same :class:`~cudaload.request.Request` the Python API builds, before torch or transformers is
    imported: a bad value is refused at once. Its warnings are printed as the CLI's own lines."""
    from ...request import Request

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", CudaloadWarning)
        req = Request.build(model, entry=entry, **options)
    for w in caught:
        if issubclass(w.category, CudaloadWarning):
            print(f"cudaload: warning: {as_flags(str(w.message))}", file=sys.stderr)
        else:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    return req
