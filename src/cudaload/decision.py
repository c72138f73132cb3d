"""The shape every policy answers in: the choice, and every candidate with its reasons.

Modelled on huggingface/kernels' resolver: nothing is rejected silently. A policy is a pure function of
its inputs and returns a :class:`Decision`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Candidate:
    """One option a policy considered. ``ok`` False means rejected; ``reasons`` say why either way."""

    name: str
    ok: bool
    reasons: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "ok": self.ok, "reasons": list(self.reasons)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Candidate:
        return cls(name=d["name"], ok=bool(d["ok"]), reasons=tuple(d.get("reasons", ())))


@dataclass(frozen=True)
class Decision:
    """The outcome of one policy: ``choice`` (None when nothing was chosen), why, and all candidates."""

    choice: str | None
    reasons: tuple[str, ...] = ()
    candidates: tuple[Candidate, ...] = field(default_factory=tuple)
    explicit: bool = False

    @property
    def rejected(self) -> tuple[Candidate, ...]:
        return tuple(c for c in self.candidates if not c.ok)

    def candidate(self, name: str) -> Candidate | None:
        return next((c for c in self.candidates if c.name == name), None)

    def to_dict(self) -> dict[str, Any]:
        return {
            "choice": self.choice,
            "reasons": list(self.reasons),
            "explicit": self.explicit,
            "candidates": [c.to_dict() for c in self.candidates],
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Decision:
        return cls(
            choice=d.get("choice"),
            reasons=tuple(d.get("reasons", ())),
            explicit=bool(d.get("explicit", False)),
            candidates=tuple(Candidate.from_dict(c) for c in d.get("candidates", ())),
        )


def first_ok(candidates: Iterable[Candidate]) -> Candidate | None:
    return next((c for c in candidates if c.ok), None)
