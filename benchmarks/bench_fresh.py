"""Time to a ready model from a fresh process: ``python -c`` start to the first forward's result (issue 14).

Each sample is a new interpreter, so it pays what a user's script pays: importing torch and transformers,
creating the CUDA context, loading, and the first forward. Methods, interleaved within each repetition:

- ``plain``: ``AutoModelForCausalLM.from_pretrained(path, dtype=bfloat16, device_map="cuda")`` (+ a
  ``BitsAndBytesConfig`` for int8 / nf4, nf4 with double quant and bf16 compute as cudaload plans it);
- ``cudaload``: ``cudaload.load_model(path, quantization=...)`` with its defaults (prefetch on);
- ``cudaload-noprefetch``: the same with ``prefetch=False``, to show what reading while importing buys;
- ``cudaload-read``: the prefetch mode named (threads that read the files), as the default does;
- ``cudaload-nogpustart``: the defaults with ``CUDALOAD_GPU_START=0`` (no CUDA context made on a thread while
  transformers imports), to show what that buys;
- ``METHOD-online`` (``plain-online``, ``cudaload-online``, ``cudaload-noprefetch-online``...): without
  ``HF_HUB_OFFLINE`` or ``TRANSFORMERS_OFFLINE`` (the other methods set the first), as a user whose machine is
  not marked offline runs them; with ``--silent-hub`` the Hub endpoint is a loopback socket that accepts and
  never answers (what a firewall that drops packets looks like to a client), else the machine's real network;
- ``METHOD@NAME``: the method with cudaload imported from ``--src NAME=DIR`` (byte-compiled first like this
  repo's, and checked in the child), to compare two commits in one interleaved run;
- ``plain-pyc`` / ``cudaload-pyc``: ``plain`` / ``cudaload`` after ``cudaload precompile --prefix DIR`` (run
  once before the samples, its report in the meta), the children reading those caches through
  ``PYTHONPYCACHEPREFIX=DIR``: what the packages' cached bytecode is worth where the installation has none.

``--generate 1x512+128,8x1024+128:left``: after the first forward the child runs these generate() calls in
turn, greedy, exactly N new tokens each (``:left``: left-padded rows of varying length with the mask, as a
tokenizer pads a batch), each meeting its lengths for the first time, as a user's script does. The total is
then start to the end of the last generate(): what a user waits for before reading the first answers.

Warm: the checkpoint is in the page cache (one untimed read first). Cold: before each sample the checkpoint's
files are evicted (fsync + fadvise DONTNEED, checked with mincore, as ``benchmarks/pagecache.py`` does; the
resident fraction is reported). Phases are timestamps taken in the child (seconds since the parent started
it): imports, CUDA context, load, first forward; the cudaload side also reports ``plan.verified['phases']``.

    # on the H200, from the repo root after `source .whl/env.sh` (quant wheels for int8/nf4):
    python benchmarks/bench_fresh.py --out $OUT/fresh --shapes Qwen3-8B,Qwen3-0.6B --quant bf16 --budget-s 300
    python benchmarks/bench_fresh.py --smoke --out /tmp/fresh     # CPU, a tiny model, seconds
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

TAG = "@@FRESH@@"

# The child program: every timestamp is seconds since the parent's clock at Popen (passed in T0).
CHILD = r"""
import json, os, sys, time
T0 = float(os.environ["FRESH_T0"]); spec = json.loads(os.environ["FRESH_SPEC"])
marks = {"python_started": time.time() - T0}
def mark(name): marks[name] = time.time() - T0
cuda = spec["device"].startswith("cuda")
if spec["method"].startswith("plain"):
    import torch; mark("import_torch")
    if cuda: torch.cuda.init(); mark("cuda_context")
    import transformers; mark("import_transformers")
    kw = {"dtype": torch.bfloat16 if cuda else torch.float32, "device_map": spec["device"]}
    if spec["quant"] != "bf16":
        from transformers import BitsAndBytesConfig
        kw["quantization_config"] = (BitsAndBytesConfig(load_in_8bit=True) if spec["quant"] == "int8" else
            BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                               bnb_4bit_compute_dtype=torch.bfloat16))
    model = transformers.AutoModelForCausalLM.from_pretrained(spec["path"], **kw)
    if cuda: torch.cuda.synchronize()
    mark("loaded")
    extra = {}
else:
    if spec["method"] == "cudaload-nogpustart":
        os.environ["CUDALOAD_GPU_START"] = "0"
    import cudaload; mark("import_cudaload")
    quant = {"bf16": "none", "int8": "int8", "nf4": "nf4"}[spec["quant"]]
    kw = {"cudaload-noprefetch": {"prefetch": False}, "cudaload-read": {"prefetch": "read"}}
    model = cudaload.load_model(spec["path"], quantization=quant, **kw.get(spec["method"], {}))
    import torch
    if cuda: torch.cuda.synchronize()
    mark("loaded")
    v = model.cudaload_plan.verified or {}
    extra = {"cudaload_file": cudaload.__file__, "phases": v.get("phases"), "load_path": v.get("load_path"), "prefetch": v.get("prefetch"), "gpu_start": v.get("gpu_start"),
             "attention": model.cudaload_plan.attention.choice}
ids = torch.randint(4, int(model.config.vocab_size), (1, 16), device=spec["device"])
with torch.no_grad():
    out = model(input_ids=ids).logits
    float(out[0, -1, 0])  # the first forward's result on the host
mark("first_forward")
gen_s = []
for i, g in enumerate(spec.get("generate") or []):
    b, p, n = g["batch"], g["prompt"], g["new_tokens"]
    gen = torch.Generator().manual_seed(1234 + i)
    ids = torch.randint(4, int(model.config.vocab_size), (b, p), generator=gen)
    mask = torch.ones_like(ids)
    # built here rather than with cudaload.execute.measure.backends.make_inputs: the plain child never imports cudaload.
    # The same lengths as WorkShape.lengths: evenly spaced from p // 2 up to p, longest first
    if g["padding"] == "left" and b > 1:
        lo = max(1, p // 2)
        for row in range(b):
            real = p - round(row * (p - lo) / (b - 1))
            ids[row, : p - real] = 0
            mask[row, : p - real] = 0
    ids, mask = ids.to(spec["device"]), mask.to(spec["device"])
    t = time.time()
    out = model.generate(ids, attention_mask=mask, max_new_tokens=n, min_new_tokens=n, do_sample=False,
                         num_beams=1, pad_token_id=0)
    if cuda: torch.cuda.synchronize()
    assert out.shape[1] == p + n, out.shape
    gen_s.append(time.time() - t)
    mark(f"generate{i}")
if gen_s:
    mark("generated")
    extra["generate_s"] = gen_s
    if not spec["method"].startswith("plain"):
        extra["sdpa_decode_dispatch"] = v.get("sdpa_decode_dispatch")
print(__import__("os").environ.get("FRESH_TAG", "") + json.dumps({"marks": marks, **extra}), flush=True)
"""


def child_env(spec: dict[str, Any]) -> dict[str, str]:
    """The child's environment: its spec, cudaload's sources first on the path, offline, the start time."""
    env = dict(os.environ)
    env["FRESH_SPEC"] = json.dumps(spec)
    env["FRESH_TAG"] = TAG
    src = spec.get("src") or str(HERE.parent / "src")
    env["PYTHONPATH"] = src + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    if spec.get("online"):
        for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):  # either makes huggingface_hub offline
            env.pop(name, None)
        if spec.get("hub_endpoint"):
            env["HF_ENDPOINT"] = spec["hub_endpoint"]
    else:
        env.setdefault("HF_HUB_OFFLINE", "1")
    if spec.get("pyc"):  # the caches `cudaload precompile --prefix` wrote
        env["PYTHONPYCACHEPREFIX"] = spec["pycache"]
    env["FRESH_T0"] = repr(time.time())
    return env


def run_child(spec: dict[str, Any], timeout: float) -> dict[str, Any]:
    env = child_env(spec)
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(
            [sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    wall = time.perf_counter() - t0
    for line in proc.stdout.splitlines():
        if line.startswith(TAG):
            res: dict[str, Any] = json.loads(line[len(TAG) :])
            res["wall_s"] = round(wall, 3)
            return res
    return {"error": (proc.stderr or proc.stdout)[-1500:], "wall_s": round(wall, 3)}


def write_checkpoint(shape: str, path: Path, device: str) -> dict[str, Any]:
    """A random bf16 checkpoint of a full-size shape (benchmarks/benchlib's writer), in a subprocess."""
    if (path / "config.json").exists():
        return {"reused": True}
    spec = {"path": str(path), "config": shape}
    code = (
        "import json,sys; sys.path.insert(0, sys.argv[1]); from benchlib.common import w_write; "
        "print(json.dumps(w_write(json.loads(sys.argv[2]))))"
    )
    env = dict(os.environ)
    env["PYTHONPATH"] = str(HERE.parent / "src") + (os.pathsep + env.get("PYTHONPATH", ""))
    if not device.startswith("cuda"):
        env["CUDA_VISIBLE_DEVICES"] = ""
    out = subprocess.run(
        [sys.executable, "-c", code, str(HERE), json.dumps(spec)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def split_method(method: str) -> tuple[str, frozenset[str], str]:
    """``cudaload-noprefetch-online@before`` -> (``cudaload-noprefetch``, {``online``}, ``before``): the load the
    child makes, the settings its environment gets (``-pyc``, ``-online``, in any order), the sources it imports."""
    core, _, src_name = method.partition("@")
    settings: set[str] = set()
    while True:
        suffix = next((x for x in ("-pyc", "-online") if core.endswith(x)), None)
        if suffix is None:
            return core, frozenset(settings), src_name
        settings.add(suffix[1:])
        core = core[: -len(suffix)]


def compile_sources(extra: list[str] | None = None) -> dict[str, Any]:
    """Byte-compile cudaload's sources, as ``pip install`` does for a wheel, so the children time an installed
    cudaload: from a source checkout under PYTHONDONTWRITEBYTECODE (set on some machines) every fresh process
    would otherwise compile its ~60 modules from source again (0.2 s on a 2-core CPU), which no installed
    package pays and plain transformers (installed, compiled) does not pay either."""
    import compileall

    t = time.perf_counter()
    ok = all(
        compileall.compile_dir(str(Path(src) / "cudaload"), quiet=1)
        for src in [str(HERE.parent / "src"), *(extra or [])]
    )
    return {
        "ok": bool(ok),
        "seconds": round(time.perf_counter() - t, 3),
        "PYTHONDONTWRITEBYTECODE": os.environ.get("PYTHONDONTWRITEBYTECODE"),
    }


def write_tiny(path: Path) -> None:
    from cudaload.testing.models import make_tiny

    make_tiny("qwen3", path)


def summarize(samples: list[dict[str, Any]]) -> list[dict[str, Any]]:
    groups: dict[tuple[str, str, str, str], list[dict[str, Any]]] = {}
    for s in samples:
        groups.setdefault((s["shape"], s["quant"], s["temp"], s["method"]), []).append(s)
    rows = []
    for (shape, quant, temp, method), ss in groups.items():
        ok = [s for s in ss if "marks" in s]
        total = [end_mark(s) for s in ok]
        row: dict[str, Any] = {
            "shape": shape,
            "quant": quant,
            "temp": temp,
            "method": method,
            "n": len(ok),
            "errors": [s["error"][-300:] for s in ss if "error" in s],
            "total_median": statistics.median(total) if total else None,
            "total_min": min(total) if total else None,
            "total_max": max(total) if total else None,
        }
        if ok:
            keys = [k for k in ok[0]["marks"] if all(k in s["marks"] for s in ok)]
            row["marks_median"] = {k: round(statistics.median(s["marks"][k] for s in ok), 3) for k in keys}
            if ok[0].get("phases"):
                row["phases_first"] = ok[0]["phases"]
            gens = [s["generate_s"] for s in ok if s.get("generate_s")]
            if gens:
                row["generate_s_median"] = [
                    round(statistics.median(g[i] for g in gens), 3) for i in range(len(gens[0]))
                ]
                row["first_forward_median"] = round(
                    statistics.median(s["marks"]["first_forward"] for s in ok), 3
                )
            res = [s.get("resident_before") for s in ok if s.get("resident_before") is not None]
            row["resident_before_max"] = max(res) if res else None
        rows.append(row)
    # each against plain transformers in the same installation and environment: the -pyc methods against
    # plain-pyc, the -online ones against plain-online
    plain = {
        (r["shape"], r["quant"], r["temp"], _setting(r["method"])): r["total_median"]
        for r in rows
        if split_method(r["method"])[0] == "plain" and not split_method(r["method"])[2]
    }
    for r in rows:
        p = plain.get((r["shape"], r["quant"], r["temp"], _setting(r["method"])))
        r["vs_plain"] = round(r["total_median"] / p, 3) if p and r["total_median"] else None
    return sorted(rows, key=lambda r: (r["shape"], r["quant"], r["temp"], r["method"]))


def end_mark(sample: dict[str, Any]) -> float:
    """Seconds from start to what the run waits for: the last generate() when ``--generate`` ran, else the
    first forward."""
    marks = sample["marks"]
    return float(marks.get("generated", marks["first_forward"]))


def parse_generate(text: str) -> list[dict[str, Any]]:
    """``1x512+128,8x1024+128:left`` -> one dict per generate() call (batch, prompt, new_tokens, padding)."""
    works = []
    for item in filter(None, (x.strip() for x in text.split(","))):
        shape, _, padding = item.partition(":")
        try:
            b, rest = shape.split("x")
            p, n = rest.split("+")
            work = {"batch": int(b), "prompt": int(p), "new_tokens": int(n), "padding": padding or "none"}
        except ValueError:
            raise ValueError(f"--generate {item!r}: write BATCHxPROMPT+NEW, optionally :left") from None
        if (
            work["padding"] not in ("none", "left")
            or min(work["batch"], work["prompt"], work["new_tokens"]) < 1
        ):
            raise ValueError(f"--generate {item!r}: sizes must be >= 1 and the padding none or left")
        works.append(work)
    return works


def _setting(method: str) -> frozenset[str]:
    """The installation/environment a method runs in, which its plain counterpart shares."""
    return split_method(method)[1]


def markdown(rows: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    out = [
        "# Fresh process: start to " + ("the last generate()" if meta.get("generate") else "first forward"),
        "",
        f"{meta.get('date')}, {meta.get('gpu')}, torch {meta.get('torch')}, "
        f"transformers {meta.get('transformers')}; median (min-max) of n fresh processes, seconds since start; "
        "vs plain: against plain transformers in the same installation (the -pyc rows against plain-pyc, the "
        "-online rows against plain-online).",
        "",
        "| shape | quant | cache | method | n | total s | vs plain | import torch | import transformers/cudaload"
        " | loaded | resident before |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        m = r.get("marks_median") or {}
        fmt = (
            f"{r['total_median']:.2f} ({r['total_min']:.2f}-{r['total_max']:.2f})"
            if r["total_median"] is not None
            else "failed"
        )
        imp = m.get("import_transformers", m.get("import_cudaload"))
        out.append(
            f"| {r['shape']} | {r['quant']} | {r['temp']} | {r['method']} | {r['n']} | {fmt} | "
            f"{r['vs_plain'] if r['vs_plain'] is not None else '-'} | {m.get('import_torch', '-')} | "
            f"{imp if imp is not None else '-'} | {m.get('loaded', '-')} | {r.get('resident_before_max', '-')} |"
        )
    for r in rows:
        if r.get("phases_first"):
            out.append(f"\n{r['shape']} {r['quant']} {r['temp']} {r['method']} phases: `{r['phases_first']}`")
        if r.get("generate_s_median"):
            out.append(
                f"\n{r['shape']} {r['quant']} {r['temp']} {r['method']}: first forward at "
                f"{r['first_forward_median']:.2f} s, then generate() s {r['generate_s_median']} "
                f"({', '.join(w['name'] for w in meta['generate'])})"
            )
        for e in r["errors"][:2]:
            out.append(f"\nerror {r['shape']} {r['quant']} {r['temp']} {r['method']}: `{e}`")
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--shapes", default="Qwen3-8B,Qwen3-0.6B")
    ap.add_argument("--quant", default="bf16", help="comma list of bf16,int8,nf4")
    ap.add_argument("--temps", default="warm,cold")
    ap.add_argument("--methods", default="plain,cudaload,cudaload-noprefetch")
    ap.add_argument(
        "--reps", type=int, default=None, help="fresh processes per method (default 3; --smoke 1)"
    )
    ap.add_argument("--budget-s", type=float, default=300)
    ap.add_argument("--workdir", default=None, help="where checkpoints are written (default: a temp dir)")
    ap.add_argument("--smoke", action="store_true", help="CPU, a tiny model, one rep")
    ap.add_argument(
        "--src",
        action="append",
        default=[],
        metavar="NAME=DIR",
        help="other cudaload sources: a method METHOD@NAME imports cudaload from DIR (an A/B of two commits, "
        "interleaved); without @NAME, this repo's src",
    )
    ap.add_argument(
        "--silent-hub",
        action="store_true",
        help="the -online methods' Hub endpoint is a loopback socket that never answers (a dropping firewall)",
    )
    ap.add_argument(
        "--generate",
        default="",
        help="generate() calls after the first forward, e.g. 1x512+128,8x1024+128:left (see the docstring)",
    )
    args = ap.parse_args(argv)
    try:
        generate = parse_generate(args.generate)
    except ValueError as e:
        ap.error(str(e))
    for w in generate:
        w["name"] = f"{w['batch']}x{w['prompt']}+{w['new_tokens']}" + (
            ":left" if w["padding"] == "left" else ""
        )

    from pagecache import evict, files_of, resident_fraction

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()
    device = "cpu" if args.smoke else "cuda:0"
    work = Path(args.workdir or tempfile.mkdtemp(prefix="cudaload-fresh-"))
    shapes = ["tiny"] if args.smoke else args.shapes.split(",")
    reps = args.reps or (1 if args.smoke else 3)
    meta: dict[str, Any] = {"date": time.strftime("%Y-%m-%d"), "device": device, "command": sys.argv}
    hub_endpoint = None
    if args.silent_hub:
        import socket

        silent = socket.socket()  # held open for the whole run; nothing ever accepts
        silent.bind(("127.0.0.1", 0))
        silent.listen(64)
        hub_endpoint = f"http://127.0.0.1:{silent.getsockname()[1]}"
    if any("=" not in item for item in args.src):
        ap.error("--src takes NAME=DIR")
    sources = {name: str(Path(d).resolve()) for name, d in (item.split("=", 1) for item in args.src)}
    unknown = {split_method(m)[2] for m in args.methods.split(",")} - set(sources) - {""}
    if unknown:
        ap.error(f"methods name sources not given with --src NAME=DIR: {', '.join(sorted(unknown))}")
    meta.update(sources=sources, hub_endpoint=hub_endpoint, generate=generate)
    try:
        import torch
        import transformers

        meta.update(torch=torch.__version__, transformers=transformers.__version__)
        if torch.cuda.is_available():
            meta["gpu"] = torch.cuda.get_device_name(0)
    except ImportError:
        pass
    meta["compile_sources"] = compile_sources(list(sources.values()))
    pycache = str(work / "pycache")
    if any("pyc" in split_method(m)[1] for m in args.methods.split(",")):
        env = dict(os.environ)
        env["PYTHONPATH"] = str(HERE.parent / "src") + (os.pathsep + env.get("PYTHONPATH", ""))
        pc = subprocess.run(
            [sys.executable, "-m", "cudaload", "precompile", "--prefix", pycache, "--json"],
            env=env,
            capture_output=True,
            text=True,
        )
        meta["precompile"] = json.loads(pc.stdout) if pc.returncode == 0 else {"error": pc.stderr[-800:]}
        print(f"precompile: {meta['precompile'].get('seconds', meta['precompile'])}", flush=True)
    samples: list[dict[str, Any]] = []

    def save() -> None:
        rows = summarize(samples)
        (out / "fresh.json").write_text(
            json.dumps({"meta": meta, "rows": rows, "samples": samples}, indent=1)
        )
        (out / "fresh.md").write_text(markdown(rows, meta))

    for shape in shapes:
        path = work / shape
        if args.smoke:
            if not (path / "config.json").exists():
                write_tiny(path)
        else:
            print(f"writing {shape} ...", flush=True)
            meta.setdefault("writes", {})[shape] = write_checkpoint(shape, path, device)
        files = [str(f) for f in files_of(path)]
        for quant in args.quant.split(","):
            for temp in args.temps.split(","):
                if temp == "warm":  # one untimed pass puts the files in the page cache
                    for f in files:
                        with open(f, "rb") as fh:
                            while fh.read(64 << 20):
                                pass
                for rep in range(reps):
                    for method in args.methods.split(","):
                        left = args.budget_s - (time.perf_counter() - t_start)
                        if left < 25 and not args.smoke:
                            print(
                                f"budget spent: skipping {shape} {quant} {temp} {method} rep {rep}",
                                flush=True,
                            )
                            continue
                        res_before = None
                        if temp == "cold":
                            evict(files)
                            res_before = resident_fraction(files)
                        core, settings, src_name = split_method(method)
                        spec = {
                            "path": str(path),
                            "device": device,
                            "quant": quant,
                            "method": core,
                            "online": "online" in settings,
                            "pyc": "pyc" in settings,
                            "pycache": pycache,
                            "src": sources[src_name] if src_name else None,
                            "hub_endpoint": hub_endpoint,
                            "generate": generate,
                        }
                        r = run_child(spec, timeout=max(20.0, min(left, 240.0)))
                        got = r.get("cudaload_file")
                        if spec["src"] and got and not str(got).startswith(spec["src"] + os.sep):
                            # PYTHONPATH did not win (DIR is not a src folder): both sides would time one tree
                            r = {"error": f"imported cudaload from {got}, not from {spec['src']}"}
                        r.update(
                            shape=shape,
                            quant=quant,
                            temp=temp,
                            method=method,
                            rep=rep,
                            resident_before=res_before,
                        )
                        samples.append(r)
                        total = end_mark(r) if "marks" in r else None
                        print(
                            f"{shape} {quant} {temp} {method} rep{rep}: "
                            f"{f'{total:.2f} s' if total else r.get('error', '')[-200:]}",
                            flush=True,
                        )
                        save()
    save()
    print((out / "fresh.md").read_text(), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
