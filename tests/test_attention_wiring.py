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


def _priors_8b() -> list[dict[str, object]]:
    import json
    from importlib import resources

    doc = json.loads(resources.files("cudaload.tuning").joinpath("priors.json").read_text())
    # the unpadded rows a tokenizer's batch makes (all-ones mask) and the left-padded ones
    return [
        p for p in doc["priors"] if p["model"] == "Qwen3-8B" and p.get("mask") in ("ones", "left", "none")
    ]


@pytest.mark.parametrize("row", _priors_8b(), ids=lambda p: f"{p['work']}-{p.get('mask')}")  # type: ignore[index]
def test_declared_work_takes_the_cheapest_measured_backend(h200: Capabilities, row: dict) -> None:  # type: ignore[type-arg]
    """For every shipped 8B row: the plan for that declared work lists the row's seconds and chooses the
    backend with the least measured seconds + first-use seconds (FA4's import and JIT in a fresh process)."""
    from cudaload.policies.attention.first_use import FIRST_USE

    w = row["work"]
    p = _plan(
        h200,
        batch_size=w["batch_size"],
        seq_len=w["prompt_len"] + w["new_tokens"],
        new_tokens=w["new_tokens"],
        padded=w["padded"],
    )
    assert p.attention.reasons[0].startswith("shipped prior: NVIDIA H200 (sm90)")
    got = lookup_seconds(p.attention.reasons[0])
    assert got  # every measured backend listed with its seconds
    if (
        w["padded"]
        or row.get("mask") == "ones"
        or all(r.get("mask") != "ones" for r in _priors_8b() if r["work"] == w)
    ):
        seconds = {n: float(t) for n, t in row["seconds"].items()}
        if "cudaload_sdpa" in seconds and "cudaload_sdpa_nocudnn" in seconds:
            # the same kernels on first-seen lengths: one candidate, at the lower of the two (the policy's rule)
            seconds["cudaload_sdpa"] = min(seconds["cudaload_sdpa"], seconds.pop("cudaload_sdpa_nocudnn"))
        cost = {n: t + (FIRST_USE[n].seconds if n in FIRST_USE else 0.0) for n, t in seconds.items()}
        assert p.attention.choice == min(cost, key=cost.__getitem__)


def lookup_seconds(reason: str) -> dict[str, float]:
    import re

    return {m[1]: float(m[2]) for m in re.finditer(r"([a-z_0-9]+) ([0-9.]+) s", reason)}


def test_no_declared_work_pays_nothing(h200: Capabilities) -> None:
    p = _plan(h200)
    # sdpa with cuDNN kept off lengths met for the first times (the shipped H200 facts); no one-time cost
    assert p.attention.choice == "cudaload_sdpa"
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
    from cudaload.commands.cli import main

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
    assert "attention: " in out and "left-padded" in out


def test_first_use_here_follows_the_fa4_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """This process's FA4 first use: the JIT is a cache hit when cudaload's FA4 cache holds kernels, unless
    the user turned FA4's cache off."""
    from cudaload.capabilities import Capabilities
    from cudaload.planner import _first_use_here
    from cudaload.policies.attention.first_use import FA4_IMPORT_WARM_S, FA4_JIT_CACHED_S

    live = Capabilities(source="detected")
    monkeypatch.delenv("FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED", raising=False)
    monkeypatch.delenv("FLASH_ATTENTION_CUTE_DSL_CACHE_DIR", raising=False)
    if "flash_attn.cute" in __import__("sys").modules:
        pytest.skip("FA4 is imported in this process")
    assert _first_use_here(live) is None  # empty cache (CUDALOAD_CACHE is a fresh tmp dir): the shipped table
    (tmp_path / "fa4").mkdir()
    (tmp_path / "fa4" / "kernel.o").write_bytes(b"x")
    got = _first_use_here(live)
    assert got is not None and got["flash_attention_4"] == pytest.approx(FA4_IMPORT_WARM_S + FA4_JIT_CACHED_S)
    monkeypatch.setenv("FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED", "0")
    assert _first_use_here(live) is None
    assert _first_use_here(Capabilities(source="profile:H200")) is None  # a profile is a fresh process
