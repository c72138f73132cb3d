"""Where ``detect()``'s time goes in a fresh process (issue 14): each part timed in a new interpreter.

``load_model()`` detects before anything else, serially, so every millisecond here is added to a fresh
process's time to its first forward (run 24: 0.19-0.30 s on the H200, the whole margin by which a 0.6B
``load_model()`` lost to plain ``from_pretrained``). Each child times, in this order: importing
``cudaload.detection``; NVML (``nvml.read``: import, init, every device); the package probes
(``packages.probe_all``); the bytecode probe; the Hub probe with the child's environment (the network as the
machine has it, unless ``HF_HUB_OFFLINE`` is set); and the whole ``detect()`` again (cached parts reused) with and
without the Hub. Children alternate with a child that times only ``detect(probe_hub=False)`` cold, the figure
``load_model()`` pays.

    python benchmarks/investigations/profile_detect.py --out DIR --reps 5          # the machine's own network
    HF_HUB_OFFLINE=1 python benchmarks/investigations/profile_detect.py --out DIR  # no Hub request at all
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
TAG = "@@DETECT@@"

PARTS = r"""
import json, os, sys, time
t = {}
def lap(name, t0):
    t[name] = round(time.perf_counter() - t0, 4)
    return time.perf_counter()
s = time.perf_counter()
import cudaload.detection as d
from cudaload.detection import bytecode, hub, nvml, packages, versions
from cudaload import _env
s = lap("import", s)
report = nvml.read(d._host_memory())
s = lap("nvml", s)
tc = versions.torch_cuda_version(); tv = versions.dist_version("transformers")
s = lap("versions", s)
packages.probe_all(transformers_version=tv, torch_cuda=tc, has_gpu=bool(report.devices),
                   bnb_override=_env.bnb_cuda_version())
s = lap("packages", s)
bytecode.probe()
s = lap("bytecode", s)
probe = d.hub_probe()
answer = None if probe is None else probe.answer()
s = lap("hub", s)
d.detect(probe_hub=False)
s = lap("detect_again_no_hub", s)
t["hub_answer"] = answer
t["gpus"] = len(report.devices)
t["torch_imported"] = "torch" in sys.modules
print(os.environ["DETECT_TAG"] + json.dumps(t), flush=True)
"""

WHOLE = r"""
import json, os, time
s = time.perf_counter()
import cudaload.detection as d
caps = d.detect(probe_hub=False)
print(os.environ["DETECT_TAG"] + json.dumps({"detect_cold": round(time.perf_counter() - s, 4),
      "gpus": len(caps.gpus)}), flush=True)
"""


def child(code: str) -> dict[str, Any]:
    env = dict(os.environ)
    env["DETECT_TAG"] = TAG
    src = str(HERE.parents[1] / "src")
    env["PYTHONPATH"] = src + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    for line in p.stdout.splitlines():
        if line.startswith(TAG):
            out: dict[str, Any] = json.loads(line[len(TAG) :])
            return out
    return {"error": (p.stderr or p.stdout)[-800:]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    samples: list[dict[str, Any]] = []
    for rep in range(args.reps):
        for kind, code in (("parts", PARTS), ("whole", WHOLE)):
            r = child(code)
            r.update(kind=kind, rep=rep)
            samples.append(r)
            print(kind, rep, r, flush=True)
    keys = sorted({k for s in samples for k, v in s.items() if isinstance(v, float)})
    rows = {}
    for k in keys:
        vals = [s[k] for s in samples if isinstance(s.get(k), float)]
        rows[k] = {"median": statistics.median(vals), "min": min(vals), "max": max(vals), "n": len(vals)}
    meta = {
        "date": time.strftime("%Y-%m-%d"),
        "HF_HUB_OFFLINE": os.environ.get("HF_HUB_OFFLINE"),
        "HF_ENDPOINT": os.environ.get("HF_ENDPOINT"),
        "command": sys.argv,
    }
    (out / "detect.json").write_text(json.dumps({"meta": meta, "rows": rows, "samples": samples}, indent=1))
    lines = [
        "# detect() in fresh processes, seconds",
        "",
        f"{meta['date']}; HF_HUB_OFFLINE={meta['HF_HUB_OFFLINE']!r}; median (min-max) of n children",
        "",
        "| part | median | min-max | n |",
        "|---|---|---|---|",
    ]
    for k, r in rows.items():
        lines.append(f"| {k} | {r['median']:.4f} | {r['min']:.4f}-{r['max']:.4f} | {r['n']} |")
    (out / "detect.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
