"""The top-level usage names every subcommand the parser has (a hand-written list once missed ``tune``)."""

from __future__ import annotations

from cudaload.cli import build_parser


def test_usage_lists_every_subcommand() -> None:
    p = build_parser()
    usage = p.format_usage()
    for name in ("env", "doctor", "plan", "tune", "profiles", "demo"):
        assert name in usage.split("{", 1)[1].split("}", 1)[0].split(","), (name, usage)


def test_verbose_after_every_subcommand() -> None:
    # `cudaload tune m -v` as `cudaload plan m -v`: -v is shared by every subcommand
    p = build_parser()
    assert p.parse_args(["tune", "m", "--batch-size", "1", "--seq-len", "64", "-v"]).verbose is True
    assert p.parse_args(["plan", "m", "-v"]).verbose is True
