"""The ``cudaload`` command: env, doctor, precompile, plan, tune, profiles, demo (docs/api.md lists them).

Each subcommand is a thin shell over the library: it parses arguments, calls the public function and
prints. Errors from cudaload are printed with their fix and exit 2; anything else is a bug and raises.

One module per subcommand (``cudaload plan`` is :mod:`cudaload.commands.cli.plan`), each with ``add_parser`` (its flags)
and ``run`` (the command); :mod:`~cudaload.commands.cli.inputs` turns what the user typed into the library's values, and
:mod:`~cudaload.commands.cli.flags` the library's keywords in its messages back into flags.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from ...errors import CudaloadError
from . import demo, doctor, env, plan, precompile, profiles, tune
from .flags import FLAGS, as_flags
from .inputs import checked_request

__all__ = ["FLAGS", "as_flags", "build_parser", "main"]

#: the checked request as callers that imported it from cudaload.commands.cli name it
_request = checked_request

#: the subcommands in the order ``cudaload --help`` lists them
_SUBCOMMANDS = (env, doctor, precompile, plan, tune, profiles, demo)


def build_parser() -> argparse.ArgumentParser:
    from ... import __version__

    verbose_help = "log cudaload's decisions as they are made"
    p = argparse.ArgumentParser(
        prog="cudaload",
        description="Device-aware Hugging Face model loading: see what this machine can do (env, doctor), "
        "plan a load for it or for a named GPU (plan, profiles), measure attention backends on this GPU (tune), "
        "stop new processes compiling the packages a load imports (precompile), or watch the whole path on a "
        "tiny model (demo).",
    )
    p.add_argument("--version", action="version", version=f"cudaload {__version__}")
    p.add_argument("-v", "--verbose", action="store_true", help=verbose_help)
    # -v also after the subcommand (`cudaload plan m -v`); SUPPRESS keeps an absent -v there from
    # resetting one given before it
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS, help=verbose_help)
    sub = p.add_subparsers(dest="command", required=True)
    for command in _SUBCOMMANDS:
        command.add_parser(sub, [common])
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.verbose:
        logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    try:
        return int(args.func(args))
    except CudaloadError as e:
        print(f"cudaload: error: {as_flags(str(e))}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `cudaload ... | head`: the reader left; not an error of ours
        sys.stderr.close()
        return 0
