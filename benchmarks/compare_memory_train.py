"""cudaload's training memory estimate held against measured peaks (issue 15).

Reads a ``results.json`` written by ``benchmarks/bench_memory_train.py`` (any version: only the point and
bisection fields it has always written are read) and, with cudaload's own API and no GPU:

- for every measured point, ``cudaload.policies.memory.estimate`` with the point's optimizer, checkpointing,
  attention, batch and seq_len (LoRA r16 on every linear layer, nf4 double quant bf16 compute for QLoRA, the
  shapes of ``cudaload.testing.full_config``): the estimate of the allocator's peak (``total`` less the CUDA
  context, which is outside the allocator) and of its reserved peak (``reserved_estimate``), against the
  measured ``peak_allocated`` / ``peak_reserved``. An OOM point is a lower bound (what was allocated when the
  allocation failed): the estimate agrees with it when it is at least that.
- for every converged bisection, the longest seq_len (a multiple of 256) that ``cudaload.plan`` accepts on an
  H200 capped to the emulated card, against the longest that trained. The measurement capped the caching
  allocator at ``card_bytes`` (``set_per_process_memory_fraction``) with the CUDA context (``context_bytes``)
  outside that cap, so the capped GPU has ``card_bytes + context_bytes`` of free memory, from which cudaload
  takes its own context allowance.

Writes ``compare.json`` and ``compare.md`` next to the results (or into ``--out``).

    python benchmarks/compare_memory_train.py benchmarks/results/2026-12-01-h200/run1-memtrain/results.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

GiB = 1 << 30
ALIGN = 256
#: the goals of issue 15
PEAK_TOL = 0.10
SEQ_TOL = 0.10
SEQ_OVER = 0.05
SHAPES = {"8b": "Qwen3-8B", "0.6b": "Qwen3-0.6B"}

_INFO: dict[str, Any] = {}
_CFG: dict[str, Any] = {}


def config(shape: str) -> Any:
    from cudaload.testing import full_config

    if shape not in _CFG:
        _CFG[shape] = full_config(SHAPES[shape])
    return _CFG[shape]


def info(shape: str) -> Any:
    from cudaload.model_info import model_info

    if shape not in _INFO:
        _INFO[shape] = model_info(config(shape))
    return _INFO[shape]


def plan_args(mode: str, optim: str) -> dict[str, Any] | None:
    """bench mode/optim -> cudaload arguments; AdamW on bf16 weights has no cudaload counterpart."""
    if optim == "adamw_torch_bf16":
        return None
    if mode == "qlora":
        return {"intent": "qlora", "quantization": "nf4", "optimizer": optim}
    if mode == "lora":
        return {"intent": "lora", "quantization": None, "optimizer": optim}
    return {"intent": "training", "quantization": None, "optimizer": optim}


#: how bench_memory_train.py trained its adapters (its LORA and its loop): LoRA dropout 0.05, peft's fp32 cast for
#: QLoRA, no autocast around LoRA's forward -- not cudaload's defaults, so the step says it
BENCH_LORA_DROPOUT = 0.05


def measured_step(row: dict[str, Any], seq_len: int | None = None) -> Any:
    """The step shape the bench measured for ``row`` (padded, at ``seq_len`` when given)."""
    from cudaload.plans.training import StepShape

    return StepShape.padded(
        row["batch"],
        seq_len or row["seq_len"],
        lora_dropout=BENCH_LORA_DROPOUT,
        kbit_upcast=row["mode"] == "qlora",
        autocast=row["mode"] == "full",
    )


def estimate_point(row: dict[str, Any]) -> dict[str, Any] | None:
    from cudaload.policies.memory import allocated_bytes, estimate, reserved_bytes

    args = plan_args(row["mode"], row["optim"])
    if args is None:
        return None
    t = estimate(
        info(row["shape"]),
        dtype="bfloat16",
        seq_len=row["seq_len"],
        batch_size=row["batch"],
        attn=row["attn"],
        gradient_checkpointing=row["gradient_checkpointing"],
        step=measured_step(row),
        **args,
    )
    return {"terms": t, "allocated": allocated_bytes(t), "reserved": reserved_bytes(t)}


def longest_aligned(fits: Callable[[int], bool], align: int | None = None) -> int:
    """The largest multiple of ``align`` (default ALIGN) for which ``fits`` holds, by doubling then bisection
    (``fits`` must be monotone: what fits at n fits below n); 0 when even ``align`` does not fit."""
    step = align or ALIGN
    lo, hi = 0, 1
    while fits(hi * step) and hi * step < 1 << 20:
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if fits(mid * step):
            lo = mid
        else:
            hi = mid
    return lo * step


def planned_longest(rec: dict[str, Any]) -> int:
    """The longest seq_len (multiple of ALIGN) cudaload's fit ladder accepts on the emulated card, for the step
    the bench measured (:func:`measured_step`)."""
    from cudaload.errors import DoesNotFitError
    from cudaload.policies.quantization import fit
    from cudaload.profiles import hardware

    args = plan_args(rec["mode"], rec["optim"])
    assert args is not None
    free = int(rec["card_bytes"]) + int(rec["context_bytes"])
    h200 = hardware("H200").with_packages(["bitsandbytes", "peft"], [])
    # the H200 profile with its free memory capped: the emulated card, as the allocator saw it, plus the context
    caps = dataclasses.replace(h200, gpus=tuple(dataclasses.replace(g, free_memory=free) for g in h200.gpus))

    def fits(seq: int) -> bool:
        try:
            fit(
                info(rec["shape"]),
                caps,
                dtype="bfloat16",
                intent=args["intent"],
                quantization=args["quantization"] or "none",
                optimizer=args["optimizer"],
                gradient_checkpointing=rec["gradient_checkpointing"],
                attn=rec["attn"],
                seq_len=seq,
                batch_size=rec["batch"],
                step=measured_step(rec, seq),
            )
            return True
        except DoesNotFitError:
            return False

    return longest_aligned(fits)


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else a / b


def compare(res: dict[str, Any]) -> dict[str, Any]:
    points = []
    for row in res.get("points", []):
        if row.get("peak_allocated") is None:
            continue
        est = estimate_point(row)
        if est is None:
            continue
        oom = bool(row.get("oom"))
        ra = _ratio(est["allocated"], row["peak_allocated"])
        rr = _ratio(est["reserved"], row.get("peak_reserved"))
        # an OOM point is a lower bound: the estimate must be at least (nearly) what was allocated when it failed
        ok = ra is not None and (ra >= 1 - PEAK_TOL if oom else abs(ra - 1) <= PEAK_TOL)
        points.append(
            {
                "key": row["key"],
                "shape": row["shape"],
                "mode": row["mode"],
                "optim": row["optim"],
                "seq_len": row["seq_len"],
                "batch": row["batch"],
                "gradient_checkpointing": row["gradient_checkpointing"],
                "attn": row["attn"],
                "oom": oom,
                "measured_allocated": row["peak_allocated"],
                "measured_reserved": row.get("peak_reserved"),
                "estimate_allocated": est["allocated"],
                "estimate_reserved": est["reserved"],
                "ratio_allocated": ra,
                "ratio_reserved": rr,
                "goal_met": ok,
                "terms": est["terms"],
            }
        )
    cards = []
    for rec in res.get("bisections", []):
        if not rec.get("converged") or not rec.get("longest_trains"):
            continue
        if plan_args(rec["mode"], rec["optim"]) is None:
            continue
        planned = planned_longest(rec)
        measured = int(rec["longest_trains"])
        r = planned / measured
        cards.append(
            {
                "group": rec["group"],
                "shape": rec["shape"],
                "mode": rec["mode"],
                "card_gib": rec["card_gib"],
                "measured_longest": measured,
                "measured_shortest_fail": rec.get("shortest_fails"),
                "planned_longest": planned,
                "ratio": r,
                "within_10pct": abs(r - 1) <= SEQ_TOL,
                "not_over_5pct": r <= 1 + SEQ_OVER,
                "goal_met": abs(r - 1) <= SEQ_TOL and r <= 1 + SEQ_OVER,
            }
        )
    ok_pts = [p for p in points if not p["oom"]]
    summary = {
        "points": len(points),
        "points_ok_within_10pct": sum(p["goal_met"] for p in ok_pts),
        "points_measured": len(ok_pts),
        "oom_points_lower_bound_ok": sum(p["goal_met"] for p in points if p["oom"]),
        "oom_points": len(points) - len(ok_pts),
        "worst_ratio_allocated": max(
            (p["ratio_allocated"] for p in ok_pts), key=lambda x: abs(x - 1), default=None
        ),
        "cards": len(cards),
        "cards_ok": sum(c["goal_met"] for c in cards),
    }
    summary["all_goals_met"] = all(p["goal_met"] for p in points) and all(c["goal_met"] for c in cards)
    return {"source": res.get("meta", {}), "summary": summary, "points": points, "cards": cards}


def _g(n: float | None) -> str:
    return "-" if n is None else f"{n / GiB:.2f}"


def _r(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def render(cmp: dict[str, Any]) -> str:
    s = cmp["summary"]
    m = cmp["source"]
    out = [
        "# cudaload's training memory estimate against measured peaks (benchmarks/compare_memory_train.py)",
        "",
        f"Measured {m.get('date', '?')} on {m.get('device_name', '?')} (torch {m.get('torch', '?')}, "
        f"transformers {m.get('transformers', '?')}, peft {m.get('peft', '?')}, bitsandbytes "
        f"{m.get('bitsandbytes', '?')}). Estimates: cudaload.policies.memory.estimate (allocated: total less "
        "the CUDA context; reserved: plus the caching allocator's slack) and cudaload.plan on an H200 capped to "
        "each emulated card (card + the measured context free).",
        "",
        f"Goals (issue 15): every peak within {PEAK_TOL:.0%} of measured allocated (OOM points are lower "
        f"bounds: estimate >= {1 - PEAK_TOL:.0%} of what was allocated at the failure); planned longest seq_len "
        f"within {SEQ_TOL:.0%} of measured and never more than {SEQ_OVER:.0%} above it.",
        "",
        f"- measured points within 10%: {s['points_ok_within_10pct']} / {s['points_measured']}; OOM lower bounds "
        f"held: {s['oom_points_lower_bound_ok']} / {s['oom_points']}; worst allocated ratio "
        f"{_r(s['worst_ratio_allocated'])}",
        f"- emulated cards within goal: {s['cards_ok']} / {s['cards']}",
        f"- all goals met: {s['all_goals_met']}",
        "",
        "## Peaks (GiB)",
        "",
        "| shape | mode | seq | batch | ckpt | attn | result | measured alloc | estimate alloc | ratio | "
        "measured reserved | estimate reserved | ratio | goal |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for p in cmp["points"]:
        out.append(
            f"| {p['shape']} | {p['mode']} | {p['seq_len']} | {p['batch']} | "
            f"{'on' if p['gradient_checkpointing'] else 'off'} | {p['attn']} | {'OOM' if p['oom'] else 'ok'} | "
            f"{_g(p['measured_allocated'])}{'+' if p['oom'] else ''} | {_g(p['estimate_allocated'])} | "
            f"{_r(p['ratio_allocated'])} | {_g(p['measured_reserved'])} | {_g(p['estimate_reserved'])} | "
            f"{_r(p['ratio_reserved'])} | {'yes' if p['goal_met'] else 'NO'} |"
        )
    out += [
        "",
        "## Longest seq_len on emulated cards",
        "",
        "| group | card GiB | measured longest | planned longest | ratio | within 10% | not over 5% |",
        "|---|---|---|---|---|---|---|",
    ]
    for c in cmp["cards"]:
        out.append(
            f"| {c['group']} | {c['card_gib']} | {c['measured_longest']} | {c['planned_longest']} | "
            f"{_r(c['ratio'])} | {'yes' if c['within_10pct'] else 'NO'} | "
            f"{'yes' if c['not_over_5pct'] else 'NO'} |"
        )
    return "\n".join(out) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("results", type=Path, help="results.json from bench_memory_train.py")
    ap.add_argument("--out", type=Path, default=None, help="directory for compare.json/.md (default: beside)")
    a = ap.parse_args(argv)
    res = json.loads(a.results.read_text())
    cmp = compare(res)
    out = a.out or a.results.parent
    out.mkdir(parents=True, exist_ok=True)
    (out / "compare.json").write_text(json.dumps(cmp, indent=1, sort_keys=True) + "\n")
    (out / "compare.md").write_text(render(cmp))
    s = cmp["summary"]
    print(
        f"points {s['points_ok_within_10pct']}/{s['points_measured']} within 10%, OOM bounds "
        f"{s['oom_points_lower_bound_ok']}/{s['oom_points']}, cards {s['cards_ok']}/{s['cards']}; "
        f"all goals met: {s['all_goals_met']}",
        flush=True,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
