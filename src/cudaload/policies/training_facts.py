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


@dataclass(frozen=True)
class LayerCompileFacts:
    """What compiling each decoder layer (``torch.compile`` per layer, dynamic in the packed row's length) did
    to a training step, measured on one GPU model: the step's wall seconds eager and compiled over the same data
    (steps of about ``tokens_per_step`` real tokens), and the seconds the compile added to the first step with
    cold caches (``compile_s``) and, where measured, with torch's compile caches filled by an earlier process
    (``compile_s_warm``). ``intent``, ``layout`` and ``attention`` are what it was measured with: the decision
    takes the compile only for what a record measured."""

    gpu: str  # "NVIDIA H100 80GB HBM3/sm90"
    versions: Mapping[str, str]
    date: str
    model: str
    intent: str
    layout: str
    attention: str
    tokens_per_step: int
    step_s: float
    compiled_step_s: float
    compile_s: float
    source: str
    compile_s_warm: float | None = None

    @property
    def saved_per_step_s(self) -> float:
        return self.step_s - self.compiled_step_s

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> LayerCompileFacts:
        warm = d.get("compile_s_warm")
        return cls(
            gpu=str(d["gpu"]),
            versions=dict(d.get("versions") or {}),
            date=str(d["date"]),
            model=str(d["model"]),
            intent=str(d["intent"]),
            layout=str(d["layout"]),
            attention=str(d["attention"]),
            tokens_per_step=int(d["tokens_per_step"]),
            step_s=float(d["step_s"]),
            compiled_step_s=float(d["compiled_step_s"]),
            compile_s=float(d["compile_s"]),
            source=str(d["source"]),
            compile_s_warm=None if warm is None else float(warm),
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "gpu": self.gpu,
            "versions": dict(self.versions),
            "date": self.date,
            "model": self.model,
            "intent": self.intent,
            "layout": self.layout,
            "attention": self.attention,
            "tokens_per_step": self.tokens_per_step,
            "step_s": self.step_s,
            "compiled_step_s": self.compiled_step_s,
            "compile_s": self.compile_s,
            "compile_s_warm": self.compile_s_warm,
            "source": self.source,
        }


def layer_compile_facts_for(
    caps: Capabilities, facts: Sequence[LayerCompileFacts], *, intent: str, layout: str, attention: str
) -> LayerCompileFacts | None:
    """The measurement of compiled decoder layers that speaks for this GPU and this training: the same compute
    capability (the same GPU name first, the newest), the same intent, layout and attention."""
    same = [f for f in facts if (f.intent, f.layout, f.attention) == (intent, layout, attention)]
    return record_for_gpu(caps, same)
