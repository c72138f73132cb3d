"""Which shipped measurement speaks for this machine's GPU: one rule for every kind of record (training
throughput, decode costs), so they cannot drift apart."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar

from ..capabilities import Capabilities


class _Record(Protocol):
    @property
    def gpu(self) -> str: ...  # "NVIDIA H200/sm90"

    @property
    def date(self) -> str: ...


R = TypeVar("R", bound=_Record)


def record_for_gpu(
    caps: Capabilities, records: Sequence[R], prefer: Callable[[R], Any] = lambda r: 0
) -> R | None:
    """The record measured on a GPU of this machine's first GPU's compute capability: the same GPU name first,
    then ``prefer`` (larger wins), then the newest. None where none is of that capability (or no GPU)."""
    if not caps.gpus:
        return None
    gpu = caps.gpus[0]
    same = [r for r in records if r.gpu.rsplit("/", 1)[-1] == f"sm{gpu.sm}"]
    if not same:
        return None
    return max(same, key=lambda r: (r.gpu.rsplit("/", 1)[0] == gpu.name, prefer(r), r.date))
