#!/usr/bin/env python
"""Long generations: dynamic against compiled decode, fresh process to the end of a job (issue 35).

    python benchmarks/bench_decode.py --out DIR [--shape 8b] [--runs plain:short,cudaload:short,...]
                                      [--work /tmp/cudaload-bench] [--budget-s 540] [--smoke]

Each run is one fresh process (``--child``) that imports, loads and runs one job, timed from the process's
start (the interpreter's start time, so imports count). Methods:

- ``plain``: ``from_pretrained(dtype=bfloat16, device_map="cuda")`` (sdpa), ``generate()`` as transformers
  defaults (dynamic cache).
- ``cudaload``: ``load_model(path)``, no work declared (its default: each generate() call decides its decode,
  issue 43); ``cudaload:nf4`` / ``cudaload:int8``: with ``quantization=`` that bitsandbytes rung (needs
  bitsandbytes).
- ``dynamic``: ``load_model(path, decode="dynamic")``: every call on transformers' dynamic path (the default
  before issue 43).
- ``declared``: ``load_model(path, seq_len=S, batch_size=B, new_tokens=N, generate_calls=C)``: the work declared
  (the longest prompt + new tokens, the largest batch, one call's new tokens, the calls), the plan decides
  (``plan.decode``).
- ``compiled``: ``declared`` with ``decode="compiled"``: cudaload's compiled path whatever the plan would weigh.
- ``static``: plain ``from_pretrained`` + transformers' own static cache and compile
  (``cache_implementation="static"``, ``max_cache_len`` = the job's bucket, ``CompileConfig()``), what a user
  who read transformers' docs runs; with ``:mega`` the torch mega-cache artifacts are loaded from / saved to
  ``--artifacts`` (``torch.compiler.load_cache_artifacts`` / ``save_cache_artifacts``).

Jobs (greedy, exactly ``new`` tokens each call, EOS off; prompts random ids, batches left-padded with a mask):
``short``: 3 calls, 512+100 each (~300 new tokens); ``quant``: 2 calls of 512+128 (issue 35's quantized-rung
comparison reads the second); ``long``: 1 call 512+5,000 at batch 1; ``long3k``: 1 call 640+3,000; ``short64``: 2
calls 640+64; ``mix``: 640+64, 640+3,000, 640+64 (issue 43: the per-call decode's short call before and after a
long one); ``batched``: 2 calls
of batch 8, prompts 200-700 tokens left-padded, +128; ``b4`` / ``b8`` / ``b32``: 2 calls of batch 4 / 8 / 32,
prompts 200-700 left-padded, +256 (issue 43 item 4); ``notebook``: 640+20, 640+120, 700+300, then 640+3,000
(issue 43 item 6); ``probe``: a compile probe: 512+16 (the compile), then
512+256, 900+256, 1500+128 (the same bucket: no recompile expected), each call timed, the prefill of each
prompt timed apart (``max_new_tokens=1``) so ms per decode token = (call - prefill) / (new - 1). ``ab``: the
probe's first call, then its other calls ``--reps`` times, each with both decode loops in rotated order, in one
process: ``late`` (``custom_generate=cudaload.execute.runtime.decode_loop.late_stop_sample``, the stop read one step late; what a
compiled plan's ``generate()`` passes) and ``transformers`` (``custom_generate=None``: transformers' ``_sample``),
their ms per decode token and whether their greedy ids are equal.

Recorded per run: seconds from process start to the model ready and to the job's end, every call's seconds,
ms per decode token, dynamo's compile counters, peak memory; ``--profile`` adds a torch.profiler table of 16
decode steps (where the time goes). Writes ``DIR/results.json`` after every run and ``DIR/results.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

SHAPES = {"0.6b": "Qwen3-0.6B", "8b": "Qwen3-8B"}
TAG = "BENCH-DECODE "
#: job -> list of (batch, prompt lengths or one length, new tokens)
JOBS: dict[str, list[tuple[int, Any, int]]] = {
    "short": [(1, 512, 100), (1, 512, 100), (1, 512, 100)],
    "long": [(1, 512, 5000)],
    "batched": [
        (8, [700, 520, 300, 650, 200, 480, 610, 390], 128),
        (8, [260, 700, 450, 330, 590, 210, 640, 500], 128),
    ],
    "probe": [(1, 512, 16), (1, 512, 256), (1, 900, 256), (1, 1500, 128)],
    # issue 35's quantized-rung comparison: the second call of 512 + 128 (run with cudaload:nf4 / cudaload:int8)
    "quant": [(1, 512, 128), (1, 512, 128)],
    # the probe's calls again, each timed with both decode loops in rotated order (see ``_ab``)
    "ab": [(1, 512, 16), (1, 512, 256), (1, 900, 256), (1, 1500, 128)],
    # issue 43: a notebook's short call, one long call, the short call again (the per-call decode's three cases:
    # dynamic untouched, compiled in the call, compiled with no compile)
    "mix": [(1, 640, 64), (1, 640, 3000), (1, 640, 64)],
    "long3k": [(1, 640, 3000)],
    "short64": [(1, 640, 64), (1, 640, 64)],
    # issue 43 item 4: batched decode at batch 4, 8 and 32 (prompts 200-700 left-padded, +256, two calls: the
    # second is past any compile)
    "b4": [(4, [700, 520, 300, 650], 256), (4, [260, 700, 450, 330], 256)],
    "b8": [
        (8, [700, 520, 300, 650, 200, 480, 610, 390], 256),
        (8, [260, 700, 450, 330, 590, 210, 640, 500], 256),
    ],
    "b32": [
        (
            32,
            [
                219,
                346,
                556,
                590,
                273,
                691,
                436,
                389,
                543,
                557,
                605,
                249,
                432,
                506,
                455,
                511,
                209,
                463,
                421,
                495,
                390,
                519,
                636,
                684,
                480,
                653,
                586,
                686,
                422,
                401,
                290,
                229,
            ],
            256,
        )
    ]
    * 2,
    # issue 43 item 6: a notebook's work, a few calls of 20-300 new tokens, then one long call
    "notebook": [(1, 640, 20), (1, 640, 120), (1, 700, 300), (1, 640, 3000)],
}
SMOKE_JOBS: dict[str, list[tuple[int, Any, int]]] = {
    "ab": [(1, 16, 4), (1, 20, 8), (1, 30, 8)],
    "quant": [(1, 16, 6), (1, 16, 6)],
    "short": [(1, 16, 6), (1, 16, 6)],
    "long": [(1, 16, 40)],
    "batched": [(2, [12, 7], 5)],
    "probe": [(1, 16, 4), (1, 20, 8), (1, 30, 8)],
    "mix": [(1, 16, 4), (1, 16, 40), (1, 16, 4)],
    "long3k": [(1, 16, 40)],
    "short64": [(1, 16, 4), (1, 16, 4)],
    "b4": [(4, [12, 7, 9, 5], 5)] * 2,
    "b8": [(8, [12, 7, 9, 5, 11, 6, 8, 10], 5)] * 2,
    "b32": [(32, [5 + i % 9 for i in range(32)], 5)] * 2,
    "notebook": [(1, 16, 4), (1, 16, 8), (1, 18, 8), (1, 16, 40)],
}


def _process_start() -> float:
    """The wall-clock time this process started (Linux: /proc/self/stat's start time), so imports count."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        boot = next(
            float(line.split()[1])
            for line in Path("/proc/stat").read_text().splitlines()
            if line.startswith("btime")
        )
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, StopIteration, IndexError):
        return time.time()


def _bucket(n: int) -> int:
    b = 1024
    while b < n:
        b *= 2
    return b


def child(spec: dict[str, Any]) -> dict[str, Any]:
    t_start = _process_start()
    out: dict[str, Any] = {"spec": spec}
    method, _, variant = spec["method"].partition(":")
    jobs = (SMOKE_JOBS if spec.get("smoke") else JOBS)[spec["job"]]
    longest = max((max(p) if isinstance(p, list) else p) + n for _, p, n in jobs)
    batch = max(b for b, _, _ in jobs)
    new_total = sum(b * n for b, _, n in jobs)
    import torch

    cuda = torch.cuda.is_available()
    device = "cuda" if cuda else "cpu"
    dtype = torch.bfloat16 if cuda else torch.float32
    if method in ("plain", "static"):
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(spec["path"], dtype=dtype, device_map=device)
    else:
        import cudaload

        kw: dict[str, Any] = {}
        if variant in ("nf4", "int8"):  # cudaload:nf4 / cudaload:int8: that bitsandbytes rung, forced
            kw["quantization"] = variant
        if method == "dynamic":  # every call dynamic: the undeclared default before issue 43
            kw["decode"] = "dynamic"
        if method in ("declared", "compiled"):
            # new_tokens: one call's new tokens (of seq_len); generate_calls: how many calls
            kw = {
                "seq_len": longest,
                "batch_size": batch,
                "new_tokens": max(n for _, _, n in jobs),
                "generate_calls": len(jobs),
            }
            if method == "compiled":  # the compiled path whatever the plan would weigh (to time it)
                kw["decode"] = "compiled"
        model = cudaload.load_model(spec["path"], **kw)
        p = model.cudaload_plan
        out["plan"] = {
            "attention": p.attention.choice,
            "decode": p.decode.to_dict() if getattr(p, "decode", None) is not None else None,
            "verified_decode": p.verified.get("decode"),
        }
    if method == "static":
        from transformers import CompileConfig

        gc_ = model.generation_config
        gc_.cache_implementation = "static"
        gc_.max_cache_len = _bucket(longest)
        cc = CompileConfig()
        if not cuda:
            cc._compile_all_devices = True
        gc_.compile_config = cc
        if variant == "mega" and spec.get("artifacts") and Path(spec["artifacts"]).exists():
            data = Path(spec["artifacts"]).read_bytes()
            t0 = time.perf_counter()
            torch.compiler.load_cache_artifacts(data)
            out["artifacts_loaded"] = {"bytes": len(data), "seconds": time.perf_counter() - t0}
    gc_ = model.generation_config
    gc_.eos_token_id = None
    gc_.pad_token_id = 0
    gc_.do_sample = False
    if cuda:
        torch.cuda.synchronize()
    out["ready_s"] = time.time() - t_start
    gen = torch.Generator().manual_seed(0)
    vocab = model.config.get_text_config().vocab_size

    def inputs(b: int, lens: Any) -> dict[str, Any]:
        lens = lens if isinstance(lens, list) else [lens] * b
        L = max(lens)
        ids = torch.zeros((b, L), dtype=torch.long)
        mask = torch.zeros((b, L), dtype=torch.long)
        for i, n in enumerate(lens):  # left padding, as generate() wants for a decoder
            ids[i, L - n :] = torch.randint(10, vocab - 10, (n,), generator=gen)
            mask[i, L - n :] = 1
        return {"input_ids": ids.to(device), "attention_mask": mask.to(device)}

    def timed(x: dict[str, Any], new: int, **kw: Any) -> tuple[float, Any]:
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        y = model.generate(**x, max_new_tokens=new, min_new_tokens=new, **kw)
        if cuda:
            torch.cuda.synchronize()
        return time.perf_counter() - t0, y

    calls = []
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    if spec["job"] == "ab":
        _ab(out, jobs, timed, inputs, int(spec.get("reps") or 3))
        jobs = []
    for b, lens, new in jobs:
        x = inputs(b, lens)
        s, y = timed(x, new)
        row: dict[str, Any] = {"batch": b, "prompt": lens, "new": new, "seconds": s}
        if spec["job"] == "probe":
            p1, _ = timed(x, 1)
            row["prefill_s"] = p1
            row["ms_per_token"] = (s - p1) / max(new - 1, 1) * 1000
        else:
            row["ms_per_token_whole"] = s / new * 1000
        calls.append(row)
        out["calls"] = calls
        print(TAG + json.dumps({"progress": row}), flush=True)
    out["job_s"] = time.time() - t_start
    out["new_tokens"] = new_total
    if calls:
        out["tokens_head"] = y[0, -8:].tolist()
    try:
        from torch._dynamo.utils import counters

        out["dynamo"] = {k: dict(v) for k, v in counters.items() if k in ("stats", "recompiles", "frames")}
    except Exception as e:
        out["dynamo"] = {"error": repr(e)}
    try:  # dynamo's and inductor's seconds by phase in this process (where a warm compile's time goes)
        from torch._dynamo.utils import compile_times

        out["compile_times"] = compile_times(repr="str", aggregate=True)
    except Exception as e:
        out["compile_times"] = repr(e)
    if method == "static" and variant == "mega" and spec.get("artifacts") and "artifacts_loaded" not in out:
        t0 = time.perf_counter()
        saved = torch.compiler.save_cache_artifacts()
        if saved is not None:
            data, _info = saved
            Path(spec["artifacts"]).write_bytes(data)
            out["artifacts_saved"] = {"bytes": len(data), "seconds": time.perf_counter() - t0}
    if cuda:
        out["peak_allocated"] = torch.cuda.max_memory_allocated()
    if spec.get("profile") and cuda:
        try:
            _profile(out, timed, inputs)
        except Exception as e:
            out["profile_error"] = repr(e)
    return out


def _ab(out: dict[str, Any], jobs: list[tuple[int, Any, int]], timed: Any, inputs: Any, reps: int) -> None:
    """Both decode loops on the same calls in one process (same model, same compiled graph), in rotated order."""
    import statistics

    from cudaload.execute.runtime.decode_loop import late_stop_sample

    loops: dict[str, dict[str, Any]] = {
        "late": {"custom_generate": late_stop_sample},
        "transformers": {"custom_generate": None},
    }
    b, lens, new = jobs[0]
    first_s, _ = timed(inputs(b, lens), new)  # a compiled plan's first call (its compile, where not warmed)
    ms: dict[str, list[float]] = {k: [] for k in loops}
    rows, equal, turn = [], True, 0
    diffs: list[int | None] = []
    for rep in range(reps):
        for b, lens, new in jobs[1:]:
            x = inputs(b, lens)
            prefill, _ = timed(x, 1)
            names = list(loops)
            names = names[turn % 2 :] + names[: turn % 2]
            turn += 1
            ids = {}
            for name in names:
                s, ids[name] = timed(x, new, **loops[name])
                ms[name].append((s - prefill) / max(new - 1, 1) * 1000)
                rows.append(
                    {"rep": rep, "prompt": lens, "new": new, "loop": name, "seconds": s, "prefill_s": prefill}
                )
            a, t = ids["late"][0, -new:].tolist(), ids["transformers"][0, -new:].tolist()
            # where the two parted (None: never): greedy ids of random bf16 weights part at near-ties, and
            # cudaload_sdpa sends a prompt shape to cuDNN from its third meeting (so the second loop's prefill of
            # a length can round differently from the first's)
            diffs.append(next((i for i, (p, q) in enumerate(zip(a, t, strict=True)) if p != q), None))
            equal = equal and a == t
            print(TAG + json.dumps({"progress": rows[-1]}), flush=True)
    out["ab"] = {
        "first_s": first_s,
        "rows": rows,
        "ms_per_token": ms,
        "median": {k: statistics.median(v) for k, v in ms.items() if v},
        "spread": {k: [min(v), max(v)] for k, v in ms.items() if v},
        "ids_equal": equal,
        "first_difference": diffs,
    }


def _profile(out: dict[str, Any], timed: Any, inputs: Any) -> None:
    """Where 16 decode steps' time goes: torch.profiler's tables by GPU and by CPU time."""
    from torch.profiler import ProfilerActivity, profile

    x = inputs(1, 512)
    timed(x, 17)  # the shapes of this call met once before the profile
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        out["profile_wall_s"], _ = timed(x, 17)
    out["profile"] = prof.key_averages().table(sort_by="cuda_time_total", row_limit=25)
    out["profile_cpu"] = prof.key_averages().table(sort_by="cpu_time_total", row_limit=15)


def _run_child(spec: dict[str, Any], timeout: float, env: dict[str, str]) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--child", json.dumps(spec)]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired as e:
        tail = (e.stdout or b"")[-2000:] if isinstance(e.stdout, bytes) else (e.stdout or "")[-2000:]
        return {"spec": spec, "error": f"timed out after {timeout:.0f} s", "stdout_tail": tail}
    for line in reversed(p.stdout.splitlines()):
        if line.startswith(TAG) and '"progress"' not in line[:30]:
            return json.loads(line[len(TAG) :])
    return {"spec": spec, "error": (p.stderr or p.stdout)[-3000:]}


def write(out: Path, res: dict[str, Any]) -> None:
    (out / "results.json").write_text(json.dumps(res, indent=1, default=str))
    lines = [
        "# Decode: fresh process to the end of a job (benchmarks/bench_decode.py)",
        "",
        res["meta"]["line"],
        "",
    ]
    lines += [
        "| run | ready s | job s | new tokens | calls (s) | ms/token | compiles | error |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in res["runs"]:
        calls = r.get("calls") or []
        mspt = ", ".join(
            f"{c['ms_per_token']:.1f}" if "ms_per_token" in c else f"{c['ms_per_token_whole']:.1f}"
            for c in calls
        )
        st = (r.get("dynamo") or {}).get("stats", {})
        secs = ", ".join(f"{c['seconds']:.2f}" for c in calls)
        lines.append(
            f"| {r['spec']['label']} | {r.get('ready_s', 0):.1f} | {r.get('job_s', 0):.1f} | {r.get('new_tokens', '-')} "
            f"| {secs} | {mspt} | {st.get('unique_graphs', '-')} | "
            f"{str(r.get('error') or '')[-160:].replace(chr(10), ' ')} |"
        )
    for r in res["runs"]:
        ab = r.get("ab")
        if ab:
            lines.append(
                f"\n{r['spec']['label']}: ms per decode token, median [min, max]: "
                + "; ".join(
                    f"{k} {ab['median'][k]:.2f} {[round(x, 2) for x in ab['spread'][k]]}"
                    for k in ab["median"]
                )
                + f"; greedy ids equal: {ab['ids_equal']} (first difference at new token: {ab.get('first_difference')})"
            )
    (out / "results.md").write_text("\n".join(lines) + "\n")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--shape", default="8b")
    ap.add_argument("--runs", default="plain:probe,static:probe")
    ap.add_argument("--work", default="/tmp/cudaload-bench")
    ap.add_argument("--budget-s", type=float, default=540)
    ap.add_argument("--profile", default="", help="labels of runs to profile (comma-separated)")
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--reps", type=int, default=3, help="repetitions of the ab job's calls")
    ap.add_argument("--child")
    a = ap.parse_args()
    if a.child:
        spec = json.loads(a.child)
        try:
            r = child(spec)
        except Exception:
            r = {"spec": spec, "error": traceback.format_exc()}
        print(TAG + json.dumps(r, default=str), flush=True)
        return 0
    t0 = time.perf_counter()
    out = Path(a.out or "/tmp/bench-decode")
    out.mkdir(parents=True, exist_ok=True)
    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    if a.smoke:
        path = work / "tiny-qwen3-decode"
        if not (path / "config.json").exists():
            from cudaload.testing import make_tiny

            make_tiny("qwen3", path)
    else:
        path = work / SHAPES[a.shape]
        if not (path / "config.json").exists():
            from benchlib.common import w_write

            print(json.dumps(w_write({"path": str(path), "config": SHAPES[a.shape]})), flush=True)
    import torch
    import transformers

    meta = {
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "line": f"{time.strftime('%Y-%m-%d')}, {torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'CPU'}; "
        f"torch {torch.__version__}, transformers {transformers.__version__}; shape {a.shape}; "
        f"command: `python {' '.join(sys.argv)}`",
    }
    res: dict[str, Any] = {"meta": meta, "runs": []}
    env = dict(os.environ)
    # the inductor cache of these runs, apart from the user's: 'cold' runs get a new one, later runs share it
    for i, item in enumerate(a.runs.split(",")):
        label = f"{i}:{item}"
        method, job = item.rsplit(":", 1)
        # "static!" / "declared!": new, empty inductor and cudaload cache folders; "declared~": a new inductor
        # folder only (what cudaload's own compile cache carries, without torch's disk cache of this machine)
        fresh = method.endswith("!")
        fresh_inductor = fresh or method.endswith("~")
        method = method.rstrip("!~")
        ind = work / "inductor" / (f"fresh{i}" if fresh_inductor else "shared")
        env["TORCHINDUCTOR_CACHE_DIR"] = str(ind)
        env["CUDALOAD_CACHE"] = str(work / (f"cudaload-cache-fresh{i}" if fresh else "cudaload-cache"))
        spec = {
            "label": label,
            "method": method,
            "job": job,
            "path": str(path),
            "smoke": a.smoke,
            "artifacts": str(work / "mega.bin"),
            "profile": label in a.profile.split(",") or item in a.profile.split(","),
            "reps": a.reps,
        }
        left = a.budget_s - (time.perf_counter() - t0)
        if left < 30:
            res.setdefault("skipped", []).append(label)
            continue
        print(f"run {label} ({left:.0f} s left)", flush=True)
        r = _run_child(spec, left, env)
        res["runs"].append(r)
        calls = r.get("calls") or []
        print(
            f"  {label}: ready {r.get('ready_s', 0):.1f} s, job {r.get('job_s', 0):.1f} s, calls "
            + ", ".join(f"{c['seconds']:.2f}" for c in calls)
            + (f" ERROR {str(r['error']).strip().splitlines()[-1][:300]}" if r.get("error") else ""),
            flush=True,
        )
        write(out, res)
    write(out, res)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
