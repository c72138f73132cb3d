#!/usr/bin/env python
"""cudaload's benchmark runner: the numbers that show cudaload chooses right and runs fast (issue 8).

    python benchmarks/run.py --out DIR [--small] [--sections load,choice,memory,overheads,firstuse]
                             [--shapes 0.6b,8b] [--quant bf16,int8,nf4] [--reps N] [--budget-s S]

writes ``DIR/results.json``, ``DIR/results.md`` and ``DIR/plot.png``. Every number that compares cudaload
with plain transformers is measured in the same run, and every GPU measurement runs in a fresh subprocess
(this file again, with ``--worker``) so peaks, caches and CUDA contexts never leak between measurements.
The parent process never touches CUDA: it detects, plans (pure) and orchestrates.

Results are rewritten after every measurement, so a run killed by a time limit still leaves what it measured.
See benchmarks/README.md for the sections, the goals and how to split a run on the H200.

The code lives in benchlib/: common.py (names, goals, helpers shared once), one module per section (load,
choice, memory, overheads, firstuse, plot: its worker, its Runner part, its summary and markdown) and
runner.py (orchestration, report, merge, command line). This file is the entry point and keeps every name
the tests and older scripts import from it.
"""

from __future__ import annotations

import sys
from pathlib import Path

# benchlib sits next to this file; run as a script (or loaded by path in the tests) it is not on sys.path
sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchlib.choice import summarize_choice
from benchlib.common import (
    ALL_SECTIONS,
    CUDALOAD_QUANT,
    PLAN_CONFIGS,
    QUANTS,
    SECTIONS,
    SHAPES,
    TITLES,
    csv,
    fmt,
    gib,
    human,
    md_table,
    median,
    ratio,
    within,
)
from benchlib.load import summarize_load
from benchlib.memory import compare_memory
from benchlib.plot import make_plot
from benchlib.runner import WORKERS, Runner, build_parser, main, merge, render_markdown, worker_main

__all__ = [
    "ALL_SECTIONS",
    "CUDALOAD_QUANT",
    "PLAN_CONFIGS",
    "QUANTS",
    "SECTIONS",
    "SHAPES",
    "TITLES",
    "WORKERS",
    "Runner",
    "build_parser",
    "compare_memory",
    "csv",
    "fmt",
    "gib",
    "human",
    "main",
    "make_plot",
    "md_table",
    "median",
    "merge",
    "ratio",
    "render_markdown",
    "summarize_choice",
    "summarize_load",
    "within",
    "worker_main",
]

if __name__ == "__main__":
    sys.exit(main())
