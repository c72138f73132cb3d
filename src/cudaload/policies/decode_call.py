"""How one ``generate()`` call decodes when no work was declared (issue 43): transformers' dynamic cache, or a
static cache of a bucket with the decode step compiled. Pure: :mod:`cudaload.execute.decode` reads the call and
the process's state into a :class:`CallQuery`, and :func:`choose_call_decode` returns the choice with every
candidate and its reason.

The rule: a call's decode steps x (dynamic - compiled ms per step) must beat what the compiled path pays first,
by :data:`cudaload.policies.decode.MARGIN` of the dynamic time:

* nothing, when this process has already compiled the call's bucket and batch (the graph is in memory);
* the warm compile (:func:`cudaload.compile_cache.present`: cudaload's saved artifacts for the bucket's key);
* the cold compile otherwise.

The ms per step and the compile seconds are the measured decode facts
(:mod:`cudaload.policies.decode_facts`), scaled to the model as the plan scales them.

An EOS may stop the call before ``max_new_tokens``. The compile is paid whole before the first step; the saving
accrues per step; and how far a call will run is unknown before it runs. So the steps counted are:

* all of them where nothing can stop the call early (no ``eos_token_id``, or ``min_new_tokens`` reaching
  ``max_new_tokens``);
* else ``min_new_tokens`` plus a share of the rest: the mean share this process's earlier EOS calls ran (from
  :data:`OBSERVED_MIN` such calls on), or :data:`EOS_SHARE` before that. :data:`EOS_SHARE` is 0.5, the mean of a
  stop equally likely anywhere up to the cap: a call that stops at once then loses at most the compile, and one
  that runs to the cap is counted at half its saving.

A call is kept dynamic, whatever it would save, where the compiled path cannot serve it: no decode step (one new
token), a length past the model's context, a static cache that the free GPU memory cannot hold, a bucket and batch
whose compile failed earlier in this process, or more compiled shapes than :data:`MAX_COMPILED` (dynamo's
recompile limit).
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
    scaled to this model (None: none speaks for it)."""

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

    @property
    def length(self) -> int:
        """Prompt + new tokens: what the static cache must hold."""
        return self.prompt_len + self.max_new_tokens


@dataclass(frozen=True)
class CallChoice:
    """The call's decode: ``decision.choice`` ``dynamic`` or ``compiled`` (with every candidate), the static cache's
    ``bucket`` (compiled only), the ``compile`` it pays (``none``, ``warm`` or ``cold``; compiled only) and the
    figures weighed (``expected``: steps counted, ms per step of each path, the compile seconds, each path's
    seconds)."""

    decision: Decision
    bucket: int | None = None
    compile: str | None = None
    expected: Mapping[str, float] = field(default_factory=dict)

    @property
    def compiled(self) -> bool:
        return self.decision.choice == "compiled"

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


def choose_call_decode(q: CallQuery) -> CallChoice:
    """``dynamic`` or ``compiled`` for one call, with every candidate and its reason (module docstring)."""
    blocked = _blockers(q)
    f = q.facts
    if f is None:
        blocked.insert(0, "no decode measurement speaks for this GPU and model")
    if blocked:
        return _dynamic(("the compiled path cannot serve this call: " + "; ".join(blocked),), blocked, {})
    assert f is not None and q.bucket is not None
    steps, counted = expected_steps(q)
    dyn_ms = f.dynamic_ms(q.length, q.batch)
    comp_ms = f.compiled_ms(q.bucket, q.batch)
    kind = "none" if q.compiled_here else "warm" if q.warm else "cold"
    compile_s = 0.0 if q.compiled_here else f.compile_s(q.warm)
    dyn_s = steps * dyn_ms / 1000
    comp_s = steps * comp_ms / 1000 + compile_s
    saved_s = dyn_s - steps * comp_ms / 1000
    expected = {
        "steps": steps,
        "ms_per_step_dynamic": dyn_ms,
        "ms_per_step_compiled": comp_ms,
        "compile_s": compile_s,
        "seconds_dynamic": dyn_s,
        "seconds_compiled": comp_s,
    }
    pays = {
        "none": f"no compile: this process compiled the {q.bucket:,}-slot bucket at batch {q.batch} already",
        "warm": f"{compile_s:.0f} s warm compile (cudaload's saved artifacts)",
        "cold": f"{compile_s:.0f} s cold compile",
    }[kind]
    saving = f"saves {steps:,.0f} x ({dyn_ms:.1f} - {comp_ms:.1f}) ms = {saved_s:.1f} s"
    dyn_reason = f"~{dyn_s:.1f} s of decode steps, nothing compiled ({counted})"
    margin = f"{MARGIN * dyn_s:.1f} s margin ({MARGIN:.0%} of the dynamic decode)"
    if comp_s <= (1 - MARGIN) * dyn_s:
        comp_reason = f"{saving} > {pays} + {margin}" if compile_s else f"{saving} > {margin}; {pays}"
        return CallChoice(
            Decision(
                "compiled",
                (f"compiled, static cache of {q.bucket:,} slots: {comp_reason} ({counted})",),
                (
                    Candidate("dynamic", True, (dyn_reason, f"{MARGIN:.0%} or more slower for this call")),
                    Candidate("compiled", True, (comp_reason, f"static cache of {q.bucket:,} slots")),
                ),
            ),
            bucket=q.bucket,
            compile=kind,
            expected=expected,
        )
    comp_reason = f"{saving} < {pays} + {margin}" if compile_s else f"{saving} < {margin}; {pays}"
    return _dynamic(
        (f"dynamic: compiled {comp_reason} ({counted})",),
        [comp_reason],
        expected,
        dyn_reason,
    )


def _dynamic(
    reasons: Sequence[str],
    comp_why: Sequence[str],
    expected: Mapping[str, float],
    dyn_reason: str = "transformers' DynamicCache, nothing compiled",
) -> CallChoice:
    return CallChoice(
        Decision(
            "dynamic",
            tuple(reasons),
            (Candidate("dynamic", True, (dyn_reason,)), Candidate("compiled", False, tuple(comp_why))),
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
    if q.failed_here:
        out.append("its compile failed earlier in this process")
    elif not q.compiled_here and q.compiled_count >= MAX_COMPILED:
        out.append(
            f"this process compiled {q.compiled_count} shapes already, the most it compiles ({MAX_COMPILED}: "
            "dynamo's recompile limit)"
        )
    if q.free_bytes is not None and q.cache_bytes > HEADROOM * q.free_bytes:
        out.append(
            f"its static cache ({q.cache_bytes / 2**30:.1f} GiB) is more than {HEADROOM:.0%} of the "
            f"{q.free_bytes / 2**30:.1f} GiB free on the GPU"
        )
    return out
