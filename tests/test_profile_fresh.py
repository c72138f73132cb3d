"""benchmarks/investigations/profile_fresh.py's readers: ``python -X importtime`` output and the modules only
one side imports; bench_fresh.py's method names and summary."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"
# profile_fresh from investigations/, bench_fresh (which it imports too) from benchmarks/
sys.path[:0] = [str(BENCH / "investigations"), str(BENCH)]

import profile_fresh  # noqa: E402


def test_parse_importtime_reads_a_real_interpreters_output() -> None:
    err = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", "import json"], capture_output=True, text=True, check=True
    ).stderr
    mods = profile_fresh.parse_importtime(err)
    assert "json" in mods and "json.decoder" in mods
    self_us, cum_us, depth = mods["json"]
    assert cum_us >= self_us >= 0 and depth == 0
    assert mods["json.decoder"][2] >= 1  # imported by json: nested one level deeper


def test_modules_diff_groups_by_package_both_ways() -> None:
    plain = {"torch": (10, 10, 0), "transformers": (5, 5, 0)}
    other = {"torch": (10, 10, 0), "cudaload": (3000, 3000, 0), "cudaload.plans.plan": (1000, 1000, 1)}
    text = profile_fresh.modules_diff(plain, other, "plain", "cudaload")
    assert "## imported by cudaload, not by plain" in text
    assert "| cudaload | 2 | 4.0 |" in text
    assert "## imported by plain, not by cudaload" in text and "| transformers | 1 | 0.0 |" in text


def test_bench_fresh_pairs_each_method_with_plain_in_its_setting() -> None:
    import bench_fresh

    assert bench_fresh.split_method("cudaload-noprefetch-online@before") == (
        "cudaload-noprefetch",
        frozenset({"online"}),
        "before",
    )
    assert bench_fresh.split_method("plain-pyc-online") == ("plain", frozenset({"pyc", "online"}), "")

    def sample(method: str, total: float) -> dict[str, object]:
        return {
            "shape": "s",
            "quant": "bf16",
            "temp": "warm",
            "method": method,
            "marks": {"first_forward": total},
        }

    rows = bench_fresh.summarize(
        [
            sample("plain", 10.0),
            sample("plain-online", 20.0),
            sample("cudaload", 5.0),
            sample("cudaload-online", 10.0),
            sample("cudaload-online@before", 30.0),
        ]
    )
    ratio = {r["method"]: r["vs_plain"] for r in rows}
    assert ratio == {
        "plain": 1.0,
        "plain-online": 1.0,
        "cudaload": 0.5,
        "cudaload-online": 0.5,
        "cudaload-online@before": 1.5,  # another tree, the same environment: against plain-online
    }


def test_bench_fresh_generate_works_parse_and_end_the_total() -> None:
    import pytest

    import bench_fresh

    assert bench_fresh.parse_generate("1x512+128, 8x1024+64:left") == [
        {"batch": 1, "prompt": 512, "new_tokens": 128, "padding": "none"},
        {"batch": 8, "prompt": 1024, "new_tokens": 64, "padding": "left"},
    ]
    for bad in ("8x1024", "8x1024+64:right", "0x10+1"):
        with pytest.raises(ValueError, match="--generate"):
            bench_fresh.parse_generate(bad)

    def sample(method: str, ff: float, gen: float | None) -> dict[str, object]:
        marks = {"first_forward": ff, **({"generated": gen} if gen is not None else {})}
        return {
            "shape": "s",
            "quant": "bf16",
            "temp": "warm",
            "method": method,
            "marks": marks,
            "generate_s": [gen - ff] if gen is not None else None,
        }

    rows = bench_fresh.summarize([sample("plain", 10.0, 30.0), sample("cudaload", 9.0, 15.0)])
    by = {r["method"]: r for r in rows}
    # the total runs to the end of the last generate(), not the first forward
    assert by["plain"]["total_median"] == 30.0 and by["cudaload"]["vs_plain"] == 0.5
    assert by["cudaload"]["generate_s_median"] == [6.0] and by["cudaload"]["first_forward_median"] == 9.0
