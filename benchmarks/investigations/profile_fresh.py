"""Where a fresh process's seconds go, plain ``from_pretrained`` against ``cudaload.load_model()`` (issue 14).

``bench_fresh.py`` says how long each side takes from ``python -c`` to the first forward; this says why. For
each method it runs fresh interpreters of the same child program as ``bench_fresh.py`` (its ``CHILD``), under
cProfile for the whole program (imports included) and once more under ``python -X importtime``, and writes:

- ``profile-<shape>-<method>.txt``: the functions with the most cumulative and the most own time;
- ``importtime-<shape>-<method>.txt``: the slowest imports (self and cumulative microseconds);
- ``modules.md``: the modules one side imports and the other does not, by top-level package, with their
  import time: what cudaload imports that plain transformers does not is overhead it must justify.

    # on the H200, from the repo root (PYTHONPATH=src); the checkpoint is written as bench_fresh writes it
    python benchmarks/investigations/profile_fresh.py --out $OUT/prof --shapes Qwen3-0.6B,Qwen3-8B
    python benchmarks/investigations/profile_fresh.py --smoke --out /tmp/prof     # CPU, a tiny model, seconds
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
# benchmarks/, for bench_fresh
sys.path.insert(0, str(HERE.parent))

from bench_fresh import (  # noqa: E402
    CHILD,
    TAG,
    child_env,
    compile_sources,
    write_checkpoint,
    write_tiny,
)

# cProfile around the child program: the stats are dumped where the parent asks, after the first forward
PROFILED = (
    "import cProfile as _cp, os as _os\n"
    "_prof = _cp.Profile(); _prof.enable()\n"
    "exec(compile(_os.environ['FRESH_CHILD'], '<fresh-child>', 'exec'))\n"
    "_prof.disable(); _prof.dump_stats(_os.environ['FRESH_PSTATS'])\n"
)

_IMPORTTIME = re.compile(r"import time:\s+(\d+) \|\s+(\d+) \|(\s*)(\S+)")


def _run(args: list[str], env: dict[str, str], timeout: float) -> tuple[dict[str, Any], str]:
    try:
        proc = subprocess.run(args, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}, ""
    for line in proc.stdout.splitlines():
        if line.startswith(TAG):
            return json.loads(line[len(TAG) :]), proc.stderr
    return {"error": (proc.stderr or proc.stdout)[-1500:]}, proc.stderr


def parse_importtime(stderr: str) -> dict[str, tuple[int, int, int]]:
    """module -> (self us, cumulative us, nesting depth), from ``python -X importtime``'s stderr."""
    out: dict[str, tuple[int, int, int]] = {}
    for line in stderr.splitlines():
        m = _IMPORTTIME.match(line)
        if m:
            out[m.group(4)] = (int(m.group(1)), int(m.group(2)), len(m.group(3)) // 2)
    return out


def profile_text(pstats_path: Path, top: int = 45) -> str:
    import io
    import pstats

    buf = io.StringIO()
    st = pstats.Stats(str(pstats_path), stream=buf)
    st.strip_dirs()
    buf.write("== by cumulative time\n")
    st.sort_stats("cumulative").print_stats(top)
    buf.write("\n== by own time\n")
    st.sort_stats("tottime").print_stats(top)
    return buf.getvalue()


def importtime_text(mods: dict[str, tuple[int, int, int]], top: int = 60) -> str:
    lines = ["self_ms cumulative_ms depth module"]
    for name, (self_us, cum_us, depth) in sorted(mods.items(), key=lambda kv: -kv[1][0])[:top]:
        lines.append(f"{self_us / 1e3:8.1f} {cum_us / 1e3:10.1f} {depth:3d} {name}")
    return "\n".join(lines) + "\n"


def modules_diff(
    a: dict[str, tuple[int, int, int]], b: dict[str, tuple[int, int, int]], an: str, bn: str
) -> str:
    """The modules ``b`` imports and ``a`` does not (and the reverse), grouped by top-level package."""
    out = []
    for x, y, xn, yn in ((a, b, an, bn), (b, a, bn, an)):
        only = set(y) - set(x)
        groups: dict[str, list[str]] = {}
        for m in only:
            groups.setdefault(m.split(".")[0], []).append(m)
        out.append(f"## imported by {yn}, not by {xn}\n")
        out.append("| package | modules | self ms (sum) |")
        out.append("|---|---|---|")
        for pkg, ms in sorted(groups.items(), key=lambda kv: -sum(y[m][0] for m in kv[1])):
            out.append(f"| {pkg} | {len(ms)} | {sum(y[m][0] for m in ms) / 1e3:.1f} |")
        out.append("")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--shapes", default="Qwen3-0.6B")
    ap.add_argument("--methods", default="plain,cudaload")
    ap.add_argument("--workdir", default=None, help="where checkpoints are written (default: a temp dir)")
    ap.add_argument("--timeout-s", type=float, default=180)
    ap.add_argument("--smoke", action="store_true", help="CPU, a tiny model")
    args = ap.parse_args(argv)

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    device = "cpu" if args.smoke else "cuda:0"
    work = Path(args.workdir or tempfile.mkdtemp(prefix="cudaload-prof-"))
    shapes = ["tiny"] if args.smoke else args.shapes.split(",")
    methods = args.methods.split(",")
    summary: dict[str, Any] = {
        "device": device,
        "command": sys.argv,
        "compile_sources": compile_sources(),
        "runs": {},
    }
    for shape in shapes:
        path = work / shape
        if shape == "tiny":
            if not (path / "config.json").exists():
                write_tiny(path)
        else:
            write_checkpoint(shape, path, device)
        # one untimed read: the page cache is warm for every method alike
        for f in path.glob("*.safetensors"):
            with open(f, "rb") as fh:
                while fh.read(64 << 20):
                    pass
        imports: dict[str, dict[str, tuple[int, int, int]]] = {}
        for method in methods:
            spec = {"method": method, "path": str(path), "quant": "bf16", "device": device}
            stats = out / f"profile-{shape}-{method}.pstats"
            env = child_env(spec)
            env["FRESH_CHILD"] = CHILD
            env["FRESH_PSTATS"] = str(stats)
            res, _ = _run([sys.executable, "-c", PROFILED], env, args.timeout_s)
            if stats.exists():
                (out / f"profile-{shape}-{method}.txt").write_text(profile_text(stats))
                stats.unlink()
            res_it, err = _run(
                [sys.executable, "-X", "importtime", "-c", CHILD], child_env(spec), args.timeout_s
            )
            imports[method] = parse_importtime(err)
            (out / f"importtime-{shape}-{method}.txt").write_text(importtime_text(imports[method]))
            summary["runs"][f"{shape}/{method}"] = {"profiled": res, "importtime_run": res_it}
            print(f"{shape} {method}: {json.dumps(res.get('marks') or res.get('error'))}", flush=True)
        if "plain" in imports:
            for method in methods:
                if method != "plain":
                    (out / f"modules-{shape}-{method}.md").write_text(
                        modules_diff(imports["plain"], imports[method], "plain", method)
                    )
    (out / "profile.json").write_text(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
