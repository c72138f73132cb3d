"""The plot of a run (plot.png) and its markdown line."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def _md_plot(sec: dict[str, Any]) -> list[str]:
    return ["![load and throughput, cudaload vs transformers](plot.png)"] if sec.get("status") == "ok" else []


def make_plot(res: dict[str, Any], path: Path) -> str:
    """plot.png: load time (cudaload vs transformers) and decode throughput (cudaload's choice vs sdpa)."""
    try:
        import matplotlib
    except ImportError:
        return "skipped: matplotlib not installed (pip install matplotlib)"
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    load = [r for r in res["sections"].get("load", {}).get("summary", []) if r["cache"] == "warm"]
    load += [r for r in res["sections"].get("load", {}).get("summary", []) if r["cache"] == "cold"]
    choice = [
        s for s in res["sections"].get("choice", {}).get("summary", []) if s["metric"] == "decode_tok_s"
    ]
    if not load and not choice:
        return "skipped: nothing to plot (no load or choice results)"
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.8))
    ax = axes[0]
    labels = [f"{r['shape']}\n{r['quant']} {r['cache']}" for r in load]
    xs = range(len(load))
    ax.bar(
        [x - 0.2 for x in xs], [r["transformers"]["seconds"] or 0 for r in load], 0.4, label="transformers"
    )
    ax.bar([x + 0.2 for x in xs], [r["cudaload"]["seconds"] or 0 for r in load], 0.4, label="cudaload")
    ax.set_xticks(list(xs), labels, fontsize=7)
    ax.set_ylabel("seconds to a ready model (median)")
    ax.set_title("Load (lower is better)")
    ax.legend()
    ax = axes[1]
    labels = [f"{s['shape']}\n{s['work']}" for s in choice]
    xs = range(len(choice))
    ax.bar(
        [x - 0.2 for x in xs],
        [s["values"].get("sdpa") or 0 for s in choice],
        0.4,
        label="sdpa (transformers default)",
    )
    ax.bar(
        [x + 0.2 for x in xs],
        [s["values"].get(s["cudaload_choice"]) or 0 for s in choice],
        0.4,
        label="cudaload's choice",
    )
    ax.set_xticks(list(xs), labels, fontsize=7)
    ax.set_ylabel("decode tokens/s (batch total)")
    ax.set_title("Throughput (higher is better)")
    ax.legend()
    meta = res.get("meta", {})
    fig.suptitle(
        f"cudaload benchmarks, {meta.get('date', '')[:10]}, transformers "
        f"{meta.get('versions', {}).get('transformers')}",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return "ok"
