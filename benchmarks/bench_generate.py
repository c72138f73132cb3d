#!/usr/bin/env python
"""generate() as a user runs it, every attention backend on first-seen and on repeated lengths (issue 28).

On the H200, from the repo root (FA4 is timed when its wheels are there: `source .whl/env.sh` after
`../shared/device/wheels.sh fa4`):

    timeout 580 python benchmarks/bench_generate.py --out OUT/gen --budget-s 540
    python benchmarks/bench_generate.py --out /tmp/gen-smoke --smoke          # CPU, tiny Qwen3, ~40 s

then ``python -m cudaload.tuning priors OUT/gen/results.json --out src/cudaload/tuning/priors.json --replace``
turns the results into the priors and SDPA dispatch facts cudaload ships.

For each shape (--shapes, default 8b then 0.6b) one model per backend is built on the GPU from the config
(random bf16 weights, one state dict copied into all, so every backend runs the same weights) and held at
once: plain ``sdpa`` (transformers' default), ``cudaload_sdpa`` (cuDNN only for shapes that recur),
``cudaload_sdpa_nocudnn`` (left out of every call), ``eager``, and ``flash_attention_4`` when
``flash_attn.cute`` imports. Every (backend, work) gets a full-length warm-up, then rounds of two calls
(cudaload.execute.measure.backends, which ``cudaload tune`` shares): **first-seen** on a new thread, whose cuDNN graph
cache is empty as in a new process, and **repeated** on that thread, which has just run those lengths (for
``cudaload_sdpa``, which sends a shape to cuDNN once it has met it twice, after two more calls: the one that
builds cuDNN's graphs is kept apart, in ``settle_s``).
Backends are interleaved, the first one rotating each round; greedy, exactly ``new_tokens`` tokens; prefill
(one forward of the prompt) is timed in both states too.

Goals (issue 28), as ratios in this run:
- ``load_model()`` defaults (its choice without a declared work, ``choices.default``) >= 1.8x plain sdpa's
  generate() on first-seen lengths for the 8B shape; >= 0.97x on repeated lengths and in prefill;
- with the work declared, >= 0.97x the fastest backend on every row in the state the process is in; the
  choice is evaluated leave-one-out (``benchmarks/generate_goals.py``: priors from the other works only).

Also recorded: which SDPA backend torch picks for a decode step on this GPU (``torch._fused_sdp_choice``).
Writes OUT/results.json and OUT/results.md after every shape; progress on stdout.
"""

from __future__ import annotations

import argparse
import copy
import datetime as _dt
import gc
import importlib.util
import json
import os
import platform
import statistics
import sys
import time
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))  # this checkout's cudaload, before any installed one

from cudaload.execute.measure.backends import Measurement, WorkShape, measure_backends  # noqa: E402
from cudaload.policies.sdpa_dispatch import RECUR, SDPA_DECODE, SDPA_NO_CUDNN  # noqa: E402

SHAPES = {"0.6b": "Qwen3-0.6B", "8b": "Qwen3-8B"}
#: batch 1-32, prompts 256-8192, 32-256 new tokens, padded and not
WORKS: tuple[WorkShape, ...] = (
    WorkShape(1, 512, 32),
    WorkShape(1, 8192, 32),
    WorkShape(4, 1024, 64, "ones"),
    WorkShape(8, 2048, 32),
    WorkShape(8, 2048, 32, "left", 1024),
    WorkShape(16, 384, 96, "left", 192),
    WorkShape(2, 6000, 48),
    WorkShape(32, 256, 128, "ones"),
    WorkShape(1, 256, 256),
    WorkShape(32, 512, 64, "left", 256),
)
SMOKE_WORKS: tuple[WorkShape, ...] = (
    WorkShape(2, 32, 4),
    WorkShape(3, 32, 4, "left", 16),
    WorkShape(1, 48, 6, "ones"),
)
BACKENDS = ("sdpa", SDPA_DECODE, SDPA_NO_CUDNN, "eager", "flash_attention_4")


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def _err(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"[:400]


def versions() -> dict[str, str | None]:
    from importlib import metadata

    out: dict[str, str | None] = {}
    for d in ("torch", "transformers", "flash-attn-4", "nvidia-cutlass-dsl", "accelerate"):
        try:
            out[d] = metadata.version(d)
        except metadata.PackageNotFoundError:
            out[d] = None
    try:
        import torch

        v = torch.backends.cudnn.version()
        out["cudnn"] = f"{v // 10000}.{v // 100 % 100}.{v % 100}" if v else None
    except Exception:
        out["cudnn"] = None
    return out


def usable_backends(device: str, wanted: Sequence[str]) -> tuple[list[str], dict[str, str]]:
    skipped: dict[str, str] = {}
    names = []
    for b in wanted:
        if b == "flash_attention_4":
            if not device.startswith("cuda"):
                skipped[b] = "needs a CUDA GPU"
                continue
            try:
                if (
                    importlib.util.find_spec("flash_attn") is None
                    or importlib.util.find_spec("flash_attn.cute") is None
                ):
                    skipped[b] = "flash_attn.cute is not installed"
                    continue
            except (ImportError, ValueError):
                skipped[b] = "flash_attn.cute is not installed"
                continue
        names.append(b)
    return names, skipped


def build_models(
    config: Any, backends: Sequence[str], device: str, dtype: Any
) -> tuple[dict[str, Any], dict[str, str], float]:
    """One model per backend, built on ``device`` (no disk), all with the first one's weights."""
    import torch
    from transformers import AutoModelForCausalLM

    from cudaload.execute.runtime.sdpa_decode import register

    register()  # cudaload_sdpa and cudaload_sdpa_nocudnn, as load_model registers them
    t = time.perf_counter()
    models: dict[str, Any] = {}
    errors: dict[str, str] = {}
    base_state: dict[str, Any] | None = None
    for b in backends:
        try:
            torch.manual_seed(0)
            with torch.device(device):
                # a config of its own: from_config writes _attn_implementation into the config it gets
                m = AutoModelForCausalLM.from_config(
                    copy.deepcopy(config), dtype=dtype, attn_implementation=b
                )
            m.eval()
            got = m.config._attn_implementation
            if got != b:
                raise RuntimeError(f"asked for {b}, the model runs {got}")
            if base_state is None:
                base_state = m.state_dict()
            else:
                m.load_state_dict(base_state)  # same weights in every backend's model, bit for bit
            m.generation_config.pad_token_id = 0
            models[b] = m
            del m
        except Exception as e:  # a backend this machine cannot build is a result
            errors[b] = _err(e)
            log(f"  {b}: not usable: {errors[b]}")
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return models, errors, time.perf_counter() - t


def choices(config: Any, works: Sequence[WorkShape]) -> dict[str, Any]:
    """cudaload's attention choice on this machine: ``default`` (nothing declared, what ``load_model(path)``
    takes) and, per work, with the work declared (the shipped priors as they are in this checkout)."""
    import cudaload
    from cudaload.detection import detect

    caps = detect()
    out: dict[str, Any] = {}
    try:
        p = cudaload.plan(config, hardware=caps)
        out["default"] = {"choice": p.attention.choice, "reasons": list(p.attention.reasons)[:4]}
    except Exception as e:
        out["default"] = {"choice": None, "error": _err(e)}
    out["declared"] = {}
    for w in works:
        try:
            p = cudaload.plan(
                config,
                hardware=caps,
                seq_len=w.prompt + w.new_tokens,
                batch_size=w.batch,
                new_tokens=w.new_tokens,
                padded=w.padding == "left",
            )
            out["declared"][w.name] = {"choice": p.attention.choice, "reasons": list(p.attention.reasons)[:3]}
        except Exception as e:
            out["declared"][w.name] = {"choice": None, "error": _err(e)}
    return out


def run_shape(shape: str, args: argparse.Namespace, deadline: float, t0: float) -> dict[str, Any]:
    import torch

    from cudaload.testing import full_config, tiny_config

    device = "cuda:0" if torch.cuda.is_available() and not args.smoke else "cpu"
    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    config, label = (
        (tiny_config("qwen3"), "tiny-qwen3") if args.smoke else (full_config(SHAPES[shape]), SHAPES[shape])
    )
    backends, skipped = usable_backends(device, args.backends or BACKENDS)
    out: dict[str, Any] = {"shape": label, "device": device, "dtype": str(dtype).replace("torch.", "")}
    text = config.get_text_config()
    heads, kv, hd = int(text.num_attention_heads), int(text.num_key_value_heads), int(text.head_dim)
    if device.startswith("cuda"):
        from cudaload.execute.runtime.sdpa_decode import decode_backend

        out["decode_dispatch"] = decode_backend(device, dtype, heads, kv, hd)
        log(f"{label}: torch's SDPA picks for a decode step: {out['decode_dispatch']}")
    log(f"{label}: building {backends} on {device}")
    models, build_errors, build_s = build_models(config, backends, device, dtype)
    out.update({"build_s": build_s, "backends": list(models), "not_usable": {**skipped, **build_errors}})
    works = SMOKE_WORKS if args.smoke else WORKS
    if args.works:
        works = tuple(w for w in works if w.name in args.works)
    out["choices"] = choices(config, works)
    log(
        f"{label}: built in {build_s:.1f} s; {int(deadline - time.perf_counter())} s left; default choice "
        f"{out['choices']['default'].get('choice')}"
    )
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    # cudaload_sdpa changes kernels with how often a shape was met: its repeated sample comes after RECUR more
    # calls (the second, like the others' repeated one, still skips cuDNN; the third builds cuDNN's graphs)
    settle = {SDPA_DECODE: RECUR}
    ms: list[Measurement] = measure_backends(
        models, works, reps=args.reps, deadline=deadline, log=log, t0=t0, settle=settle
    )
    out["rows"] = [m.summary() for m in ms]
    if device.startswith("cuda"):
        out["gpu_peak_bytes"] = torch.cuda.max_memory_allocated()
    del models, ms
    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    return out


STEADY_WORKS: tuple[WorkShape, ...] = (
    WorkShape(1, 512, 32),
    WorkShape(4, 1024, 64, "ones"),
    WorkShape(8, 2048, 32, "left", 1024),
)


def steady(shape: str, args: argparse.Namespace, deadline: float) -> dict[str, Any]:
    """Repeated lengths only, many samples: sdpa and cudaload_sdpa on one thread, each work run until both
    have met its lengths RECUR + 1 times (cudaload_sdpa then runs cuDNN with its graphs built, like sdpa), then
    pairs alternating which goes first. The per-pair ratio sdpa / cudaload_sdpa is what a process that keeps
    meeting the same lengths sees."""
    import torch

    from cudaload.execute.measure.backends import generate_call, make_inputs, timed
    from cudaload.testing import full_config, tiny_config

    device = "cuda:0" if torch.cuda.is_available() and not args.smoke else "cpu"
    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    config, label = (
        (tiny_config("qwen3"), "tiny-qwen3") if args.smoke else (full_config(SHAPES[shape]), SHAPES[shape])
    )
    models, errors, _s = build_models(config, ["sdpa", SDPA_DECODE], device, dtype)
    out: dict[str, Any] = {"shape": label, "errors": errors, "works": []}
    vocab = int(config.get_text_config().vocab_size)
    works = STEADY_WORKS
    if args.works:  # the works named, from both lists
        works = tuple({w.name: w for w in (*WORKS, *STEADY_WORKS) if w.name in args.works}.values())
    for w in SMOKE_WORKS[:1] if args.smoke else works:
        ids, mask = make_inputs(w, vocab, device)
        calls = {b: generate_call(m, ids, mask, w.new_tokens) for b, m in models.items()}
        for _ in range(RECUR + 1):
            for c in calls.values():
                timed(c, device)
        pairs: list[dict[str, float]] = []
        while time.perf_counter() < deadline and len(pairs) < args.steady:
            order = list(calls) if len(pairs) % 2 == 0 else list(calls)[::-1]
            pairs.append({b: timed(calls[b], device)[0] for b in order})
        ratios = [p["sdpa"] / p[SDPA_DECODE] for p in pairs if len(p) == 2]
        rec = {
            "work": w.name,
            "pairs": pairs,
            "ratio_median": statistics.median(ratios) if ratios else None,
            "ratio_min": min(ratios) if ratios else None,
            "ratio_max": max(ratios) if ratios else None,
        }
        log(f"{label} steady {w.name}: sdpa / cudaload_sdpa {rec['ratio_median']} over {len(ratios)} pairs")
        out["works"].append(rec)
    del models
    gc.collect()
    return out


# -- the report ------------------------------------------------------------------------------------------------


def _med(row: dict[str, Any] | None, key: str) -> float | None:
    g = (row or {}).get(key) or {}
    return g.get("median")


def goal_rows(sh: dict[str, Any]) -> list[dict[str, Any]]:
    """Per work: each backend's median seconds in both states, and the default choice against plain sdpa."""
    default = ((sh.get("choices") or {}).get("default") or {}).get("choice")
    by: dict[str, dict[str, dict[str, Any]]] = {}
    for r in sh.get("rows") or []:
        by.setdefault(r["work"], {})[r["backend"]] = r
    out = []
    for work, rows in by.items():
        rec: dict[str, Any] = {"work": work, "default": default}
        for state, key in (("first", "generate_first_s"), ("repeated", "generate_s")):
            secs = {b: _med(r, key) for b, r in rows.items() if _med(r, key)}
            rec[state] = secs
            if secs:
                rec[f"fastest_{state}"] = min(secs, key=lambda b: secs[b])
            base, d = secs.get("sdpa"), secs.get(default or "")
            rec[f"default_vs_sdpa_{state}"] = base / d if base and d else None
        pre = {b: _med(r, "prefill_s") for b, r in rows.items() if _med(r, "prefill_s")}
        rec["prefill"] = pre
        base, d = pre.get("sdpa"), pre.get(default or "")
        rec["default_vs_sdpa_prefill"] = base / d if base and d else None
        pre_first = {b: _med(r, "prefill_first_s") for b, r in rows.items() if _med(r, "prefill_first_s")}
        rec["prefill_first"] = pre_first
        out.append(rec)
    return out


def _f(x: Any, d: int = 3) -> str:
    return "-" if x is None else (f"{x:.{d}f}" if isinstance(x, float) else str(x))


def render(res: dict[str, Any]) -> str:
    lines = [
        "# generate(): every backend on first-seen and repeated lengths",
        "",
        f"{res.get('date')}, {res.get('gpu', 'CPU')}, {res.get('versions')}",
        f"command: `{res.get('command')}`",
        "",
        "Seconds per generate() call, median (n in the JSON); first-seen = a new thread (empty cuDNN graph "
        "cache), repeated = that thread again once it has met the same lengths (steady state). Default = cudaload's choice with "
        "nothing declared; ratios are plain sdpa's seconds over the default's (above 1: faster).",
        "",
    ]
    for sh in res.get("shapes") or []:
        lines.append(f"## {sh.get('shape')}")
        if "error" in sh or "skipped" in sh:
            lines += [f"{sh.get('error') or sh.get('skipped')}", ""]
            continue
        lines.append(f"decode dispatch (torch's choice for a decode step): {sh.get('decode_dispatch')}")
        lines.append(f"default choice: {((sh.get('choices') or {}).get('default') or {}).get('choice')}")
        if sh.get("not_usable"):
            lines.append(f"not timed: {sh['not_usable']}")
        lines.append("")
        names = list(sh.get("backends") or [])
        lines.append(
            "| work | "
            + " | ".join(f"{b} first / rep" for b in names)
            + " | default vs sdpa first / rep / prefill |"
        )
        lines.append("|---" * (len(names) + 2) + "|")
        for g in goal_rows(sh):
            cells = [f"{_f(g['first'].get(b), 2)} / {_f(g['repeated'].get(b), 2)}" for b in names]
            ratio = " / ".join(_f(g[f"default_vs_sdpa_{k}"], 2) for k in ("first", "repeated", "prefill"))
            lines.append(f"| {g['work']} | " + " | ".join(cells) + f" | {ratio} |")
        lines.append("")
    st = res.get("steady")
    if st:
        lines += [f"## repeated lengths, alternating pairs ({st.get('shape')})", ""]
        lines += ["| work | pairs | sdpa / cudaload_sdpa median (min-max) |", "|---|---|---|"]
        for w in st.get("works") or []:
            lines.append(
                f"| {w['work']} | {len(w['pairs'])} | {_f(w['ratio_median'], 3)} "
                f"({_f(w['ratio_min'], 3)}-{_f(w['ratio_max'], 3)}) |"
            )
        if st.get("error"):
            lines.append(st["error"])
        lines.append("")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument(
        "--shapes", default="8b,0.6b", type=lambda s: [x.strip() for x in s.split(",") if x.strip()]
    )
    ap.add_argument("--budget-s", type=float, default=None)
    ap.add_argument("--share-8b", type=float, default=0.62, help="the 8B shape's share of the budget")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--backends", type=lambda s: [x.strip() for x in s.split(",") if x.strip()])
    ap.add_argument(
        "--works",
        type=lambda s: [x.strip() for x in s.split(";") if x.strip()],
        help="names, ';'-separated (also picks the --steady works)",
    )
    ap.add_argument("--smoke", action="store_true", help="CPU, tiny Qwen3, 3 works")
    ap.add_argument(
        "--steady",
        type=int,
        default=0,
        help="then N alternating pairs of sdpa / cudaload_sdpa on repeated lengths",
    )
    ap.add_argument("--steady-shape", default="8b")
    ap.add_argument("--steady-s", type=float, default=120.0, help="seconds for the --steady part")
    args = ap.parse_args(argv)
    if args.budget_s is None:
        args.budget_s = 90.0 if args.smoke else 540.0
    if args.smoke:
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    res: dict[str, Any] = {
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
        "versions": versions(),
        "python": platform.python_version(),
        "budget_s": args.budget_s,
        "smoke": args.smoke,
        "shapes": [],
    }
    import torch

    if torch.cuda.is_available() and not args.smoke:
        pr = torch.cuda.get_device_properties(0)
        res["gpu"] = f"{pr.name} (sm{pr.major}{pr.minor}, {pr.total_memory / 2**30:.0f} GiB)"
        res["gpu_id"] = f"{pr.name}/sm{pr.major}{pr.minor}"  # as cudaload.tuning.store.gpu_id writes it

    def save() -> None:
        res["elapsed_s"] = time.perf_counter() - t0
        (out / "results.json").write_text(json.dumps(res, indent=1, default=str))
        (out / "results.md").write_text(render(res))

    end = t0 + args.budget_s - (args.steady_s if args.steady else 0.0)
    shapes = ["tiny"] if args.smoke else args.shapes
    try:
        for i, shape in enumerate(shapes):
            left = end - time.perf_counter()
            share = (
                left
                if i == len(shapes) - 1
                else (args.share_8b if shape == "8b" else 1 - args.share_8b) * left
            )
            if left < 20:
                res["shapes"].append({"shape": shape, "skipped": "time budget"})
                continue
            try:
                res["shapes"].append(run_shape(shape, args, time.perf_counter() + share, t0))
            except Exception as e:
                traceback.print_exc()
                res["shapes"].append({"shape": shape, "error": _err(e)})
            save()
        if args.steady:
            try:
                res["steady"] = steady(args.steady_shape, args, time.perf_counter() + args.steady_s)
            except Exception as e:
                traceback.print_exc()
                res["steady"] = {"error": _err(e)}
    finally:
        save()
    for sh in res["shapes"]:
        for g in goal_rows(sh) if "rows" in sh else []:
            log(
                f"{sh['shape']} {g['work']}: default vs sdpa first {_f(g['default_vs_sdpa_first'], 2)}, "
                f"repeated {_f(g['default_vs_sdpa_repeated'], 2)}, prefill {_f(g['default_vs_sdpa_prefill'], 2)}"
            )
    log(f"done in {time.perf_counter() - t0:.1f} s: {out / 'results.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
