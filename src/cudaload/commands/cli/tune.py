"""``cudaload tune``: its parser is cudaload.execute.measure's (``add_tune_parser``); this module checks the work before
cudaload.execute.measure.run_tune imports torch."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from ...errors import ConfigurationError, CudaloadError
from .inputs import checked_request


def add_parser(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], parents: Sequence[argparse.ArgumentParser]
) -> None:
    from ...execute.measure import add_tune_parser

    add_tune_parser(sub, parents=parents).set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """`cudaload tune`: the work checked as plan()'s (a zero length is refused, not stored in the timing cache),
    then cudaload.execute.measure.run_tune, which imports torch."""
    try:
        checked_request(
            args.model,
            "tune",
            batch_size=args.batch_size,
            seq_len=args.seq_len,
            new_tokens=args.new_tokens,
            padded=args.padded,
            tune_budget_s=args.budget_s,
        )
    except CudaloadError as e:
        # tune's own spelling of the one keyword plan has no flag for
        e.message = e.message.replace("tune_budget_s=", "--budget-s ")
        e.fix = e.fix and e.fix.replace("tune_budget_s=", "--budget-s ")
        raise
    if args.reps < 1:
        raise ConfigurationError(f"--reps {args.reps} times nothing", fix="pass --reps 1 or more (default 5)")
    from ...request import attention_name

    for name in args.backends or ():
        if name == "auto":
            raise ConfigurationError(
                "--backends names the backends to time; auto is not one",
                fix="leave --backends out to time every usable one",
            )
        attention_name(name)  # the names --attn takes, refused the same way
    from ...execute.measure import run_tune

    return run_tune(args)
