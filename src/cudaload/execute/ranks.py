"""Under torchrun: the ranks exchange their GPU facts before planning, and a rank that fails tells the others."""

from __future__ import annotations

import contextlib
import logging
import os
from typing import Any

from ..capabilities import Capabilities

# the package's one logger, named as it was before the split (logging configuration refers to it)
logger = logging.getLogger("cudaload.execute")


def rank_error(e: BaseException) -> dict[str, Any]:
    """What a rank that raises publishes to the others instead of its facts or its plan."""
    first = str(e).splitlines()[0] if str(e) else ""
    return {"error": f"{type(e).__name__}: {first}", "fix": getattr(e, "fix", None)}


def tell_ranks_before_planning(caps: Capabilities, e: BaseException, model: str | os.PathLike[str]) -> None:
    """A torchrun rank that stops before the GPU exchange (a broken GPU selection) publishes its error there,
    so that the other ranks stop with its reason at once instead of waiting CUDALOAD_RANKS_TIMEOUT (300 s) for
    it and then loading without it."""
    from ..detection.ranks import open_rendezvous

    d = caps.distributed
    try:
        rendezvous, _ = open_rendezvous(d.rank or 0, d.world_size or 1, model=model)
        if rendezvous is not None:
            rendezvous.tell("gpus", rank_error(e))
    except Exception as why:  # this rank's own error is the one to raise
        logger.debug("cudaload: could not tell the other ranks: %s", why)


def tell_ranks_refused(e: BaseException, model: Any) -> None:
    """A torchrun rank whose request is refused (a bad argument or variable) publishes the error where the
    other ranks wait for its GPU facts, so they stop with its reason instead of waiting for it."""
    from .. import _env

    with contextlib.suppress(
        Exception
    ):  # the environment itself may be what was refused: nobody to tell then
        launch = _env.launch()
        if (launch.world_size or 1) > 1 and isinstance(model, (str, os.PathLike)):
            from ..detection.ranks import open_rendezvous

            rendezvous, _ = open_rendezvous(launch.rank or 0, launch.world_size or 1, model=model)
            if rendezvous is not None:
                rendezvous.tell("gpus", rank_error(e))


def agree_on_gpus(caps: Capabilities, model: str | os.PathLike[str]) -> tuple[Capabilities, Any, str]:
    """Every torchrun rank's GPU, exchanged before anyone plans or loads (cudaload.detection.ranks), and this
    rank's Capabilities planned from all of them (cudaload.policies.ranks.agree). Returns the rendezvous for
    comparing the plans afterwards (None when the ranks could not agree) and a line for plan.verified."""
    from ..capabilities import RankGPU
    from ..detection.ranks import host, open_rendezvous
    from ..policies.ranks import agree, check_failed, facts

    d = caps.distributed
    rendezvous, why = open_rendezvous(d.rank or 0, d.world_size or 1, model=model)
    if rendezvous is None:
        return caps, None, why
    got = rendezvous.exchange("gpus", facts(caps, host()).to_dict())
    if got is None:
        alone = f"not every rank published its GPU within {rendezvous.timeout_s:.0f} s: planned alone"
        # a rank that arrives later finds every GPU published and plans; it must not wait a second timeout for
        # this rank's plan, which will never come
        with contextlib.suppress(Exception):  # a store that went away: the late rank has nobody to wait for
            rendezvous.publish(
                "plans", {"alone": f"not every rank's GPU was published within {rendezvous.timeout_s:.0f} s"}
            )
        return caps, None, alone
    check_failed(got)  # a rank that stopped before planning (a broken GPU selection): its reason, at once
    agreed = agree(caps, [RankGPU.from_dict(x) for x in got])
    return agreed, rendezvous, f"the {d.world_size} ranks planned from the same GPU facts ({rendezvous.how})"
