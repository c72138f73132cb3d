"""``python -m cudaload.tuning priors RESULTS.json... --out src/cudaload/tuning/priors.json``

Turns benchmarks/bench_attention.py results (generate mode, run on a GPU) into shipped priors. Priors already
in --out for the same GPU, model shape, work and mask are replaced; the others are kept (--replace: none).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .timings import PRIORS_VERSION, priors_from_bench


def _ident(p: dict) -> tuple:  # type: ignore[type-arg]
    return (p.get("gpu"), p.get("model"), json.dumps(p.get("work"), sort_keys=True), p.get("mask"))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m cudaload.tuning", description=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    pr = sub.add_parser("priors", help="bench_attention.py results.json -> priors.json")
    pr.add_argument("results", nargs="+", help="results.json files of benchmarks/bench_attention.py")
    pr.add_argument("--out", required=True, help="priors.json to write (merged into when it exists)")
    pr.add_argument("--replace", action="store_true", help="drop the priors already in --out")
    args = ap.parse_args(argv)
    out = Path(args.out)
    old: dict = {}  # type: ignore[type-arg]
    if out.exists() and not args.replace:
        old = json.loads(out.read_text())
    keep = {_ident(p): p for p in old.get("priors", [])}
    added = 0
    for r in args.results:
        doc = priors_from_bench(json.loads(Path(r).read_text()), source=str(Path(r).parent))
        for p in doc["priors"]:
            keep[_ident(p)] = p
            added += 1
    data = {k: v for k, v in old.items() if k not in ("version", "priors")}
    data.update({"version": PRIORS_VERSION, "priors": list(keep.values())})
    out.write_text(json.dumps(data, indent=1) + "\n")
    print(f"{added} priors from {len(args.results)} result file(s); {len(keep)} in {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
