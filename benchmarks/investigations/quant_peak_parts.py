"""What a quantized load's GPU peak is made of: ``from_pretrained`` against cudaload's quantized fast path.

``tests/test_quantized_fastload_gpu.py`` bounds the fast path's peak by from_pretrained's plus one layer's bf16
scratch plus bitsandbytes' temporaries for the largest weight; on the H200 (run 26) the 0.6B int8 load went
over that bound by 0.26 MiB of a 39 MiB difference. This records every allocation of each load (torch's
memory history, Python stacks), finds the moment of the peak, and sums the blocks alive then by the innermost
frame in cudaload, bitsandbytes or transformers, so the difference can be named instead of guessed.

    python benchmarks/investigations/quant_peak_parts.py --out DIR --shape Qwen3-0.6B --quant int8   # on the GPU
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
# benchmarks/, for benchlib
sys.path.insert(0, str(HERE.parent))

#: frames named after these (path parts) are the places a block is attributed to, innermost first
OWNERS = ("cudaload", "bitsandbytes", "transformers", "accelerate", "safetensors")


def owner(frames: Iterable[Mapping[str, Any]]) -> str:
    """The innermost frame that belongs to one of :data:`OWNERS` (``file:line function``), else the innermost."""
    frames = list(frames)
    for f in frames:
        path = str(f.get("filename", ""))
        if any(f"/{o}/" in path for o in OWNERS):
            short = path.split("site-packages/")[-1].split("/src/")[-1]
            return f"{short}:{f.get('line')} {f.get('name')}"
    if frames:
        f = frames[0]
        return f"{f.get('filename')}:{f.get('line')} {f.get('name')}"
    return "?"


def peak_parts(events: list[Mapping[str, Any]]) -> tuple[int, Counter[str], int]:
    """(bytes alive at the peak, those bytes by owner, event index of the peak) over one device's trace.

    Only allocations made inside the recorded window count, so both loads are measured from the same start."""
    live: dict[int, int] = {}
    total = peak = peak_at = 0
    for i, e in enumerate(events):
        action, addr, size = e.get("action"), int(e.get("addr", 0)), int(e.get("size", 0))
        if action == "alloc":
            live[addr] = size
            total += size
            if total > peak:
                peak, peak_at = total, i
        elif action in ("free_requested", "free_completed") and addr in live:
            total -= live.pop(addr)
    parts: Counter[str] = Counter()
    alive: dict[int, Mapping[str, Any]] = {}
    for e in events[: peak_at + 1]:
        action, addr = e.get("action"), int(e.get("addr", 0))
        if action == "alloc":
            alive[addr] = e
        elif action in ("free_requested", "free_completed"):
            alive.pop(addr, None)
    for e in alive.values():
        parts[owner(e.get("frames") or [])] += int(e.get("size", 0))
    return peak, parts, peak_at


def recorded(load: Callable[[], Any], torch: Any) -> tuple[Any, dict[str, Any]]:
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    torch.cuda.memory._record_memory_history(max_entries=500_000)
    model = load()
    torch.cuda.synchronize()
    snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    events = snap["device_traces"][torch.cuda.current_device()]
    peak, parts, at = peak_parts(events)
    # what stays: every block still allocated, from the allocator's own segments (authoritative where the trace
    # and memory_allocated disagree); blocks made before the window carry no frames
    final: Counter[str] = Counter()
    for seg in snap["segments"]:
        if seg.get("device") != torch.cuda.current_device():
            continue
        for b in seg.get("blocks", []):
            if b.get("state") == "active_allocated":
                final[owner(b.get("frames") or []) if b.get("frames") else "(before the window)"] += int(
                    b["size"]
                )
    actions = Counter(str(e.get("action")) for e in events)
    return model, {
        "peak_allocated": torch.cuda.max_memory_allocated() - base,
        "final_allocated": torch.cuda.memory_allocated() - base,
        "trace_peak": peak,
        "trace_peak_event": at,
        "events": len(events),
        "parts": dict(parts.most_common(25)),
        "final_parts": dict(final.most_common(25)),
        "actions": dict(actions),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--shape", default="Qwen3-0.6B")
    ap.add_argument("--quant", default="int8")
    args = ap.parse_args(argv)
    import torch
    import transformers

    from benchlib.common import w_write
    from cudaload.fastload import quantized

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = Path(tempfile.mkdtemp(prefix="qpeak-")) / args.shape
    w_write({"path": str(path), "config": args.shape})
    if args.quant == "int8":
        cfg = transformers.BitsAndBytesConfig(load_in_8bit=True)
    else:
        cfg = transformers.BitsAndBytesConfig(
            load_in_4bit=True,
            bnb_4bit_quant_type="nf4",
            bnb_4bit_use_double_quant=True,
            bnb_4bit_compute_dtype=torch.bfloat16,
        )
    result: dict[str, Any] = {"shape": args.shape, "quant": args.quant, "torch": torch.__version__}
    # once untimed, so neither side pays first-use costs (cuBLAS, bitsandbytes' library) inside its window
    warm = quantized.load_quantized(path, quantization_config=cfg, device="cuda:0", dtype=torch.bfloat16)
    del warm
    ref, result["from_pretrained"] = recorded(
        lambda: transformers.AutoModelForCausalLM.from_pretrained(
            path, dtype=torch.bfloat16, device_map="cuda:0", quantization_config=cfg
        ),
        torch,
    )
    largest = max(
        m.in_features * m.out_features
        for m in ref.modules()
        if type(m).__name__ in ("Linear8bitLt", "Linear4bit")
    )
    del ref
    got, result["fast"] = recorded(
        lambda: quantized.load_quantized(
            path, quantization_config=cfg, device="cuda:0", dtype=torch.bfloat16
        ),
        torch,
    )
    result["scratch_bytes"] = got.cudaload_fastload["scratch_bytes"]
    result["largest_weight_elements"] = largest
    (out / f"peak-{args.shape}-{args.quant}.json").write_text(json.dumps(result, indent=1))
    for side in ("from_pretrained", "fast"):
        r = result[side]
        print(
            f"== {side}: peak {r['peak_allocated'] / 2**20:.2f} MiB (trace {r['trace_peak'] / 2**20:.2f}), "
            f"final {r['final_allocated'] / 2**20:.2f} MiB"
        )
        for k, v in r["parts"].items():
            print(f"  {v / 2**20:10.2f} MiB  {k}")
        print(f"  alive at the end (allocator segments), events {r['actions']}:")
        for k, v in r["final_parts"].items():
            print(f"  {v / 2**20:10.2f} MiB  {k}")
    print(f"scratch {result['scratch_bytes'] / 2**20:.2f} MiB, largest weight {largest} elements")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
