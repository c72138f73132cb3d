"""cudaload.tuning: signatures and work buckets, the timing cache, lookup (cache, then shipped priors), FA4's
compile cache switch, the shared timing code and tune() on a tiny model on the CPU. Timing runs are real;
no speed is asserted."""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest

from cudaload.capabilities import Capabilities
from cudaload.errors import LoadError
from cudaload.execute.measure.backends import Measurement, WorkShape, make_inputs, run_rounds
from cudaload.execute.runtime.fa4_cache import enable_fa4_compile_cache
from cudaload.model_info import model_info
from cudaload.profiles import hardware
from cudaload.testing import full_config
from cudaload.tuning import (
    CACHE_VERSION,
    AttentionSignature,
    Entry,
    TimingCache,
    Work,
    WorkBucket,
    as_work,
    bucket,
    gpu_id,
    load_priors,
    lookup,
    package_versions,
    priors_from_bench,
    signature,
)
from cudaload.tuning.timings import prior_entry

FIXTURES = Path(__file__).parent / "fixtures"
BENCH = Path(__file__).resolve().parent.parent / "benchmarks" / "investigations" / "bench_attention.py"


@pytest.fixture(scope="module")
def h200() -> Capabilities:
    return Capabilities.from_json((FIXTURES / "h200.json").read_text())


@pytest.fixture(scope="module")
def qwen8b() -> Any:
    return model_info(full_config("Qwen3-8B"))


def _entry(
    caps: Capabilities, info: Any, work: Work, seconds: dict[str, float], date: str = "2026-12-01"
) -> Entry:
    return Entry(
        gpu=gpu_id(caps),
        versions=package_versions(caps),
        signature=signature(info, "bfloat16"),
        work=bucket(work),
        seconds=seconds,
        date=date,
        detail={
            "work": {
                "batch_size": work.batch_size,
                "prompt_len": work.prompt_len,
                "new_tokens": work.new_tokens,
                "padded": work.padded,
            }
        },
    )


# -- signature and buckets -------------------------------------------------------------------------------------


def test_signature_of_qwen3_8b_and_gemma2(qwen8b: Any) -> None:
    s = signature(qwen8b, "torch.bfloat16")
    assert (s.heads, s.kv_heads, s.qk_head_dim, s.v_head_dim, s.dtype) == (32, 8, 128, 128, "bfloat16")
    assert (s.sliding_window, s.softcap, s.sinks, s.alibi) == (None, None, False, False)
    assert s.klass() == "qk128/v128/bfloat16/plain"
    g = signature(model_info(full_config("Gemma-2-9B")), "bfloat16")
    assert (g.qk_head_dim, g.sliding_window, g.softcap) == (256, 4096, 50.0)
    assert g.klass() == "qk256/v256/bfloat16/window+softcap"
    assert g.key() != s.key()
    assert AttentionSignature.from_dict(json.loads(json.dumps(g.to_dict()))) == g


def test_signature_reads_facts_added_to_model_info(qwen8b: Any) -> None:
    """MLA head dims, sinks and ALiBi come from ModelInfo fields when it has them (0 = same as head_dim)."""
    mla = SimpleNamespace(
        summary=qwen8b.summary,
        qk_head_dim=192,
        v_head_dim=128,
        sinks=True,
        alibi=False,
        attn_softcapping=None,
        sliding_layers=0,
    )
    s = signature(mla, "bfloat16")
    assert (s.qk_head_dim, s.v_head_dim, s.sinks) == (192, 128, True)
    assert s.klass() == "qk192/v128/bfloat16/sinks"
    same = SimpleNamespace(summary=qwen8b.summary, qk_head_dim=0, v_head_dim=0)
    assert signature(same, "bfloat16").qk_head_dim == 128


def test_window_counts_only_where_a_layer_slides(qwen8b: Any) -> None:
    summary = replace(qwen8b.summary, sliding_window=4096)
    assert signature(SimpleNamespace(summary=summary, sliding_layers=0), "bfloat16").sliding_window is None
    assert signature(SimpleNamespace(summary=summary, sliding_layers=3), "bfloat16").sliding_window == 4096


def test_buckets_round_up_to_powers_of_two() -> None:
    assert bucket(Work(8, 2048, 32)) == WorkBucket(8, 2048, 32, False)
    assert bucket(Work(3, 1500, 100, True)) == WorkBucket(4, 2048, 128, True)
    assert bucket(Work(1, 10, 1)) == WorkBucket(1, 64, 16, False)
    assert bucket(Work(1, 512)).new_tokens is None
    a, b = bucket(Work(8, 2048, 32)), bucket(Work(8, 1024, 64))
    assert a.distance(b) == 2.0
    assert a.distance(replace(a, padded=True)) == float("inf")
    assert a.distance(bucket(Work(8, 2048))) == 0.0  # undeclared new tokens match any
    assert WorkBucket.from_dict(a.to_dict()) == a


def test_as_work_accepts_what_callers_hold() -> None:
    assert as_work((8, 2080)) == Work(8, 2080)
    assert as_work({"batch_size": 8, "seq_len": 2080, "new_tokens": 32}) == Work(8, 2048, 32)
    assert as_work({"batch_size": 2, "prompt_len": 100, "padded": True}) == Work(2, 100, None, True)
    assert Work.from_total(1, 544, 32) == Work(1, 512, 32)
    with pytest.raises(ValueError):
        Work(0, 512)


# -- the timing cache -------------------------------------------------------------------------------------------


def test_cache_round_trip_is_atomic_and_keyed_by_versions(
    tmp_path: Path, h200: Capabilities, qwen8b: Any
) -> None:
    c = TimingCache(tmp_path / "sub" / "t.json")
    e = _entry(h200, qwen8b, Work(8, 2048, 32), {"sdpa": 1.5, "eager": 2.0})
    assert c.put(e)
    assert c.get(e.key) == e
    assert os.listdir(tmp_path / "sub") == ["t.json"]  # no temp file or lock file left behind
    data = json.loads((tmp_path / "sub" / "t.json").read_text())
    assert data["version"] == CACHE_VERSION and list(data["entries"]) == [e.key]
    # another torch is another key: an upgrade never reads old numbers
    newer = replace(h200, torch_version="2.12.0")
    assert package_versions(newer)["torch"] == "2.12.0"
    e2 = replace(e, versions=package_versions(newer), seconds={"sdpa": 1.0, "eager": 3.0})
    c.put(e2)
    assert c.get(e.key) == e and c.get(e2.key) == e2
    assert "flash-attn-4" not in package_versions(h200)  # not installed there
    fa4 = h200.with_packages(installed=["flash-attn-4"])
    assert "flash-attn-4" in package_versions(fa4)


@pytest.mark.parametrize(
    "content",
    [
        "{not json",
        json.dumps([1, 2]),
        json.dumps({"version": CACHE_VERSION + 1, "entries": {}}),
        json.dumps({"version": 0, "entries": {"k": {}}}),
    ],
)
def test_unusable_cache_is_ignored_with_a_warning_and_rewritten(
    tmp_path: Path, h200: Capabilities, qwen8b: Any, content: str, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "t.json"
    path.write_text(content)
    c = TimingCache(path)
    with caplog.at_level(logging.WARNING, logger="cudaload.tuning.store"):
        assert list(c.entries()) == []
        assert lookup(h200, qwen8b, "bfloat16", Work(64, 64, 512), cache=c, priors=[]) is None
    assert "ignoring the attention timing cache" in caplog.text
    e = _entry(h200, qwen8b, Work(8, 2048, 32), {"sdpa": 1.5})
    assert c.put(e)
    assert [x.key for x in c.entries()] == [e.key]


def test_malformed_entry_is_skipped(
    tmp_path: Path, h200: Capabilities, qwen8b: Any, caplog: pytest.LogCaptureFixture
) -> None:
    e = _entry(h200, qwen8b, Work(8, 2048, 32), {"sdpa": 1.5})
    path = tmp_path / "t.json"
    path.write_text(
        json.dumps({"version": CACHE_VERSION, "entries": {"bad": {"gpu": "x"}, e.key: e.to_dict()}})
    )
    with caplog.at_level(logging.WARNING):
        assert [x.key for x in TimingCache(path).entries()] == [e.key]
    assert "'bad'" in caplog.text


def test_unwritable_cache_reports_instead_of_raising(tmp_path: Path, h200: Capabilities, qwen8b: Any) -> None:
    (tmp_path / "file").write_text("")
    c = TimingCache(tmp_path / "file" / "t.json")  # its directory is a file
    assert c.put(_entry(h200, qwen8b, Work(1, 512, 32), {"sdpa": 1.0})) is False


def test_default_cache_lives_under_cudaload_cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("CUDALOAD_CACHE", str(tmp_path))
    assert TimingCache().path == str(tmp_path / "attention-timings.json")


# -- lookup ---------------------------------------------------------------------------------------------------


def _shipped(model: str, work: tuple[int, int, int, bool], mask: str | None = None) -> dict[str, Any]:
    """The shipped prior row for ``model`` and ``work`` (batch, prompt, new, padded), read from the file."""
    from importlib import resources

    doc = json.loads(resources.files("cudaload.tuning").joinpath("priors.json").read_text())
    keys = ("batch_size", "prompt_len", "new_tokens", "padded")
    rows = [
        p
        for p in doc["priors"]
        if p["model"] == model
        and tuple(p["work"][k] for k in keys) == work
        and (mask is None or p.get("mask") == mask)
    ]
    assert rows, f"no shipped prior for {model} {work} {mask}"
    return dict(rows[-1])


def test_cache_comes_before_priors(tmp_path: Path, h200: Capabilities, qwen8b: Any) -> None:
    c = TimingCache(tmp_path / "t.json")
    t = lookup(h200, qwen8b, "bfloat16", Work(8, 2048, 32), cache=c)
    assert t is not None and t.kind == "prior"
    assert t.source.startswith("shipped prior: NVIDIA H200 (sm90), 20")
    # the same bucket answers before a nearer mask of another bucket (the all-ones 4 x 1024 + 64 row)
    ones = _shipped(model="Qwen3-8B", work=(8, 2048, 32, False))
    assert dict(t.seconds) == ones["seconds"] and t.fastest == min(ones["seconds"], key=ones["seconds"].get)
    c.put(_entry(h200, qwen8b, Work(8, 2048, 32), {"sdpa": 1.8, "flash_attention_4": 1.6}))
    t = lookup(h200, qwen8b, "bfloat16", Work(8, 2048, 32), cache=c)
    assert t is not None and t.kind == "measured" and t.fastest == "flash_attention_4"
    assert t.source == ("measured on this GPU on 2026-12-01 for batch 8 x 2048 + 32 new")
    near = lookup(h200, qwen8b, "bfloat16", Work(8, 1024, 64), cache=c)
    assert near is not None and near.kind == "measured"
    assert "(nearest to the declared batch 8 x 1024 + 64 new)" in near.source
    # another dtype is another signature: the cache does not answer, the priors (bf16) do not either
    assert lookup(h200, qwen8b, "float16", Work(8, 2048, 32), cache=c) is None


def test_priors_pick_the_nearest_bucket_and_respect_padding(
    tmp_path: Path, h200: Capabilities, qwen8b: Any
) -> None:
    c = TimingCache(tmp_path / "t.json")
    short = lookup(h200, qwen8b, "bfloat16", Work(1, 512, 32), cache=c)
    assert short is not None and dict(short.seconds) == _shipped("Qwen3-8B", (1, 512, 32, False))["seconds"]
    padded = lookup(h200, qwen8b, "bfloat16", Work(8, 2048, 32, padded=True), cache=c)
    assert padded is not None and "left-padded" in padded.source
    assert dict(padded.seconds) == _shipped("Qwen3-8B", (8, 2048, 32, True))["seconds"]
    assert lookup(h200, qwen8b, "bfloat16", Work(64, 512, 32), cache=c) is None  # too far from any prior
    assert lookup(h200, qwen8b, "bfloat16", None, cache=c) is None  # nothing declared, nothing measured
    small = model_info(full_config("Qwen3-0.6B"))  # other head counts, same class
    assert lookup(h200, small, "bfloat16", Work(8, 2048, 32), cache=c) is not None
    gemma = model_info(full_config("Gemma-2-9B"))  # soft-capping and window: other kernels
    assert lookup(h200, gemma, "bfloat16", Work(8, 2048, 32), cache=c) is None


def test_priors_cross_gpus_only_within_a_compute_capability(
    tmp_path: Path, qwen8b: Any, h200: Capabilities
) -> None:
    c = TimingCache(tmp_path / "t.json")
    h100 = lookup(hardware("H100-SXM"), qwen8b, "bfloat16", Work(8, 2048, 32), cache=c)
    assert h100 is not None
    assert h100.source.startswith(
        "shipped prior: NVIDIA H200 (sm90), same compute capability as this NVIDIA H100 80GB HBM3, 20"
    )
    assert lookup(hardware("A100-80GB"), qwen8b, "bfloat16", Work(8, 2048, 32), cache=c) is None
    assert lookup(replace(h200, gpus=()), qwen8b, "bfloat16", Work(8, 2048, 32), cache=c) is None


def test_shipped_priors_load_and_are_dated_and_sourced() -> None:
    priors = load_priors()
    assert len(priors) >= 7
    for p in priors:
        assert p.gpu == "NVIDIA H200/sm90" and p.date >= "2026-11-30"
        assert p.versions["torch"].startswith("2.11") and p.versions["transformers"] == "5.17.0"
        assert p.detail["source"] and p.detail["how"]
        # first-seen seconds with the repeated ones beside them, for the same backends
        assert "eager" in p.seconds and len(p.seconds) >= 2 and set(p.repeated_s) == set(p.seconds)


def test_bad_priors_file_is_ignored(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    bad = tmp_path / "p.json"
    bad.write_text(json.dumps({"version": 99, "priors": []}))
    with caplog.at_level(logging.WARNING):
        assert load_priors(bad) == []
        bad.write_text("[")
        assert load_priors(bad) == []
    assert caplog.text.count("ignoring attention priors") == 2


# -- FA4's compile cache ---------------------------------------------------------------------------------------


def test_fa4_cache_is_turned_on_under_cudaload_cache_when_unset(tmp_path: Path) -> None:
    env = {"CUDALOAD_CACHE": str(tmp_path)}
    st = enable_fa4_compile_cache(env)
    assert env["FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED"] == "1"
    assert env["FLASH_ATTENTION_CUTE_DSL_CACHE_DIR"] == str(tmp_path / "fa4")
    assert st.enabled and st.directory == str(tmp_path / "fa4") and len(st.set_by_cudaload) == 2


@pytest.mark.parametrize(
    ("user", "enabled", "directory"),
    [
        ({"FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED": "0"}, False, None),
        ({"FLASH_ATTENTION_CUTE_DSL_CACHE_DIR": "/mine"}, True, "/mine"),
        (
            {"FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED": "1", "FLASH_ATTENTION_CUTE_DSL_CACHE_DIR": "/mine"},
            True,
            "/mine",
        ),
    ],
)
def test_fa4_cache_respects_the_user(user: dict[str, str], enabled: bool, directory: str | None) -> None:
    env = dict(user)
    st = enable_fa4_compile_cache(env)
    assert st.enabled is enabled and st.directory == directory
    for k, v in user.items():
        assert env[k] == v
    if not enabled:
        assert "FLASH_ATTENTION_CUTE_DSL_CACHE_DIR" not in env and "off" in st.note


def test_fa4_cache_left_alone_once_fa4_is_imported(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED", raising=False)
    monkeypatch.delenv("FLASH_ATTENTION_CUTE_DSL_CACHE_DIR", raising=False)
    monkeypatch.setitem(sys.modules, "flash_attn.cute.cache_utils", ModuleType("flash_attn.cute.cache_utils"))
    st = enable_fa4_compile_cache()
    assert not st.enabled and "imported before" in st.note
    assert "FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED" not in os.environ


def test_importing_cudaload_tuning_sets_nothing_and_imports_no_torch() -> None:
    code = (
        "import os, sys, cudaload, cudaload.tuning; "
        "assert not any(k.startswith('FLASH_ATTENTION_CUTE_DSL') for k in os.environ); "
        "assert 'torch' not in sys.modules and 'transformers' not in sys.modules, 'heavy import'"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLASH_ATTENTION_CUTE_DSL")}
    subprocess.run([sys.executable, "-c", code], check=True, env=env)


# -- the shared timing code -----------------------------------------------------------------------------------


def test_work_shapes_build_the_masks_they_name() -> None:
    import torch

    ids, mask = make_inputs(WorkShape(2, 16, 4), 320, "cpu")
    assert ids.shape == (2, 16) and mask is None and int(ids.min()) >= 4
    _, ones = make_inputs(WorkShape(2, 16, 4, "ones"), 320, "cpu")
    assert ones is not None and bool(ones.all())
    w = WorkShape(4, 16, 4, "left", 8)
    assert w.lengths() == [16, 13, 11, 8] and w.name == "4x16+4 left-pad 8-16"
    ids, m = make_inputs(w, 320, "cpu", pad_token_id=1)
    assert m is not None
    assert m.sum(dim=1).tolist() == w.lengths()
    assert bool((ids[m == 0] == 1).all()) and bool(m[:, -1].all())  # left padding: the last column is real
    assert torch.equal(make_inputs(w, 320, "cpu", pad_token_id=1)[0], ids)  # the same batch every time
    with pytest.raises(ValueError):
        WorkShape(1, 8, 2, "right")


def _tiny_models(*backends: str) -> dict[str, Any]:
    import torch
    from transformers import AutoModelForCausalLM

    from cudaload.testing import tiny_config

    out = {}
    for b in backends:
        torch.manual_seed(0)
        out[b] = AutoModelForCausalLM.from_config(tiny_config("qwen3"), attn_implementation=b).eval()
    return out


def test_run_rounds_times_every_backend_and_work_and_honours_the_deadline() -> None:
    import time

    models = _tiny_models("sdpa", "eager")
    works = [WorkShape(2, 16, 3), WorkShape(3, 16, 3, "left", 8)]
    ms = run_rounds(models, works, reps=2, deadline=time.perf_counter() + 300, slow_factor=1e9)
    assert [(m.backend, m.work.name) for m in ms] == [(b, w.name) for w in works for b in models]
    for m in ms:
        s = m.summary()
        assert m.error is None and m.stopped == "done" and s["generate_s"]["n"] == 2
        assert s["prefill_s"]["n"] == 2 and s["decode_s_per_token"] is not None and m.warmup_tokens == 3
        assert s["cpu_fraction"] >= 0 and s["first_rep_extra_s"] is not None
        json.dumps(s)
    late = run_rounds(models, works[:1], reps=2, deadline=time.perf_counter() - 1)
    assert all(m.stopped == "budget" and not m.generate_s and m.warmup_s is None for m in late)


def test_a_backend_far_behind_stops_after_two_reps() -> None:
    import time

    models = _tiny_models("sdpa", "eager")
    ms = run_rounds(
        models,
        [WorkShape(1, 8, 2)],
        reps=3,
        deadline=time.perf_counter() + 300,
        slow_factor=1.0,
        first_seen=False,
    )
    counts = sorted(len(m.generate_s) for m in ms)
    assert counts == [2, 3]  # with factor 1 whichever is slower after two reps stops there, the other goes on
    loser = next(m for m in ms if len(m.generate_s) == 2)
    assert loser.stopped == "more than 1x the fastest after 2 reps"


@pytest.mark.filterwarnings("ignore:You are calling .generate\\(\\) with the `input_ids` being on a device")
def test_run_rounds_records_a_failing_backend_and_goes_on() -> None:
    import time

    import torch

    models = _tiny_models("sdpa")
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):  # weights without data: generate() fails for real
        models["broken"] = AutoModelForCausalLM.from_config(models["sdpa"].config)
    ms = run_rounds(models, [WorkShape(1, 8, 2)], reps=1, deadline=time.perf_counter() + 300)
    by = {m.backend: m for m in ms}
    assert by["sdpa"].generate_s and by["broken"].error and by["broken"].stopped == "error"


def test_first_call_extra_is_the_warmup_beyond_a_steady_call() -> None:
    m = Measurement(
        "x",
        WorkShape(1, 8, 5),
        warmup_s=3.0,
        warmup_tokens=3,
        generate_s=[1.0, 1.2, 1.1],
        generate_cpu_s=[0.9, 1.0, 1.0],
        generate_at=[0, 1, 2],
        prefill_s=[0.2, 0.2, 0.2],
    )
    s = m.summary()
    assert s["decode_s_per_token"] == pytest.approx((1.1 - 0.2) / 4)
    assert s["first_call_extra_s"] == pytest.approx(3.0 - (0.2 + 2 * (0.9 / 4)))
    assert s["first_rep_extra_s"] == pytest.approx(1.0 - 1.15)
    # no warm-up prefill recorded: the warm-up's 3 s over its 2 decode steps, scaled to 4 steps
    assert m.expected_s() == pytest.approx(6.0)
    assert replace(m, warmup_prefill_s=1.0).expected_s() == pytest.approx(1.0 + 4 * 1.0)


# -- priors from a benchmark run -------------------------------------------------------------------------------


def test_priors_from_bench_results_round_trip(h200: Capabilities, qwen8b: Any, tmp_path: Path) -> None:
    def row(b: str, w: WorkShape, xs: list[float]) -> dict[str, Any]:
        # first-seen seconds xs; the repeated ones 10% lower
        return Measurement(
            b,
            w,
            warmup_s=2.0,
            warmup_tokens=4,
            generate_s=[x * 0.9 for x in xs],
            generate_cpu_s=xs,
            generate_at=[0.0] * len(xs),
            prefill_s=[0.1] * len(xs),
            first_s=xs,
        ).summary()

    w1, w2 = WorkShape(8, 2048, 32, "ones"), WorkShape(8, 2048, 32, "left", 1024)
    results = {
        "date": "2026-12-01T01:00:00+00:00",
        "gpu_id": "NVIDIA H200/sm90",
        "versions": {
            "torch": "2.11.0+cu130",
            "transformers": "5.17.0",
            "flash-attn-4": "4.0.0b36",
            "triton": "3.6",
        },
        "shapes": [
            {
                "shape": "Qwen3-8B",
                "dtype": "bfloat16",
                "rows": [
                    row("sdpa", w1, [1.6, 1.7, 1.5]),
                    row("eager", w1, [2.1]),
                    row("flash_attention_4", w1, [1.9, 2.0]),
                    row("sdpa", w2, [2.4]),
                    row("eager", w2, [2.2, 2.3]),
                ],
            }
        ],
    }
    doc = priors_from_bench(results, source="run-x")
    assert len(doc["priors"]) == 2
    entries = [prior_entry(p) for p in doc["priors"]]
    assert entries[0].seconds == {"sdpa": 1.6, "eager": 2.1, "flash_attention_4": 1.95}
    assert entries[0].repeated_s["sdpa"] == pytest.approx(1.44)
    assert entries[0].signature == signature(qwen8b, "bfloat16")
    assert entries[1].work.padded and entries[1].detail["mask"] == "left"
    assert "triton" not in entries[0].versions
    # through the CLI into a priors file, then through lookup
    res = tmp_path / "results.json"
    res.write_text(json.dumps(results))
    out = tmp_path / "priors.json"
    subprocess.run(
        [sys.executable, "-m", "cudaload.tuning", "priors", str(res), "--out", str(out)], check=True
    )
    priors = load_priors(out)
    t = lookup(
        h200,
        qwen8b,
        "bfloat16",
        Work(8, 2048, 32, True),
        cache=TimingCache(tmp_path / "c.json"),
        priors=priors,
    )
    assert t is not None and t.fastest == "eager" and "2026-12-01" in t.source
    assert t.repeated["eager"] == pytest.approx(2.25 * 0.9)


def test_sdpa_facts_from_runs_use_the_steady_pairs(tmp_path: Path) -> None:
    from cudaload.tuning.timings import sdpa_facts_from_bench

    def row(b: str, first: float, rep: float) -> dict[str, Any]:
        w = WorkShape(4, 1024, 64, "ones")
        return Measurement(
            b, w, generate_s=[rep], generate_cpu_s=[rep], generate_at=[0.0], first_s=[first]
        ).summary()

    run = {
        "date": "2026-12-02T12:00:00+00:00",
        "gpu_id": "NVIDIA H200/sm90",
        "versions": {"torch": "2.11.0", "transformers": "5.17.0", "cudnn": "9.19.0"},
        "shapes": [{"shape": "Qwen3-8B", "rows": [row("sdpa", 6.0, 2.8), row("cudaload_sdpa", 3.0, 3.5)]}],
        "steady": {"works": [{"work": "x", "ratio_median": 1.01}, {"work": "y", "ratio_median": 0.99}]},
    }
    (fact,) = sdpa_facts_from_bench([run], source="run-y")
    assert fact["variant"] == "cudaload_sdpa" and fact["speedup_first_seen"] == [2.0, 2.0, 2.0]
    # the one repeated call (0.8x) is within the host's noise: the alternating pairs speak for that state
    assert fact["ratio_repeated"] == [0.99, 1.0, 1.01] and fact["versions"]["cudnn"] == "9.19.0"
    # the same work measured again in a later run counts once, from that run (as the priors keep the last)
    again = json.loads(json.dumps(run))
    again["shapes"][0]["rows"] = [row("sdpa", 6.0, 2.8), row("cudaload_sdpa", 2.0, 2.8)]
    (fact,) = sdpa_facts_from_bench([run, again], source="run-y")
    assert fact["works"] == 1 and fact["speedup_first_seen"] == [3.0, 3.0, 3.0]
    assert fact["ratio_repeated"] == [0.99, 1.0, 1.01]  # the steady works, once each


# -- tune() and the command line ----------------------------------------------------------------------------------


def test_tune_measures_stores_and_lookup_finds_it(
    tiny_model: Callable[..., Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    import argparse

    from cudaload.detection import detect
    from cudaload.execute.measure import add_tune_parser, measured_or_tune, run_tune

    monkeypatch.setenv("CUDALOAD_CACHE", str(tmp_path))
    path = tiny_model("qwen3")
    parser = argparse.ArgumentParser()
    add_tune_parser(parser.add_subparsers())
    args = parser.parse_args(
        [
            "tune",
            str(path),
            "--batch-size",
            "2",
            "--seq-len",
            "19",  # 16 prompt tokens + 3 new, counted like `cudaload plan --seq-len`
            "--new-tokens",
            "3",
            "--padded",
            "--budget-s",
            "120",
            "--reps",
            "2",
            "--backends",
            "sdpa,eager,nonsense",
            "--json",
        ]
    )
    assert args.func(args) == 0 and args.func is run_tune
    out = json.loads(capsys.readouterr().out)
    assert set(out["timings"]["seconds"]) == {"sdpa", "eager"}
    assert "nonsense" in out["not_usable"] and out["stored"] and out["interleaved"]
    assert out["timings"]["source"].startswith("measured on this machine's CPU on ")
    assert "batch 2 x 16 + 3 new, left-padded" in out["timings"]["source"]
    caps = detect()
    info = model_info(path)
    t = lookup(caps, info, "float32", Work(2, 16, 3, True))
    assert t is not None and t.kind == "measured" and t.seconds == out["timings"]["seconds"]
    assert lookup(caps, info, "float32", Work(2, 16, 3, False)) is None  # unpadded was not measured
    # load_model(tune=True)'s helper: the cached measurement, no second run
    again = measured_or_tune(str(path), caps, info, "float32", Work(2, 16, 3, True), budget_s=0.0)
    assert again.kind == "measured" and again.seconds == t.seconds


def test_tune_one_backend_at_a_time(tiny_model: Callable[..., Path], tmp_path: Path) -> None:
    from cudaload.execute.measure import tune

    c = TimingCache(tmp_path / "t.json")
    r = tune(
        str(tiny_model("qwen3")), seq_len=8, new_tokens=2, reps=1, budget_s=120, interleave=False, cache=c
    )
    assert not r.interleaved and set(r.timings.seconds) == {"sdpa", "eager"}
    assert "one backend at a time" in r.entry.detail["how"] and c.get(r.entry.key) == r.entry
    assert "measured on this machine's CPU" in r.render()
    assert any("no GPU plan reads them" in n for n in r.notes)
    assert sorted(os.listdir(tmp_path)) == ["t.json"]


def test_tune_without_time_for_one_call_says_so(tiny_model: Callable[..., Path], tmp_path: Path) -> None:
    from cudaload.execute.measure import tune

    with pytest.raises(LoadError) as e:
        tune(str(tiny_model("qwen3")), budget_s=1e-9, cache=TimingCache(tmp_path / "t.json"))
    assert "budget" in str(e.value)
    assert not (tmp_path / "t.json").exists()


@pytest.mark.parametrize("budget", [0, 0.0, -5, float("nan"), True, "60"])
def test_tune_refuses_a_budget_of_no_time(tmp_path: Path, budget: Any) -> None:
    """budget_s=0 loaded nothing and then failed with a LoadError; it is refused before the model is read."""
    from cudaload.errors import ConfigurationError
    from cudaload.execute.measure import tune

    with pytest.raises(ConfigurationError, match="budget_s") as e:
        tune(str(tmp_path / "no-such-model"), budget_s=budget, cache=TimingCache(tmp_path / "t.json"))
    assert "above 0" in (e.value.fix or "")


@pytest.mark.parametrize("argv", [["--seq-len", "0"], ["--seq-len", "32", "--new-tokens", "32"]])
def test_tune_command_refuses_a_seq_len_with_no_prompt(
    monkeypatch: pytest.MonkeyPatch, argv: list[str]
) -> None:
    """`cudaload tune --seq-len 0` timed (and cached) a 1-token prompt: max(1, seq_len - new_tokens) hid it."""
    import argparse

    from cudaload.errors import ConfigurationError
    from cudaload.execute.measure import add_tune_parser

    # the package's `tune` is the function
    tune_module = importlib.import_module("cudaload.execute.measure.tune")
    called: list[dict[str, Any]] = []
    monkeypatch.setattr(tune_module, "tune", lambda *a, **kw: called.append(kw))
    parser = argparse.ArgumentParser()
    add_tune_parser(parser.add_subparsers())
    args = parser.parse_args(["tune", "MODEL", *argv])
    with pytest.raises(ConfigurationError, match="leaves no prompt") as e:
        args.func(args)
    assert "--seq-len 33" in (e.value.fix or "") and not called


# -- the GPU benchmark's CPU smoke mode ---------------------------------------------------------------------------


def _load_bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("cudaload_bench_attention", BENCH)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.slow
def test_bench_attention_smoke_writes_its_tables(tmp_path: Path) -> None:
    subprocess.run(
        [
            sys.executable,
            str(BENCH),
            "--smoke",
            "--out",
            str(tmp_path),
            "--works",
            "2x32+4;3x32+4 left-pad 16-32",
            "--reps",
            "2",
            "--budget-s",
            "120",
        ],
        check=True,
        capture_output=True,
        text=True,
    )
    res = json.loads((tmp_path / "results.json").read_text())
    (shape,) = res["shapes"]
    assert shape["backends"] == ["sdpa", "eager"]
    assert {r["work"] for r in shape["rows"]} == {"2x32+4", "3x32+4 left-pad 16-32"}
    assert all(r["generate_s"] for r in shape["rows"])
    assert shape["choices"]["2x32+4"]["choice"] in ("sdpa", "eager")  # plan()'s pick beside the measurement
    assert set(shape["sdpa_probe"]["variants"]) == {"gqa, no mask", "gqa, bool mask", "repeat_kv, bool mask"}
    assert shape["replica"]["run9 order"]["rows"] and shape["replica"]["reversed"]["order"] == [
        "eager",
        "sdpa",
    ]
    md = (tmp_path / "results.md").read_text()
    assert "| 3x32+4 left-pad 16-32 |" in md and "Run-9 replica" in md
    bench = _load_bench()
    assert len(bench.WORKS) >= 8 and {w.name for w in bench.WORKS} >= set(bench.ISSUE_TABLE)
