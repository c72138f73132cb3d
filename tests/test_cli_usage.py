"""The top-level usage names every subcommand the parser has (a hand-written list once missed ``tune``)."""

from __future__ import annotations

from cudaload.cli import build_parser


def test_usage_lists_every_subcommand() -> None:
    p = build_parser()
    usage = p.format_usage()
    for name in ("env", "doctor", "plan", "tune", "profiles", "demo"):
        assert name in usage.split("{", 1)[1].split("}", 1)[0].split(","), (name, usage)
