"""``python -m cudaload.tuning priors RESULTS.json... --out src/cudaload/tuning/priors.json``

Turns benchmarks/bench_generate.py results (run on a GPU) into shipped priors and SDPA dispatch facts. Priors already
in --out for the same GPU, model shape, work and mask are replaced; the others are kept (--replace: none).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .timings import PRIORS_VERSION, prior_key, priors_from_bench, sdpa_facts_from_bench


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m cudaload.tuning", description=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    pr = sub.add_parser("priors", help="bench_generate.py results.json -> priors.json")
    pr.add_argument("results", nargs="+", help="results.json files of benchmarks/bench_generate.py")
    pr.add_argument("--out", required=True, help="priors.json to write (merged into when it exists)")
    pr.add_argument("--replace", action="store_true", help="drop the priors already in --out")
    args = ap.parse_args(argv)
    out = Path(args.out)
    old: dict = {}  # type: ignore[type-arg]
    if out.exists() and not args.replace:
        old = json.loads(out.read_text())
        if old.get("version") != PRIORS_VERSION:
            old = {}  # another format: its numbers mean something else (version 1: mostly repeated lengths)
    keep = {prior_key(p): p for p in old.get("priors", [])}
    facts = {(f.get("gpu"), f.get("variant")): f for f in old.get("sdpa_dispatch", [])}
    added = 0
    runs = [json.loads(Path(r).read_text()) for r in args.results]
    for r, res in zip(args.results, runs, strict=True):
        doc = priors_from_bench(res, source=str(Path(r).parent))
        for p in doc["priors"]:
            keep[prior_key(p)] = p
            added += 1
    # one fact per GPU and variant over every run given (both shapes), replacing what --out had
    sources = ", ".join(sorted({str(Path(r).parent) for r in args.results}))
    for f in sdpa_facts_from_bench(runs, source=sources):
        facts[(f.get("gpu"), f.get("variant"))] = f
    data = {k: v for k, v in old.items() if k not in ("version", "priors", "sdpa_dispatch")}
    data.update(
        {"version": PRIORS_VERSION, "priors": list(keep.values()), "sdpa_dispatch": list(facts.values())}
    )
    out.write_text(json.dumps(data, indent=1) + "\n")
    print(f"{added} priors from {len(args.results)} result file(s); {len(keep)} in {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
