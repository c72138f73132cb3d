"""Section "load": cudaload.load_model against from_pretrained, warm and cold, per shape and quantization."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from .common import (
    CUDALOAD_QUANT,
    _bnb_config,
    _device,
    _preimport,
    _rss_now,
    _rss_peak,
    _sync,
    human,
    md_table,
    median,
    ratio,
)


def w_load(spec: dict[str, Any]) -> dict[str, Any]:
    """Time one load to a ready model: cudaload.load_model or plain from_pretrained."""
    import torch
    import transformers

    import cudaload

    device = _device()
    cuda = device.startswith("cuda")
    quant = spec["quant"]
    imports_s = _preimport(spec["path"], cudaload_modules=spec["method"] == "cudaload", quant=quant)
    rss_before = _rss_now()
    if cuda:
        torch.cuda.init()  # context creation is not load time, for either side
        torch.cuda.reset_peak_memory_stats()
    out: dict[str, Any] = {"device": device}
    t0 = time.perf_counter()
    if spec["method"] == "cudaload":
        model = cudaload.load_model(spec["path"], quantization=CUDALOAD_QUANT[quant])
        _sync(device)
        seconds = time.perf_counter() - t0
        plan = model.cudaload_plan
        v = plan.verified or {}
        out.update(
            {
                "load_path": v.get("load_path"),
                "verified_load_seconds": v.get("load_seconds"),
                "attention": plan.attention.choice,
                "dtype": plan.dtype.choice,
                "quantization": plan.quantization.choice,
                "notes": v.get("notes"),
            }
        )
    else:
        kw: dict[str, Any] = {
            "dtype": torch.bfloat16 if cuda else torch.float32,
            "device_map": "cuda" if cuda else "cpu",
        }
        qcfg = _bnb_config(quant)
        if qcfg is not None:
            kw["quantization_config"] = qcfg
        model = transformers.AutoModelForCausalLM.from_pretrained(spec["path"], **kw)
        _sync(device)
        seconds = time.perf_counter() - t0
        out["kwargs"] = {k: str(v) for k, v in kw.items()}
    out.update(
        {"seconds": seconds, "imports_s": imports_s, "rss_before": rss_before, "rss_peak": _rss_peak()}
    )
    if cuda:
        out.update(
            {
                "gpu_peak": torch.cuda.max_memory_allocated(),
                "gpu_final": torch.cuda.memory_allocated(),
                "gpu_reserved_peak": torch.cuda.max_memory_reserved(),
            }
        )
    return out


class LoadSection:
    """The Runner's load section (a mixin of benchlib.runner.Runner: uses its args, worker(), save()...)."""

    args: Any
    results: Any

    def s_load(self, sec: dict[str, Any]) -> None:
        reps = self.args.reps
        cold_ok, cold_why = False, "--cold off"
        if self.args.cold == "on" or (self.args.cold == "auto" and not self.args.small):
            cold_ok = hasattr(os, "posix_fadvise") or os.access("/proc/sys/vm/drop_caches", os.W_OK)
            cold_why = "" if cold_ok else "neither posix_fadvise nor a writable drop_caches here"
        elif self.args.small:
            cold_why = "--small (dropping the page cache would slow everything else on a CI machine)"
        sec["cold"] = "measured" if cold_ok else f"cold not measured: {cold_why}"
        sec["device"] = "cuda:0" if self.has_gpu else "cpu"
        qstat = self.quant_status()
        sec["quant_skipped"] = {q: why for q, why in qstat.items() if why}
        samples: list[dict[str, Any]] = []
        sec["samples"] = samples
        sec["skipped"] = []
        for shape in self.args.shape_list:
            path = self.checkpoint(shape)
            for quant in self.args.quant_list:
                if qstat[quant]:
                    continue
                # 8B quantized loads take 4-20 s each: one rep keeps the full run inside its time cap
                n = 1 if (shape == "8b" and quant != "bf16") else reps
                plan_: list[tuple[str, str]] = []
                for i in range(n):
                    order = ("transformers", "cudaload") if i % 2 == 0 else ("cudaload", "transformers")
                    plan_ += [("warm", m) for m in order]
                # cold 8B quantized loads would cost ~1 min each: the 8B cold figure is measured in bf16
                if cold_ok and (shape != "8b" or quant == "bf16"):
                    plan_ += [("cold", "transformers"), ("cold", "cudaload")]
                for cache, method in plan_:
                    tag = {"shape": self.shape_label(shape), "quant": quant, "cache": cache, "method": method}
                    if self.over_budget():
                        sec["skipped"].append(
                            {**tag, "why": f"time budget ({self.args.budget_s:.0f} s) reached"}
                        )
                        continue
                    resident: float | None = None
                    if cache == "cold":
                        ok, why, resident = self.evict(path)
                        if not ok:
                            sec["skipped"].append({**tag, "why": why})
                            continue
                        sec["cold"] = f"measured (page cache dropped by {why})"
                    elif not any(s["shape"] == tag["shape"] and s["quant"] == quant for s in samples):
                        # the first warm sample of a checkpoint must not be the one that reads it from disk
                        self._read_through(path)
                    self.log(f"load {tag}")
                    res = self.worker("load", {"path": path, "method": method, "quant": quant})
                    samples.append(
                        {**tag, **res, **({"resident_before": resident} if cache == "cold" else {})}
                    )
                    self.save()
        sec["summary"] = summarize_load(samples)
        if sec["skipped"] or sec["quant_skipped"]:
            sec["status"] = "partial"

    def _read_through(self, path: str) -> None:
        for f in sorted(Path(path).glob("*.safetensors")):
            with open(f, "rb") as fh:
                while fh.read(64 * 2**20):
                    pass


# ----------------------------------------------------------------------------------------------------
# summaries (pure: results in, rows out)
# ----------------------------------------------------------------------------------------------------
def summarize_load(samples: list[dict[str, Any]]) -> list[dict[str, Any]]:
    keys: list[tuple[str, str, str]] = []
    for s in samples:
        k = (s["shape"], s["quant"], s["cache"])
        if k not in keys:
            keys.append(k)
    out = []
    for shape, quant, cache in keys:
        row: dict[str, Any] = {"shape": shape, "quant": quant, "cache": cache}
        for m in ("transformers", "cudaload"):
            ss = [
                s
                for s in samples
                if (s["shape"], s["quant"], s["cache"], s["method"]) == (shape, quant, cache, m)
            ]
            ok = [s for s in ss if "error" not in s]
            row[m] = {
                "n": len(ok),
                "seconds": median(s["seconds"] for s in ok),
                "samples": [s["seconds"] for s in ok],
                "gpu_peak": median(s.get("gpu_peak") for s in ok),
                "gpu_final": median(s.get("gpu_final") for s in ok),
                "rss_peak": median(s.get("rss_peak") for s in ok),
                "rss_before": median(s.get("rss_before") for s in ok),
                "errors": [s["error"] for s in ss if "error" in s],
            }
            if m == "cudaload":
                row[m]["load_path"] = next((s.get("load_path") for s in ok), None)
        row["ratio"] = ratio(row["cudaload"]["seconds"], row["transformers"]["seconds"])
        out.append(row)
    return out


#: metrics where a smaller number is better (times); the others are rates


def _md_load(sec: dict[str, Any]) -> list[str]:
    baseline = (
        "dtype=torch.bfloat16, device_map='cuda', quantization_config=..."
        if sec.get("device") != "cpu"
        else "dtype=torch.float32, device_map='cpu'"
    )
    out = [
        f"Device {sec.get('device')}; {sec.get('cold')}. "
        "Ratio = cudaload / transformers (below 1 is faster). "
        f"transformers = `AutoModelForCausalLM.from_pretrained(path, {baseline})`; "
        "cudaload = `cudaload.load_model(path, quantization=...)`. tf = transformers, cl = cudaload. "
        "Each sample is a fresh process; time excludes module imports (pre-imported and timed apart: "
        "`imports_s` in results.json) and CUDA context creation; RSS peak is the whole process's.",
        "",
    ]
    rows = []
    merged_runs = any(x.get("run") for x in sec.get("samples", []))
    for r in sec.get("summary", []):
        if merged_runs:
            r = {
                **r,
                "run": ", ".join(
                    dict.fromkeys(
                        x["run"]
                        for x in sec["samples"]
                        if (x["shape"], x["quant"], x["cache"]) == (r["shape"], r["quant"], r["cache"])
                    )
                ),
            }
        t, c = r["transformers"], r["cudaload"]
        rows.append(
            [
                r["shape"],
                r["quant"],
                r["cache"],
                t["seconds"],
                c["seconds"],
                r["ratio"],
                human(t["gpu_peak"]),
                human(c["gpu_peak"]),
                human(t["rss_peak"]),
                human(c["rss_peak"]),
                c.get("load_path"),
                f"{t['n']}/{c['n']}",
                *([r.get("run")] if merged_runs else []),
            ]
        )
    out += md_table(
        [
            "shape",
            "quant",
            "cache",
            "transformers s",
            "cudaload s",
            "ratio",
            "GPU peak tf",
            "GPU peak cl",
            "RSS peak tf",
            "RSS peak cl",
            "cudaload path",
            "n tf/cl",
            *(["run"] if merged_runs else []),
        ],
        rows,
    )
    errs = [
        (r["shape"], r["quant"], m, e)
        for r in sec.get("summary", [])
        for m in ("transformers", "cudaload")
        for e in r[m]["errors"]
    ]
    for shape, quant, m, e in errs:
        out.append(f"- error ({shape} {quant} {m}): {e.splitlines()[0] if e else e}")
    for q, why in (sec.get("quant_skipped") or {}).items():
        out.append(f"- {q}: {why}")
    for s in sec.get("skipped", []):
        out.append(f"- skipped {s['shape']} {s['quant']} {s['cache']} {s['method']}: {s['why']}")
    return out


def _merge_load(ran: list[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    """Samples per (shape, quant, cache) from the first run that measured that row; summary recomputed."""
    base = dict(ran[0][1])
    samples: list[dict[str, Any]] = []
    have: set[tuple[str, str, str]] = set()
    colds: list[str] = []
    for label, sec in ran:
        mine = [x for x in sec.get("samples", []) if (x["shape"], x["quant"], x["cache"]) not in have]
        if mine:
            samples += [{**x, "run": label} for x in mine]
            have |= {(x["shape"], x["quant"], x["cache"]) for x in mine}
            if sec.get("cold"):
                colds.append(f"{label}: {sec['cold']}")
    skipped = []
    for _, sec in ran:
        for x in sec.get("skipped", []):
            if (x["shape"], x["quant"], x["cache"]) not in have and x not in skipped:
                skipped.append(x)
    base.update(samples=samples, summary=summarize_load(samples), skipped=skipped, cold="; ".join(colds))
    base["status"] = "partial" if skipped else "ok"
    return base
