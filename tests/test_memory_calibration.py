"""The training memory model held against the peaks measured on the H200 (issue 15).

benchmarks/results/2026-12-01-h200/run1-memtrain/results.json holds 32 measured training steps (Qwen3-8B QLoRA
and LoRA at seq_len 512-16384, batch 1/4, gradient checkpointing on/off, sdpa and eager; a 0.6B full
fine-tune) and the longest 8B QLoRA seq_len that trained on emulated 24/48/80 GiB cards; run7-memtrain2 holds
27 full fine-tuning steps (0.6B and 8B; fused/foreach AdamW with fp32 master weights, 8-bit and paged 8-bit
AdamW, Adafactor, SGD on bf16 weights) and the longest 0.6B full fine-tune on the same emulated cards.
benchmarks/compare_memory_train.py computes cudaload's estimate and planned boundary for each; the goals are
asserted here for every point, so a change to the memory model that breaks agreement with the measurements
fails."""

from __future__ import annotations

import importlib.util
import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from cudaload.model_info import model_info
from cudaload.plans.training import StepShape
from cudaload.policies import memory as M
from cudaload.testing import full_config

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "2026-12-01-h200"
#: run -> (points measured, points cudaload has a counterpart for, of those the ones that ran without OOM);
#: AdamW on bf16 weights (run7's adamw_torch_bf16) is measured for reference, not planned by cudaload
RUNS = {"run1-memtrain": (32, 32, 24), "run7-memtrain2": (29, 27, 27)}


def _compare_module() -> Any:
    spec = importlib.util.spec_from_file_location(
        "compare_memory_train", ROOT / "benchmarks/compare_memory_train.py"
    )
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module", params=sorted(RUNS))
def run(request: pytest.FixtureRequest) -> Path:
    return RESULTS / str(request.param)


@pytest.fixture(scope="module")
def cmp(run: Path) -> dict[str, Any]:
    res = json.loads((run / "results.json").read_text())
    out: dict[str, Any] = _compare_module().compare(res)
    return out


def test_every_measured_point_is_compared(cmp: dict[str, Any], run: Path) -> None:
    res = json.loads((run / "results.json").read_text())
    points, compared, ran = RUNS[run.name]
    assert len(res["points"]) == points and len(cmp["points"]) == compared
    assert sum(not p["oom"] for p in cmp["points"]) == ran
    assert [c["card_gib"] for c in cmp["cards"]] == [24, 48, 80]


def test_training_peaks_within_10_percent(cmp: dict[str, Any]) -> None:
    bad = [
        f"{p['key']}: estimate {p['estimate_allocated'] / M.GiB:.2f} GiB, measured "
        f"{p['measured_allocated'] / M.GiB:.2f}"
        for p in cmp["points"]
        if not p["oom"] and abs(p["ratio_allocated"] - 1) > 0.10
    ]
    assert not bad, bad


def test_reserved_peaks_close(cmp: dict[str, Any]) -> None:
    """allocated + the allocator's slack against max_memory_reserved. Uncapped, the allocator keeps cached
    blocks it would free under a cap (the slack is sized for the capped cards), and the points of one model run
    one after another in one process, so a point's reserved peak carries the cache of the one before: the
    estimate may sit up to 20% under the uncapped reserved peak (run1: 0.88 for 8B QLoRA eager at 2048; run7:
    0.82 for 0.6B 8-bit AdamW at 2048, run after 512) and up to 12% over it (run7: 1.11 at 0.6B 16384)."""
    bad = [p["key"] for p in cmp["points"] if not p["oom"] and not 0.80 <= p["ratio_reserved"] <= 1.12]
    assert not bad, bad


def test_oom_points_are_not_planned_smaller_than_what_failed(cmp: dict[str, Any]) -> None:
    """An OOM point's peak is what was allocated when an allocation failed: a lower bound."""
    bad = [p["key"] for p in cmp["points"] if p["oom"] and p["ratio_allocated"] < 0.9]
    assert not bad, bad


def test_the_h200_verdict_matches_every_point(cmp: dict[str, Any], run: Path) -> None:
    """What ran is estimated to fit the measuring H200 (its allocator may hold the device less the context),
    what ran out of memory is estimated not to."""
    meta = json.loads((run / "results.json").read_text())["meta"]
    room = meta["device_total_bytes"] - meta["context_bytes"]
    wrong = [p["key"] for p in cmp["points"] if (p["estimate_reserved"] > room) != p["oom"]]
    assert not wrong, wrong


def test_planned_longest_seq_len_on_emulated_cards(cmp: dict[str, Any]) -> None:
    for c in cmp["cards"]:
        assert 0.9 <= c["ratio"] <= 1.05, c
        # never planned at a length that was seen to fail
        assert c["measured_shortest_fail"] is None or c["planned_longest"] < c["measured_shortest_fail"], c


def test_committed_comparison_is_current(cmp: dict[str, Any], run: Path) -> None:
    """compare.json is what the script makes from the committed measurements with this code."""
    committed = json.loads((run / "compare.json").read_text())
    assert committed["summary"] == json.loads(json.dumps(cmp["summary"]))
    assert committed["summary"]["all_goals_met"]


def test_sdpa_math_path_only_for_fp32_grouped_kv() -> None:
    """QLoRA's fp32 activations send sdpa to its math path on a GQA model (Qwen3-8B: 32 q / 8 kv heads),
    bf16 does not, and a model without grouped kv heads keeps the memory-efficient kernel."""
    q8 = model_info(full_config("Qwen3-8B"))
    assert M.sdpa_math(q8, 4) and not M.sdpa_math(q8, 2)
    kw: dict[str, Any] = dict(dtype="bfloat16", seq_len=8192, batch_size=1, gradient_checkpointing=True)
    # as the bench trained them (peft's fp32 cast for QLoRA; cudaload's own QLoRA plan keeps bf16)
    measured = StepShape.padded(1, 8192, lora_dropout=0.05, autocast=False)
    qlora = M.estimate(q8, quantization="nf4", intent="qlora", step=replace(measured, kbit_upcast=True), **kw)
    lora = M.estimate(q8, quantization=None, intent="lora", step=measured, **kw)
    # measured: QLoRA 46.18 GiB allocated against LoRA 32.10 although its weights are 7 GiB smaller
    assert M.allocated_bytes(qlora) > M.allocated_bytes(lora)
    # one layer's fp32 scores, kept and in backward, are in the QLoRA peak
    scores = 32 * 8192 * 8192
    assert qlora["activations"] > scores * (M.EAGER_SAVED_FP32 + M.FP32_SCORES_BACKWARD_BYTES)
