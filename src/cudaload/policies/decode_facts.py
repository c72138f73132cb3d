"""What was measured about generate()'s decode steps (:class:`DecodeFacts`, the priors file's ``decode`` records),
which measurement speaks for a GPU, and the per-token and compile costs it gives for another model. Data only:
:mod:`cudaload.policies.decode` decides from these numbers and :mod:`cudaload.policies.quantization` states the
quantized rungs' decode cost with them; a new measurement replaces the record, not the code.

How a record speaks for another model: decode at batch 1 reads every weight once a token, so the per-token times
are scaled by the model's weight bytes over the measured model's (both modes alike: the choice between them
rests on their ratio and on the compile seconds, which the scale leaves as measured); the compile seconds are
scaled by the layer count (transformers compiles the whole forward, one graph per layer's ops). Both scales are
said in the reasons wherever they are not 1.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..capabilities import Capabilities
from .measured import record_for_gpu


@dataclass(frozen=True)
class DecodeFacts:
    """Decode measured on one GPU model, for one model shape, dtype and batch.

    ``dynamic_ms``: (prompt + new tokens, ms per new token) of the dynamic cache (cudaload's default generate());
    ``compiled_ms``: (``max_cache_len``, ms per new token) of the static cache compiled by generate();
    ``batched``: (batch, prompt + new tokens, ms per decode step) of the compiled path with several sequences;
    ``compile_s``: seconds of the first compiled call: ``cold`` (a fresh inductor cache), ``warm`` (its cache on
    disk), ``new_batch_cold`` / ``new_batch_warm`` (another batch size in the same process);
    ``bound_ms``: the weights over the GPU's memory bandwidth; ``quantized_s``: one call's seconds per
    quantization method (``none`` is the unquantized dtype) on ``quantized_work``."""

    gpu: str  # "NVIDIA H200/sm90"
    versions: Mapping[str, str]
    date: str
    model: str
    weight_bytes: int
    layers: int
    dtype: str
    dynamic_ms: tuple[tuple[int, float], ...]
    compiled_ms: tuple[tuple[int, float], ...]
    compile_s: Mapping[str, float]
    source: str
    batched: tuple[tuple[int, int, float], ...] = ()
    bound_ms: float | None = None
    quantized_s: Mapping[str, float] = field(default_factory=dict)
    quantized_work: str = ""
    graphed_ms: tuple[tuple[int, float], ...] = ()
    capture_s: float | None = None
    graphed_from: str = ""  # another GPU's record the graphed figures come from ("": this one's)
    #: (batch, max_cache_len, ms per decode step) of the graphed decode with several sequences
    graphed_batched: tuple[tuple[int, int, float], ...] = ()

    @property
    def gpu_name(self) -> str:
        return self.gpu.rsplit("/", 1)[0]

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> DecodeFacts:
        compile_s = {str(k): float(v) for k, v in dict(d["compile_s"]).items()}
        for k in ("cold", "warm"):
            if k not in compile_s:
                raise KeyError(f"compile_s.{k}")
        out = cls(
            gpu=str(d["gpu"]),
            versions=dict(d.get("versions") or {}),
            date=str(d["date"]),
            model=str(d["model"]),
            weight_bytes=int(d["weight_bytes"]),
            layers=int(d["layers"]),
            dtype=str(d["dtype"]),
            dynamic_ms=tuple(sorted((int(n), float(ms)) for n, ms in d["dynamic_ms_per_token"])),
            compiled_ms=tuple(sorted((int(n), float(ms)) for n, ms in d["compiled_ms_per_token"])),
            compile_s=compile_s,
            source=str(d["source"]),
            batched=tuple(
                (int(b), int(n), float(ms)) for b, n, ms in d.get("compiled_ms_per_step_batched") or ()
            ),
            bound_ms=None if d.get("memory_bound_ms") is None else float(d["memory_bound_ms"]),
            quantized_s={str(k): float(v) for k, v in dict(d.get("quantized_s") or {}).items()},
            quantized_work=str(d.get("quantized_work") or ""),
            graphed_ms=tuple(sorted((int(n), float(ms)) for n, ms in d.get("graphed_ms_per_token") or ())),
            capture_s=None if d.get("graph_capture_s") is None else float(d["graph_capture_s"]),
            graphed_from=str(d.get("graphed_from") or ""),
            graphed_batched=tuple(
                (int(b), int(n), float(ms)) for b, n, ms in d.get("graphed_ms_per_step_batched") or ()
            ),
        )
        if not out.dynamic_ms or not out.compiled_ms or out.weight_bytes <= 0 or out.layers <= 0:
            raise ValueError("a decode record needs dynamic and compiled timings, weight_bytes and layers")
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "gpu": self.gpu,
            "versions": dict(self.versions),
            "date": self.date,
            "model": self.model,
            "weight_bytes": self.weight_bytes,
            "layers": self.layers,
            "dtype": self.dtype,
            "dynamic_ms_per_token": [list(p) for p in self.dynamic_ms],
            "compiled_ms_per_token": [list(p) for p in self.compiled_ms],
            "compiled_ms_per_step_batched": [list(p) for p in self.batched],
            "compile_s": dict(self.compile_s),
            "memory_bound_ms": self.bound_ms,
            "quantized_s": dict(self.quantized_s),
            "quantized_work": self.quantized_work,
            "graphed_ms_per_token": [list(p) for p in self.graphed_ms],
            "graph_capture_s": self.capture_s,
            "graphed_from": self.graphed_from,
            "graphed_ms_per_step_batched": [list(p) for p in self.graphed_batched],
            "source": self.source,
        }

    # -- the costs it gives ----------------------------------------------------------------------------------

    def dynamic_ms_at(self, length: int) -> float:
        """ms per new token of the dynamic cache for sequences of ``length`` (prompt + new): linear between the
        measured lengths (repeated lengths averaged), the nearest measurement outside them. Held flat past the
        longest: growing it there would claim a compiled speed-up that was not measured."""
        return _interpolate(_averaged(self.dynamic_ms), length, extrapolate=False)

    def compiled_ms_at(self, max_cache_len: int) -> float:
        """ms per new token of the compiled static cache of ``max_cache_len`` slots (its attention reads every
        slot): linear between the measured lengths, extended past the longest along the last segment where it
        rises (the compiled side's cost grows, the cautious direction) and held flat where it falls (6,144 slots
        measure 6.2 ms against the 2,048 slots' 6.7 mean, whose samples include a process's first calls; the
        record's ``source`` in tuning/priors.json),
        the shortest's below it."""
        return _interpolate(_averaged(self.compiled_ms), max_cache_len, extrapolate=True)

    def graphed_ms_at(self, max_cache_len: int) -> float:
        """ms per new token of the graphed decode (the eager step replayed as a CUDA graph) with a static cache of
        ``max_cache_len`` slots, as :meth:`compiled_ms_at` extends its points. Only where ``graphed_ms`` holds
        a measurement (:attr:`graphed` True)."""
        return _interpolate(_averaged(self.graphed_ms), max_cache_len, extrapolate=True)

    @property
    def graphed(self) -> bool:
        """Whether the graphed decode was measured here (its step and its capture)."""
        return bool(self.graphed_ms) and self.capture_s is not None

    def batch_factor(self, batch: int) -> float:
        """A decode step of ``batch`` sequences over one of a single sequence: linear from 1 at batch 1 to the
        measured batched step over the compiled batch-1 step of the same length (the compiled path's only;
        applied to both modes, see :mod:`cudaload.policies.decode`)."""
        if batch <= 1 or not self.batched:
            return 1.0
        b, n, ms = max(self.batched)
        ratio = ms / self.compiled_ms_at(n)
        if b <= 1:
            return 1.0
        return max(1.0, 1.0 + (batch - 1) * (ratio - 1.0) / (b - 1))

    def graphed_batch_factor(self, batch: int) -> float:
        """The graphed step of ``batch`` sequences over one of a single sequence: linear from 1 at batch 1 to the
        measured batched graphed step over the batch-1 graphed step of the same slots; where no batched graphed
        step was measured, :meth:`batch_factor` (the compiled path's). The graphed step runs eager kernels whose
        batch-1 GEMVs leave bandwidth unused, so its batched step grows less than the compiled one (H100, 8B, 4,096
        slots: 13.9 ms at batch 8 against 11.2 at batch 1, 1.24x; compiled 1.65x)."""
        if batch <= 1:
            return 1.0
        if not self.graphed_batched or not self.graphed_ms:
            return self.batch_factor(batch)
        b, n, ms = max(self.graphed_batched)
        if b <= 1:
            return 1.0
        ratio = ms / self.graphed_ms_at(n)
        return max(1.0, 1.0 + (batch - 1) * (ratio - 1.0) / (b - 1))

    def relative_decode(self) -> dict[str, float]:
        """Each quantization method's decode time relative to the unquantized model's (``quantized_s``)."""
        base = self.quantized_s.get("none")
        if not base:
            return {}
        return {m: s / base for m, s in self.quantized_s.items() if m != "none"}


@dataclass(frozen=True)
class Scaled:
    """A record's numbers for one model: ``weights``/``layers`` are the scales applied (1.0: the measured model
    itself) and ``text`` the sentence a reason shows."""

    facts: DecodeFacts
    weights: float
    layers: float
    text: str

    def dynamic_ms(self, length: int, batch: int = 1) -> float:
        return self.facts.dynamic_ms_at(length) * self.weights * self.facts.batch_factor(batch)

    def compiled_ms(self, max_cache_len: int, batch: int = 1) -> float:
        return self.facts.compiled_ms_at(max_cache_len) * self.weights * self.facts.batch_factor(batch)

    def compile_s(self, warm: bool) -> float:
        return self.facts.compile_s["warm" if warm else "cold"] * self.layers

    def graphed_ms(self, max_cache_len: int, batch: int = 1) -> float:
        return self.facts.graphed_ms_at(max_cache_len) * self.weights * self.facts.graphed_batch_factor(batch)

    def capture_s(self) -> float:
        """The graph's capture: one warm-up step and the capture, scaled by layers as the compile is."""
        return (self.facts.capture_s or 0.0) * self.layers


def with_graphed(facts: DecodeFacts, records: Sequence[DecodeFacts]) -> DecodeFacts:
    """``facts`` with the graphed decode's figures of another record of the same compute capability where its own
    has none (the newest such): the graphed step runs the eager model's kernels, so a GPU of the same architecture
    and software gives its order; the record says whose they are (``graphed_from``)."""
    if facts.graphed:
        return facts
    sm = facts.gpu.rsplit("/", 1)[-1]
    donors = [r for r in records if r.graphed and r.gpu.rsplit("/", 1)[-1] == sm]
    if not donors:
        return facts
    d = max(donors, key=lambda r: r.date)
    return dataclasses.replace(
        facts,
        graphed_ms=d.graphed_ms,
        capture_s=d.capture_s,
        graphed_from=d.gpu_name,
        graphed_batched=d.graphed_batched,
    )


def scaled(facts: DecodeFacts, weight_bytes: int, layers: int, gpu_name: str | None = None) -> Scaled:
    """``facts`` for a model of ``weight_bytes`` (unquantized) and ``layers``, on ``gpu_name``."""
    w = weight_bytes / facts.weight_bytes if weight_bytes > 0 else 1.0
    lay = layers / facts.layers if layers > 0 else 1.0
    where = f"measured on the {facts.gpu_name} ({facts.source})"
    if gpu_name and gpu_name != facts.gpu_name:
        where += f"; this GPU ({gpu_name}) has the same compute capability, not the same name"
    parts = []
    if abs(w - 1.0) > 0.05:
        parts.append(f"per-token times x{w:.2f} by weight bytes")
    if abs(lay - 1.0) > 0.05:
        parts.append(f"compile seconds x{lay:.2f} by layers")
    text = where
    if parts:
        text += (
            f"; scaled from {facts.model} ({facts.weight_bytes / 1e9:.1f} GB, {facts.layers} layers): "
            + (", ".join(parts))
        )
    return Scaled(facts, w, lay, text)


def decode_facts_for(caps: Capabilities, facts: Sequence[DecodeFacts]) -> DecodeFacts | None:
    """The measurement that speaks for this GPU: the same compute capability, the same GPU name first, the
    newest (:func:`cudaload.policies.measured.record_for_gpu`)."""
    return record_for_gpu(caps, facts)


@dataclass(frozen=True)
class QuantDecodeCost:
    """What the fit ladder weighs about decode speed (:func:`cudaload.policies.quantization.fit`): each
    quantization method's per-token time relative to the unquantized model's (``relative``), this model's
    unquantized ms per token (``ms_per_token``, scaled; None where no record speaks for the GPU), the decode
    steps the caller declared (``steps``: new tokens per call x calls; None: not declared) and the source."""

    relative: Mapping[str, float]
    source: str
    ms_per_token: float | None = None
    steps: int | None = None


def _averaged(points: Sequence[tuple[int, float]]) -> list[tuple[int, float]]:
    by: dict[int, list[float]] = {}
    for n, ms in points:
        by.setdefault(n, []).append(ms)
    return sorted((n, sum(v) / len(v)) for n, v in by.items())


def _interpolate(points: Sequence[tuple[int, float]], x: int, *, extrapolate: bool) -> float:
    if len(points) == 1 or x <= points[0][0]:
        return points[0][1]
    for (x0, y0), (x1, y1) in itertools.pairwise(points):
        if x <= x1:
            return y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    if not extrapolate:
        return points[-1][1]
    (x0, y0), (x1, y1) = points[-2], points[-1]
    # never falling past the longest measured: a cost that fell between two noisy points is held flat there
    return y1 + max(y1 - y0, 0.0) * (x - x1) / (x1 - x0)
