#!/usr/bin/env python
"""One masked paged attention layer, measured: the memory it allocates beside the cache (against
``cudaload.policies.serving.masked_step_transient``) and the time it takes, for transformers' own
``paged|eager`` and ``paged|sdpa`` forwards at the step shapes continuous batching runs.

    python benchmarks/investigations/bench_masked_transient.py --out DIR [--budget-s 240] [--device cuda:0] [--reps 5]
    python benchmarks/investigations/bench_masked_transient.py --smoke --out /tmp/masked-smoke  # CPU, tiny heads

Why: the serving plan counts, per layer step, the K/V gathered from the cache and repeated to every head, and for
``paged|eager`` the scores (heads x q x K at 10 bytes each for bf16: the scores, their float32 copy, the float32
softmax). It counts no scores for ``paged|sdpa``, trusting torch's fused kernels for a masked call (cuDNN,
memory-efficient) to hold none; a fall-back to the math kernel would hold them. This measures both on the GPU.
It also times the layer at decode shapes (64 queries over the keys 64 requests of ~2300 tokens read, padded as
transformers pads them), beside the 90 ms decode steps measured for the 0.6B shape
(benchmarks/results/2026-12-01-h200/run7-serving): layers x this time shows how much of a step the attention is.

Shapes: Qwen3-0.6B's attention (16 query heads, 8 KV heads, head_dim 128, 28 layers; cudaload.testing.shapes) and
Qwen3-8B's (32, 8, 128, 36), bf16. The cache is a stub exposing what transformers 5.17's
``PagedAttentionCache.update`` reads (its own ``update`` runs, bound to the stub); the mask is a slice of a
static [1, 1, M, N + M] tensor as transformers keeps it (input_outputs.py:185-190, 525). Cases whose formula peak
exceeds 80% of the free memory are skipped and say so; an OOM is caught and recorded. Variants of one case
(eager, sdpa, sdpa without cuDNN) are interleaved per repetition; medians and min-max are reported.
JSON (``masked_transient.json``) and markdown (``masked_transient.md``) are rewritten after every case.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import weakref
from pathlib import Path
from types import SimpleNamespace
from typing import Any

SRC = Path(__file__).resolve().parents[2] / "src"
if SRC.is_dir() and str(SRC) not in sys.path:
    sys.path.insert(0, str(SRC))

GiB = 1 << 30

#: (name, query heads, KV heads, head_dim, layers)
SHAPES = {"Qwen3-0.6B": (16, 8, 128, 28), "Qwen3-8B": (32, 8, 128, 36)}
#: (label, query tokens, KV tokens read before the new ones): decode steps of 64 requests at growing context
#: (padded to transformers' 16384-token KV steps), and prefill chunks of 2048 and 8192 tokens
CASES = [
    ("decode 64 x 16k", 64, 16_384),
    ("decode 64 x 64k", 64, 65_536),
    ("decode 64 x 147k", 64, 147_456),
    ("decode 64 x 192k", 64, 192_512),
    ("prefill 2048 x 64k", 2048, 65_536),
    ("prefill 2048 x 192k", 2048, 192_512),
    ("prefill 8192 x 64k", 8192, 65_536),
]
SMOKE_SHAPES = {"tiny": (4, 2, 16, 2)}
SMOKE_CASES = [("decode 4 x 256", 4, 256), ("prefill 32 x 256", 32, 256)]


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


class LiveBytes:
    """CPU stand-in for the CUDA allocator's peak: the bytes of the tensors allocated while active, each storage
    counted once until its last tensor dies (a TorchDispatchMode); storages that existed before are skipped."""

    def __init__(self, existing: list[Any]) -> None:
        from torch.utils._python_dispatch import TorchDispatchMode

        outer = self
        self.skip = {t.untyped_storage().data_ptr() for t in existing}
        self.live: dict[int, list[int]] = {}
        self.now = 0
        self.peak = 0

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
                import torch
                from torch.utils._pytree import tree_leaves

                out = func(*args, **(kwargs or {}))
                for t in tree_leaves(out):
                    if isinstance(t, torch.Tensor):
                        outer.track(t)
                return out

        self.mode = Mode()

    def track(self, t: Any) -> None:
        st = t.untyped_storage()
        key, size = st.data_ptr(), st.nbytes()
        if size == 0 or key in self.skip:
            return
        if key in self.live:
            self.live[key][1] += 1
        else:
            self.live[key] = [size, 1]
            self.now += size
            self.peak = max(self.peak, self.now)
        weakref.finalize(t, self.drop, key)

    def drop(self, key: int) -> None:
        e = self.live.get(key)
        if e is None:
            return
        e[1] -= 1
        if e[1] == 0:
            self.now -= e[0]
            del self.live[key]


def formula_peak(heads: int, kv_heads: int, d: int, q: int, keys: int, eager: bool) -> int:
    from cudaload.policies.serving import masked_step_transient

    return masked_step_transient(
        heads=heads, kv_heads=kv_heads, head_dim=d, dtype="bfloat16", q_tokens=q, keys=keys, eager=eager
    )["peak"]


class Layer:
    """One attention layer's inputs for a step: the stub cache, q/k/v of the new tokens, the mask slice."""

    def __init__(
        self, torch: Any, device: str, heads: int, kv_heads: int, d: int, q: int, kv_read: int
    ) -> None:
        from transformers.generation.continuous_batching.cache import PagedAttentionCache

        dt = torch.bfloat16
        keys = kv_read + q
        self.keys = keys
        self.cache = SimpleNamespace(
            layer_index_to_group_indices={0: (0, 0)},
            key_cache=[torch.randn(keys + 1, kv_heads, d, dtype=dt, device=device)],
            value_cache=[torch.randn(keys + 1, kv_heads, d, dtype=dt, device=device)],
            sliding_windows={0: 1},
        )
        self.cache.update = PagedAttentionCache.update.__get__(self.cache)
        self.module = SimpleNamespace(layer_idx=0, num_key_value_groups=heads // kv_heads)
        self.q = torch.randn(1, heads, q, d, dtype=dt, device=device)
        self.k = torch.randn(1, kv_heads, q, d, dtype=dt, device=device)
        self.v = torch.randn(1, kv_heads, q, d, dtype=dt, device=device)
        # the static mask is [1, 1, M, N + M]; a step reads its [:q, :K] corner (input_outputs.py:525)
        full = torch.zeros(1, 1, q, keys + 64, dtype=dt, device=device)
        self.mask = full[..., :q, :keys]
        self.read = [torch.arange(keys, device=device)]
        self.write = [torch.arange(kv_read, keys, device=device)]
        self.d = d

    def tensors(self) -> list[Any]:
        return [self.q, self.k, self.v, self.mask, *self.read, *self.write, *self.cache.key_cache,
                *self.cache.value_cache]  # fmt: skip

    def run(self, impl: str) -> None:
        kw = {"cache": self.cache, "read_index": self.read, "write_index": self.write}
        if impl == "eager":
            from transformers.integrations.eager_paged import eager_paged_attention_forward

            out, w = eager_paged_attention_forward(
                self.module, self.q, self.k, self.v, self.mask, self.d**-0.5, **kw
            )
        else:
            from transformers.integrations.sdpa_paged import sdpa_attention_paged_forward

            out, w = sdpa_attention_paged_forward(
                self.module, self.q, self.k, self.v, self.mask, scaling=self.d**-0.5, **kw
            )
        del out, w


def measure(torch: Any, layer: Layer, impl: str, device: str) -> dict[str, Any]:
    """One call: peak bytes beside what existed before, and seconds."""
    cudnn = impl != "sdpa-nocudnn"
    name = "sdpa" if impl.startswith("sdpa") else "eager"
    if device.startswith("cuda"):
        prev = torch.backends.cuda.cudnn_sdp_enabled()
        torch.backends.cuda.enable_cudnn_sdp(cudnn)
        try:
            torch.cuda.synchronize()
            base = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            t = time.perf_counter()
            with torch.no_grad():
                layer.run(name)
            torch.cuda.synchronize()
            s = time.perf_counter() - t
            return {"peak": torch.cuda.max_memory_allocated() - base, "s": s}
        finally:
            torch.backends.cuda.enable_cudnn_sdp(prev)
    probe = LiveBytes(layer.tensors())
    t = time.perf_counter()
    with torch.no_grad(), probe.mode:
        layer.run(name)
    return {"peak": probe.peak, "s": time.perf_counter() - t}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--budget-s", type=float, default=240.0)
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--smoke", action="store_true", help="CPU, tiny heads and lengths")
    a = ap.parse_args(argv)
    import torch
    import transformers

    device = "cpu" if a.smoke else a.device
    shapes = SMOKE_SHAPES if a.smoke else SHAPES
    cases = SMOKE_CASES if a.smoke else CASES
    reps = 2 if a.smoke else a.reps
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    res: dict[str, Any] = {
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "device": torch.cuda.get_device_name(device) if device.startswith("cuda") else "cpu",
        "cases": [],
    }
    if not transformers.__version__.startswith("5.17."):
        log(
            f"transformers {transformers.__version__}: the stub cache mirrors 5.17's PagedAttentionCache.update"
        )
    impls = ["eager", "sdpa"] + (["sdpa-nocudnn"] if device.startswith("cuda") else [])
    for shape, (heads, kv_heads, d, layers) in shapes.items():
        for label, q, kv_read in cases:
            if time.perf_counter() - t0 > a.budget_s:
                log("budget spent: stopping")
                break
            keys = kv_read + q
            entry: dict[str, Any] = {"shape": shape, "case": label, "q": q, "keys": keys, "layers": layers}
            free = torch.cuda.mem_get_info(device)[0] if device.startswith("cuda") else None
            runs: dict[str, list[dict[str, Any]]] = {i: [] for i in impls}
            skipped: dict[str, str] = {}
            for impl in impls:
                f = formula_peak(heads, kv_heads, d, q, keys, impl == "eager")
                entry[f"formula_{impl}"] = f
                if free is not None and f > 0.8 * free:
                    skipped[impl] = f"formula peak {f / GiB:.1f} GiB > 80% of {free / GiB:.1f} GiB free"
            log(f"{shape} {label}: q {q}, keys {keys:,}" + (f"; skipped {skipped}" if skipped else ""))
            try:
                layer = Layer(torch, device, heads, kv_heads, d, q, kv_read)
            except torch.OutOfMemoryError as e:  # the inputs alone
                entry["error"] = f"inputs: {e}"[:300]
                res["cases"].append(entry)
                continue
            for r in range(reps + 1):  # the first round warms up (kernels, cuDNN plans) and is not kept
                for impl in impls:
                    if impl in skipped or any(x.get("oom") for x in runs[impl]):
                        continue
                    try:
                        m = measure(torch, layer, impl, device)
                    except torch.OutOfMemoryError as e:
                        m = {"oom": str(e)[:300]}
                        if device.startswith("cuda"):
                            torch.cuda.empty_cache()
                    if r > 0 or "oom" in m:
                        runs[impl].append(m)
            del layer
            if device.startswith("cuda"):
                torch.cuda.empty_cache()
            for impl in impls:
                ok = [x for x in runs[impl] if "oom" not in x]
                s = {
                    "skipped": skipped.get(impl),
                    "oom": next((x["oom"] for x in runs[impl] if "oom" in x), None),
                }
                if ok:
                    ms = [x["s"] * 1e3 for x in ok]
                    peak = max(x["peak"] for x in ok)
                    s.update(
                        {
                            "peak_bytes": peak,
                            "formula_bytes": entry[f"formula_{impl}"],
                            "measured_over_formula": peak / max(entry[f"formula_{impl}"], 1),
                            "ms_median": statistics.median(ms),
                            "ms_min": min(ms),
                            "ms_max": max(ms),
                            "ms_x_layers": statistics.median(ms) * layers,
                            "n": len(ok),
                        }
                    )
                entry[impl] = s
                log(f"  {impl}: {summary_line(s)}")
            res["cases"].append(entry)
            res["elapsed_s"] = time.perf_counter() - t0
            write(out, res)
    res["elapsed_s"] = time.perf_counter() - t0
    write(out, res)
    log(f"done in {res['elapsed_s']:.1f}s -> {out}")
    return 0


def summary_line(s: dict[str, Any]) -> str:
    if s.get("skipped"):
        return f"skipped ({s['skipped']})"
    if "peak_bytes" not in s:
        return f"OOM: {s.get('oom')}"
    return (
        f"peak {s['peak_bytes'] / GiB:.4g} GiB vs formula {s['formula_bytes'] / GiB:.4g} GiB "
        f"(x{s['measured_over_formula']:.2f}); {s['ms_median']:.2f} ms (min {s['ms_min']:.2f}, max "
        f"{s['ms_max']:.2f}); x layers {s['ms_x_layers']:.1f} ms"
    )


def write(out: Path, res: dict[str, Any]) -> None:
    (out / "masked_transient.json").write_text(json.dumps(res, indent=1))
    lines = [
        "# One masked paged attention layer: memory beside the cache and time",
        "",
        f"{res['when']} on {res['device']}, torch {res['torch']}, transformers {res['transformers']}, "
        f"elapsed {res.get('elapsed_s', 0):.1f} s. Formula: cudaload.policies.serving.masked_step_transient.",
        "",
        "| shape | case | q | keys | impl | measured GiB | formula GiB | measured/formula | ms median | min-max "
        "| ms x layers | note |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for e in res["cases"]:
        for impl in ("eager", "sdpa", "sdpa-nocudnn"):
            s = e.get(impl)
            if s is None:
                continue
            note = s.get("skipped") or (("OOM: " + str(s["oom"])[:60]) if s.get("oom") else "")
            if "peak_bytes" in s:
                lines.append(
                    f"| {e['shape']} | {e['case']} | {e['q']} | {e['keys']:,} | {impl} | {s['peak_bytes'] / GiB:.4g} "
                    f"| {s['formula_bytes'] / GiB:.4g} | {s['measured_over_formula']:.2f} | {s['ms_median']:.2f} "
                    f"| {s['ms_min']:.2f}-{s['ms_max']:.2f} | {s['ms_x_layers']:.1f} | {note} |"
                )
            else:
                lines.append(
                    f"| {e['shape']} | {e['case']} | {e['q']} | {e['keys']:,} | {impl} | - | "
                    f"{e.get('formula_' + impl, 0) / GiB:.4g} | - | - | - | - | {note} |"
                )
    (out / "masked_transient.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    sys.exit(main())
