#!/usr/bin/env python
"""Attention backends through transformers' real generate(), as a user runs it (issue 13).

Superseded by benchmarks/bench_generate.py, which holds the goal and makes the shipped priors: this script
timed one state only, where bench_generate.py times lengths a process has not met and repeated ones apart.
Its findings are in benchmarks/results/2026-12-01-h200/README.md (run 2).

On the H200, from the repo root, with the FA4 wheels (`source .whl/env.sh` after `wheels.sh fa4`):

    python benchmarks/investigations/bench_attention.py --out OUT/attn --budget-s 420           # both shapes
    python benchmarks/investigations/bench_attention.py --out OUT/fresh --fresh --budget-s 400  # fresh processes
    python benchmarks/investigations/bench_attention.py --out /tmp/attn-smoke --smoke           # CPU, ~30 s

Run each under ``timeout 560`` (a device call allows 600 s). At 420 s for both shapes each row gets about 1-3
timed calls on the 8B shape (its 8 works cost ~100 s a round for sdpa, eager and FA4); for more samples run
the shapes apart: ``--shapes 8b --budget-s 540 --replica`` and ``--shapes 0.6b --budget-s 400``. (Its
results made the priors until 2026-12-02; ``python -m cudaload.tuning priors`` now reads bench_generate.py's.)

**Generate mode** (default). For each shape (--shapes, default 8b then 0.6b) one model per backend is built
directly on the GPU from the config (random bf16 weights, transformers' own init: normal(0, 0.02), norms
1; the same seed and one state dict copied into all of them, so every backend runs the same weights) and
held at once. Backends: sdpa, eager, flash_attention_4 when ``flash_attn.cute`` imports, flex_attention
(transformers compiles it with torch.compile: its compile cost is the "warm-up beyond a steady call"
column, shown apart; it runs in its own pass after the others, --flex-share of the shape's time). Every (backend, work) gets one warm-up call (full prompt, 4 new tokens; its cost beyond a steady
call is reported), then timed calls round by round, backends interleaved (see cudaload.execute.measure.backends,
which ``cudaload tune`` shares). Greedy, ``min_new_tokens == max_new_tokens`` (checked), pad_token_id 0.
The work list covers the issue's table: 8x2048+32 without a mask, with an all-ones mask and left-padded
(1024-2048), 1x4096+64, 32x512+128, 8x2048+256, 1x512+32, plus 32x512+32 left-padded (256-512).
The budget is split between shapes (--share-8b of it for the 8B shape first, the rest and anything
unused for 0.6B); inside a shape, reps stop when its share is used (every row gets a first sample before
any gets a second), and a backend more than 2x behind the fastest gets no more reps on that work.

With ``--replica``, at the end of the 8B shape, the in-process **run-9 replica**: one model switched with
``set_attn_implementation`` through sdpa, eager, FA4 in sequence (not interleaved), on run 9's batch
(random ids, seed 1234, all-ones mask), warm-up = prefill + a 2-token generate, median of 2 generates:
benchmarks/run.py's ``w_choice`` step for step, then the same in the reverse backend order.

**Fresh mode** (``--fresh``): writes the 8B shape once with ``save_pretrained`` into --work (about 16 GB,
on the GPU machine's disk), then runs in new processes, interleaved: plain transformers
(``from_pretrained(dtype=bfloat16, device_map="cuda", attn_implementation="sdpa")``) and
``cudaload.load_model(path)`` with defaults (a fresh CUDALOAD_CACHE for the first, reused by the second),
and cudaload with FA4's persistent compile cache turned on explicitly (cold, then warm). Each reports
seconds from its launch: interpreter start, import torch, CUDA context, import transformers, import
cudaload, load, first forward (1x512), second forward. Then benchmarks/run.py's own choice worker (run 9's
exact code, loading from the saved checkpoint in a new process), in run 9's backend order and reversed.

**Why run 9 (benchmarks/results/2026-11-29-h200/run9-choice-8b: sdpa 2.33 s at 8x2048+32) differs from the
issue's 1.52 s.** Read from benchmarks/run.py ``w_choice``: (1) its batch carried an all-ones
``attention_mask`` (``mask = torch.ones_like(ids)``), so it compares with the issue's "all-ones mask" row
(1.69 s), not the no-mask row; (2) one model was loaded and switched with ``set_attn_implementation``, the
backends timed one after another, sdpa first, right after the load, nothing interleaved; (3) its warm-up was
a prefill and a 2-token generate, then ``generate_reps=2`` with the median (= the mean of two): the first
timed call is the first to reach KV lengths prompt+3..prompt+32, so any cost paid once per new shape lands
in half the reported number, where the issue's table took the best of 2-3. Only sdpa moved (run 9 vs the
issue: FA4 1.78 vs 1.80 s, eager 2.08 vs 2.03 s, prefill equal; sdpa's decode 1.82 s vs ~1.0-1.2 s, and at
1x512+32 1.88 vs 1.07 s). This benchmark covers each factor: the no-mask and all-ones rows, every sample
kept with the first full-length call's excess reported apart ("first timed call beyond the later ones"),
the in-process replica of w_choice's procedure (--replica), (--fresh) run.py's own worker in a new process in
both backend orders, and a probe of torch SDPA alone at decode shapes (kernels launched; a KV length seen for
the first time vs a repeated one) that tells whether sdpa pays per new length.

Writes OUT/results.json and OUT/results.md; progress on stdout (flush=True).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import gc
import importlib.util
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

_T_LAUNCH_ENV = "BENCH_ATTN_LAUNCH"  # the parent's time.time() at Popen, for the fresh children
ROOT = Path(__file__).resolve().parents[2]  # benchmarks/investigations/ -> the repo root
sys.path.insert(0, str(ROOT / "src"))  # this checkout's cudaload, before any installed one
sys.path.insert(0, str(ROOT / "benchmarks"))  # bench_generate: the model builder both scripts use

from bench_generate import build_models  # noqa: E402
from cudaload.execute.measure.backends import (  # noqa: E402
    Measurement,
    WorkShape,
    generate_call,
    make_inputs,
    measure_backends,
    prefill_call,
    timed,
)

SHAPES = {"0.6b": "Qwen3-0.6B", "8b": "Qwen3-8B"}
RESULT_TAG = "BENCH-ATTN-RESULT "
WORKS: tuple[WorkShape, ...] = (
    WorkShape(8, 2048, 32),
    WorkShape(8, 2048, 32, "ones"),
    WorkShape(8, 2048, 32, "left", 1024),
    WorkShape(1, 4096, 64),
    WorkShape(32, 512, 128),
    WorkShape(32, 512, 32, "left", 256),
    WorkShape(1, 512, 32),
    WorkShape(8, 2048, 256),
)
SMOKE_WORKS: tuple[WorkShape, ...] = (
    WorkShape(2, 32, 4),
    WorkShape(2, 32, 4, "ones"),
    WorkShape(3, 32, 4, "left", 16),
    WorkShape(1, 48, 6),
)
#: the issue's table (H200, 2026-11-30), for the side-by-side column
ISSUE_TABLE = {
    "8x2048+32": {"sdpa": 1.52, "flash_attention_4": 1.80, "eager": 2.03},
    "8x2048+32 ones-mask": {"sdpa": 1.69, "flash_attention_4": 1.95, "eager": 2.12},
    "8x2048+32 left-pad 1024-2048": {"sdpa": 2.42, "flash_attention_4": 3.05, "eager": 2.21},
    "1x4096+64": {"sdpa": 2.37, "flash_attention_4": 3.04, "eager": 2.63},
    "32x512+128": {"sdpa": 6.75, "flash_attention_4": 6.90, "eager": 7.24},
    "8x2048+256": {"sdpa": 12.40, "flash_attention_4": 12.15, "eager": 9.78},
    "1x512+32": {"sdpa": 1.07, "flash_attention_4": 1.84, "eager": 1.03},
}


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def _err(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"[:400]


def versions() -> dict[str, str | None]:
    from importlib import metadata

    out: dict[str, str | None] = {}
    for d in ("torch", "transformers", "flash-attn-4", "nvidia-cutlass-dsl", "triton", "accelerate"):
        try:
            out[d] = metadata.version(d)
        except metadata.PackageNotFoundError:
            out[d] = None
    return out


def usable_backends(device: str) -> tuple[list[str], dict[str, str]]:
    """(backends to time, why others are not)."""
    skipped: dict[str, str] = {}
    names = ["sdpa", "eager"]
    if device.startswith("cuda"):
        if importlib.util.find_spec("flash_attn") is not None and _has_module("flash_attn.cute"):
            names.append("flash_attention_4")
        else:
            skipped["flash_attention_4"] = "flash_attn.cute is not installed"
    else:
        skipped["flash_attention_4"] = "needs a CUDA GPU"
    if not device.startswith("cuda"):
        # on the CPU inductor compiles C++ for every new shape: minutes, and not a path anyone decodes on
        skipped["flex_attention"] = "timed on CUDA only (pass --backends to force it)"
    elif _has_module("torch.nn.attention.flex_attention"):
        names.append("flex_attention")
    else:
        skipped["flex_attention"] = "this torch has no torch.nn.attention.flex_attention"
    return names, skipped


def _has_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


# ----------------------------------------------------------------------------------------------------
# generate mode
# ----------------------------------------------------------------------------------------------------
def run9_replica(
    model: Any, backends: Sequence[str], device: str, works: Sequence[WorkShape]
) -> list[dict[str, Any]]:
    """benchmarks/run.py w_choice step for step (run 9), on one model switched between backends."""
    import torch

    rows: list[dict[str, Any]] = []
    for b in backends:
        try:
            model.set_attn_implementation(b)
        except Exception as e:
            rows.append({"backend": b, "error": _err(e)})
            continue
        for w in works:
            row: dict[str, Any] = {"backend": b, "work": w.name}
            try:
                ids, mask = make_inputs(w, int(model.config.vocab_size), device)
                with torch.no_grad():
                    first, _c, _ = timed(prefill_call(model, ids, mask), device)
                    timed(generate_call(model, ids, mask, 2), device)
                    pre = [timed(prefill_call(model, ids, mask), device)[0] for _ in range(3)]
                    gens = [timed(generate_call(model, ids, mask, w.new_tokens), device) for _ in range(2)]
                row.update(
                    {
                        "first_prefill_s": first,
                        "prefill_s": statistics.median(pre),
                        "generate_s": statistics.median(g[0] for g in gens),
                        "generate_samples_s": [g[0] for g in gens],
                        "generate_cpu_s": [g[1] for g in gens],
                    }
                )
                log(f"  replica {b} {w.name}: generate {row['generate_s']:.3f} s {row['generate_samples_s']}")
            except Exception as e:
                row["error"] = _err(e)
            rows.append(row)
    return rows


def sdpa_probe(device: str, dtype: Any, heads: int, kv_heads: int, head_dim: int) -> dict[str, Any]:
    """What torch SDPA does at decode shapes (q_len 1, batch 8, KV length 2048+): which kernels it launches
    with and without a mask, and whether a KV length seen for the first time costs more than a repeated one
    (a per-shape plan or autotune would: the suspect for run 9's slow sdpa, whose first timed call reached new
    lengths). Milliseconds of GPU time; nothing here depends on transformers."""
    import torch
    import torch.nn.functional as F

    out: dict[str, Any] = {
        "flags": {
            n: bool(getattr(torch.backends.cuda, n)())
            for n in (
                "flash_sdp_enabled",
                "mem_efficient_sdp_enabled",
                "math_sdp_enabled",
                "cudnn_sdp_enabled",
            )
            if hasattr(torch.backends.cuda, n)
        }
    }
    b, base = (8, 2048) if device.startswith("cuda") else (2, 64)
    g = torch.Generator(device=device).manual_seed(0)
    q = torch.randn(b, heads, 1, head_dim, device=device, dtype=dtype, generator=g)
    variants = {
        "gqa, no mask": lambda k, v: F.scaled_dot_product_attention(q, k, v, enable_gqa=True),
        "gqa, bool mask": lambda k, v: F.scaled_dot_product_attention(
            q,
            k,
            v,
            attn_mask=torch.ones(b, 1, 1, k.shape[2], dtype=torch.bool, device=device),
            enable_gqa=True,
        ),
        "repeat_kv, bool mask": lambda k, v: F.scaled_dot_product_attention(
            q,
            k.repeat_interleave(heads // kv_heads, 1),
            v.repeat_interleave(heads // kv_heads, 1),
            attn_mask=torch.ones(b, 1, 1, k.shape[2], dtype=torch.bool, device=device),
        ),
    }
    res: dict[str, Any] = {}
    for name, fn in variants.items():
        try:
            first, second = [], []
            for i in range(12):
                n = base + 1 + i + 16 * len(res)  # lengths no variant has seen
                k = torch.randn(b, kv_heads, n, head_dim, device=device, dtype=dtype, generator=g)
                v = torch.randn_like(k)
                first.append(timed(lambda fn=fn, k=k, v=v: fn(k, v), device)[0])
                second.append(timed(lambda fn=fn, k=k, v=v: fn(k, v), device)[0])
            kernels: list[str] = []
            if device.startswith("cuda"):
                from torch.profiler import ProfilerActivity, profile

                with profile(activities=[ProfilerActivity.CUDA]) as prof:
                    fn(k, v)
                    torch.cuda.synchronize()
                # GPU kernels only (the CPU-side aten:: and cuda* runtime entries say nothing about the path)
                names = {e.key for e in prof.key_averages()}
                kernels = sorted(n for n in names if not n.startswith(("aten::", "cuda", "Activity")))[:12]
            res[name] = {
                "first_ms": 1000 * statistics.median(first),
                "repeat_ms": 1000 * statistics.median(second),
                "kernels": kernels,
            }
            log(
                f"  sdpa probe {name}: new length {res[name]['first_ms']:.3f} ms, repeated "
                f"{res[name]['repeat_ms']:.3f} ms; {kernels[:4]}"
            )
        except Exception as e:
            res[name] = {"error": _err(e)}
    out["variants"] = res
    return out


def rule_choices(config: Any, works: Sequence[WorkShape]) -> dict[str, Any]:
    """cudaload's plan() choice for each work on this machine (the rules, plus whatever timings plan() looks
    up), to set beside the measured fastest. Declared work is passed as plan() accepts it here."""
    import inspect

    import cudaload
    from cudaload.detection import detect

    caps = detect()
    accepts = set(inspect.signature(cudaload.plan).parameters)
    out: dict[str, Any] = {}
    for w in works:
        kw: dict[str, Any] = {"seq_len": w.prompt + w.new_tokens, "batch_size": w.batch}
        if "new_tokens" in accepts:
            kw["new_tokens"] = w.new_tokens
        if "padded" in accepts:
            kw["padded"] = w.padding == "left"
        try:
            p = cudaload.plan(config, hardware=caps, **kw)
            out[w.name] = {"choice": p.attention.choice, "reasons": list(p.attention.reasons)[:3]}
        except Exception as e:
            out[w.name] = {"choice": None, "error": _err(e)}
    return out


def run_shape(shape: str, args: argparse.Namespace, deadline: float, t0: float) -> dict[str, Any]:
    import torch

    device = "cuda:0" if torch.cuda.is_available() and not args.smoke else "cpu"
    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    from cudaload.testing import full_config, tiny_config

    if args.smoke:
        config, label = tiny_config("qwen3"), "tiny-qwen3"
    else:
        config, label = full_config(SHAPES[shape]), SHAPES[shape]
    backends, skipped = usable_backends(device)
    if args.backends:
        skipped.update({b: "not in --backends" for b in backends if b not in args.backends})
        backends = list(args.backends)
    out: dict[str, Any] = {"shape": label, "device": device, "dtype": str(dtype).replace("torch.", "")}
    log(f"{label}: building {backends} on {device}")
    models, build_errors, build_s = build_models(config, backends, device, dtype)
    out.update({"build_s": build_s, "backends": list(models), "not_usable": {**skipped, **build_errors}})
    log(f"{label}: built in {build_s:.1f} s; {int(deadline - time.perf_counter())} s left for this shape")
    works = SMOKE_WORKS if args.smoke else WORKS
    if args.works:
        works = tuple(w for w in works if w.name in args.works)
    if "sdpa" in models:
        text = config.get_text_config()
        out["sdpa_probe"] = sdpa_probe(
            device, dtype, int(text.num_attention_heads), int(text.num_key_value_heads), int(text.head_dim)
        )
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    # run 9's two works x 3 backends, one order (~36 s on the 8B shape), with --replica; --fresh runs run.py's
    # own worker in both orders
    replica = (args.smoke or shape == "8b") and args.replica and "sdpa" in models
    replica_s = 40.0 if replica and not args.smoke else 0.0
    # flex_attention compiles (torch.compile, again for new shapes): measure_backends times it in a pass of
    # its own after the others, with --flex-share of the time, so its compiles cannot starve the main table
    ms: list[Measurement] = measure_backends(
        models,
        works,
        reps=args.reps,
        deadline=deadline - replica_s,
        compiled_share=args.flex_share,
        log=log,
        t0=t0,
    )
    out["rows"] = [m.summary() for m in ms]
    out["choices"] = rule_choices(config, works)
    if device.startswith("cuda"):
        out["gpu_peak_bytes"] = torch.cuda.max_memory_allocated()
    # the run-9 replica (8B only, or in --smoke on the tiny model so the path is exercised)
    if replica:
        rep_works = (
            (WorkShape(1, 32, 4, "ones"), WorkShape(2, 48, 4, "ones"))
            if args.smoke
            else (WorkShape(1, 512, 32, "ones"), WorkShape(8, 2048, 32, "ones"))
        )
        order = [b for b in ("sdpa", "eager", "flash_attention_4") if b in models]
        out["replica"] = {}
        orders = (
            (("run9 order", order), ("reversed", order[::-1])) if args.smoke else (("run9 order", order),)
        )
        for name, seq in orders:
            if time.perf_counter() + (8 if args.smoke else 11) * len(seq) > deadline:
                out["replica"][name] = {"skipped": "time budget"}
                continue
            log(f"{label}: run-9 replica, {name}: {seq}")
            # the sdpa-built model switched in turn, like run 9's single from_pretrained model
            out["replica"][name] = {
                "order": seq,
                "rows": run9_replica(models["sdpa"], seq, device, rep_works),
            }
        with contextlib.suppress(Exception):
            models["sdpa"].set_attn_implementation("sdpa")
    del models, ms
    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    return out


def generate_mode(args: argparse.Namespace, res: dict[str, Any], save: Any) -> None:
    t0 = time.perf_counter()
    end = t0 + args.budget_s
    shapes = ["tiny"] if args.smoke else args.shapes
    res["shapes"] = []
    for i, shape in enumerate(shapes):
        left = end - time.perf_counter()
        share = (
            left if i == len(shapes) - 1 else (args.share_8b if shape == "8b" else 1 - args.share_8b) * left
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


# ----------------------------------------------------------------------------------------------------
# fresh mode
# ----------------------------------------------------------------------------------------------------
def child_main(spec: dict[str, Any]) -> dict[str, Any]:
    """One fresh process: phases in seconds since the parent launched it."""
    launch = float(os.environ.get(_T_LAUNCH_ENV, time.time()))
    marks: dict[str, float] = {"interpreter": time.time() - launch}
    if spec["action"] == "write":
        return write_checkpoint(spec)

    def mark(name: str) -> None:
        marks[name] = time.time() - launch

    import torch

    mark("import_torch")
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.init()
        torch.empty(1, device="cuda")
    mark("cuda_context")
    import transformers
    from transformers import AutoModelForCausalLM

    mark("import_transformers")
    out: dict[str, Any] = {"kind": spec["kind"]}
    device = "cuda" if cuda else "cpu"
    dtype = torch.bfloat16 if cuda else torch.float32
    if spec["kind"] == "plain":
        model = AutoModelForCausalLM.from_pretrained(
            spec["path"], dtype=dtype, device_map=device, attn_implementation="sdpa"
        )
        mark("load")
        out["attention"] = model.config._attn_implementation
    else:
        import cudaload

        mark("import_cudaload")
        model = cudaload.load_model(spec["path"])
        mark("load")
        plan = model.cudaload_plan
        out["attention"] = plan.attention.choice
        out["load_path"] = (plan.verified or {}).get("load_path")
    ids = torch.randint(4, int(model.config.vocab_size), (1, int(spec.get("prompt", 512)))).to(device)
    with torch.no_grad():
        model(input_ids=ids)
        if cuda:
            torch.cuda.synchronize()
        mark("first_forward")
        model(input_ids=ids)
        if cuda:
            torch.cuda.synchronize()
        mark("second_forward")
    out["marks"] = marks
    out["transformers"] = transformers.__version__
    return out


def write_checkpoint(spec: dict[str, Any]) -> dict[str, Any]:
    import torch
    from transformers import AutoModelForCausalLM

    from cudaload.testing import full_config, tiny_config

    t = time.perf_counter()
    cuda = torch.cuda.is_available() and not spec.get("smoke")
    config = tiny_config("qwen3") if spec.get("smoke") else full_config(spec["config"])
    torch.manual_seed(0)
    with torch.device("cuda" if cuda else "cpu"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16 if cuda else torch.float32)
    built = time.perf_counter() - t
    model.save_pretrained(spec["path"])
    size = sum(f.stat().st_size for f in Path(spec["path"]).glob("*.safetensors"))
    return {"build_s": built, "seconds": time.perf_counter() - t, "bytes": size}


def run_child(argv: list[str], env: dict[str, str], timeout: float, tag: str = RESULT_TAG) -> dict[str, Any]:
    env = {**env, _T_LAUNCH_ENV: repr(time.time())}
    t = time.perf_counter()
    try:
        p = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s", "wall_s": time.perf_counter() - t}
    wall = time.perf_counter() - t
    for line in p.stdout.splitlines():
        if line.startswith(tag):
            r = json.loads(line[len(tag) :])
            r["wall_s"] = wall
            return r
    return {"error": f"exit {p.returncode}: {(p.stderr or p.stdout)[-1500:]}", "wall_s": wall}


def fresh_mode(args: argparse.Namespace, res: dict[str, Any], save: Any) -> None:
    t0 = time.perf_counter()
    end = t0 + args.budget_s
    work = Path(args.work or tempfile.gettempdir()) / (
        "bench-attn-tiny" if args.smoke else "bench-attn-Qwen3-8B"
    )
    sec: dict[str, Any] = {"checkpoint": str(work), "runs": []}
    res["fresh"] = sec
    me = [sys.executable, str(Path(__file__).resolve())]
    base_env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]),
    }
    if args.smoke:
        base_env["CUDA_VISIBLE_DEVICES"] = ""
    if not (work / "config.json").exists():
        log(f"writing the checkpoint to {work}")
        spec = {"action": "write", "path": str(work), "config": "Qwen3-8B", "smoke": args.smoke}
        r = run_child(
            [*me, "--child", json.dumps(spec)], base_env, timeout=max(60.0, end - time.perf_counter())
        )
        sec["write"] = r
        if "error" in r:
            log(f"write failed: {r['error']}")
            save()
            return
        log(f"wrote {r['bytes'] / 1e9:.2f} GB in {r['seconds']:.1f} s")
    os.sync()  # the children read a settled page cache, not one still writing back 16 GB
    cache_root = Path(tempfile.mkdtemp(prefix="bench-attn-cache-"))
    fa4_dir = cache_root / "fa4-explicit"
    variants: list[tuple[str, str, dict[str, str]]] = [
        ("plain sdpa", "plain", {}),
        ("cudaload defaults (cold cudaload cache)", "cudaload", {"CUDALOAD_CACHE": str(cache_root / "c1")}),
        ("plain sdpa", "plain", {}),
        ("cudaload defaults (warm cudaload cache)", "cudaload", {"CUDALOAD_CACHE": str(cache_root / "c1")}),
        (
            "cudaload, FA4 compile cache on (cold)",
            "cudaload",
            {
                "CUDALOAD_CACHE": str(cache_root / "c2"),
                "FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED": "1",
                "FLASH_ATTENTION_CUTE_DSL_CACHE_DIR": str(fa4_dir),
            },
        ),
        (
            "cudaload, FA4 compile cache on (warm)",
            "cudaload",
            {
                "CUDALOAD_CACHE": str(cache_root / "c2"),
                "FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED": "1",
                "FLASH_ATTENTION_CUTE_DSL_CACHE_DIR": str(fa4_dir),
            },
        ),
    ]
    est = 25.0 if not args.smoke else 5.0
    for label, kind, extra in variants:
        if time.perf_counter() + est > end:
            sec["runs"].append({"label": label, "skipped": "time budget"})
            continue
        spec = {"action": "run", "kind": kind, "path": str(work)}
        r = run_child(
            [*me, "--child", json.dumps(spec)],
            {**base_env, **extra},
            timeout=max(30.0, end - time.perf_counter()),
        )
        r["label"] = label
        sec["runs"].append(r)
        marks = r.get("marks") or {}
        log(
            f"fresh {label}: first forward at {marks.get('first_forward', float('nan')):.2f} s "
            f"({r.get('attention')}) {r.get('error', '')}"
        )
        est = max(est, float(r.get("wall_s", est)))
        save()
    # benchmarks/run.py's own choice worker: run 9 exactly, in a new process loading from disk
    runpy = ROOT / "benchmarks" / "run.py"
    backends, _skip = usable_backends("cpu" if args.smoke else "cuda:0")
    order = [b for b in ("sdpa", "eager", "flash_attention_4") if b in backends]
    works = (
        [{"name": "bs1 p32", "batch": 1, "prompt": 32}, {"name": "bs2 p64", "batch": 2, "prompt": 64}]
        if args.smoke
        else [
            {"name": "bs1 p512", "batch": 1, "prompt": 512},
            {"name": "bs8 p2048", "batch": 8, "prompt": 2048},
        ]
    )
    sec["run9_worker"] = {}
    for name, seq in (("run9 order", order), ("reversed", order[::-1])):
        if time.perf_counter() + (15 if args.smoke else 60) > end:
            sec["run9_worker"][name] = {"skipped": "time budget"}
            continue
        spec = {
            "path": str(work),
            "backends": seq,
            "new_tokens": 4 if args.smoke else 32,
            "works": works,
            "prefill_reps": 3,
            "generate_reps": 2,
        }
        log(f"run.py choice worker, {name}: {seq}")
        r = run_child(
            [sys.executable, str(runpy), "--worker", "choice", "--spec", json.dumps(spec)],
            base_env,
            timeout=max(30.0, end - time.perf_counter()),
            tag="BENCH-RESULT ",
        )
        sec["run9_worker"][name] = r
        for row in r.get("rows", []):
            log(
                f"  {row.get('backend')} {row.get('work')}: generate {row.get('generate_s')} {row.get('error', '')}"
            )
        save()


# ----------------------------------------------------------------------------------------------------
# report
# ----------------------------------------------------------------------------------------------------
def fmt(x: Any, digits: int = 3) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:.{digits}g}"
    if isinstance(x, (list, tuple)):
        return ", ".join(fmt(v, digits) for v in x)
    return str(x)


def md_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(fmt(c) for c in r) + " |" for r in rows]
    return out


def render(res: dict[str, Any]) -> str:
    lines = [
        "# Attention backends through generate()",
        "",
        f"- date: {res['date']}; elapsed {fmt(res.get('elapsed_s'))} s; command: `{res['command']}`",
        f"- versions: {', '.join(f'{k} {v}' for k, v in res['versions'].items() if v)}",
        f"- device: {res.get('gpu') or 'cpu'}",
        "",
    ]
    for sh in res.get("shapes", []):
        lines += [f"## {sh.get('shape')}", ""]
        if "rows" not in sh:
            lines += [f"_{sh.get('skipped') or sh.get('error')}_", ""]
            continue
        lines += [
            f"{sh['device']}, {sh['dtype']}, models built in {fmt(sh['build_s'])} s; not usable: "
            + (", ".join(f"{k} ({v})" for k, v in sh["not_usable"].items()) or "none"),
            "",
            "generate() seconds, median [min-max] (n); fastest in bold; `issue` = the 2026-11-30 H200 table.",
            "",
        ]
        backends = sh["backends"]
        by: dict[str, dict[str, dict[str, Any]]] = {}
        for r in sh["rows"]:
            by.setdefault(r["work"], {})[r["backend"]] = r
        rows = []
        for work, per in by.items():
            meds = {b: (per[b]["generate_s"] or {}).get("median") for b in backends if b in per}
            best = min((v for v in meds.values() if v), default=None)
            cells = []
            for b in backends:
                g = per.get(b, {}).get("generate_s")
                if not g:
                    cells.append(per.get(b, {}).get("error") or per.get(b, {}).get("stopped") or "-")
                    continue
                c = f"{g['median']:.3f} [{g['min']:.3f}-{g['max']:.3f}] ({g['n']})"
                cells.append(f"**{c}**" if g["median"] == best else c)
            fastest = min((b for b in meds if meds[b]), key=lambda b: meds[b] or 0, default=None)
            issue = ISSUE_TABLE.get(work) if sh["shape"] == "Qwen3-8B" else None
            rule = ((sh.get("choices") or {}).get(work) or {}).get("choice")
            ratio = (meds[fastest] / meds[rule]) if fastest and rule in meds and meds.get(rule) else None
            rows.append(
                [
                    work,
                    *cells,
                    fastest,
                    rule,
                    ratio,
                    ", ".join(f"{k} {v}" for k, v in issue.items()) if issue else "-",
                ]
            )
        lines += [
            *md_table(["work", *backends, "fastest", "plan() chose", "fastest / chosen", "issue"], rows),
            "",
        ]
        lines += ["Prefill ms (median) / decode ms per token / generate CPU-time fraction:", ""]
        rows = []
        for work, per in by.items():
            cells = []
            for b in backends:
                r = per.get(b) or {}
                p = (r.get("prefill_s") or {}).get("median")
                d = r.get("decode_s_per_token")
                cf = r.get("cpu_fraction")
                cells.append(f"{fmt(p and p * 1000)} / {fmt(d and d * 1000)} / {fmt(cf, 2)}")
            rows.append([work, *cells])
        lines += [*md_table(["work", *backends], rows), ""]
        lines += [
            "One-time costs, seconds: warm-up call (4 new tokens) beyond a steady call of its length (JIT, "
            "torch.compile) / first timed call beyond the median of the later ones (new KV lengths):",
            "",
        ]
        rows = [
            [
                work,
                *[
                    f"{fmt((per.get(b) or {}).get('first_call_extra_s'))} / "
                    f"{fmt((per.get(b) or {}).get('first_rep_extra_s'))}"
                    for b in backends
                ],
            ]
            for work, per in by.items()
        ]
        lines += [*md_table(["work", *backends], rows), ""]
        pr = sh.get("sdpa_probe")
        if pr:
            lines += [
                "torch SDPA alone at decode shapes (q_len 1), median ms: a KV length seen for the first time vs "
                f"repeated; flags {pr.get('flags')}:",
                "",
            ]
            rows = [
                [
                    n,
                    v.get("first_ms"),
                    v.get("repeat_ms"),
                    ", ".join(v.get("kernels") or []) or v.get("error"),
                ]
                for n, v in (pr.get("variants") or {}).items()
            ]
            lines += [*md_table(["variant", "new length ms", "repeated ms", "kernels"], rows), ""]
        if sh.get("replica"):
            lines += ["Run-9 replica (one model switched, sequential, all-ones mask, median of 2):", ""]
            rows = []
            for name, rep in sh["replica"].items():
                for r in rep.get("rows", []):
                    rows.append(
                        [
                            name,
                            r.get("backend"),
                            r.get("work"),
                            r.get("generate_s"),
                            r.get("generate_samples_s"),
                            r.get("prefill_s"),
                            r.get("error"),
                        ]
                    )
                if "skipped" in rep:
                    rows.append([name, "-", "-", "-", "-", "-", rep["skipped"]])
            lines += [
                *md_table(["order", "backend", "work", "generate s", "samples", "prefill s", "error"], rows),
                "",
            ]
    fr = res.get("fresh")
    if fr:
        lines += ["## Fresh process: seconds from launch", ""]
        phases = [
            "interpreter",
            "import_torch",
            "cuda_context",
            "import_transformers",
            "import_cudaload",
            "load",
            "first_forward",
            "second_forward",
        ]
        rows = []
        for r in fr["runs"]:
            m = r.get("marks") or {}
            rows.append(
                [
                    r.get("label"),
                    r.get("attention"),
                    *[m.get(p) for p in phases],
                    r.get("error") or r.get("skipped"),
                ]
            )
        lines += [*md_table(["run", "attention", *phases, "error"], rows), ""]
        if fr.get("run9_worker"):
            lines += ["benchmarks/run.py choice worker (run 9's code, new process, from disk):", ""]
            rows = []
            for name, r in fr["run9_worker"].items():
                for row in r.get("rows", []):
                    rows.append(
                        [
                            name,
                            row.get("backend"),
                            row.get("work"),
                            row.get("generate_s"),
                            row.get("prefill_ms"),
                            row.get("error"),
                        ]
                    )
                if "rows" not in r:
                    rows.append([name, "-", "-", "-", "-", r.get("error") or r.get("skipped")])
            lines += [*md_table(["order", "backend", "work", "generate s", "prefill ms", "error"], rows), ""]
    return "\n".join(lines) + "\n"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--out", help="directory for results.json and results.md")
    p.add_argument("--smoke", action="store_true", help="CPU, tiny Qwen3, seconds")
    p.add_argument("--fresh", action="store_true", help="fresh-process time to first forward (see docstring)")
    p.add_argument(
        "--budget-s", type=float, default=None, help="stop starting calls after this (default 420; smoke 60)"
    )
    p.add_argument("--shapes", type=lambda s: [x for x in s.split(",") if x], default=["8b", "0.6b"])
    p.add_argument(
        "--share-8b", type=float, default=0.65, help="fraction of the budget for the 8B shape (run first)"
    )
    p.add_argument(
        "--flex-share",
        type=float,
        default=0.15,
        help="fraction of a shape's time for the flex_attention pass (after the other backends)",
    )
    p.add_argument(
        "--reps", type=int, default=5, help="timed generate() calls per (backend, work), budget allowing"
    )
    p.add_argument("--backends", type=lambda s: [x for x in s.split(",") if x], default=None)
    p.add_argument(
        "--works",
        type=lambda s: [x for x in s.split(";") if x],
        default=None,
        help="';'-separated work names to keep (e.g. '8x2048+32;1x512+32')",
    )
    p.add_argument(
        "--replica", action="store_true", help="generate mode: also the in-process run-9 replica (~40 s)"
    )
    p.add_argument("--work", help="--fresh: where the checkpoint is written (default $TMPDIR)")
    p.add_argument("--child", help=argparse.SUPPRESS)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.child:
        try:
            r = child_main(json.loads(args.child))
        except Exception as e:
            traceback.print_exc()
            r = {"error": _err(e)}
        print(RESULT_TAG + json.dumps(r, default=str), flush=True)
        return 0
    if not args.out:
        build_parser().error("--out is required")
    if args.budget_s is None:
        args.budget_s = 60.0 if args.smoke else 420.0
    if args.smoke:
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
        args.reps = min(args.reps, 3)
        args.replica = True
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    res: dict[str, Any] = {
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
        "versions": versions(),
        "python": platform.python_version(),
        "budget_s": args.budget_s,
        "mode": "fresh" if args.fresh else "generate",
        "smoke": args.smoke,
    }

    def save() -> None:
        res["elapsed_s"] = time.perf_counter() - t0
        (out / "results.json").write_text(json.dumps(res, indent=1, default=str))
        (out / "results.md").write_text(render(res))

    if not args.fresh:
        import torch

        if torch.cuda.is_available() and not args.smoke:
            pr = torch.cuda.get_device_properties(0)
            res["gpu"] = f"{pr.name} (sm{pr.major}{pr.minor}, {pr.total_memory / 2**30:.0f} GiB)"
            res["gpu_id"] = f"{pr.name}/sm{pr.major}{pr.minor}"  # as cudaload.tuning.store.gpu_id writes it
    try:
        if args.fresh:
            fresh_mode(args, res, save)
        else:
            generate_mode(args, res, save)
    finally:
        save()
    log(f"done in {time.perf_counter() - t0:.1f} s: {out / 'results.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
