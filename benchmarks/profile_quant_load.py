"""Where a bitsandbytes load spends its time (issue 14): cProfile of ``from_pretrained`` with int8 and nf4.

    python benchmarks/profile_quant_load.py --out DIR [--shape Qwen3-8B] [--quant int8,nf4]

Writes a random bf16 checkpoint of the shape once (benchlib's writer), warms the page cache, then loads it in
a fresh process per quantization under cProfile; DIR/profile-<quant>.txt holds the top functions by
cumulative and by own time, DIR/profile.json the load seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

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
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    sys.path.insert(0, str(HERE))
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


if __name__ == "__main__":
    raise SystemExit(main())
