"""The top-level usage names every subcommand the parser has (a hand-written list once missed ``tune``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from cudaload.commands.cli import build_parser


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


def test_precompile_refuses_a_prefix_it_cannot_write_before_compiling(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import cudaload.commands.bytecache as bytecache
    from cudaload.commands.cli import main

    class Reached(Exception):
        pass

    def finding_the_packages(*args: object, **kw: object) -> None:
        raise Reached  # imports torch and transformers in a child, then compiles: what a refusal must precede

    monkeypatch.setattr(bytecache, "_inspect", finding_the_packages)
    # a file where the prefix would be: no folder can be made there, for root either (os.access said yes to
    # root for /proc/nope, and the refusal came after a full compile)
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert main(["precompile", "--prefix", str(blocker / "pyc")]) == 2
    err = capsys.readouterr().err
    assert "cannot write bytecode caches under" in err and "Fix: pass a writable folder as --prefix" in err
    assert main(["precompile", "--jobs", "-1"]) == 2
    assert "--jobs 0" in capsys.readouterr().err
    # a writable prefix passes the check, which leaves no folder of its own behind
    with pytest.raises(Reached):
        main(["precompile", "--prefix", str(tmp_path / "new")])
    assert not (tmp_path / "new").exists()
