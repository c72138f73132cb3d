"""Where one load_model() call's seconds went (``plan.verified["phases"]``)."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any


class Phases:
    """Seconds spent in each step of one load_model() call, in order."""

    def __init__(self) -> None:
        self._last = self._start = time.perf_counter()
        self._spent: dict[str, float] = {}

    def mark(self, name: str) -> None:
        now = time.perf_counter()
        self._spent[name] = round(now - self._last, 4)
        self._last = now

    def as_dict(self, fastload: Mapping[str, Any] | None) -> dict[str, float]:
        out = dict(self._spent)
        # the fast path's own split of "load": skeleton, GPU storage, read+copy, finish; the quantized fast path
        # reports its unquantized tensors (plain) and its layer-by-layer read+quantize instead of alloc/fill
        if fastload:
            for key in ("build_s", "alloc_s", "fill_s", "plain_s", "quantize_s", "finish_s"):
                if key in fastload:
                    out[f"load.{key.removesuffix('_s')}"] = fastload[key]
        out["total"] = round(time.perf_counter() - self._start, 4)
        return out
