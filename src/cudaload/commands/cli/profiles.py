"""``cudaload profiles``: the named GPUs ``--hardware NAME`` plans for (cudaload.profiles)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence


def add_parser(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], parents: Sequence[argparse.ArgumentParser]
) -> None:
    pr = sub.add_parser(
        "profiles",
        parents=list(parents),
        help="list the named hardware profiles",
        description="List the GPUs `--hardware NAME` plans for (NxNAME for N of them): device name, compute "
        "capability, architecture, memory, bf16 / fp8 support.",
    )
    pr.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ...profiles import describe

    print(describe())
    return 0
