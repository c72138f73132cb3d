"""``cudaload env``: the machine as cudaload sees it, as text or as the JSON snapshot ``--hardware FILE`` reads."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from .inputs import hardware, hardware_help


def add_parser(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], parents: Sequence[argparse.ArgumentParser]
) -> None:
    e = sub.add_parser(
        "env",
        parents=list(parents),
        help="the machine as cudaload sees it",
        description="Print the machine as cudaload sees it: GPUs (from NVML; CUDA is not initialised), CUDA, "
        "torch and transformers versions, optional packages and whether they load, launch and Hub state, and "
        "what looks wrong. --json prints the snapshot, which --hardware FILE plans against.",
    )
    e.add_argument("--json", action="store_true", help="print the snapshot as JSON (a reusable profile)")
    e.add_argument("--hardware", metavar="PROFILE", help=hardware_help("show"))
    e.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    caps = hardware(args.hardware)
    if args.json:
        print(caps.to_json())
    else:
        from ...detection import render

        print(render(caps))
    return 0
