"""The training memory model against the H200's and the H100's fine-tuning runs (issue 33: within 10% of every
measured peak, never more than 5% low), through benchmarks/bench_train.py's own comparison, and the one run that
ran out of memory no longer planned as fitting."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
RUNS = sorted((ROOT / "benchmarks/results/2026-12-03-h200").glob("run*/t*/results.json"))
sys.path.insert(0, str(ROOT / "benchmarks"))

GiB = 1 << 30


def _outside_the_band(done: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    """The runs whose predicted peak is not within 5% under to 10% over the measured one."""
    return [
        (r["run"], r["mode"], r["dist"], r["method"], round(r["ratio"], 3))
        for r in done
        if not 0.95 <= r["ratio"] <= 1.10
    ]


@pytest.fixture(scope="module")
def rows() -> list[dict[str, Any]]:
    import bench_train

    out = bench_train.recompare([str(p) for p in RUNS])
    # run37's plain rows picked their largest step by real tokens, not by padded size (a bench bug fixed after
    # it; the results README says so): their step is not the one that set the peak
    return [r for r in out if not (r["run"].startswith("run37") and r["method"] == "plain")]


def test_the_runs_are_there(rows: list[dict[str, Any]]) -> None:
    assert len(RUNS) >= 5
    assert {r["method"] for r in rows} >= {"plain", "cudaload"}
    assert {r["mode"] for r in rows} == {"lora", "qlora"} and {r["shape"] for r in rows} == {"8b", "0.6b"}


def test_every_peak_is_predicted_within_10_percent_and_never_5_percent_low(
    rows: list[dict[str, Any]],
) -> None:
    done = [r for r in rows if not r["oom"]]
    assert len(done) >= 18
    assert not _outside_the_band(done)


def test_the_configuration_that_ran_out_of_memory_is_not_planned_again() -> None:
    """run39 t5: 8B LoRA on an emulated 46 GiB card, steps of 4,096 tokens, Liger's loss, no checkpointing; it
    failed with 44.05 GiB allocated and 1.90 GiB reserved but unusable. Today's model needs more than the card
    for it, and the plan for that card is another one: at most the same step without PEFT's fp32 input copies
    (the adapter_cast decision, which came after that run), 4.5 GiB less."""

    import cudaload
    from cudaload.model_info import model_info
    from cudaload.plans.training import StepShape
    from cudaload.policies.memory import CUDA_CONTEXT_BYTES, allocated_bytes, estimate, reserved_bytes
    from cudaload.profiles import hardware
    from cudaload.testing import full_config

    info = model_info(full_config("Qwen3-8B"))
    step = StepShape(4096, 8, 2048, packed=True, fused_loss=True)  # PEFT's cast, as it ran
    t = estimate(
        info,
        dtype="bfloat16",
        quantization=None,
        intent="lora",
        seq_len=2048,
        batch_size=8,
        attn="flash_attention_4",
        optimizer="adamw_torch_fused",
        gradient_checkpointing=False,
        step=step,
    )
    assert allocated_bytes(t) > 44.05 * GiB and reserved_bytes(t) > 46 * GiB
    caps = hardware("H200").with_packages(["peft", "flash-attn-4", "liger-kernel"], [])
    p = cudaload.plan(
        full_config("Qwen3-8B"),
        hardware=caps,
        intent="lora",
        seq_len=2048,
        batch_size=8,
        max_memory={"cuda:0": 46 * GiB + CUDA_CONTEXT_BYTES},
    )
    assert p.training is not None and p.gradient_checkpointing is not None
    chosen = (p.training.step.tokens, p.training.step.fused_loss, p.gradient_checkpointing.choice)
    assert chosen != (4096, True, "off") or p.training.step.cast_outside_autocast
    assert p.memory.per_device["cuda:0"] <= p.memory.budget["cuda:0"]


#: the H100's fine-tuning runs (2026-12-07: compiled layers, the chunked loss, TRL's SFTTrainer, filled steps;
#: 8B LoRA and QLoRA on chat lengths), recomputed with today's model the same way
H100_RUNS = sorted((ROOT / "benchmarks/results").glob("2026-12-07-*/gpu*/t*/results.json"))


def test_the_h100_runs_peaks_are_predicted_within_10_percent_and_never_5_percent_low() -> None:
    import bench_train

    out = bench_train.recompare([str(p) for p in H100_RUNS])
    done = [r for r in out if not r["oom"]]
    assert len(done) >= 27
    methods = {r["method"] for r in done}
    assert {"plain", "cudaload-compiled", "cudaload-fill-compiled", "cudaload-trl-compiled"} <= methods
    assert not _outside_the_band(done)
