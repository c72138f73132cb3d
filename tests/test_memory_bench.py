"""benchmarks/bench_memory_train.py: the bisection finds the boundary, and the --smoke run (CPU, fake memory
meter) records points, OOMs and bisections end to end."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "bench_memory_train", ROOT / "benchmarks" / "bench_memory_train.py"
    )
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("boundary", [256, 257, 1000, 4096, 9999, 40960, 131071])
@pytest.mark.parametrize("guess", [256, 2048, 8192, 100000])
def test_bisect_finds_the_longest_aligned_length(boundary: int, guess: int) -> None:
    b = _bench()
    seen: list[int] = []

    def trains(seq: int) -> bool:
        seen.append(seq)
        return seq <= boundary

    lo, hi = b.bisect_longest(trains, guess, align=256, max_seq=131072)
    want = boundary // 256 * 256
    assert lo == want
    assert hi == want + 256
    assert all(s % 256 == 0 for s in seen)
    assert len(seen) == len(set(seen))  # never probes a length twice
    assert len(seen) <= 20  # a guess 9 doublings off still brackets and bisects in 20 probes


def test_bisect_stops_when_told_and_keeps_its_bracket() -> None:
    b = _bench()
    calls: list[int] = []

    def trains(seq: int) -> bool | None:
        calls.append(seq)
        if len(calls) > 3:
            return None  # the budget ran out
        return seq <= 5000

    lo, hi = b.bisect_longest(trains, 4096, align=256, max_seq=131072)
    assert lo is not None and lo <= 5000
    assert hi is None or hi > 5000


def test_bisect_everything_fails_or_trains() -> None:
    b = _bench()
    assert b.bisect_longest(lambda s: False, 4096, align=256, max_seq=65536) == (None, 256)
    assert b.bisect_longest(lambda s: True, 4096, align=256, max_seq=65536) == (65536, None)


def test_first_guess_is_where_the_line_reaches_the_card() -> None:
    b = _bench()
    # 1 GiB fixed + 1 MiB per token: a 9 GiB card holds 8192 tokens
    pts = [(1024, (1 << 30) + 1024 * (1 << 20)), (2048, (1 << 30) + 2048 * (1 << 20))]
    assert b.first_guess(pts, 9 << 30, default=7, align=256) == 8192
    assert b.first_guess(pts[:1], 9 << 30, default=7, align=256) == 7


@pytest.mark.slow
def test_smoke_run_records_points_and_bisections(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    pytest.importorskip("peft")
    out = tmp_path / "out"
    cmd = [
        sys.executable,
        str(ROOT / "benchmarks" / "bench_memory_train.py"),
        "--smoke",
        "--out",
        str(out),
        "--groups",
        "full06,bisect_full06",
        "--work",
        str(tmp_path / "work"),
    ]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    res = json.loads((out / "results.json").read_text())
    pts = res["points"]
    assert {p["optim"] for p in pts} >= {"adamw_torch", "adafactor", "sgd"}
    assert all(p["steps"] >= 2 for p in pts)
    assert any(not p["gradient_checkpointing"] for p in pts) and any(p["attn"] == "eager" for p in pts)
    # the fake meter charges model bytes + 64 KiB a token; a fake "24 GB" card is 96 MiB
    model = next(m for m in res["groups"]["full06"]["models"] if m["master_fp32"])
    base = model["model_allocated"]
    for bis in res["bisections"]:
        card = bis["card_bytes"]
        want = (card - base) // (64 * 1024) // 256 * 256
        assert bis["longest_trains"] == want, bis
        assert bis["shortest_fails"] == want + 256
        assert any(not p["trains"] for p in bis["probes"])  # an OOM was caught and recorded
    # cudaload's own estimate rides along with every point it can plan, and its planned boundary per card
    est = [p["cudaload"] for p in pts if p["optim"] != "adamw_torch_bf16"]
    assert est and all(e["estimate_allocated"] > 0 and e["ratio_allocated"] > 0 for e in est)
    assert all(p["cudaload"] is None for p in pts if p["optim"] == "adamw_torch_bf16")
    assert all(isinstance(b["cudaload_planned"], int) for b in res["bisections"])
    md = (out / "results.md").read_text()
    assert "Fit boundary" in md and "adafactor" in md
