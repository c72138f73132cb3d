"""The parent side: the Runner (orchestrates sections, one subprocess per GPU measurement), the
worker entry point, the markdown report, merging split runs and the command line."""

from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from .choice import ChoiceSection, _md_choice, _merge_choice, w_choice
from .common import (
    ALL_SECTIONS,
    QUANTS,
    RESULT_TAG,
    SECTIONS,
    SHAPES,
    TITLES,
    _status_line,
    csv,
    gib,
    w_write,
)
from .firstuse import FirstUseSection, _md_firstuse, _merge_firstuse, w_firstuse
from .load import LoadSection, _md_load, _merge_load, w_load
from .memory import MemorySection, _md_memory, w_memory
from .overheads import OverheadsSection, _md_overheads, w_overheads
from .plot import _md_plot, make_plot

#: the entry point: workers are this file run again with --worker (a fresh process per measurement)
RUN_PY = Path(__file__).resolve().parent.parent / "run.py"

WORKERS: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    "write": w_write,
    "load": w_load,
    "choice": w_choice,
    "memory": w_memory,
    "overheads": w_overheads,
    "firstuse": w_firstuse,
}


def worker_main(kind: str, spec_json: str) -> int:
    import logging

    logging.basicConfig(level=logging.WARNING)
    try:
        result = WORKERS[kind](json.loads(spec_json))
    except Exception as e:
        traceback.print_exc()
        result = {"error": f"{type(e).__name__}: {e}"[:1000]}
    print(RESULT_TAG + json.dumps(result, default=str), flush=True)
    return 0


# ----------------------------------------------------------------------------------------------------
# parent side
# ----------------------------------------------------------------------------------------------------
class Runner(LoadSection, ChoiceSection, MemorySection, OverheadsSection, FirstUseSection):
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.out = Path(args.out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.work = Path(args.work or os.path.join(tempfile.gettempdir(), "cudaload-bench"))
        self.work.mkdir(parents=True, exist_ok=True)
        self.t0 = time.perf_counter()
        self.env = dict(os.environ)
        # the benchmark machines have no Hub: say so up front instead of waiting on network timeouts
        self.env.setdefault("HF_HUB_OFFLINE", "1")
        self.env.setdefault("TOKENIZERS_PARALLELISM", "false")
        # a private probe cache: first-use numbers must not depend on what earlier runs left in ~/.cache
        self.env["CUDALOAD_CACHE"] = str(self.work / f"probe-cache-{os.getpid()}")
        self.caps: Any = None
        self.has_gpu = False
        self.results: dict[str, Any] = {"meta": {}, "machine": {}, "sections": {}}
        self.paths: dict[str, str] = {}

    # -- plumbing ------------------------------------------------------------------------
    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def over_budget(self) -> bool:
        return self.args.budget_s > 0 and self.elapsed() > self.args.budget_s

    def log(self, msg: str) -> None:
        print(f"[{self.elapsed():6.1f}s] {msg}", file=sys.stderr, flush=True)

    def worker(self, kind: str, spec: dict[str, Any], timeout: float | None = None) -> dict[str, Any]:
        cmd = [sys.executable, str(RUN_PY), "--worker", kind, "--spec", json.dumps(spec)]
        limit = timeout or self.args.worker_timeout_s
        if self.args.budget_s > 0:
            # a measurement started just inside the budget may overrun it by two minutes, not more: the
            # caller's hard cap (10 min on the H200) must still find results.json written
            limit = min(limit, max(60.0, self.args.budget_s + 120.0 - self.elapsed()))
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, env=self.env, timeout=limit)
        except subprocess.TimeoutExpired:
            return {"error": f"worker {kind} timed out after {limit:.0f} s"}
        for line in reversed(proc.stdout.splitlines()):
            if line.startswith(RESULT_TAG):
                res: dict[str, Any] = json.loads(line[len(RESULT_TAG) :])
                if "error" in res:
                    res["stderr_tail"] = proc.stderr[-1500:]
                return res
        return {
            "error": f"worker {kind} exited {proc.returncode} without a result",
            "stderr_tail": proc.stderr[-1500:],
        }

    def section(self, name: str) -> dict[str, Any]:
        sec: dict[str, Any] = self.results["sections"][name]
        return sec

    def save(self) -> None:
        self.results["meta"]["elapsed_s"] = round(self.elapsed(), 1)
        tmp = self.out / "results.json.tmp"
        tmp.write_text(json.dumps(self.results, indent=1, default=str))
        os.replace(tmp, self.out / "results.json")
        (self.out / "results.md").write_text(render_markdown(self.results))

    def evict(self, path: str) -> tuple[bool, str, float | None]:
        """Drop one checkpoint's files from the page cache (fsync + fadvise, no root needed; see
        pagecache.py): (done, how or why not, fraction of its pages still cached afterwards)."""
        sys.path.insert(0, str(RUN_PY.parent))
        import pagecache

        files = pagecache.files_of(path)
        ok, how = pagecache.evict(files)
        return ok, how, pagecache.resident_fraction(files) if ok else None

    # -- set-up ------------------------------------------------------------------------
    def collect_meta(self) -> None:
        from importlib import metadata

        versions: dict[str, str | None] = {}
        for dist in (
            "torch",
            "transformers",
            "accelerate",
            "safetensors",
            "huggingface-hub",
            "kernels",
            "bitsandbytes",
            "flash-attn",
            "flash-attn-3",
            "flash-attn-4",
            "peft",
            "nvidia-ml-py",
        ):
            try:
                versions[dist] = metadata.version(dist)
            except metadata.PackageNotFoundError:
                versions[dist] = None
        import cudaload

        versions["cudaload"] = cudaload.__version__
        commit = None
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            commit = (
                subprocess.run(
                    ["git", "rev-parse", "--short", "HEAD"],
                    capture_output=True,
                    text=True,
                    cwd=str(RUN_PY.parent),
                    timeout=10,
                ).stdout.strip()
                or None
            )
        self.results["meta"] = {
            "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "command": " ".join([os.path.basename(sys.executable), *sys.argv]),
            "small": self.args.small,
            "sections": self.args.sections,
            "shapes": self.args.shape_list,
            "quant": self.args.quant_list,
            "reps": self.args.reps,
            "budget_s": self.args.budget_s,
            "git_commit": commit,
            "python": platform.python_version(),
            "platform": platform.platform(),
            "cpu_count": os.cpu_count(),
            "versions": versions,
            "hf_hub_offline": self.env.get("HF_HUB_OFFLINE"),
        }
        try:
            self.caps = cudaload.detect()
            self.results["machine"] = self.caps.to_dict()
            self.has_gpu = bool(self.caps.has_gpu)
        except Exception as e:  # the runner must still say what it could measure
            self.results["machine"] = {"error": f"detect() failed: {type(e).__name__}: {e}"[:500]}
            import torch

            self.has_gpu = bool(torch.cuda.is_available())

    def usable(self, dist: str, module: str) -> bool:
        if self.caps is not None:
            return bool(self.caps.usable(dist))
        import importlib.util

        return importlib.util.find_spec(module) is not None

    def checkpoint(self, shape: str) -> str:
        """Path of a checkpoint for a --shapes name; written once per machine and reused."""
        if self.args.small:
            path = self.work / "tiny-qwen3"
            if not (path / "config.json").exists():
                from cudaload.testing import make_tiny

                make_tiny("qwen3", path, dtype="bfloat16")
            return str(path)
        # Same directory and reuse rule as benchmarks/bench_fastload.py (Task D): whichever runs first writes
        # the 16 GB checkpoint, the other reuses it. config.json is written last, so its presence means done.
        path = self.work / SHAPES[shape]
        done = (path / "config.json").exists() and any(
            (path / f).exists() for f in ("model.safetensors", "model.safetensors.index.json")
        )
        if done:
            self.results["meta"].setdefault("checkpoints", {})[shape] = {"path": str(path), "reused": True}
            return str(path)
        self.log(f"writing the {SHAPES[shape]} checkpoint to {path}")
        res = self.worker("write", {"path": str(path), "config": SHAPES[shape]}, timeout=400)
        if "error" in res:
            raise RuntimeError(f"could not write the {shape} checkpoint: {res['error']}")
        self.log(f"wrote {res['bytes'] / 1e9:.1f} GB in {res['seconds']:.1f} s")
        self.results["meta"].setdefault("checkpoints", {})[shape] = {
            **res,
            "path": str(path),
            "reused": False,
        }
        return str(path)

    def shape_label(self, shape: str) -> str:
        return "tiny-qwen3" if self.args.small else SHAPES[shape]

    def works(self) -> list[dict[str, Any]]:
        if self.args.small:
            return [
                {"name": "bs1 p32", "batch": 1, "prompt": 32},
                {"name": "bs2 p64", "batch": 2, "prompt": 64},
            ]
        return [
            {"name": "bs1 p512", "batch": 1, "prompt": 512},
            {"name": "bs8 p2048", "batch": 8, "prompt": 2048},
        ]

    # -- sections ------------------------------------------------------------------------
    def run(self) -> int:
        self.collect_meta()
        for name in ALL_SECTIONS:
            wanted = name in self.args.sections or (name == "plot" and not self.args.no_plot)
            self.results["sections"][name] = {
                "title": TITLES[name],
                "status": "pending" if wanted else "skipped: not requested",
            }
        self.save()
        for name in SECTIONS:
            if name not in self.args.sections:
                continue
            self.log(f"section {name}")
            sec = self.section(name)
            sec["status"] = "running"
            try:
                getattr(self, f"s_{name}")(sec)
                if sec["status"] == "running":
                    sec["status"] = "ok"
            except Exception as e:  # one broken section must not cost the others
                sec["status"] = f"error: {type(e).__name__}: {e}"[:500]
                sec["traceback"] = traceback.format_exc()[-3000:]
            self.save()
        if not self.args.no_plot:
            sec = self.section("plot")
            try:
                sec["status"] = make_plot(self.results, self.out / "plot.png")
            except Exception as e:
                sec["status"] = f"error: {type(e).__name__}: {e}"[:500]
        self.save()
        self.log(f"done: {self.out / 'results.md'}")
        return 0

    def _skip_gpu(self, sec: dict[str, Any]) -> bool:
        if not self.has_gpu:
            sec["status"] = "skipped: no GPU"
            return True
        return False

    def quant_status(self) -> dict[str, str | None]:
        """quant name -> None when measurable here, else why not."""
        out: dict[str, str | None] = {}
        for q in self.args.quant_list:
            if q == "bf16":
                out[q] = None
            elif not self.has_gpu:
                out[q] = "skipped: no GPU (bitsandbytes quantizes on CUDA)"
            elif not self.usable("bitsandbytes", "bitsandbytes"):
                why = self.caps.package("bitsandbytes").reason if self.caps is not None else "not importable"
                out[q] = f"skipped: bitsandbytes not usable ({why}); on the H200 `source .whl/env.sh` first"
            else:
                out[q] = None
        return out

    def plan_for(self, path: str, **kw: Any) -> Any:
        import cudaload

        return (
            cudaload.plan(path, hardware=self.caps, **kw)
            if self.caps is not None
            else cudaload.plan(path, **kw)
        )


def render_markdown(res: dict[str, Any]) -> str:
    meta, machine, secs = res.get("meta", {}), res.get("machine", {}), res.get("sections", {})
    v = meta.get("versions", {})
    lines = ["# cudaload benchmarks", ""]
    lines.append(
        f"- date: {meta.get('date')}; commit {meta.get('git_commit')}; elapsed {meta.get('elapsed_s')} s; "
        f"{'--small (CPU/CI shapes)' if meta.get('small') else 'full shapes'}"
    )
    lines.append(f"- command: `{meta.get('command')}`")
    lines.append("- versions: " + ", ".join(f"{k} {val}" for k, val in v.items() if val))
    gpus = machine.get("gpus") or []
    if gpus:
        lines.append(
            "- GPUs: "
            + "; ".join(
                f"{g.get('name')} (sm{g['compute_capability'][0]}{g['compute_capability'][1]}, "
                f"{g.get('total_memory', 0) / 2**30:.0f} GiB)"
                for g in gpus
            )
        )
    elif "error" in machine:
        lines.append(f"- machine: {machine['error']}")
    else:
        lines.append("- GPUs: none (CPU)")
    lines.append(
        f"- host: {meta.get('cpu_count')} CPUs, {gib(machine.get('host_memory'))} GiB, "
        f"Python {meta.get('python')}; full snapshot in results.json (`machine`)"
    )
    lines.append("")
    for name in ALL_SECTIONS:
        sec = secs.get(name, {"status": "missing"})
        lines += [f"## {TITLES[name]}", "", _status_line(sec), ""]
        renderer = {
            "load": _md_load,
            "choice": _md_choice,
            "memory": _md_memory,
            "overheads": _md_overheads,
            "firstuse": _md_firstuse,
            "plot": _md_plot,
        }[name]
        if not str(sec.get("status", "")).startswith("skipped"):
            try:
                lines += renderer(sec)
            except Exception as e:  # a half-filled section (run killed mid-way) still renders the rest
                lines.append(f"(could not render: {type(e).__name__}: {e})")
        lines.append("")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description="cudaload's benchmark runner: the numbers that show cudaload chooses right and runs fast."
    )
    p.add_argument("--out", help="directory for results.json, results.md, plot.png")
    p.add_argument(
        "--small", action="store_true", help="CPU/CI: tiny shapes, 1 rep, GPU-only sections skipped"
    )
    p.add_argument(
        "--sections", default=",".join(SECTIONS), help=f"comma-separated subset of {','.join(SECTIONS)}"
    )
    p.add_argument(
        "--shapes", default="0.6b,8b", help="comma-separated subset of 0.6b,8b (ignored with --small)"
    )
    p.add_argument("--quant", default="bf16,int8,nf4", help="comma-separated subset of bf16,int8,nf4")
    p.add_argument(
        "--reps", type=int, default=None, help="load samples per method (default 3; 1 with --small)"
    )
    p.add_argument("--new-tokens", type=int, default=32, help="greedy tokens generated per timed generate()")
    p.add_argument(
        "--cold",
        choices=["auto", "on", "off"],
        default="auto",
        help="drop the page cache for cold loads (auto: on for full runs when root, off with --small)",
    )
    p.add_argument(
        "--budget-s",
        type=float,
        default=None,
        help="stop starting measurements after this many seconds (default 450; 0 = no limit)",
    )
    p.add_argument("--worker-timeout-s", type=float, default=300.0)
    p.add_argument(
        "--work", help="where checkpoints are written and reused (default: $TMPDIR/cudaload-bench)"
    )
    p.add_argument(
        "--backends",
        type=csv,
        default=None,
        help="attention backends to time in the choice section (default: sdpa, eager and every valid candidate "
        "of cudaload's plan except flex_attention)",
    )
    p.add_argument("--no-plot", action="store_true")
    p.add_argument(
        "--merge",
        nargs="+",
        metavar="RESULTS_JSON",
        help="combine the results.json of split runs into --out (results.json, results.md, plot.png)",
    )
    p.add_argument("--worker", choices=sorted(WORKERS), help=argparse.SUPPRESS)
    p.add_argument("--spec", help=argparse.SUPPRESS)
    return p


def _run_label(path: str) -> str:
    """A results.json's name in a merged table: its folder (e.g. ``run8-load-8b``)."""
    return Path(path).resolve().parent.name


def merge(paths: Sequence[str], out: Path, plot: bool = True) -> dict[str, Any]:
    """Combine results.json files of split runs (e.g. one with the quant wheels, one with FA4) into one.

    Load rows (shape, quant, cache), choice shapes and first-use shapes come from the first file that
    measured them, so a later run fills what an earlier one lacked and a newer file listed first replaces
    older rows; every row keeps the name of its run. Other sections come whole from the first file that ran
    them; meta and machine from the first file, with every file's meta kept under ``meta.merged_from``.
    """
    runs = [json.loads(Path(p).read_text()) for p in paths]
    labels = [_run_label(p) for p in paths]
    merged: dict[str, Any] = {"meta": dict(runs[0].get("meta", {})), "machine": runs[0].get("machine", {})}
    merged["meta"]["merged_from"] = [
        {"file": str(p), "run": lb, **r.get("meta", {})} for p, lb, r in zip(paths, labels, runs, strict=True)
    ]
    sections: dict[str, Any] = {}
    for name in SECTIONS:
        ran = [
            (lb, r["sections"][name])
            for lb, r in zip(labels, runs, strict=True)
            if name in r.get("sections", {})
        ]
        done = [
            (lb, s)
            for lb, s in ran
            if not str(s.get("status", "")).startswith(("skipped: not requested", "pending", "missing"))
        ]
        if not done:
            sections[name] = ran[0][1] if ran else {"title": TITLES[name], "status": "missing"}
        elif name == "load":
            sections[name] = _merge_load(done)
        elif name == "choice":
            sections[name] = _merge_choice(done)
        elif name == "firstuse":
            sections[name] = _merge_firstuse(done)
        else:
            sections[name] = {**done[0][1], "run": done[0][0]}
    sections["plot"] = {"title": TITLES["plot"], "status": "skipped: not requested"}
    merged["sections"] = sections
    out.mkdir(parents=True, exist_ok=True)
    if plot:
        sections["plot"]["status"] = make_plot(merged, out / "plot.png")
    (out / "results.json").write_text(json.dumps(merged, indent=1, default=str))
    (out / "results.md").write_text(render_markdown(merged))
    return merged


def main(argv: Sequence[str] | None = None) -> int:
    p = build_parser()
    args = p.parse_args(argv)
    if args.worker:
        return worker_main(args.worker, args.spec or "{}")
    if not args.out:
        p.error("--out is required")
    if args.merge:
        merge(args.merge, Path(args.out), plot=not args.no_plot)
        return 0
    args.sections = csv(args.sections)
    bad = [s for s in args.sections if s not in SECTIONS]
    args.shape_list = ["tiny"] if args.small else csv(args.shapes)
    args.quant_list = csv(args.quant)
    bad += [s for s in args.shape_list if s not in SHAPES and s != "tiny"]
    bad += [q for q in args.quant_list if q not in QUANTS]
    if bad:
        p.error(f"unknown names: {', '.join(bad)}")
    if args.reps is None:
        args.reps = 1 if args.small else 3
    if args.budget_s is None:
        args.budget_s = 0.0 if args.small else 450.0
    return Runner(args).run()
