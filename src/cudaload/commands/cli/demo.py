"""``cudaload demo``: detect, plan, load and run a tiny random model made on the spot (cudaload.commands.demo)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from .inputs import positive_int


def add_parser(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], parents: Sequence[argparse.ArgumentParser]
) -> None:
    from ...testing.models import TINY_KINDS

    de = sub.add_parser(
        "demo",
        parents=list(parents),
        help="detect, plan, load and run a tiny model made on the spot (offline)",
        description="Detect, plan, load and verify a tiny random model made on the spot, then generate "
        "(decoders) or extract features (bert). Offline; the output text is noise (random weights).",
    )
    de.add_argument(
        "--model", default="qwen3", choices=TINY_KINDS, help="tiny model family to make (default qwen3)"
    )
    de.add_argument(
        "--prompt", default="The fastest way to load a model is", help="the text the model runs on"
    )
    de.add_argument(
        "--max-new-tokens",
        type=positive_int,
        metavar="N",
        default=16,
        help="tokens to generate (default 16)",
    )
    de.add_argument("--cpu", action="store_true", help="use the CPU even when a GPU is present")
    de.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..demo import run as run_demo

    return run_demo(kind=args.model, prompt=args.prompt, max_new_tokens=args.max_new_tokens, cpu=args.cpu)
