"""The request's warnings: a :class:`~cudaload.errors.CudaloadWarning` at the caller's line. ``training_data`` and
``execute.adapters`` warn through it too (as ``cudaload.request._warn``)."""

from __future__ import annotations

import os
import sys
import warnings

from ..errors import CudaloadWarning

#: cudaload's own folder (the package above this one), not this one's: the warning skips every cudaload frame, so it
#: points at the caller's line wherever in cudaload it was raised
_HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def warn(message: str) -> None:
    """A :class:`CudaloadWarning` pointed at the caller's line, past cudaload's own frames (and the dataclass'
    generated ``__init__``), so the default filter shows each once per calling line."""
    level, frame = 1, sys._getframe(0)
    while frame is not None and (
        frame.f_code.co_filename.startswith(_HERE) or frame.f_code.co_filename == "<string>"
    ):
        frame = frame.f_back  # type: ignore[assignment]
        level += 1
    warnings.warn(message, CudaloadWarning, stacklevel=level)
