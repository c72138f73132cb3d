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

    def explain_lines(self, title: str, none_label: str = "none") -> list[str]:
        """This decision as ``Plan.explain()`` prints it: ``title: choice``, the reasons, then every other
        candidate with why (``none_label`` names the choice None and its candidate)."""
        lines = [
            f"{title}: {self.choice if self.choice is not None else none_label}"
            + ("  (explicit)" if self.explicit else "")
        ]
        lines.extend(f"    because {r}" for r in self.reasons)
        for c in self.candidates:
            if c.name == self.choice or (self.choice is None and c.name == none_label and c.ok):
                continue
            mark = "ok " if c.ok else "no "
            why = "; ".join(c.reasons) if c.reasons else "-"
            if c.reasons and any(why in r for r in self.reasons):  # the choice's reason already says it
                why = "see above"
            lines.append(f"  - {mark}{c.name}: {why}")
        return lines

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
