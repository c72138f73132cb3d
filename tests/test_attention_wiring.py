"""The attention choice as plan() makes it: declared work -> this GPU's tune cache or shipped priors -> the
policy weighs measured seconds and first-use costs (issue 13). Pure: recorded H200 snapshot, configs only."""

from __future__ import annotations

from pathlib import Path

import pytest

import cudaload
from cudaload.capabilities import Capabilities
from cudaload.testing import full_config

FIXTURE = Path(__file__).parent / "fixtures" / "h200.json"


@pytest.fixture(scope="module")
def h200() -> Capabilities:
    return Capabilities.from_json(FIXTURE.read_text())


@pytest.fixture(autouse=True)
def empty_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDALOAD_CACHE", str(tmp_path))  # no tune cache: the shipped priors answer


def _plan(h200: Capabilities, **kw: object) -> cudaload.Plan:
    return cudaload.plan(full_config("Qwen3-8B"), hardware=h200, assume_installed=["flash-attn-4"], **kw)


@pytest.mark.parametrize(
    ("batch", "total", "new", "padded", "want"),
    [
        (8, 2080, 32, False, "sdpa"),  # 1.69 s vs FA4 1.95 (all-ones mask)
        (8, 2080, 32, True, "eager"),  # left-padded: eager 2.21 vs sdpa 2.42
        (1, 4160, 64, False, "sdpa"),  # 2.37 vs eager 2.63
        (1, 544, 32, False, "eager"),  # 1.03 vs sdpa 1.07
        (32, 640, 128, False, "sdpa"),  # 6.75 vs FA4 6.90 (+ its first use)
    ],
)
def test_declared_work_uses_shipped_priors(
    h200: Capabilities, batch: int, total: int, new: int, padded: bool, want: str
) -> None:
    p = _plan(h200, batch_size=batch, seq_len=total, new_tokens=new, padded=padded)
    assert p.attention.choice == want
    assert p.attention.reasons[0].startswith("shipped prior: NVIDIA H200 (sm90), 2026-11-30")
    assert "flash_attention_4" in p.attention.reasons[0]  # every measured backend listed with its seconds


def test_no_declared_work_pays_nothing(h200: Capabilities) -> None:
    p = _plan(h200)
    assert p.attention.choice == "sdpa"
    assert not any("shipped prior" in r for r in p.attention.reasons)


def test_this_gpus_measurement_wins_over_priors(h200: Capabilities) -> None:
    from cudaload.model_info import model_info
    from cudaload.tuning import Entry, TimingCache, Work, bucket, gpu_id, package_versions, signature

    info = model_info(full_config("Qwen3-8B"))
    caps = h200.with_packages(["flash-attn-4"], ())
    work = Work(8, 2048, 32)
    entry = Entry(
        gpu=gpu_id(caps),
        versions=package_versions(caps),
        signature=signature(info, "bfloat16"),
        work=bucket(work),
        seconds={"sdpa": 9.0, "eager": 9.5, "flash_attention_4": 1.0},
        date="2026-12-01T00:00:00",
    )
    assert TimingCache().put(entry)
    p = cudaload.plan(full_config("Qwen3-8B"), hardware=caps, batch_size=8, seq_len=2080, new_tokens=32)
    assert p.attention.choice == "flash_attention_4"  # 1.0 + 5.7 s first use < 9.0
    assert p.attention.reasons[0].startswith("measured on this GPU on 2026-12-01")


def test_explicit_backend_is_kept_with_the_timings_shown(h200: Capabilities) -> None:
    p = _plan(h200, batch_size=8, seq_len=2080, new_tokens=32, attn="flash_attention_4")
    assert p.attention.choice == "flash_attention_4" and p.attention.explicit


def test_tune_needs_a_declared_work(tiny_model) -> None:  # type: ignore[no-untyped-def]
    from cudaload.errors import ConfigurationError

    with pytest.raises(ConfigurationError, match="batch_size"):
        cudaload.load_model(str(tiny_model("qwen3")), tune=True)


def test_cli_plan_takes_new_tokens_and_padded(h200: Capabilities, tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    from cudaload.cli import main

    (tmp_path / "h200.json").write_text(FIXTURE.read_text())
    cfg = tmp_path / "cfg"
    full_config("Qwen3-8B").save_pretrained(cfg)
    rc = main(
        [
            "plan",
            str(cfg),
            "--hardware",
            str(tmp_path / "h200.json"),
            "--batch-size",
            "8",
            "--seq-len",
            "2080",
            "--new-tokens",
            "32",
            "--padded",
            "--assume-installed",
            "flash-attn-4",
        ]
    )
    assert rc == 0
    out = capsys.readouterr().out
    assert "attention: eager" in out and "left-padded" in out
