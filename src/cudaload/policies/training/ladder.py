"""The step ladder's walk: each (step bound, loss, checkpointing) rung probed through the fit ladder, cheapest
first, until one fits; every attempt's outcome kept for the decisions that state them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

from ...errors import DoesNotFitError
from ...plans.training import StepShape

if TYPE_CHECKING:
    from ..quantization import FitResult

#: the fit probe the planner passes in: (step, gradient_checkpointing) -> a fit result (raises DoesNotFitError);
#: with checkpointing on, ``step.checkpoint_every`` says which layers
FitProbe = Callable[[StepShape, "bool | None"], "FitResult"]

#: a rung's checkpointing in the ladder's attempts: 0 off, 1 every layer, n >= 2 every n-th layer
OFF, EVERY = 0, 1

Attempt = tuple[int, bool, int, str]  # (bound, fused loss, checkpointing: OFF / EVERY / n, outcome)


def shape_at(base: StepShape, tokens: int, fused: bool, gc: int = OFF) -> StepShape:
    """``base`` at one rung: a bound of ``tokens``, the fused loss or not, checkpointing ``gc``."""
    every = gc if gc > EVERY else 1
    if not base.packed:  # a padded step of fewer sequences
        return replace(
            base,
            tokens=tokens,
            sequences=max(1, tokens // base.longest),
            fused_loss=fused,
            checkpoint_every=every,
        )
    return replace(
        base, tokens=tokens, longest=min(base.longest, tokens), fused_loss=fused, checkpoint_every=every
    )


def walk(
    fit: FitProbe,
    base: StepShape,
    bounds: list[int],
    losses: list[bool],
    gradient_checkpointing: bool | None,
    last_is_the_callers: bool = False,
    partial_layers: int = 0,
) -> tuple[int, bool, int, FitResult, list[Attempt]]:
    """The first (bound, fused loss, checkpointing) that fits, in the ladder's order: without checkpointing
    every loss and bound, then every n-th layer checkpointed (where ``partial_layers``, the model's decoder
    layers, is set: at each loss and bound the largest n that fits), then every layer. Returns it (checkpointing
    as OFF, EVERY or n) with the fit result and every attempt's outcome. When nothing fits, raises the largest
    bound's own error (its suggestions are for the caller's whole step), or where the step's sequences were
    assumed (``last_is_the_callers``) the smallest bound's, the step the caller would get."""
    tried: list[Attempt] = []
    # the fit ladder's optimizer for the largest bound (with checkpointing if it needs it): smaller bounds are
    # tried without checkpointing (or with it partial) only with that optimizer, so a full fine-tune does not
    # trade fp32 AdamW for an 8-bit one to skip checkpointing (the fit ladder's own order: optimizer first, then
    # checkpointing)
    r0_err: DoesNotFitError | None = None
    try:
        r0 = fit(shape_at(base, bounds[0], losses[0]), gradient_checkpointing)
    except DoesNotFitError as e:
        r0, r0_err = None, e
    opt0 = r0.optimizer.choice if r0 is not None and r0.optimizer is not None else None

    def probe(t: int, fused: bool, gc: int) -> FitResult | None:
        """The fit at one rung, or None (its outcome recorded either way)."""
        try:
            r = fit(shape_at(base, t, fused, gc), gc != OFF)
        except DoesNotFitError as e:
            tried.append((t, fused, gc, _short(e)))
            return None
        if gc != EVERY and opt0 is not None and r.optimizer is not None and r.optimizer.choice != opt0:
            tried.append((t, fused, gc, f"fits only with {r.optimizer.choice} in place of {opt0}"))
            return None
        tried.append((t, fused, gc, "fits"))
        return r

    rungs = [gc for gc in (False, True) if gradient_checkpointing in (None, gc)]
    for gc in rungs:
        if gc and gradient_checkpointing is None and partial_layers > 1:
            # partial: the bound with the least recompute (largest n), the larger bound where n ties -- as the
            # rungs without checkpointing, a smaller bound before more recompute (typical data rarely fills the
            # larger one); transformers' loss before the fused one
            for fused in losses:
                best: tuple[int, int, FitResult] | None = None  # (n, bound, fit)
                for t in bounds:
                    found = _largest_every(probe, t, fused, partial_layers, above=best[0] if best else 1)
                    if found is not None and (best is None or found[0] > best[0]):
                        best = (found[0], t, found[1])
                    if best is not None and best[0] >= partial_layers:
                        break  # one layer checkpointed: no smaller bound recomputes less
                if best is not None:
                    return best[1], fused, best[0], best[2], tried
        for fused in losses:
            for t in bounds:
                r = probe(t, fused, EVERY if gc else OFF)
                if r is not None:
                    return t, fused, EVERY if gc else OFF, r, tried
    if r0_err is not None and not last_is_the_callers:
        raise r0_err
    # the smallest step the ladder went down to: its error's suggestions are for the step the caller would get
    fit(shape_at(base, bounds[-1], losses[-1]), gradient_checkpointing)
    raise DoesNotFitError(
        "no step bound fits", reasons=[o for *_, o in tried], fix="declare a shorter seq_len"
    )


def _largest_every(
    probe: Callable[[int, bool, int], FitResult | None], t: int, fused: bool, layers: int, above: int = 1
) -> tuple[int, FitResult] | None:
    """The largest n (``above`` < n <= layers, n >= 2) for which checkpointing every n-th layer fits at bound
    ``t``, with its fit: the fewest layers recomputed. Memory only grows with n (fewer layers checkpointed), so
    the smallest n is tried first (none fits if it does not) and the rest by bisection. Of the n that checkpoint
    as many layers, the smallest (the checkpointed layers evenly spread)."""
    first = max(2, above + 1)
    if first > layers:
        return None
    r = probe(t, fused, first)
    if r is None:
        return None
    lo, hi, best = first, layers, r
    while lo < hi:
        mid = (lo + hi + 1) // 2
        got = probe(t, fused, mid)
        if got is None:
            hi = mid - 1
        else:
            lo, best = mid, got
    even = -(-layers // -(-layers // lo))  # the smallest n checkpointing ceil(layers / lo) layers
    if even != lo:
        got = probe(t, fused, even)
        if got is not None:  # the same layers' count, the same bytes: fits as lo did
            return even, got
    return lo, best


def _short(e: DoesNotFitError) -> str:
    """A fit failure in one line: the first device's need against its budget, else the message."""
    need = next((r.split(": does not fit: ", 1)[-1] for r in e.reasons if "needs" in r), None)
    return f"does not fit ({need})" if need else f"does not fit: {e.message}"


def checkpointed(n: int) -> str:
    return "every layer" if n == EVERY else f"every {n} layers"
