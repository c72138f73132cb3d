"""Does creating the CUDA context (and cuBLAS) on a background thread overlap with importing transformers?

Issue 14: from a fresh process, cudaload's time to a ready model is mostly imports (torch ~3 s, transformers
~7 s on the H200). The CUDA context (+0.3 s) and the first GEMM's set-up (cuBLAS handle, lazily loaded
kernels) come after them today. This measures, in fresh processes interleaved, the time from process start
until transformers is imported AND one bf16 GEMM has run on cuda:0, three ways:

- ``serial``: import torch, import transformers (modeling_utils, as load_model does), then the GPU work;
- ``thread``: import torch, start a thread doing the GPU work through torch, import transformers, join;
- ``ctypes``: import torch, start a thread that only creates the primary context through libcuda (ctypes
  releases the GIL during the call), import transformers, then the GPU work through torch.

It decided whether load_model should start the GPU work early (it does: ``cudaload.execute.runtime.gpu_start``, from run 16).

    python benchmarks/investigations/bench_init_overlap.py --out DIR --reps 4 --budget-s 170
    python benchmarks/investigations/bench_init_overlap.py --out DIR --smoke      # CPU: the machinery only
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

CHILD = r"""
import json, sys, time, threading
t0 = float(sys.argv[1]); mode = sys.argv[2]; smoke = sys.argv[3] == "1"
marks = {}
def mark(k): marks[k] = round(time.time() - t0, 4)
mark("python")
import torch
mark("torch")
def gpu_work():
    if smoke:
        a = torch.randn(256, 256); (a @ a).sum().item(); return
    a = torch.randn(1024, 1024, device="cuda", dtype=torch.bfloat16)
    (a @ a).float().sum().item()
    torch.cuda.synchronize()
def ctx_only():
    if smoke:
        return
    import ctypes
    cu = ctypes.CDLL("libcuda.so.1")
    assert cu.cuInit(0) == 0
    dev = ctypes.c_int(); assert cu.cuDeviceGet(ctypes.byref(dev), 0) == 0
    ctx = ctypes.c_void_p(); assert cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev) == 0
th = None
if mode == "thread":
    th = threading.Thread(target=gpu_work); th.start()
elif mode == "ctypes":
    th = threading.Thread(target=ctx_only); th.start()
from transformers import AutoConfig, PreTrainedModel  # noqa: F401  (what load_model imports)
mark("transformers")
if th is not None:
    th.join()
    mark("joined")
if mode != "thread":
    gpu_work()
mark("ready")
print("RESULT " + json.dumps(marks), flush=True)
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--reps", type=int, default=4)
    ap.add_argument("--budget-s", type=float, default=170)
    ap.add_argument("--modes", default="serial,thread,ctypes")
    ap.add_argument("--smoke", action="store_true")
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    modes = a.modes.split(",")
    start = time.monotonic()
    rows: list[dict[str, object]] = []
    for rep in range(a.reps):
        for mode in modes if rep % 2 == 0 else list(reversed(modes)):  # interleaved, order alternating
            if time.monotonic() - start > a.budget_s:
                break
            t0 = time.time()
            done = subprocess.run(
                [sys.executable, "-c", CHILD, repr(t0), mode, "1" if a.smoke else "0"],
                capture_output=True,
                text=True,
                timeout=120,
            )
            line = next((x for x in done.stdout.splitlines() if x.startswith("RESULT ")), None)
            if line is None:
                print(f"{mode} rep {rep}: failed\n{done.stderr[-2000:]}", flush=True)
                rows.append({"mode": mode, "rep": rep, "error": done.stderr[-500:]})
                continue
            marks = json.loads(line[7:])
            rows.append({"mode": mode, "rep": rep, **marks})
            print(f"{mode} rep {rep}: {marks}", flush=True)
    (out / "init_overlap.json").write_text(json.dumps(rows, indent=1))
    lines = [
        "# CUDA context and first GEMM on a thread while transformers imports",
        "",
        "Seconds from process start; median (min-max) over fresh processes, modes interleaved.",
        "",
        "| mode | n | torch imported | transformers imported | ready (GEMM done) |",
        "|---|---|---|---|---|",
    ]
    for mode in modes:
        got = [r for r in rows if r["mode"] == mode and "ready" in r]
        if not got:
            continue

        def cell(k: str, got: list[dict[str, object]] = got) -> str:
            v = sorted(float(r[k]) for r in got)  # type: ignore[arg-type]
            return f"{statistics.median(v):.2f} ({v[0]:.2f}-{v[-1]:.2f})"

        lines.append(f"| {mode} | {len(got)} | {cell('torch')} | {cell('transformers')} | {cell('ready')} |")
    (out / "init_overlap.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines), flush=True)


if __name__ == "__main__":
    main()
