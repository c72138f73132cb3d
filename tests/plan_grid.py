"""The refactoring safety net (issue 42): every plan of a grid of shapes x hardware x intents x options, as JSON and
as ``explain()`` text, written to one file; a second run compares with it and lists what changed.

    python tests/plan_grid.py --out /tmp/before.json          # before a refactoring commit
    python tests/plan_grid.py --compare /tmp/before.json      # after it: exit 1 and the differences if any

Not a test module (no ``test_`` prefix): the grid takes about a minute, and its numbers depend on the installed
transformers, so a committed snapshot would only hold for one set. A refactoring runs it before and after, in one
environment.
"""

from __future__ import annotations

import argparse
import difflib
import itertools
import json
import sys
import warnings
from typing import Any

SHAPES = ("Qwen3-0.6B", "Qwen3-8B", "Llama-3.1-70B", "Qwen3-30B-A3B", "Gemma-2-9B", "Mixtral-8x7B")
HARDWARE = ("H200", "H100-SXM", "A100-40GB", "L4", "T4", "RTX-4090", "B200", "8xH100-SXM", "2xA100-80GB")
PACKAGES = ("flash-attn-4", "bitsandbytes", "peft", "liger-kernel")
#: intent -> the option sets tried with it
OPTIONS: dict[str, tuple[dict[str, Any], ...]] = {
    "inference": (
        {},
        {"seq_len": 8192, "batch_size": 8},
        {"quantization": "nf4"},
        {"batch_size": 1, "seq_len": 1280, "new_tokens": 256, "generate_calls": 200},
        {"attn": "eager"},
    ),
    "serving": ({"seq_len": 4096, "batch_size": 64},),
    "training": ({"seq_len": 2048, "batch_size": 8},),
    "lora": ({"seq_len": 2048, "batch_size": 8}, {"seq_len": 16384, "batch_size": 4}),
    "qlora": ({"seq_len": 4096, "batch_size": 8},),
}


def grid() -> dict[str, str]:
    import cudaload
    from cudaload.profiles import hardware
    from cudaload.testing import full_config

    out: dict[str, str] = {}
    configs = {s: full_config(s) for s in SHAPES}
    for hw_name, (intent, options) in itertools.product(HARDWARE, OPTIONS.items()):
        for with_packages in (False, True):
            hw = hardware(hw_name)
            if with_packages:
                hw = hw.with_packages(list(PACKAGES))
            for shape, opts in itertools.product(SHAPES, options):
                key = (
                    f"{shape} | {hw_name}{' +pkgs' if with_packages else ''} | {intent} | {json.dumps(opts)}"
                )
                try:
                    with warnings.catch_warnings(record=True) as caught:
                        warnings.simplefilter("always")
                        p = cudaload.plan(configs[shape], hardware=hw, intent=intent, **opts)
                    text = p.to_json() + "\n" + p.explain()
                    text += "".join(f"\nwarning: {w.message}" for w in caught)
                except Exception as e:  # a refusal is a result: its class and words must not change either
                    text = f"{type(e).__name__}: {e}"
                out[key] = text
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--out", help="write the grid here")
    g.add_argument("--compare", help="compare with a grid written before")
    args = ap.parse_args(argv)
    now = grid()
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(now, f, indent=0, sort_keys=True)
        print(f"{len(now)} plans written to {args.out}")
        return 0
    with open(args.compare, encoding="utf-8") as f:
        before: dict[str, str] = json.load(f)
    changed = sorted(k for k in before.keys() | now.keys() if before.get(k) != now.get(k))
    for k in changed[:20]:
        print(f"== {k}")
        sys.stdout.writelines(
            difflib.unified_diff(
                (before.get(k) or "").splitlines(True), (now.get(k) or "").splitlines(True), n=1
            )
        )
    print(f"{len(changed)} of {len(now)} plans differ")
    return 1 if changed else 0


if __name__ == "__main__":
    raise SystemExit(main())
