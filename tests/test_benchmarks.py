"""The benchmark runner (benchmarks/run.py) stays honest: it runs end to end on CPU with tiny shapes and
writes every section; its pure summaries compute the ratios the README quotes. No timing value is asserted."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

RUNNER = Path(__file__).resolve().parent.parent / "benchmarks" / "run.py"


def _load_runner() -> ModuleType:
    spec = importlib.util.spec_from_file_location("cudaload_bench_run", RUNNER)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


run = _load_runner()


# -- pure helpers --
def test_median_and_ratio_ignore_missing_values() -> None:
    assert run.median([3.0, None, 1.0, 2.0]) == 2.0
    assert run.median([None]) is None
    assert run.ratio(1.0, 4.0) == 0.25
    assert run.ratio(1.0, 0.0) is None
    assert run.ratio(None, 1.0) is None
    assert run.within(1.04, 0.05) is True
    assert run.within(0.94, 0.05) is False


def test_human_bytes_picks_a_readable_unit() -> None:
    assert run.human(None) == "-"
    assert run.human(512) == "512 B"
    assert run.human(3 * 2**20) == "3 MiB"
    assert run.human(int(15.26 * 2**30)) == "15.3 GiB"


def _load_sample(method: str, seconds: float, **kw: Any) -> dict[str, Any]:
    return {
        "shape": "s",
        "quant": "bf16",
        "cache": "warm",
        "method": method,
        "seconds": seconds,
        "gpu_peak": 10,
        "rss_peak": 20,
        **kw,
    }


def test_summarize_load_takes_medians_and_the_cudaload_over_transformers_ratio() -> None:
    samples = [
        _load_sample("transformers", 3.0),
        _load_sample("cudaload", 1.0, load_path="fast"),
        _load_sample("cudaload", 0.5, load_path="fast"),
        _load_sample("transformers", 2.0),
        _load_sample("cudaload", 0.6, load_path="fast"),
        _load_sample("transformers", 4.0),
        _load_sample("cudaload", 0.0, error="LoadError: boom"),
    ]
    (row,) = run.summarize_load(samples)
    assert row["transformers"]["seconds"] == 3.0 and row["transformers"]["n"] == 3
    assert row["cudaload"]["seconds"] == 0.6 and row["cudaload"]["n"] == 3  # the failed sample is not a time
    assert row["cudaload"]["errors"] == ["LoadError: boom"]
    assert row["cudaload"]["load_path"] == "fast"
    assert row["ratio"] == pytest.approx(0.2)


def test_summarize_choice_compares_with_the_fastest_and_with_sdpa() -> None:
    rows = [
        {"backend": "sdpa", "work": "bs8 p2048", "decode_tok_s": 100.0, "prefill_ms": 50.0},
        {"backend": "eager", "work": "bs8 p2048", "decode_tok_s": 120.0, "prefill_ms": 100.0},
        {"backend": "flash_attention_4", "work": "bs8 p2048", "decode_tok_s": 90.0, "prefill_ms": 40.0},
        {"backend": "flash_attention_2", "work": "bs8 p2048", "error": "ImportError: not installed"},
    ]
    out = {s["metric"]: s for s in run.summarize_choice("8b", rows, {"bs8 p2048": "flash_attention_4"})}
    dec, pre = out["decode_tok_s"], out["prefill_ms"]
    assert dec["fastest"] == "eager" and dec["choice_vs_fastest"] == pytest.approx(0.75)
    assert dec["meets_goal"] is False and dec["choice_vs_sdpa"] == pytest.approx(0.9)
    # prefill: lower ms is faster, and the ratio still reads "1.0 = as fast as the fastest"
    assert pre["fastest"] == "flash_attention_4" and pre["choice_vs_fastest"] == pytest.approx(1.0)
    assert pre["meets_goal"] is True and pre["choice_vs_sdpa"] == pytest.approx(50 / 40)
    assert "flash_attention_2" not in dec["values"]


def test_summarize_choice_says_when_the_choice_was_not_timed() -> None:
    rows = [{"backend": "sdpa", "work": "bs1 p512", "decode_tok_s": 10.0, "generate_s": 2.0}]
    out = run.summarize_choice("0.6b", rows, {"bs1 p512": "flash_attention_3"})
    assert [s["metric"] for s in out] == ["decode_tok_s", "generate_s"]
    for s in out:
        assert s["choice_vs_fastest"] is None and s["meets_goal"] is None
        assert "flash_attention_3 was not timed" in s["note"]


def test_summarize_choice_ranks_whole_generate_time_lower_is_better() -> None:
    rows = [
        {
            "backend": "sdpa",
            "work": "bs8 p2048",
            "decode_tok_s": 100.0,
            "prefill_ms": 50.0,
            "generate_s": 2.0,
        },
        {
            "backend": "eager",
            "work": "bs8 p2048",
            "decode_tok_s": 120.0,
            "prefill_ms": 90.0,
            "generate_s": 2.2,
        },
    ]
    out = {s["metric"]: s for s in run.summarize_choice("8b", rows, {"bs8 p2048": "sdpa"})}
    assert out["decode_tok_s"]["fastest"] == "eager"
    assert out["generate_s"]["fastest"] == "sdpa" and out["generate_s"]["choice_vs_fastest"] == 1.0


def test_merge_takes_each_row_from_the_first_run_that_measured_it(tmp_path: Path) -> None:
    def load_sample(shape: str, cache: str, method: str, seconds: float) -> dict[str, Any]:
        return {"shape": shape, "quant": "bf16", "cache": cache, "method": method, "seconds": seconds}

    def results(samples: list[dict[str, Any]], choice_rows: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "meta": {},
            "machine": {},
            "sections": {
                "load": {"status": "ok", "samples": samples, "summary": []},
                "choice": {
                    "status": "ok",
                    "rows": choice_rows,
                    "summary": [
                        {"shape": r["shape"], "work": r["work"], "cudaload_choice": "sdpa"}
                        for r in choice_rows
                    ],
                },
            },
        }

    new = tmp_path / "run-new" / "results.json"
    old = tmp_path / "run-old" / "results.json"
    for f in (new, old):
        f.parent.mkdir()
    new.write_text(
        json.dumps(
            results(
                [load_sample("A", "warm", m, 1.0) for m in ("transformers", "cudaload")],
                [{"shape": "A", "backend": "sdpa", "work": "w", "decode_tok_s": 5.0}],
            )
        )
    )
    old.write_text(
        json.dumps(
            results(
                [
                    load_sample(sh, c, m, 9.0)
                    for sh, c in (("A", "warm"), ("A", "cold"))
                    for m in ("transformers", "cudaload")
                ],
                [{"shape": sh, "backend": "sdpa", "work": "w", "decode_tok_s": 1.0} for sh in ("A", "B")],
            )
        )
    )
    merged = run.merge([str(new), str(old)], tmp_path / "out", plot=False)
    load = {(r["shape"], r["cache"]): r for r in merged["sections"]["load"]["summary"]}
    assert load[("A", "warm")]["transformers"]["seconds"] == 1.0  # the newer run wins
    assert load[("A", "cold")]["transformers"]["seconds"] == 9.0  # the older run fills the gap
    assert merged["sections"]["choice"]["sources"] == {"A": "run-new", "B": "run-old"}
    assert "run-old" in (tmp_path / "out" / "results.md").read_text()


def test_compare_memory_ratios_estimates_against_measured_peaks() -> None:
    works = [{"name": "w", "batch": 1, "seq_len": 8}]
    estimates = {"w": {"terms": {"weights": 100, "kv_cache": 10, "cuda_context": 50}, "total": 160}}
    measured = {
        "load": {"gpu_final": 100, "gpu_peak": 104, "outside_allocator": 40},
        "forwards": [{"work": "w", "gpu_peak": 120, "gpu_reserved_peak": 130}],
    }
    rows = {r["what"]: r for r in run.compare_memory("s", "bf16", works, estimates, measured)}
    assert rows["weights (after load)"]["ratio"] == 1.0 and rows["weights (after load)"]["within_5pct"]
    assert rows["load peak (allocated) vs weights"]["ratio"] == pytest.approx(100 / 104)
    assert rows["w: total (device) vs used at forward peak"]["measured"] == 170
    assert rows["w: total - cuda_context vs allocated peak"]["estimate"] == 110
    assert rows["w: total - cuda_context vs allocated peak"]["within_5pct"] is False  # 110/120


def test_markdown_names_every_section_even_when_skipped() -> None:
    res = {
        "meta": {"versions": {"torch": "2"}},
        "machine": {"gpus": []},
        "sections": {n: {"status": "skipped: no GPU"} for n in run.ALL_SECTIONS},
    }
    md = run.render_markdown(res)
    for title in run.TITLES.values():
        assert f"## {title}" in md
    assert md.count("_skipped: no GPU_") == len(run.ALL_SECTIONS)


def test_merge_takes_each_section_from_the_run_that_ran_it(tmp_path: Path) -> None:
    def results(ran: set[str], tag: str) -> dict[str, Any]:
        return {
            "meta": {"date": tag, "versions": {}},
            "machine": {"gpus": []},
            "sections": {
                n: {"status": "ok", "from": tag} if n in ran else {"status": "skipped: not requested"}
                for n in run.ALL_SECTIONS
            },
        }

    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(results({"load", "memory"}, "quant-run")))
    b.write_text(json.dumps(results({"choice", "firstuse", "load"}, "fa4-run")))
    merged = run.merge([str(a), str(b)], tmp_path / "out", plot=False)
    secs = merged["sections"]
    assert secs["load"]["from"] == "quant-run" and secs["memory"]["from"] == "quant-run"
    assert secs["choice"]["from"] == "fa4-run" and secs["firstuse"]["from"] == "fa4-run"
    assert secs["overheads"]["status"] == "skipped: not requested"
    assert [m["date"] for m in merged["meta"]["merged_from"]] == ["quant-run", "fa4-run"]
    assert (tmp_path / "out" / "results.md").read_text().count("## ") == len(run.ALL_SECTIONS)


def test_cli_rejects_unknown_sections(tmp_path: Path) -> None:
    with pytest.raises(SystemExit):
        run.main(["--out", str(tmp_path), "--sections", "load,speed"])


# -- the runner itself, on CPU --
@pytest.mark.slow
def test_small_run_writes_json_markdown_and_every_section(tmp_path: Path) -> None:
    out, work = tmp_path / "out", tmp_path / "work"
    proc = subprocess.run(
        [sys.executable, str(RUNNER), "--out", str(out), "--small", "--work", str(work)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads((out / "results.json").read_text())
    md = (out / "results.md").read_text()

    assert res["meta"]["small"] is True and res["meta"]["versions"]["transformers"]
    assert "gpus" in res["machine"] and "packages" in res["machine"]  # cudaload.detect().to_dict()
    secs = res["sections"]
    assert set(secs) == set(run.ALL_SECTIONS)
    for name, title in run.TITLES.items():
        assert f"## {title}" in md, name
        assert not str(secs[name]["status"]).startswith(("error", "pending", "running")), (name, secs[name])
    gpu = res["machine"]["gpus"] != []

    # 1. load: both sides measured in this run, bf16, no errors; quantized loads explain why they were skipped
    (load,) = secs["load"]["summary"]
    assert (load["shape"], load["quant"], load["cache"]) == ("tiny-qwen3", "bf16", "warm")
    for m in ("transformers", "cudaload"):
        assert load[m]["n"] == 1 and not load[m]["errors"], load[m]
        assert load[m]["seconds"] > 0 and load[m]["rss_peak"] > 0
    assert load["ratio"] is not None
    assert "cold not measured" in secs["load"]["cold"]
    if not gpu:
        assert set(secs["load"]["quant_skipped"]) == {"int8", "nf4"}

    # 2. choice: every work size, sdpa and eager timed, cudaload's choice compared
    summary = secs["choice"]["summary"]
    assert {s["work"] for s in summary} == {"bs1 p32", "bs2 p64"}
    for s in summary:
        assert {"sdpa", "eager"} <= set(s["values"]) and s["cudaload_choice"]
        assert s["choice_vs_fastest"] is not None and s["choice_vs_sdpa"] is not None

    # 3. memory: the plan's estimate for every work size; measurements only on a GPU
    rows = secs["memory"]["rows"]
    assert rows and all(
        r["estimate"] is not None for r in rows if "total" in r["what"] or "weights" in r["what"]
    )
    if not gpu:
        assert secs["memory"]["measured"].startswith("skipped: no GPU")

    # 4. overheads: import, detect, and plan() of the three configs
    ov = secs["overheads"]
    assert ov["import"]["median_ms"] is not None and ov["detect"]["detect_warm_s"] is not None
    assert {p["config"] for p in ov["plans"]} == set(run.PLAN_CONFIGS)
    assert all("first_s" in p for p in ov["plans"]), ov["plans"]

    # 5. first use needs a GPU and flash-attn-4
    if not gpu:
        assert secs["firstuse"]["status"] == "skipped: no GPU"
        assert "_skipped: no GPU_" in md

    # 6. the plot, or the reason there is none
    if importlib.util.find_spec("matplotlib") is not None:
        assert secs["plot"]["status"] == "ok" and (out / "plot.png").stat().st_size > 1000
        assert "(plot.png)" in md
    else:
        assert "matplotlib not installed" in secs["plot"]["status"]


@pytest.mark.gpu
@pytest.mark.slow
def test_gpu_run_measures_peaks_backends_and_estimates(tmp_path: Path) -> None:
    """The GPU-only code paths (peaks, CUDA-event timing, memory forwards, first use) on the 0.6B shape."""
    out = tmp_path / "out"
    cmd = [
        sys.executable,
        str(RUNNER),
        "--out",
        str(out),
        "--sections",
        "load,choice,memory,firstuse",
        "--shapes",
        "0.6b",
        "--quant",
        "bf16",
        "--reps",
        "1",
        "--cold",
        "off",
        "--new-tokens",
        "4",
        "--budget-s",
        "0",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    secs = json.loads((out / "results.json").read_text())["sections"]
    (load,) = secs["load"]["summary"]
    for m in ("transformers", "cudaload"):
        assert load[m]["n"] == 1 and not load[m]["errors"], load[m]
        assert load[m]["gpu_peak"] > 1e9  # 1.2 GB of bf16 weights
    assert {s["work"] for s in secs["choice"]["summary"]} == {"bs1 p512", "bs8 p2048"}
    assert all(s["choice_vs_fastest"] is not None for s in secs["choice"]["summary"]), secs["choice"][
        "summary"
    ]
    rows = secs["memory"]["rows"]
    assert all(r["measured"] is not None and r["ratio"] is not None for r in rows), rows
    if secs["firstuse"]["status"] == "ok":
        assert all("error" not in r for r in secs["firstuse"]["rows"]), secs["firstuse"]["rows"]


def test_quant_peak_parts_names_what_is_alive_at_the_peak() -> None:
    spec = importlib.util.spec_from_file_location(
        "cudaload_quant_peak_parts", RUNNER.parent / "investigations" / "quant_peak_parts.py"
    )
    assert spec is not None and spec.loader is not None
    qp = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(qp)
    scratch = [{"filename": "/x/src/cudaload/fastload/quantized/fill.py", "line": 564, "name": "_load"}]
    bnb = [
        {"filename": "/usr/lib/site-packages/bitsandbytes/nn/modules.py", "line": 9, "name": "_quantize"},
        {"filename": "/x/src/cudaload/fastload/quantized/fill.py", "line": 590, "name": "_load"},
    ]
    events = [
        {"action": "alloc", "addr": 1, "size": 100, "frames": scratch},
        {"action": "alloc", "addr": 2, "size": 30, "frames": bnb},
        {"action": "free_requested", "addr": 2, "size": 30},
        {"action": "free_completed", "addr": 2, "size": 30},  # counted once
        {"action": "alloc", "addr": 3, "size": 50, "frames": bnb},  # the peak: 150
        {"action": "alloc", "addr": 4, "size": 10, "frames": []},  # an owner-less block: the peak, 160
        {"action": "free_requested", "addr": 3, "size": 50},
        {"action": "free_requested", "addr": 4, "size": 10},
        {"action": "free_requested", "addr": 1, "size": 100},
    ]
    peak, parts, at = qp.peak_parts(events)
    assert (peak, at) == (160, 5)
    assert parts == {
        "cudaload/fastload/quantized/fill.py:564 _load": 100,
        "bitsandbytes/nn/modules.py:9 _quantize": 50,
        "?": 10,
    }


def test_choice_worker_times_cudaload_sdpa_variants(tiny_model: Any) -> None:
    """The plan's choice on the H200 is often cudaload_sdpa: the worker registers cudaload's variants before
    switching to them (unregistered, transformers refused the name and choice_vs_fastest was None)."""
    from benchlib.choice import w_choice  # run.py put benchmarks/ on sys.path

    res = w_choice(
        {
            "path": str(tiny_model("qwen3")),
            "backends": ["sdpa", "cudaload_sdpa"],
            "new_tokens": 3,
            "works": [{"name": "bs1 p8", "batch": 1, "prompt": 8}],
            "prefill_reps": 1,
            "generate_reps": 1,
        }
    )
    rows = {r["backend"]: r for r in res["rows"]}
    assert "error" not in rows["cudaload_sdpa"], rows["cudaload_sdpa"]
    assert rows["cudaload_sdpa"]["generate_s"] > 0
