#!/usr/bin/env python
"""cudaload's training memory estimate against ``accelerate estimate-memory`` on the same measured GPU peaks.

    python benchmarks/investigations/vs_accelerate_estimate.py [--out DIR]

CPU only. The measured points are the committed ones:

- ``benchmarks/results/2026-12-01-h200/run1-memtrain`` and ``run7-memtrain2`` (``bench_memory_train.py`` on the
  H200: Qwen3-8B LoRA / QLoRA / full and Qwen3-0.6B full, padded batches, seq_len 512-16,384, several optimizers,
  with and without checkpointing; points that ran out of memory are lower bounds);
- ``benchmarks/results/2026-12-07-h100/gpu9/fit`` (``bench_fit_boundary.py`` on the H100: the plan's own longest
  sequence on emulated 24 and 12 GiB cards, LoRA / QLoRA Llama-3.1-8B and full Qwen3-0.6B).

For each point, against the measured reserved peak (what an out-of-memory error is about):

- cudaload: its memory model for the point's configuration (``compare_memory_train.estimate_point``) for the
  memtrain points, the estimate less the CUDA context (outside the allocator); for the fit runs, the plan's own
  predicted reserved peak;
- accelerate 1.16 (``accelerate/commands/estimate.py``): its table for the model as ``accelerate estimate-memory``
  prints it (its ``create_empty_model``: ``AutoModel``, so without the LM head, in float32), read as its user
  would. A full fine-tune reads "Training using Adam" in bfloat16
  (``estimate_training_usage``, :239-269: the largest of its model / gradients / optimizer / step sizes, 2x the
  fp32 weights); LoRA reads "Total Size" in bfloat16, QLoRA in int4 (accelerate has no adapter estimate; its
  bfloat16 size is the fp32 size, since ``gather_data`` :286-296 halves float16 only). One number per model,
  whatever the sequence length, batch, optimizer or checkpointing.

Writes ``compare.json`` and ``README.md``-ready tables (``results.md``) under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "benchmarks"), str(ROOT / "src")]

GiB = 1 << 30
MEMTRAIN = (
    "benchmarks/results/2026-12-01-h200/run1-memtrain/results.json",
    "benchmarks/results/2026-12-01-h200/run7-memtrain2/results.json",
)
FIT = ("benchmarks/results/2026-12-07-h100/gpu9/fit/results.json",)
#: the fit runs' shapes (bench_fit_boundary.py's MODELS)
FIT_SHAPES = {"llama8b": "Llama-3.1-8B", "qwen0.6b": "Qwen3-0.6B"}


def accelerate_table(model_name: str) -> dict[str, int]:
    """accelerate 1.16's ``estimate-memory`` rows for a model (no weights: an empty model from its config), as
    ``gather_data`` computes them: fp32 total size, and per dtype its "Total Size" and "Training using Adam"."""
    import torch
    from accelerate import init_empty_weights
    from accelerate.commands.estimate import estimate_training_usage
    from accelerate.utils import calculate_maximum_sizes
    from transformers import AutoModel

    from cudaload.testing import full_config

    # create_empty_model (:81-159): AutoModel (no auto_map in these configs, so the base model without its LM
    # head) from the config, in float32, on the meta device
    with init_empty_weights():
        model = AutoModel.from_config(full_config(model_name), dtype=torch.float32)
    total, _largest = calculate_maximum_sizes(model)
    out = {"fp32_total": int(total)}
    for dtype, div in (("float32", 1), ("float16", 2), ("bfloat16", 1), ("int8", 4), ("int4", 8)):
        # gather_data halves float16 and divides int8 / int4, leaving bfloat16 at the fp32 size
        out[f"{dtype}_total"] = int(total / div)
        usage = estimate_training_usage(total, dtype)
        out[f"{dtype}_training"] = int(max(usage.values()))
    return out


def accelerate_reading(table: dict[str, int], mode: str) -> tuple[int, str]:
    """The figure a user of ``accelerate estimate-memory`` reads for ``mode``, and which row it is."""
    if mode in ("full", "training"):
        return table["bfloat16_training"], 'bfloat16 "Training using Adam"'
    if mode == "qlora":
        return table["int4_total"], 'int4 "Total Size"'
    return table["bfloat16_total"], 'bfloat16 "Total Size"'


def _memtrain_points() -> list[dict[str, Any]]:
    import compare_memory_train as cmt
    from cudaload.policies.memory import CUDA_CONTEXT_BYTES

    rows = []
    for rel in MEMTRAIN:
        res = json.loads((ROOT / rel).read_text())
        for p in res["points"]:
            est = cmt.estimate_point(p)
            if est is None or not p.get("peak_reserved"):
                continue
            rows.append(
                {
                    "source": rel.split("/")[3],
                    "model": cmt.SHAPES[p["shape"]],
                    "mode": p["mode"],
                    "what": f"{p['optim']}, {'checkpointing' if p['gradient_checkpointing'] else 'no checkpointing'}",
                    "tokens": p["batch"] * p["seq_len"],
                    "batch": p["batch"],
                    "seq_len": p["seq_len"],
                    "oom": bool(p.get("oom")),
                    "measured_reserved": int(p["peak_reserved"]),
                    "cudaload": int(est["terms"]["total"] - CUDA_CONTEXT_BYTES),
                }
            )
    return rows


def _fit_points() -> list[dict[str, Any]]:
    """The fit runs, each against what its plan told the user: the plan's predicted reserved peak (its memory
    total less the CUDA context), made by the model committed with the run."""
    rows = []
    for rel in FIT:
        res = json.loads((ROOT / rel).read_text())
        for c in res["cases"]:
            run = c.get("run") or {}
            if not run.get("peak_reserved") or not c.get("plan"):
                continue
            rows.append(
                {
                    "source": "gpu9/fit",
                    "model": FIT_SHAPES[c["model"]],
                    "mode": c["mode"],
                    "what": f"the plan's longest sequence, {c['card']:.0f} GiB card, {c['plan']['loss']} loss",
                    "tokens": run["max_step"]["tokens"],
                    "batch": 1,
                    "seq_len": run["max_step"]["longest"],
                    "oom": False,
                    "measured_reserved": int(run["peak_reserved"]),
                    "cudaload": int(c["plan"]["predicted_reserved"]),
                }
            )
    return rows


def compare() -> dict[str, Any]:
    points = _memtrain_points() + _fit_points()
    tables = {m: accelerate_table(m) for m in sorted({p["model"] for p in points})}
    for p in points:
        acc, row = accelerate_reading(tables[p["model"]], p["mode"])
        p["accelerate"], p["accelerate_row"] = acc, row
        for k in ("cudaload", "accelerate"):
            p[f"{k}_ratio"] = p[k] / p["measured_reserved"]
            # an out-of-memory point is a lower bound: an estimate at or above it agrees with it
            p[f"{k}_ok"] = p[k] >= p["measured_reserved"] if p["oom"] else abs(p[f"{k}_ratio"] - 1) <= 0.10
            p[f"{k}_under"] = p[k] < p["measured_reserved"]
    summary: dict[str, Any] = {}
    for mode in sorted({p["mode"] for p in points}):
        sel = [p for p in points if p["mode"] == mode]
        exact = [p for p in sel if not p["oom"]]
        summary[mode] = {"points": len(sel), "oom_points": len(sel) - len(exact)}
        for k in ("cudaload", "accelerate"):
            errs = [abs(p[f"{k}_ratio"] - 1) for p in exact]
            summary[mode][k] = {
                "within_10pct_or_bound": sum(p[f"{k}_ok"] for p in sel),
                "under_measured": sum(p[f"{k}_under"] for p in sel),
                "median_abs_error": statistics.median(errs) if errs else None,
                "max_abs_error": max(errs) if errs else None,
            }
    return {"accelerate_tables": tables, "points": points, "summary": summary}


def render(res: dict[str, Any]) -> str:
    g = lambda n: f"{n / GiB:.1f}"  # noqa: E731
    lines = [
        "| mode | points (OOM) | cudaload within 10% (or >= an OOM bound) | cudaload under measured | cudaload median / max error | accelerate within 10% | accelerate under measured | accelerate median / max error |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for mode, s in res["summary"].items():
        c, a = s["cudaload"], s["accelerate"]
        pct = lambda x: "-" if x is None else f"{100 * x:.0f}%"  # noqa: E731
        lines.append(
            f"| {mode} | {s['points']} ({s['oom_points']}) | {c['within_10pct_or_bound']} | {c['under_measured']} | "
            f"{pct(c['median_abs_error'])} / {pct(c['max_abs_error'])} | {a['within_10pct_or_bound']} | "
            f"{a['under_measured']} | {pct(a['median_abs_error'])} / {pct(a['max_abs_error'])} |"
        )
    lines += [
        "",
        "| source | model | mode | configuration | batch x seq_len | measured reserved GiB | cudaload GiB (ratio) | accelerate GiB (ratio, row) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for p in res["points"]:
        oom = " (OOM: a lower bound)" if p["oom"] else ""
        lines.append(
            f"| {p['source']} | {p['model']} | {p['mode']} | {p['what']} | {p['batch']} x {p['seq_len']:,} | "
            f"{g(p['measured_reserved'])}{oom} | {g(p['cudaload'])} ({p['cudaload_ratio']:.2f}) | "
            f"{g(p['accelerate'])} ({p['accelerate_ratio']:.2f}, {p['accelerate_row']}) |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    a = ap.parse_args(argv)
    res = compare()
    md = render(res)
    if a.out:
        out = Path(a.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "compare.json").write_text(json.dumps(res, indent=1, sort_keys=True) + "\n")
        (out / "results.md").write_text(md)
    print(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
