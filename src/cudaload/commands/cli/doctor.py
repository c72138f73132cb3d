"""``cudaload doctor``: the machine judged, each problem with its fix (cudaload.commands.doctor.diagnose)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from .inputs import hardware, hardware_help


def add_parser(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], parents: Sequence[argparse.ArgumentParser]
) -> None:
    d = sub.add_parser(
        "doctor",
        parents=list(parents),
        help="verdicts: what works, what is misconfigured, and the fix",
        description="Judge the machine: per GPU, native bf16, the flash-attention packages and bitsandbytes; "
        "then Hub kernels, the GPU selection (CUDA_VISIBLE_DEVICES, device order, LOCAL_RANK) and the "
        "installation's bytecode; each problem with its fix. Exits 1 when something is broken.",
    )
    d.add_argument("--hardware", metavar="PROFILE", help=hardware_help("diagnose"))
    d.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..doctor import diagnose

    report = diagnose(hardware(args.hardware))
    print(report.render())
    return 0 if report.ok else 1
