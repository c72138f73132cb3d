#!/usr/bin/env python
"""A fit that holds at its boundary (issue 44, item 4): train at the longest seq_len cudaload's plan accepts.

    python benchmarks/bench_fit_boundary.py --out DIR [--cases qlora:llama8b:24,qlora:llama8b:12,...]
                                            [--steps 4] [--warmup 1] [--budget-s 540]
                                            [--work /tmp/cudaload-bench] [--smoke]

Runs on one GPU (an H100 or H200: every card is emulated, so the result does not depend on which). For each
case ``MODE:MODEL:CARD_GIB`` (MODE ``qlora``, ``lora`` or ``full``; MODEL ``llama8b`` (Llama-3.1-8B),
``qwen8b`` (Qwen3-8B) or ``qwen0.6b`` (Qwen3-0.6B), random bf16 weights written from the shape's config by
``benchlib.common.w_write``):

- the card: CARD_GIB for the caching allocator (``torch.cuda.set_per_process_memory_fraction(card / total)``),
  the CUDA context outside it, so cudaload is told ``max_memory={"cuda:0": card + CUDA_CONTEXT_BYTES}`` (as
  ``bench_train.py --card-gib`` and ``bench_memory_train.py`` emulate a card);
- the boundary: the longest seq_len (a multiple of 256, at most the model's context) for which
  ``cudaload.plan(path, hardware=<this machine>, intent=MODE, seq_len=S, batch_size=1, max_memory=...)``
  raises no ``DoesNotFitError`` (doubling, then bisection: ``compare_memory_train.longest_aligned``);
- the run: a fresh process (``bench_train.child``) loads ``cudaload.load_model(path, intent=MODE, seq_len=S,
  batch_size=1, max_memory=...)`` under the cap and trains ``--warmup + --steps`` optimizer steps with
  ``transformers.Trainer`` and ``cudaload.training_setup(model, data)`` on examples that are all exactly S
  tokens long (the worst case the plan allowed).

Recorded per case: the planned seq_len (and the plan's refusal one step above it), the plan's bound
(``plan.memory.total``), its predicted allocator peak (``allocated_bytes``, ``reserved_bytes``) and cudaload's
memory model at the largest step the run met (``bench_train.predict``), the measured
``torch.cuda.max_memory_allocated`` / ``max_memory_reserved``, whether it ran out of memory (the fit did not
hold), step seconds, and the plan's attention, layout, checkpointing, optimizer and quantization.

Writes ``DIR/results.json`` after every case (a killed run keeps what it had) and ``DIR/results.md``. Cases that
would overrun ``--budget-s`` are skipped and named. ``--smoke``: CPU, no GPU, a tiny Qwen3; the bisection plans
against the H100 profile with cards of 1 MiB per "GiB" (seq_len multiples of 64), and the child trains at 64
tokens (``bench_train``'s smoke length) with no memory meter: checks the machinery, not the numbers.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as _dt
import json
import platform
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_train
from benchlib.common import csv, fmt, gib, human, md_table, ratio
from compare_memory_train import ALIGN, longest_aligned

GiB = 1 << 30
MiB = 1 << 20
TAG = "BENCH-FIT-BOUNDARY "
MODELS = {"llama8b": "Llama-3.1-8B", "qwen8b": "Qwen3-8B", "qwen0.6b": "Qwen3-0.6B"}
#: bench mode -> cudaload intent
INTENTS = {"qlora": "qlora", "lora": "lora", "full": "training"}
DEFAULT_CASES = (
    "qlora:llama8b:24,qlora:llama8b:12,lora:llama8b:24,full:qwen0.6b:12,qlora:llama8b:16,full:qwen0.6b:8"
)
SMOKE_CASES = "lora:tiny:1,full:tiny:2"
SMOKE_ALIGN = 64
SMOKE_SEQ = 64  # bench_train.child trains its smoke runs at 64 tokens
#: seconds a case's child needs at least (import, load, a few steps), to skip what would overrun the budget
CHILD_S = {"llama8b": 120.0, "qwen8b": 120.0, "qwen0.6b": 50.0, "tiny": 20.0}
WRITE_S = {"llama8b": 25.0, "qwen8b": 25.0, "qwen0.6b": 5.0, "tiny": 2.0}


@dataclasses.dataclass(frozen=True)
class Case:
    mode: str
    model: str
    card: float  # GiB (MiB in --smoke)

    @classmethod
    def parse(cls, text: str) -> Case:
        mode, model, card = text.split(":")
        if mode not in INTENTS or (model not in MODELS and model != "tiny"):
            raise ValueError(
                f"case {text!r}: MODE:MODEL:CARD_GIB, modes {sorted(INTENTS)}, models {sorted(MODELS)}"
            )
        return cls(mode, model, float(card))

    @property
    def label(self) -> str:
        return f"{self.mode}:{self.model}:{self.card:g}"

    def record(self) -> dict[str, Any]:
        return {
            "case": self.label,
            "mode": self.mode,
            "model": self.model,
            "model_name": MODELS.get(self.model, "tiny Qwen3"),
            "card": self.card,
        }


# ------------------------------------------------------------------------------------------------ the child
def child(spec: dict[str, Any]) -> dict[str, Any]:
    """bench_train's child at batch 1 on examples of exactly ``spec["seq_len"]`` tokens: its card cap,
    load_model, training_setup, Trainer, OOM catch, peaks, plan record and prediction at the largest step."""
    seq = int(spec["seq_len"])
    bench_train.BATCH = 1
    # lengths drawn log-normally around seq with no spread, clipped to [seq, seq]: every example seq tokens
    bench_train.DISTS[spec["dist"]] = (seq, 0.0, seq, seq)
    if spec["shape"] in MODELS:
        bench_train.SHAPES[spec["shape"]] = MODELS[spec["shape"]]  # bench_train.predict's full_config
    return bench_train.child(spec)


def guarded(fn: Any, *args: Any) -> dict[str, Any]:
    """``fn(*args)``, or its exception as ``{"error": ...}`` (with the spec, when given one)."""
    try:
        return dict(fn(*args))
    except Exception as e:
        spec = {"spec": args[0]} if args and isinstance(args[0], dict) else {}
        return {**spec, "error": f"{type(e).__name__}: {e}\n{traceback.format_exc()[-2000:]}"}


def run_child(spec: dict[str, Any], timeout: float) -> dict[str, Any]:
    """``child(spec)`` in a fresh process (clean allocator, its own memory cap); never raises."""
    t0 = time.perf_counter()
    try:
        p = subprocess.run(
            [sys.executable, __file__, "--child", json.dumps(spec)],
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        tagged = [ln[len(TAG) :] for ln in p.stdout.splitlines() if ln.startswith(TAG)]
        res: dict[str, Any] = (
            json.loads(tagged[-1])
            if tagged
            else {"error": f"exit {p.returncode}: {(p.stderr or p.stdout)[-3000:]}"}
        )
    except subprocess.TimeoutExpired:
        res = {"error": f"timed out after {timeout:.0f} s"}
    res["wall_s"] = time.perf_counter() - t0
    return res


# ----------------------------------------------------------------------------------------------- the parent
def model_path(case: Case, work: Path) -> Path:
    """The case's checkpoint, written once into ``work``."""
    if case.model == "tiny":
        path = work / "tiny-qwen3-fit"
        if not (path / "config.json").exists():
            from cudaload.testing import make_tiny

            make_tiny("qwen3", path)
        return path
    path = work / MODELS[case.model]
    if not (path / "config.json").exists():
        import torch

        from benchlib.common import w_write

        print(f"writing {MODELS[case.model]} to {path}", flush=True)
        print(json.dumps(w_write({"path": str(path), "config": MODELS[case.model]})), flush=True)
        if torch.cuda.is_initialized():
            torch.cuda.empty_cache()  # the children's cards are their own
    return path


def hardware(smoke: bool) -> Any:
    """This machine; in --smoke the H100 profile (planning only), with this torch and bitsandbytes/peft."""
    import cudaload

    if not smoke:
        return cudaload.detect()
    import torch

    from cudaload.profiles import hardware as profile

    h100 = profile("H100").with_packages(["bitsandbytes", "peft"], [])
    return dataclasses.replace(h100, torch_version=torch.__version__.split("+")[0], torch_cuda_version="13.0")


def plan_summary(p: Any) -> dict[str, Any]:
    from cudaload.policies.memory import allocated_bytes, reserved_bytes

    terms = {**p.memory.terms, "total": p.memory.total}
    t = p.training
    return {
        "seq_len": p.seq_len,
        "memory_total": p.memory.total,
        "predicted_allocated": allocated_bytes(terms),
        "predicted_reserved": reserved_bytes(terms),
        "memory_terms": dict(p.memory.terms),
        "budget": dict(p.memory.budget),
        "attention": p.attention.choice,
        "quantization": p.quantization.choice,
        "gradient_checkpointing": p.gradient_checkpointing.choice if p.gradient_checkpointing else None,
        "checkpoint_every": p.checkpoint_every,
        "optimizer": p.optimizer.choice if p.optimizer else None,
        "layout": t.layout.choice if t else None,
        "tokens_per_step": t.step.tokens if t else None,
        "loss": t.loss.choice if t else None,
    }


def boundary(case: Case, path: Path, caps: Any, smoke: bool) -> dict[str, Any]:
    """The longest seq_len the plan accepts on the case's card, the plan there and its refusal one step up."""
    import cudaload
    from cudaload.errors import CudaloadError, DoesNotFitError
    from cudaload.policies.memory import CUDA_CONTEXT_BYTES

    card_bytes = int(case.card * (MiB if smoke else GiB))
    max_memory = {"cuda:0": card_bytes + CUDA_CONTEXT_BYTES}
    context = int(json.loads((path / "config.json").read_text()).get("max_position_embeddings") or 1 << 20)
    align = SMOKE_ALIGN if smoke else ALIGN
    probes: list[dict[str, Any]] = []
    refusals: dict[int, str] = {}

    def plan(seq: int) -> Any:
        return cudaload.plan(
            str(path),
            hardware=caps,
            intent=INTENTS[case.mode],
            seq_len=seq,
            batch_size=1,
            max_memory=max_memory,
        )

    def fits(seq: int) -> bool:
        if seq > context:
            return False
        try:
            plan(seq)
            ok = True
        except DoesNotFitError as e:
            refusals[seq] = " ".join(str(e).split())[:800]
            ok = False
        except CudaloadError as e:  # not a memory refusal: recorded, and taken as not fitting
            refusals[seq] = f"{type(e).__name__}: {' '.join(str(e).split())[:800]}"
            ok = False
        probes.append({"seq_len": seq, "fits": ok})
        return ok

    t0 = time.perf_counter()
    seq = longest_aligned(fits, align)
    rec: dict[str, Any] = {
        "card_bytes": card_bytes,
        "max_memory": max_memory,
        "align": align,
        "model_context": context,
        "planned_seq_len": seq,
        "probes": probes,
        "plan_s": time.perf_counter() - t0,
        "refused_above": refusals.get(seq + align)
        or ("the model's context" if seq + align > context else None),
    }
    if seq:
        rec["plan"] = plan_summary(plan(seq))
    return rec


def row_of(r: dict[str, Any]) -> dict[str, Any]:
    """The summary of one case: what was planned against what was measured."""
    run, planned = r.get("run") or {}, r.get("plan") or {}
    child_plan = run.get("plan") or {}
    err = str(run.get("error") or "")
    oom = bool(run.get("oom")) or err.startswith("OutOfMemoryError")
    pred, peak = planned.get("predicted_allocated"), run.get("peak_allocated")
    steps = run.get("step_seconds") or []
    warm = int((run.get("spec") or {}).get("warmup") or 0)
    timed = steps[warm:] or steps
    return {
        "case": r["case"],
        "card_gib": r["card"],
        "mode": r["mode"],
        "model": r["model_name"],
        "planned_seq_len": r.get("planned_seq_len"),
        "trained_seq_len": r.get("trained_seq_len"),
        "bound": planned.get("memory_total"),
        "predicted_allocated": pred,
        "predicted_reserved": planned.get("predicted_reserved"),
        "predicted_at_max_step": (run.get("predicted_at_max_step") or {}).get("allocated"),
        "measured_allocated": peak,
        "measured_reserved": run.get("peak_reserved"),
        "predicted_over_measured": ratio(pred, peak),
        "oom": oom if run else None,
        "error": None if oom else (err.strip().splitlines()[-1][:300] if err else None),
        "steps_run": run.get("steps_run"),
        "step_s": sum(timed) / len(timed) if timed else None,
        "choices": (
            f"{planned.get('attention')}, {planned.get('layout')}, checkpointing "
            f"{planned.get('gradient_checkpointing')}, {planned.get('optimizer')}"
            + (f", {planned['quantization']}" if planned.get("quantization") else "")
            if planned
            else "-"
        ),
        "load_plan_matches": (
            child_plan.get("memory_total") == planned.get("memory_total") if child_plan and planned else None
        ),
        "skipped": r.get("skipped"),
    }


def write(out: Path, res: dict[str, Any]) -> None:
    res["summary"] = [row_of(r) for r in res["cases"]]
    (out / "results.json").write_text(json.dumps(res, indent=1, default=str) + "\n")
    m = res["meta"]
    lines = [
        "# A fit that holds at its boundary (benchmarks/bench_fit_boundary.py, issue 44 item 4)",
        "",
        f"{m['date']}, {m.get('gpu') or 'CPU (smoke)'}; {m['versions']}",
        f"command: `{m['command']}`",
        "",
        "Each card emulated (allocator capped at the card, CUDA context outside it); seq_len the longest the plan "
        "accepts there (batch 1); trained with Trainer + training_setup on examples of exactly that length. "
        "Peaks: the allocator's (max_memory_allocated / max_memory_reserved); predicted: the plan's allocator "
        "peak at that seq_len.",
        "",
    ]
    rows = res["summary"]
    unit = m.get("card_unit", "GiB")
    size = human if m.get("smoke") else gib  # --smoke: a tiny model's bytes
    if m.get("smoke"):
        lines += ["--smoke: cards in MiB, trained at 64 tokens on the CPU, no memory meter.", ""]
    lines += md_table(
        [
            f"card {unit}",
            "mode",
            "model",
            "planned longest seq_len",
            "predicted peak GiB",
            "measured peak GiB",
            "predicted/measured",
            "measured reserved GiB",
            "OOM",
            "step s",
            "plan",
        ],
        [
            [
                f"{s['card_gib']:g}",
                s["mode"],
                s["model"],
                s["planned_seq_len"],
                size(s["predicted_allocated"]),
                size(s["measured_allocated"]),
                fmt(s["predicted_over_measured"]),
                size(s["measured_reserved"]),
                "skipped" if s["skipped"] else ("error" if s["error"] else s["oom"]),
                fmt(s["step_s"]),
                s["choices"],
            ]
            for s in rows
        ],
    )
    notes = [f"- {s['case']}: {s['skipped'] or s['error']}" for s in rows if s["skipped"] or s["error"]]
    if notes:
        lines += ["", "Skipped or failed:", "", *notes]
    (out / "results.md").write_text("\n".join(lines) + "\n")


def run_case(case: Case, a: argparse.Namespace, work: Path, caps: Any, left: float) -> dict[str, Any]:
    rec = case.record()
    path = model_path(case, work)
    rec.update(boundary(case, path, caps, a.smoke))
    seq = rec["planned_seq_len"]
    print(f"  {case.label}: plan's longest seq_len {seq} ({len(rec['probes'])} plans, {rec['plan_s']:.1f} s)")
    if not seq:
        rec["skipped"] = f"the plan fits no seq_len of {rec['align']} on this card: {rec['refused_above']}"
        return rec
    rec["trained_seq_len"] = SMOKE_SEQ if a.smoke else seq
    spec = {
        "shape": case.model,
        "mode": INTENTS[case.mode],
        "dist": f"exactly-{seq}",
        "method": "cudaload",
        "seq_len": seq,
        "path": str(path),
        "steps": a.steps,
        "warmup": a.warmup,
        "examples": a.steps + a.warmup + 2,
        "work": str(work),
        "smoke": a.smoke,
        # --smoke plans for fake cards and trains on the CPU, uncapped
        "card_gib": None if a.smoke else case.card,
    }
    rec["run"] = run_child(spec, timeout=max(left - 5, 10))
    return rec


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--out")
    ap.add_argument("--cases", help=f"MODE:MODEL:CARD_GIB,... (default {DEFAULT_CASES})")
    ap.add_argument("--steps", type=int, default=4, help="timed optimizer steps a case")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--budget-s", type=float, default=540)
    ap.add_argument("--work", default="/tmp/cudaload-bench")
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--child")
    a = ap.parse_args(argv)
    if a.child:
        print(TAG + json.dumps(guarded(child, json.loads(a.child)), default=str), flush=True)
        return 0
    if not a.out:
        ap.error("--out is required")
    t_start = time.perf_counter()
    if a.smoke:
        a.steps, a.warmup = min(a.steps, 2), min(a.warmup, 1)
    cases = [Case.parse(c) for c in csv(a.cases or (SMOKE_CASES if a.smoke else DEFAULT_CASES))]
    out, work = Path(a.out), Path(a.work)
    out.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    caps = hardware(a.smoke)
    res: dict[str, Any] = {
        "meta": {
            "date": _dt.date.today().isoformat(),
            "command": " ".join([Path(sys.argv[0]).name, *(argv if argv is not None else sys.argv[1:])]),
            "python": platform.python_version(),
            "versions": bench_train._versions(),
            "gpu": None if a.smoke or not caps.gpus else caps.gpus[0].name,
            "smoke": a.smoke,
            "card_unit": "MiB" if a.smoke else "GiB",
        },
        "cases": [],
    }
    for case in cases:
        left = a.budget_s - (time.perf_counter() - t_start)
        need = CHILD_S[case.model] + (
            0 if (work / MODELS.get(case.model, "-")).exists() else WRITE_S[case.model]
        )
        if left < need:
            why = f"budget: {left:.0f} s left, the case needs about {need:.0f} s"
            print(f"skip {case.label} ({why})", flush=True)
            res["cases"].append({**case.record(), "skipped": why})
        else:
            print(f"case {case.label} ({left:.0f} s left)", flush=True)
            rec = guarded(run_case, case, a, work, caps, left)
            if "error" in rec:  # writing or planning failed: recorded, the next case runs
                rec = {**case.record(), "run": rec}
            res["cases"].append(rec)
            s = row_of(rec)
            print(
                f"  {case.label}: seq_len {s['planned_seq_len']}, predicted {human(s['predicted_allocated'])}, "
                f"measured {human(s['measured_allocated'])}, OOM {fmt(s['oom'])}"
                + (f", ERROR {s['error']}" if s["error"] else "")
                + (f", skipped: {s['skipped']}" if s["skipped"] else ""),
                flush=True,
            )
        write(out, res)
    write(out, res)
    print(f"wrote {out / 'results.json'} and {out / 'results.md'} ({time.perf_counter() - t_start:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
