"""The fastload benchmark runs end to end on the CPU with a tiny shape (so CI keeps it honest)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_bench_fastload_small(tmp_path: Path) -> None:
    cmd = [
        sys.executable,
        str(ROOT / "benchmarks" / "bench_fastload.py"),
        "--small",
        "--shapes",
        "tiny-a",
        "--reps",
        "1",
        "--out",
        str(tmp_path / "out"),
        "--work",
        str(tmp_path / "work"),
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((tmp_path / "out" / "fastload.json").read_text())
    (shape,) = report["shapes"]
    assert shape["weights_match"] is True
    from cudaload.fastload import read_header

    assert shape["warm"]["fastload"]["seconds"] > 0 and shape["warm"]["from_pretrained"]["seconds"] > 0
    assert shape["raw_bound"]["bytes"] == read_header(tmp_path / "work" / "tiny-a").total_bytes
    md = (tmp_path / "out" / "fastload.md").read_text()
    assert "| tiny-a |" in md and "from_pretrained" in md
