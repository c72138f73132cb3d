"""Where a bitsandbytes load spends its time (issue 14): cProfile of ``from_pretrained`` with int8 and nf4,
and (``--compare``) ``from_pretrained`` against cudaload's quantized fast path.

    python benchmarks/profile_quant_load.py --out DIR [--shape Qwen3-8B] [--quant int8,nf4]
    python benchmarks/profile_quant_load.py --compare --out DIR [--reps 3] [--budget-s 140] [--smoke]

Writes a random bf16 checkpoint of the shape once (benchlib's writer), warms the page cache, then loads it in
a fresh process per quantization under cProfile; DIR/profile-<quant>.txt holds the top functions by
cumulative and by own time, DIR/profile.json the load seconds.

``--compare`` runs in one process (imports paid once, both sides warmed on a tiny model first, so the
numbers are loads, not imports or first-call set-up): per rep and quantization, ``from_pretrained(...,
quantization_config=...)`` and ``cudaload.fastload.quantized.load_quantized`` alternate (the order flips
every rep), each timed to a synchronised device with its GPU peak. In the first rep the two models of a
quantization are compared (every state_dict tensor bit for bit, logits on one input) before they are freed.
DIR/compare.json has every run, medians and spread; DIR/compare.md the table. Loads that would not fit the
--budget-s left are skipped and recorded. H200, 8B shape: ~16 s to write the checkpoint, ~10 s of imports,
3 reps of int8 (~16 s + ~1.5 s) and nf4 (~3 s + ~1.5 s): about 100-120 s. ``--smoke`` runs the same on the
CPU with a tiny model in seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent

CHILD = r"""
import cProfile, io, json, pstats, sys, time
import torch, transformers
path, quant, out = sys.argv[1:4]
torch.cuda.init()
cfg = (transformers.BitsAndBytesConfig(load_in_8bit=True) if quant == "int8" else
       transformers.BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                                       bnb_4bit_use_double_quant=True, bnb_4bit_compute_dtype=torch.bfloat16))
config = transformers.AutoConfig.from_pretrained(path)
transformers.AutoModelForCausalLM._model_mapping[type(config)]
import bitsandbytes
prof = cProfile.Profile()
t = time.perf_counter()
prof.enable()
m = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16, device_map="cuda",
                                                      quantization_config=cfg)
torch.cuda.synchronize()
prof.disable()
secs = time.perf_counter() - t
s = io.StringIO()
for key in ("cumulative", "tottime"):
    pstats.Stats(prof, stream=s).sort_stats(key).print_stats(35)
open(out, "w").write(f"{quant}: from_pretrained {secs:.2f} s under cProfile\n" + s.getvalue())
print(json.dumps({"quant": quant, "seconds_profiled": secs, "allocated": torch.cuda.memory_allocated()}))
"""


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--shape", default="Qwen3-8B")
    ap.add_argument("--quant", default="int8,nf4")
    ap.add_argument("--work", default=None)
    ap.add_argument("--compare", action="store_true", help="from_pretrained vs the quantized fast path")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--budget-s", type=float, default=140.0)
    ap.add_argument("--smoke", action="store_true", help="--compare on the CPU with a tiny model")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    sys.path.insert(0, str(HERE))
    if args.compare or args.smoke:
        return compare(args, out)
    from benchlib.common import w_write

    path = Path(args.work or tempfile.mkdtemp(prefix="cudaload-qprof-")) / args.shape
    if not (path / "config.json").exists():
        print("write:", w_write({"path": str(path), "config": args.shape}), flush=True)
    for f in path.glob("*.safetensors"):
        with open(f, "rb") as fh:
            while fh.read(64 << 20):
                pass
    results = []
    for q in args.quant.split(","):
        r = subprocess.run(
            [sys.executable, "-c", CHILD, str(path), q, str(out / f"profile-{q}.txt")],
            capture_output=True,
            text=True,
            env={**os.environ, "HF_HUB_OFFLINE": "1"},
        )
        line = r.stdout.strip().splitlines()[-1] if r.stdout.strip() else ""
        results.append(json.loads(line) if line.startswith("{") else {"quant": q, "error": r.stderr[-2000:]})
        print(results[-1], flush=True)
        (out / "profile.json").write_text(json.dumps(results, indent=1))
    return 0


def _same_bits(a: Any, b: Any) -> bool:
    import torch

    if a.shape != b.shape or a.dtype != b.dtype or a.device != b.device:
        return False
    return bool(torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8)))


def _identical(ref: Any, got: Any, device: str) -> dict[str, Any]:
    """Every state_dict tensor (packed weights, SCB, 4-bit quant state) bit for bit, module types, logits."""
    import torch

    a, b = ref.state_dict(), got.state_dict()
    differ = [k for k in a if k not in b or not _same_bits(a[k], b[k])]
    types = [type(m).__name__ for m in ref.modules()] == [type(m).__name__ for m in got.modules()]
    ids = torch.arange(1, 17, device=device).reshape(1, 16)
    with torch.no_grad():
        la, lb = ref(ids).logits, got(ids).logits
    return {
        "state_dict_keys_equal": list(a) == list(b),
        "tensors": len(a),
        "tensors_differing": differ[:8],
        "module_types_equal": types,
        "logits_equal": bool(torch.equal(la, lb)),
        "quantization_config_equal": (
            ref.config.quantization_config.to_dict() == got.config.quantization_config.to_dict()
            if hasattr(ref.config, "quantization_config")
            else not hasattr(got.config, "quantization_config")
        ),
        "identical": list(a) == list(b) and not differ and types and bool(torch.equal(la, lb)),
    }


def compare(args: argparse.Namespace, out: Path) -> int:
    """from_pretrained vs load_quantized, interleaved, warm; see the module docstring."""
    t_start = time.perf_counter()
    import gc
    import statistics

    from benchlib.common import _bnb_config, md_table, w_write

    smoke = args.smoke
    dev = "cpu" if smoke else "cuda:0"
    quants = [q for q in args.quant.split(",") if q]
    work = Path(args.work or tempfile.mkdtemp(prefix="cudaload-qfast-"))
    result: dict[str, Any] = {
        "shape": "tiny qwen3" if smoke else args.shape,
        "device": dev,
        "budget_s": args.budget_s,
        "reps": args.reps,
        "runs": [],
        "skipped": [],
        "identical": {},
    }

    def left() -> float:
        return args.budget_s - (time.perf_counter() - t_start)

    def save() -> None:
        result["elapsed_s"] = round(time.perf_counter() - t_start, 2)
        (out / "compare.json").write_text(json.dumps(result, indent=1, default=str))

    from cudaload.testing import make_tiny

    if smoke:
        path = make_tiny("qwen3", work / "tiny", dtype="bfloat16")
    else:
        path = work / args.shape
        if not (path / "config.json").exists():
            result["write"] = w_write({"path": str(path), "config": args.shape})
            print(f"[{time.perf_counter() - t_start:.0f}s] write: {result['write']}", flush=True)
    t = time.perf_counter()
    for f in path.glob("*.safetensors"):
        with open(f, "rb") as fh:
            while fh.read(64 << 20):
                pass
    result["warm_read_s"] = round(time.perf_counter() - t, 2)

    import bitsandbytes
    import torch
    import transformers

    from cudaload.fastload.quantized import load_quantized

    result.update(
        torch=torch.__version__, transformers=transformers.__version__, bitsandbytes=bitsandbytes.__version__
    )
    if not smoke:
        result["gpu"] = torch.cuda.get_device_name(0)

    def sync() -> None:
        if dev != "cpu":
            torch.cuda.synchronize()

    def load(side: str, q: str, p: Path) -> Any:
        # q "bf16": the unquantized fast path against from_pretrained, in the same run (issue 12's <= 0.30x)
        if side == "from_pretrained":
            kw = {} if q == "bf16" else {"quantization_config": _bnb_config(q)}
            return transformers.AutoModelForCausalLM.from_pretrained(
                p, dtype=torch.bfloat16, device_map=dev, **kw
            )
        if q == "bf16":
            from cudaload.fastload import load as fast_load

            return fast_load(p, device=dev, dtype=torch.bfloat16)
        return load_quantized(p, quantization_config=_bnb_config(q), device=dev, dtype=torch.bfloat16)

    def free() -> None:
        gc.collect()
        if dev != "cpu":
            torch.cuda.empty_cache()

    # warm-up on a tiny model: module imports, bitsandbytes' library and kernels, CUDA context, pinned memory
    tiny = path if smoke else make_tiny("qwen3", work / "tiny-warm", dtype="bfloat16")
    for q in quants:
        for side in ("from_pretrained", "fast"):
            m = load(side, q, tiny)
            sync()
            del m
    free()
    print(f"[{time.perf_counter() - t_start:.0f}s] imported and warmed up", flush=True)

    sides = ("from_pretrained", "fast")
    longest: dict[tuple[str, str], float] = {}
    for rep in range(args.reps):
        for q in quants:
            kept: dict[str, Any] = {}
            for side in sides if rep % 2 == 0 else sides[::-1]:
                guess = longest.get((side, q), 0.0)
                if rep and guess + 5 > left():
                    result["skipped"].append({"rep": rep, "quant": q, "side": side, "why": "budget"})
                    print(
                        f"skip rep {rep} {q} {side}: {left():.0f} s left, last took {guess:.1f} s", flush=True
                    )
                    continue
                free()
                sync()
                base = torch.cuda.memory_allocated() if dev != "cpu" else 0
                if dev != "cpu":
                    torch.cuda.reset_peak_memory_stats()
                t = time.perf_counter()
                model = load(side, q, path)
                sync()
                secs = time.perf_counter() - t
                longest[(side, q)] = max(longest.get((side, q), 0.0), secs)
                run: dict[str, Any] = {"rep": rep, "quant": q, "side": side, "seconds": round(secs, 3)}
                if dev != "cpu":
                    run["peak_gib"] = round((torch.cuda.max_memory_allocated() - base) / 2**30, 3)
                    run["allocated_gib"] = round((torch.cuda.memory_allocated() - base) / 2**30, 3)
                if side == "fast":
                    run["fast"] = {k: v for k, v in model.cudaload_fastload.items() if k.endswith("_s")}
                result["runs"].append(run)
                print(f"[{time.perf_counter() - t_start:.0f}s] {run}", flush=True)
                if rep == 0:
                    kept[side] = model
                del model
            if len(kept) == 2:
                result["identical"][q] = _identical(kept["from_pretrained"], kept["fast"], dev)
                print(f"{q} identical: {result['identical'][q]}", flush=True)
            kept.clear()
            free()
            save()

    summary: dict[str, Any] = {}
    rows = []
    for q in quants:
        summary[q] = {}
        for side in sides:
            xs = [r["seconds"] for r in result["runs"] if r["quant"] == q and r["side"] == side]
            peaks = [
                r["peak_gib"]
                for r in result["runs"]
                if r["quant"] == q and r["side"] == side and "peak_gib" in r
            ]
            if xs:
                summary[q][side] = {
                    "median_s": round(statistics.median(xs), 3),
                    "min_s": min(xs),
                    "max_s": max(xs),
                    "n": len(xs),
                    "peak_gib": max(peaks) if peaks else None,
                }
        ref, fast = summary[q].get("from_pretrained"), summary[q].get("fast")
        if ref and fast:
            summary[q]["ratio"] = round(fast["median_s"] / ref["median_s"], 3)
            rows.append(
                [
                    q,
                    f"{ref['median_s']:.2f} ({ref['min_s']:.2f}-{ref['max_s']:.2f}, n={ref['n']})",
                    f"{fast['median_s']:.2f} ({fast['min_s']:.2f}-{fast['max_s']:.2f}, n={fast['n']})",
                    summary[q]["ratio"],
                    ref["peak_gib"],
                    fast["peak_gib"],
                    result["identical"].get(q, {}).get("identical"),
                ]
            )
    result["summary"] = summary
    save()
    md = [
        f"# Quantized loads: from_pretrained vs cudaload's fast path ({result['shape']}, {dev}, warm)",
        "",
        f"torch {result['torch']}, transformers {result['transformers']}, bitsandbytes {result['bitsandbytes']}; "
        f"{args.reps} reps interleaved; median (min-max) seconds; goal: fast/from_pretrained <= 0.5",
        "",
        *md_table(
            [
                "quant",
                "from_pretrained s",
                "fast path s",
                "ratio",
                "peak GiB (fp)",
                "peak GiB (fast)",
                "identical",
            ],
            rows,
        ),
        "",
        f"skipped: {result['skipped'] or 'none'}; elapsed {result['elapsed_s']} s of {args.budget_s}",
    ]
    (out / "compare.md").write_text("\n".join(md) + "\n")
    print("\n".join(md), flush=True)
    ok = all(v.get("identical") for v in result["identical"].values()) and len(result["identical"]) == len(
        quants
    )
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
