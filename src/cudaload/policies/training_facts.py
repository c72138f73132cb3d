"""What was measured about training throughput (:class:`TrainingFacts`, shipped in the priors file), and which
measurement speaks for a GPU. Data only: the attention choice for training ranks backends by it
(:mod:`cudaload.policies.attention.choice`), and :mod:`cudaload.policies.training` cites it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..capabilities import Capabilities
from .measured import record_for_gpu


@dataclass(frozen=True)
class TrainingFacts:
    """Training throughput measured on one GPU model: real (non-padding) tokens per second through
    ``Trainer`` for each attention backend, with the layout, model shape and intent it was measured on."""

    gpu: str  # "NVIDIA H200/sm90"
    versions: Mapping[str, str]
    date: str
    model: str
    intent: str
    layout: str
    tokens_per_s: Mapping[str, float]
    source: str

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> TrainingFacts:
        return cls(
            gpu=str(d["gpu"]),
            versions=dict(d.get("versions") or {}),
            date=str(d["date"]),
            model=str(d["model"]),
            intent=str(d["intent"]),
            layout=str(d["layout"]),
            tokens_per_s={str(k): float(v) for k, v in dict(d["tokens_per_s"]).items()},
            source=str(d["source"]),
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "gpu": self.gpu,
            "versions": dict(self.versions),
            "date": self.date,
            "model": self.model,
            "intent": self.intent,
            "layout": self.layout,
            "tokens_per_s": dict(self.tokens_per_s),
            "source": self.source,
        }


def training_facts_for(caps: Capabilities, facts: Sequence[TrainingFacts]) -> TrainingFacts | None:
    """The measurement that speaks for this GPU: the same compute capability, the same GPU name first, the
    most backends measured, the newest."""
    return record_for_gpu(caps, facts, prefer=lambda f: len(f.tokens_per_s))
