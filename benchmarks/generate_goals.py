#!/usr/bin/env python
"""Issue 28's goals, read from bench_generate.py results (CPU; no GPU needed):

    python benchmarks/generate_goals.py RESULTS.json... [--out GOALS.md]

- **defaults**: ``load_model()`` with nothing declared runs the run's ``choices.default``; per work, plain
  sdpa's seconds over the default's, on first-seen lengths, on repeated ones and in prefill (and the --steady
  pairs where a run has them). Goal: >= 1.8x first-seen on the 8B shape; >= 0.97x repeated and in prefill.
- **declared work, held out**: per work, the priors are made from the runs' *other* works only (leave one
  out: no measurement of this work, of either shape, is seen), and ``cudaload.plan(..., batch_size=,
  seq_len=, new_tokens=, padded=)`` chooses on an H200 snapshot with the run's packages. The choice's first-seen
  seconds against the fastest backend's, plain and with the one-time first-use seconds a new process pays
  (FA4's import and JIT). Goal: >= 0.97x the fastest on every row.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

import cudaload  # noqa: E402
from cudaload.model_info import model_info  # noqa: E402
from cudaload.policies.attention.first_use import FIRST_USE  # noqa: E402
from cudaload.policies.sdpa_dispatch import SDPA_DECODE, SDPA_NO_CUDNN  # noqa: E402
from cudaload.profiles import hardware  # noqa: E402
from cudaload.testing import full_config  # noqa: E402
from cudaload.tuning import TimingCache, Work, lookup  # noqa: E402
from cudaload.tuning.timings import prior_entry, priors_from_bench  # noqa: E402

SHAPES = {"Qwen3-0.6B", "Qwen3-8B"}


def _med(r: dict[str, Any], key: str) -> float | None:
    return ((r or {}).get(key) or {}).get("median")


def rows_by_work(res: dict[str, Any]) -> dict[tuple[str, str], dict[str, dict[str, Any]]]:
    out: dict[tuple[str, str], dict[str, dict[str, Any]]] = {}
    for sh in res.get("shapes") or []:
        for r in sh.get("rows") or []:
            out.setdefault((sh["shape"], r["work"]), {})[r["backend"]] = r
    return out


def evaluate(runs: list[dict[str, Any]]) -> dict[str, Any]:
    caps = hardware("H200")
    v = runs[0].get("versions") or {}
    caps = replace(
        caps,
        torch_version=v.get("torch"),
        torch_cuda_version="13.0",
        transformers_version=v.get("transformers"),
    )
    installed = ["flash-attn-4"] if v.get("flash-attn-4") else []
    docs = [priors_from_bench(r, source="held out") for r in runs]
    all_priors = [p for d in docs for p in d["priors"]]
    defaults, declared = [], []
    for res in runs:
        default = None
        for sh in res.get("shapes") or []:
            default = ((sh.get("choices") or {}).get("default") or {}).get("choice") or default
        for (shape, work), by in rows_by_work(res).items():
            if shape not in SHAPES:
                continue
            first = {b: _med(r, "generate_first_s") for b, r in by.items() if _med(r, "generate_first_s")}
            rep = {b: _med(r, "generate_s") for b, r in by.items() if _med(r, "generate_s")}
            pre = {b: _med(r, "prefill_s") for b, r in by.items() if _med(r, "prefill_s")}
            if "sdpa" in first and default in first:
                defaults.append(
                    {
                        "shape": shape,
                        "work": work,
                        "default": default,
                        "first": first["sdpa"] / first[default],
                        "repeated": rep["sdpa"] / rep[default] if "sdpa" in rep and default in rep else None,
                        "prefill": pre["sdpa"] / pre[default] if "sdpa" in pre and default in pre else None,
                    }
                )
            if len(first) < 2:
                continue
            ws = next(iter(by.values()))["work_shape"]
            held = [prior_entry(p) for p in all_priors if p["work"] != _work_dict(ws)]
            w = Work(ws["batch"], ws["prompt"], ws["new_tokens"], ws["padding"] == "left")
            info = model_info(full_config(shape))
            with tempfile.TemporaryDirectory() as d:
                t = lookup(caps, info, "bfloat16", w, cache=TimingCache(Path(d) / "t.json"), priors=held)
            p = cudaload.plan(
                full_config(shape),
                hardware=caps,
                batch_size=ws["batch"],
                seq_len=ws["prompt"] + ws["new_tokens"],
                new_tokens=ws["new_tokens"],
                padded=ws["padding"] == "left",
                timings=t,
                assume_installed=installed,
            )
            choice = p.attention.choice
            with_first_use = {b: s + FIRST_USE.get(b, _NoCost).seconds for b, s in first.items()}
            fastest = min(first, key=lambda b: first[b])
            fastest_fu = min(with_first_use, key=lambda b: with_first_use[b])
            # cudaload_sdpa and cudaload_sdpa_nocudnn run the same kernels on first-seen lengths (neither lets cuDNN
            # take a shape met fewer than twice): their difference there is the host's noise, so one class
            same = dict(first)
            twins = [b for b in (SDPA_DECODE, SDPA_NO_CUDNN) if b in first]
            if len(twins) == 2:
                for b in twins:
                    same[b] = min(first[t] for t in twins)
            declared.append(
                {
                    "shape": shape,
                    "work": work,
                    "choice": choice,
                    "prior_from": t.source if t else None,
                    "fastest": fastest,
                    "ratio": first[fastest] / first[choice] if choice in first else None,
                    "ratio_twins_as_one": min(same.values()) / same[choice] if choice in same else None,
                    "fastest_with_first_use": fastest_fu,
                    "ratio_with_first_use": with_first_use[fastest_fu] / with_first_use[choice]
                    if choice in with_first_use
                    else None,
                }
            )
    steady = [w for r in runs for w in ((r.get("steady") or {}).get("works") or [])]
    return {"defaults": defaults, "declared": declared, "steady": steady}


class _NoCost:
    seconds = 0.0


def _work_dict(ws: dict[str, Any]) -> dict[str, Any]:
    return {
        "batch_size": ws["batch"],
        "prompt_len": ws["prompt"],
        "new_tokens": ws["new_tokens"],
        "padded": ws["padding"] == "left",
    }


def _f(x: Any) -> str:
    return "-" if x is None else f"{x:.2f}"


def render(ev: dict[str, Any]) -> str:
    lines = ["## defaults: plain sdpa's seconds over load_model()'s default (above 1: faster)", ""]
    lines += [
        "| shape | work | default | first-seen | repeated (1 call) | prefill |",
        "|---|---|---|---|---|---|",
    ]
    for d in ev["defaults"]:
        lines.append(
            f"| {d['shape']} | {d['work']} | {d['default']} | {_f(d['first'])} | {_f(d['repeated'])} | {_f(d['prefill'])} |"
        )
    for shape in sorted({d["shape"] for d in ev["defaults"]}):
        xs = sorted(d["first"] for d in ev["defaults"] if d["shape"] == shape)
        lines.append(
            f"\n{shape}: first-seen {xs[0]:.2f}-{xs[-1]:.2f}x, median {statistics.median(xs):.2f}x over {len(xs)} works"
        )
    if ev["steady"]:
        lines += [
            "",
            "repeated lengths, alternating pairs (sdpa / default, per-work median): "
            + ", ".join(f"{w['work']} {_f(w['ratio_median'])}" for w in ev["steady"]),
        ]
    lines += ["", "## declared work, held out (priors from the other works only)", ""]
    lines += [
        "| shape | work | choice | fastest (first-seen) | choice / fastest | the two sdpa variants as one | "
        "fastest with first use | ratio |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for d in ev["declared"]:
        lines.append(
            f"| {d['shape']} | {d['work']} | {d['choice']} | {d['fastest']} | {_f(d['ratio'])} | "
            f"{_f(d['ratio_twins_as_one'])} | "
            f"{d['fastest_with_first_use']} | {_f(d['ratio_with_first_use'])} |"
        )
    for key, what in (("ratio", "as measured"), ("ratio_twins_as_one", "the two sdpa variants as one")):
        rs = [d[key] for d in ev["declared"] if d[key] is not None]
        if rs:
            ok = sum(r >= 0.97 for r in rs)
            lines.append(
                f"\n{what}: {ok} of {len(rs)} rows at >= 0.97x the fastest first-seen backend; lowest {min(rs):.2f}x"
            )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results", nargs="+")
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    ev = evaluate([json.loads(Path(r).read_text()) for r in args.results])
    text = render(ev)
    if args.out:
        Path(args.out).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
