"""How one ``generate()`` call decodes when no work was declared (issue 43): transformers' dynamic cache, a static
cache of a bucket with the eager decode step replayed as a CUDA graph (``graphed``), or with the step compiled by
inductor (``compiled``). Pure: :mod:`cudaload.execute.decode` reads the call and the process's state into a
:class:`CallQuery`, and :func:`choose_call_decode` returns the choice with every candidate and its reason.

The rule: each path costs what it pays first plus the call's decode steps x its ms per step; a path that pays
more first must beat the cheapest one before it by :data:`cudaload.policies.decode.MARGIN` of that one's time
(dynamic, then graphed, then compiled). What each pays first:

* dynamic: nothing;
* graphed: the capture (one warm-up step and the capture, about two eager steps), at every call: transformers
  builds a new static cache for each generate() call (5.17 generation/utils.py:1987-2032), and a graph replays the
  addresses it captured;
* compiled: nothing where this process compiled the call's bucket and batch already, else the warm compile
  (:func:`cudaload.compile_cache.present`: cudaload's saved artifacts for the bucket's key), else the cold one.

The ms per step, the capture and the compile seconds are the measured decode facts
(:mod:`cudaload.policies.decode_facts`), scaled to the model as the plan scales them.

An EOS may stop the call before ``max_new_tokens``. What a path pays first is paid whole before the first step;
the saving accrues per step; and how far a call will run is unknown before it runs. So the steps counted are:

* all of them where nothing can stop the call early (no ``eos_token_id``, or ``min_new_tokens`` reaching
  ``max_new_tokens``);
* else ``min_new_tokens`` plus a share of the rest: the mean share this process's earlier EOS calls ran (from
  :data:`OBSERVED_MIN` such calls on), or :data:`EOS_SHARE` before that. :data:`EOS_SHARE` is 0.5, the mean of a
  stop equally likely anywhere up to the cap: a call that stops at once then loses at most what was paid first,
  and one that runs to the cap is counted at half its saving.

A call is kept dynamic, whatever it would save, where no static cache can serve it: no decode step (one new
token), a length past the model's context, or a static cache that the free GPU memory cannot hold. The graphed
path is left out where its step cannot be captured here (``graphable``: the attention or the device) or its capture
failed for the bucket and batch earlier in this process; the compiled path where the bucket and batch's compile
failed earlier, or past :data:`MAX_COMPILED` compiled shapes (dynamo's recompile limit).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..plans.decision import Candidate, Decision
from .decode import MARGIN, bucket_for
from .decode_facts import Scaled

__all__ = [
    "EOS_SHARE",
    "HEADROOM",
    "MAX_COMPILED",
    "OBSERVED_MIN",
    "CallChoice",
    "CallQuery",
    "call_bucket",
    "choose_call_decode",
    "expected_steps",
]

#: the share of ``max_new_tokens - min_new_tokens`` counted for a call an EOS may stop, before the process has
#: seen :data:`OBSERVED_MIN` such calls end (module docstring: the mean of a stop equally likely anywhere)
EOS_SHARE = 0.5
#: from this many earlier calls with an EOS, their mean share replaces :data:`EOS_SHARE`
OBSERVED_MIN = 3
#: the static cache may take at most this share of the GPU memory free at the call: the rest is for the prefill's
#: activations and the CUDA graphs' pool
HEADROOM = 0.8
#: the most (bucket, batch) shapes one process compiles: each is one more recompile of the same frames, and dynamo
#: stops compiling a frame past ``torch._dynamo.config.recompile_limit`` (8 by default, torch 2.11
#: torch/_dynamo/config.py) and runs it eagerly, which with a static cache is slower than the dynamic path; half of
#: it leaves room for the user's own compiles
MAX_COMPILED = 4


@dataclass(frozen=True)
class CallQuery:
    """One ``generate()`` call, and what the process knows when it starts.

    ``batch``: sequences (rows of ``input_ids``); ``prompt_len``: the prompt's length (padding included: the
    static cache holds it); ``max_new_tokens`` / ``min_new_tokens``: the call's (merged with the model's generation
    config as transformers merges them); ``eos``: an ``eos_token_id`` can stop it early; ``bucket``: the static
    cache the call would use (:func:`call_bucket`; None: none holds it); ``warm``: cudaload's compile cache has the
    artifact of that bucket and batch; ``compiled_here``: this process already compiled that bucket and batch;
    ``failed_here``: their compile failed earlier in this process; ``compiled_count``: the shapes this process has
    compiled; ``observed_shares``: the shares of ``max_new_tokens`` earlier EOS calls of this process ran;
    ``max_positions``: the model's context (None: unknown); ``cache_bytes``: the static cache's bytes (0: not
    known); ``free_bytes``: the GPU memory free at the call (None: not known); ``facts``: the decode measurement
    scaled to this model (None: none speaks for it); ``graphable``: why the step cannot be captured here (None:
    it can); ``graph_failed_here``: this bucket and batch's capture failed earlier in this process."""

    batch: int
    prompt_len: int
    max_new_tokens: int
    facts: Scaled | None
    eos: bool = True
    min_new_tokens: int = 0
    bucket: int | None = None
    warm: bool = False
    compiled_here: bool = False
    failed_here: bool = False
    compiled_count: int = 0
    observed_shares: tuple[float, ...] = ()
    max_positions: int | None = None
    cache_bytes: int = 0
    free_bytes: int | None = None
    graphable: str | None = "not asked"
    graph_failed_here: bool = False

    @property
    def length(self) -> int:
        """Prompt + new tokens: what the static cache must hold."""
        return self.prompt_len + self.max_new_tokens


@dataclass(frozen=True)
class CallChoice:
    """The call's decode: ``decision.choice`` ``dynamic``, ``graphed`` or ``compiled`` (with every candidate), the
    static cache's ``bucket`` (graphed and compiled), what it pays first (``compile``: ``none``, ``warm`` or
    ``cold`` for compiled, ``capture`` for graphed) and the figures weighed (``expected``: steps
    counted, each path's ms per step, what it pays first, its seconds)."""

    decision: Decision
    bucket: int | None = None
    compile: str | None = None
    expected: Mapping[str, float] = field(default_factory=dict)

    @property
    def compiled(self) -> bool:
        return self.decision.choice == "compiled"

    @property
    def graphed(self) -> bool:
        return self.decision.choice == "graphed"

    @property
    def reason(self) -> str:
        return "; ".join(self.decision.reasons)

    def to_dict(self) -> dict[str, Any]:
        return {
            "choice": self.decision.choice,
            "reason": self.reason,
            "bucket": self.bucket,
            "compile": self.compile,
            "candidates": [c.to_dict() for c in self.decision.candidates],
            "expected": {k: round(v, 3) for k, v in self.expected.items()},
        }


def call_bucket(length: int, buckets: Sequence[int], floor: int = 0) -> int | None:
    """The static cache a compiled call of ``length`` tokens uses: the smallest of ``buckets`` that holds it, or
    ``floor`` where that is larger (transformers sizes a static cache to the largest it has built for the model,
    ``_previous_max_cache_length``: 5.17 generation/utils.py:1987-2032, 5.25 :2168-2213). None: no bucket holds
    it."""
    b = bucket_for(length, buckets)
    if b is None:
        return None
    return max(b, floor)


def expected_steps(q: CallQuery) -> tuple[float, str]:
    """The decode steps counted for the call, and how they were counted (module docstring). The first new token
    comes from the prefill, which both paths run eagerly: the decode steps are ``max_new_tokens - 1``."""
    steps = max(q.max_new_tokens - 1, 0)
    floor = min(max(q.min_new_tokens - 1, 0), steps)
    if not q.eos or floor >= steps:
        why = "no eos_token_id" if not q.eos else "min_new_tokens reaches max_new_tokens"
        return float(steps), f"all {steps:,} decode steps ({why}: nothing stops the call early)"
    if len(q.observed_shares) >= OBSERVED_MIN:
        share = sum(q.observed_shares) / len(q.observed_shares)
        src = f"the mean share this process's {len(q.observed_shares)} earlier EOS calls ran"
    else:
        share = EOS_SHARE
        src = "an EOS may stop it anywhere before max_new_tokens: the mean of a stop equally likely anywhere"
    counted = floor + share * (steps - floor)
    return (
        counted,
        f"{counted:,.0f} of {steps:,} decode steps ({share:.0%} of those past min_new_tokens: {src})",
    )


@dataclass(frozen=True)
class _Path:
    name: str
    first_s: float  # what it pays before its first step
    ms: float  # per decode step
    pays: str  # what it pays first, in words

    def seconds(self, steps: float) -> float:
        return self.first_s + steps * self.ms / 1000


def choose_call_decode(q: CallQuery) -> CallChoice:
    """``dynamic``, ``graphed`` or ``compiled`` for one call, with every candidate and its reason (module
    docstring)."""
    blocked = _blockers(q)
    f = q.facts
    if f is None:
        blocked.insert(0, "no decode measurement speaks for this GPU and model")
    if blocked:
        why = "no static cache can serve this call: " + "; ".join(blocked)
        return _dynamic((why,), {"graphed": blocked, "compiled": blocked}, {})
    assert f is not None and q.bucket is not None
    steps, counted = expected_steps(q)
    paths, refused = _paths(q, f)
    expected: dict[str, float] = {"steps": steps}
    for p in paths:
        expected[f"ms_per_step_{p.name}"] = p.ms
        expected[f"first_s_{p.name}"] = p.first_s
        expected[f"seconds_{p.name}"] = p.seconds(steps)
    best = paths[0]
    lines: dict[str, str] = {
        "dynamic": f"~{best.seconds(steps):.1f} s of decode steps, nothing captured or compiled ({counted})"
    }
    for p in paths[1:]:
        bar = (1 - MARGIN) * best.seconds(steps)
        saved = steps * (best.ms - p.ms) / 1000
        sign = ">" if p.seconds(steps) <= bar else "<"
        lines[p.name] = (
            f"saves {steps:,.0f} x ({best.ms:.1f} - {p.ms:.1f}) ms = {saved:.1f} s {sign} {p.pays} + "
            f"{MARGIN * best.seconds(steps):.1f} s margin ({MARGIN:.0%} of {best.name}'s {best.seconds(steps):.1f} s)"
        )
        if sign == ">":
            best = p
    candidates = tuple(
        Candidate(p.name, True, (lines[p.name],) if p.name == "dynamic" else (lines[p.name], _cache(q)))
        for p in paths
    ) + tuple(Candidate(n, False, tuple(w)) for n, w in refused.items())
    if best.name == "dynamic":
        reason = (
            f"dynamic: {counted}"
            + "".join(f"; {n}: {lines[n]}" for n in lines if n != "dynamic")
            + "".join(f"; {n} closed: {'; '.join(w)}" for n, w in refused.items())
        )
        return CallChoice(Decision("dynamic", (reason,), candidates), expected=expected)
    kind = (
        "capture" if best.name == "graphed" else "none" if q.compiled_here else "warm" if q.warm else "cold"
    )
    return CallChoice(
        Decision(best.name, (f"{best.name}, {_cache(q)}: {lines[best.name]} ({counted})",), candidates),
        bucket=q.bucket,
        compile=kind,
        expected=expected,
    )


def _cache(q: CallQuery) -> str:
    assert q.bucket is not None
    return f"static cache of {q.bucket:,} slots"


def _paths(q: CallQuery, f: Scaled) -> tuple[list[_Path], dict[str, list[str]]]:
    """The paths open to the call, cheapest first paid first, and why each other one is closed."""
    assert q.bucket is not None
    paths = [_Path("dynamic", 0.0, f.dynamic_ms(q.length, q.batch), "nothing")]
    refused: dict[str, list[str]] = {}
    no_graph = []
    if not f.facts.graphed:
        no_graph.append("no graphed decode measured for this GPU")
    if q.graphable is not None:
        no_graph.append(f"its step cannot be captured here: {q.graphable}")
    if q.graph_failed_here:
        no_graph.append("its capture failed earlier in this process")
    if no_graph:
        refused["graphed"] = no_graph
    else:
        first = f.capture_s()
        paths.append(_Path("graphed", first, f.graphed_ms(q.bucket, q.batch), f"{first:.2f} s capture"))
    no_compile = []
    if q.failed_here:
        no_compile.append("its compile failed earlier in this process")
    elif not q.compiled_here and q.compiled_count >= MAX_COMPILED:
        no_compile.append(
            f"this process compiled {q.compiled_count} shapes already, the most it compiles ({MAX_COMPILED}: "
            "dynamo's recompile limit)"
        )
    if no_compile:
        refused["compiled"] = no_compile
    else:
        kind = "none" if q.compiled_here else "warm" if q.warm else "cold"
        first = 0.0 if q.compiled_here else f.compile_s(q.warm)
        pays = {
            "none": f"no compile: this process compiled the {q.bucket:,}-slot bucket at batch {q.batch} already",
            "warm": f"{first:.0f} s warm compile (cudaload's saved artifacts)",
            "cold": f"{first:.0f} s cold compile",
        }[kind]
        paths.append(_Path("compiled", first, f.compiled_ms(q.bucket, q.batch), pays))
    return paths, refused


def _dynamic(
    reasons: Sequence[str], refused: Mapping[str, Sequence[str]], expected: Mapping[str, float]
) -> CallChoice:
    return CallChoice(
        Decision(
            "dynamic",
            tuple(reasons),
            (
                Candidate("dynamic", True, ("transformers' DynamicCache, nothing captured or compiled",)),
                *(Candidate(n, False, tuple(w)) for n, w in refused.items()),
            ),
        ),
        expected=expected,
    )


def _blockers(q: CallQuery) -> list[str]:
    out: list[str] = []
    if q.max_new_tokens < 2:
        out.append(f"max_new_tokens={q.max_new_tokens}: no decode step after the prefill")
    if q.max_positions is not None and q.length > q.max_positions:
        out.append(f"{q.length:,} tokens exceed the model's context of {q.max_positions:,}")
    elif q.bucket is None:
        out.append(f"no static-cache bucket holds {q.length:,} tokens")
    if q.free_bytes is not None and q.cache_bytes > HEADROOM * q.free_bytes:
        out.append(
            f"its static cache ({q.cache_bytes / 2**30:.1f} GiB) is more than {HEADROOM:.0%} of the "
            f"{q.free_bytes / 2**30:.1f} GiB free on the GPU"
        )
    return out
