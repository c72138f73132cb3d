"""How many tokens a step holds: the bounds tried (``batch_size x seq_len`` down to what typical instruction data
puts in ``batch_size`` sequences), an explicit ``tokens_per_step`` checked against the step, and the
``tokens_per_step`` decision with each bound's attempts."""

from __future__ import annotations

from collections.abc import Sequence

from ...errors import ConfigurationError
from ...plans.decision import Candidate, Decision
from ...plans.training import StepShape
from .ladder import EVERY, OFF, Attempt, checkpointed

#: Trainer's default ``per_device_train_batch_size`` (transformers 5.17 training_args.py, the field's
#: default): the sequences a step holds when the caller declares none
DEFAULT_SEQUENCES = 8

#: The smallest step bound tried before the fused loss or checkpointing, as a fraction of ``batch_size x
#: seq_len``: instruction data's sequences average about a quarter of the longest (benchmarks/bench_train.py's
#: log-normal lengths: median 420 capped at 2048 averaged 579, 0.28 of it; median 200, 301, 0.15), so
#: ``batch_size`` sequences rarely need more, and a step that would is split in two.
TYPICAL_FILL = 0.25

#: step bounds are multiples of this (a whole number of 256-token tiles)
ALIGN = 256

#: the bounds tried, as fractions of ``batch_size x seq_len``, largest first
_FRACTIONS = (1.0, 0.75, 0.5, 0.375, TYPICAL_FILL)


def step_bounds(batch_size: int, seq_len: int, requested: int | None) -> list[int]:
    """The tokens-per-step bounds to try, largest first: ``batch_size x seq_len`` down to what typical data puts
    in ``batch_size`` sequences (:data:`TYPICAL_FILL`), never below one longest sequence."""
    if requested is not None:
        return [requested]
    full = batch_size * seq_len
    out: list[int] = [full]
    for f in _FRACTIONS[1:]:
        # rounded down to whole tiles, never below one longest sequence nor above the full step
        t = min(max(seq_len, int(full * f) // ALIGN * ALIGN), full)
        if t not in out:
            out.append(t)
    return out


def bounds_to_try(base: StepShape, tokens_per_step: int | None, sequences_declared: bool) -> list[int]:
    """The bounds to try: a packed step's (:func:`step_bounds`; an assumed batch down to one sequence), a
    padded step's one size. An explicit bound the step cannot hold or reach is refused."""
    seq, full = base.longest, base.tokens
    if not base.packed:
        # a padded step is batch x seq_len; an assumed batch may hold fewer sequences (halving down to one)
        if sequences_declared:
            return [full]
        out, b = [], base.sequences
        while b >= 1:
            out.append(b * seq)
            b //= 2
        return out
    if tokens_per_step is not None and tokens_per_step < seq:
        raise ConfigurationError(
            f"tokens_per_step={tokens_per_step} is shorter than seq_len={seq}: the longest sequence must fit "
            "in one step",
            fix=f"pass tokens_per_step >= {seq}, or a shorter seq_len",
        )
    if tokens_per_step is not None and tokens_per_step > full:
        raise ConfigurationError(
            f"tokens_per_step={tokens_per_step} cannot be reached: a step holds at most batch_size={base.sequences} "
            f"sequences of at most seq_len={seq} tokens ({full:,})",
            fix=f"pass tokens_per_step <= {full}, or a larger batch_size (sequences a step)",
        )
    bounds = step_bounds(base.sequences, seq, tokens_per_step)
    if tokens_per_step is None and not sequences_declared and bounds[-1] > seq:
        # the sequences a step holds were assumed, not declared: fewer of them is still the caller's plan
        bounds.append(seq)
    return bounds


def _attempt(fused: bool, gc: int, outcome: str) -> str:
    how = "without checkpointing" if gc == OFF else f"checkpointing {checkpointed(gc)}"
    return f"{'fused loss, ' if fused else ''}{how}: {outcome}"


def _condensed(rows: Sequence[Attempt]) -> list[Attempt]:
    """A bound's attempts as a candidate states them: every partial bisection reduced, per loss, to the largest
    n that fitted and the smallest that did not above it (or the first that did not)."""
    out: list[Attempt] = []
    for r in rows:
        _, fused, gc, _ = r
        if gc <= EVERY:
            out.append(r)
            continue
        if any(x[1] == fused and x[2] > EVERY for x in out):
            continue  # this loss's partial rows are in already
        mine = [x for x in rows if x[1] == fused and x[2] > EVERY]
        fits = [x for x in mine if x[3] == "fits"]
        top = max((x[2] for x in fits), default=0)
        fails = [x for x in mine if x[3] != "fits" and x[2] > top]
        if fits:
            out.append(next(x for x in fits if x[2] == top))
        if fails:
            out.append(min(fails, key=lambda x: x[2]))
    return out


def fmt_tokens(t: int) -> str:
    return f"{t:,}"


def tokens_decision(
    bounds: Sequence[int],
    tried: Sequence[Attempt],
    chosen: int,
    fused: bool,
    base: StepShape,
    requested: int | None,
    filled: bool = False,
) -> Decision:
    """The step bound: the chosen one, every bound tried with its outcome. ``filled``: the packed steps are filled
    to the bound (``batch_size`` not declared), so the bound, not the sequences, is what each step holds."""
    cands: list[Candidate] = []
    for b in bounds:
        rows = _condensed([x for x in tried if x[0] == b])
        if rows:
            cands.append(
                Candidate(fmt_tokens(b), b == chosen, tuple(_attempt(f, gc, o) for _, f, gc, o in rows))
            )
        else:  # below the chosen one: it would fit too (less of everything), but holds fewer tokens
            cands.append(Candidate(fmt_tokens(b), True, (f"fits, but a step of {chosen:,} tokens does too",)))
    batch_size, seq_len = base.sequences, base.longest
    if not base.packed:
        pad = f"padded: every step computes {chosen // seq_len} x {seq_len} tokens, padding included"
        if requested is not None:
            pad += f"; tokens_per_step={requested} applies to packed steps only"
        return Decision(fmt_tokens(chosen), (pad,), tuple(cands))
    if requested is not None:
        return Decision(fmt_tokens(chosen), ("requested explicitly",), tuple(cands), explicit=True)
    holds = (
        f"up to {chosen:,} real tokens a step, filled with as many sequences as fit"
        if filled
        else f"at most {batch_size} sequences and {chosen:,} real tokens a step"
    )
    reasons = [f"{holds}; memory is planned for the bound, so no step of long sequences runs out of it"]
    full = base.tokens
    if chosen < full:
        why_full = next((_attempt(f, gc, o) for t, f, gc, o in reversed(tried) if t == full), "larger")
        reasons.append(
            f"{batch_size} x {seq_len} = {full:,} tokens: {why_full}; typical instruction data averages about a "
            f"quarter of its longest sequence, so {batch_size} sequences rarely hold more than {chosen:,} tokens "
            "(a step that would is split in two)"
        )
    return Decision(fmt_tokens(chosen), tuple(reasons), tuple(cands))
