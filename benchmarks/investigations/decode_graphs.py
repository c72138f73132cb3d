#!/usr/bin/env python
"""Can a decode step be a CUDA graph without inductor's compile, and what does the undeclared default cost on
repeated lengths (issue 43, items 2 and 5)?

The dynamic decode of the 8B shape on the H200 runs at ~50 ms a token where its GPU work is a few ms: the host
launches every kernel of 36 layers each step. inductor's compiled step (6.2 ms) cures that, for ~75 s of compile
with cold caches. This asks what lies between, in one process on one loaded model:

- ``dyn``: transformers' dynamic decode, batch 1, 640 + 64 tokens, the same prompt length each round (round 0 is
  first-seen, later rounds repeat it), backends interleaved in rotated order: ``sdpa``, ``cudaload_sdpa`` (the
  undeclared default), ``cudaload_sdpa_nocudnn``. ms per decode token = (call - its prefill) / 63, and the GPU's
  own kernel time per step from torch.profiler (host-bound when far below).
- ``graph``: a static cache (transformers' ``StaticCache``: its layers count the filled slots on the device, so a
  step needs nothing from the host) and the eager model's decode step captured as one CUDA graph with
  ``torch.cuda.graph``: no dynamo, no inductor. Greedy bookkeeping (argmax, next input, output slot) is inside the
  graph; the host only replays. Attention in the graph: cudaload's grouped decode attention (each key/value head
  read once). Batch 1 and 8; capture seconds, ms per step over 300 replays, greedy tokens against the dynamic
  path's.
- ``cgb``: transformers' own static-cache path with ``CompileConfig(backend="cudagraphs", mode=None)``:
  dynamo's trace without inductor's code generation. First call (the trace and capture), then ms per token.

    python benchmarks/investigations/decode_graphs.py --shape 8b --out OUT/graphs.jsonl [--parts dyn,graph,cgb]
    python benchmarks/investigations/decode_graphs.py --shape tiny --out /tmp/g.jsonl   # CPU: bookkeeping only

JSON lines, one per measurement, flushed as written.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import traceback
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

GRAPH_ATTN = "cudaload_graph_probe"


def emit(fh: Any, **rec: Any) -> None:
    fh.write(json.dumps(rec, default=str) + "\n")
    fh.flush()
    print(json.dumps(rec, default=str), flush=True)


def _sdpa_decode() -> Any:
    try:  # the module's place before and after issue 42's folders
        from cudaload.execute.runtime import sdpa_decode
    except ImportError:
        from cudaload import sdpa_decode  # type: ignore[no-redef]
    return sdpa_decode


def register_graph_attention() -> None:
    """An attention function for the captured step: grouped decode attention for a decode step over the static
    cache's bool mask (what the compiled plan's graph runs), cudaload_sdpa for everything else (the prefill)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    sd = _sdpa_decode()

    def fwd(module: Any, query: Any, key: Any, value: Any, attention_mask: Any, **kwargs: Any) -> Any:
        if sd._grouped_applies(query, key, attention_mask, kwargs):
            return sd.grouped_decode_attention(query, key, value, attention_mask, kwargs.get("scaling"))
        return sd.sdpa_decode_forward(module, query, key, value, attention_mask, **kwargs)

    AttentionInterface.register(GRAPH_ATTN, fwd)
    AttentionMaskInterface.register(GRAPH_ATTN, sdpa_mask)


def load(shape: str, work: Path) -> tuple[Any, str]:
    import torch

    import cudaload

    if shape == "tiny":
        from cudaload.testing import make_tiny

        path = str(make_tiny("qwen3", work / "tiny"))
        device = "cpu"
    else:
        from benchlib.common import w_write

        name = {"8b": "Qwen3-8B", "0.6b": "Qwen3-0.6B"}[shape]
        path = str(work / name)
        if not (Path(path) / "config.json").exists():
            w_write({"path": path, "config": name})
        device = "cuda"
    model = cudaload.load_model(path, decode="dynamic")
    sd = _sdpa_decode()
    sd.register()
    register_graph_attention()
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    torch.manual_seed(0)
    return model, device


def prompts(model: Any, batch: int, lengths: list[int], device: str) -> tuple[Any, Any]:
    """Left-padded random prompts and their mask."""
    import torch

    g = torch.Generator().manual_seed(sum(lengths) + batch)
    vocab = model.config.vocab_size
    top = max(lengths)
    ids = torch.zeros(batch, top, dtype=torch.long)
    mask = torch.zeros(batch, top, dtype=torch.long)
    for i, n in enumerate(lengths):
        ids[i, top - n :] = torch.randint(100, vocab - 1, (n,), generator=g)
        mask[i, top - n :] = 1
    return ids.to(device), mask.to(device)


def _sync(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


def timed_generate(model: Any, ids: Any, mask: Any, new: int, device: str, **kw: Any) -> tuple[float, Any]:
    _sync(device)
    t = time.perf_counter()
    out = model.generate(
        input_ids=ids, attention_mask=mask, max_new_tokens=new, min_new_tokens=new, do_sample=False, **kw
    )
    _sync(device)
    return time.perf_counter() - t, out


def part_dyn(fh: Any, model: Any, device: str, rounds: int, prompt: int, new: int) -> None:
    import torch

    backends = ["sdpa", "cudaload_sdpa", "cudaload_sdpa_nocudnn"]
    ids, mask = prompts(model, 1, [prompt], device)
    per: dict[str, list[float]] = {b: [] for b in backends}
    for r in range(rounds):
        order = backends[r % len(backends) :] + backends[: r % len(backends)]
        for b in order:
            model.set_attn_implementation(b)
            pre, _ = timed_generate(model, ids, mask, 1, device)
            call, _ = timed_generate(model, ids, mask, new, device)
            ms = (call - pre) / (new - 1) * 1e3
            per[b].append(ms)
            emit(fh, part="dyn", round=r, backend=b, prefill_s=pre, call_s=call, ms_per_token=ms)
    for b in backends:
        xs = per[b][1:] or per[b]
        emit(
            fh,
            part="dyn-summary",
            backend=b,
            repeated_median_ms=statistics.median(xs),
            repeated_min_ms=min(xs),
            repeated_max_ms=max(xs),
            first_round_ms=per[b][0],
        )
    if device != "cuda":
        return
    from torch.profiler import ProfilerActivity, profile

    for b in backends:
        model.set_attn_implementation(b)
        timed_generate(model, ids, mask, new, device)
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            call, _ = timed_generate(model, ids, mask, new, device)
        gpu_us = sum(e.self_device_time_total for e in prof.key_averages())
        emit(
            fh,
            part="dyn-profile",
            backend=b,
            call_s=call,
            gpu_ms_per_token=gpu_us / 1e3 / new,
            top=[
                (e.key[:60], round(e.self_device_time_total / new, 1))
                for e in sorted(prof.key_averages(), key=lambda e: -e.self_device_time_total)[:8]
            ],
        )
    del torch


class GraphDecoder:
    """Greedy decode with the step captured as one CUDA graph (or, on the CPU, run eagerly: the same
    bookkeeping)."""

    def __init__(self, model: Any, batch: int, max_len: int, device: str):
        import torch
        from transformers import StaticCache

        self.model, self.batch, self.max_len, self.device = model, batch, max_len, device
        self.cache = StaticCache(config=model.config, max_cache_len=max_len)
        self.ids = torch.zeros(batch, 1, dtype=torch.long, device=device)
        self.pos = torch.zeros(batch, 1, dtype=torch.long, device=device)
        self.mask = torch.ones(batch, max_len, dtype=torch.long, device=device)
        self.tokens = torch.zeros(batch, max_len, dtype=torch.long, device=device)
        self.count = torch.zeros(1, dtype=torch.long, device=device)
        self.graph: Any = None

    def _step(self) -> None:
        import torch

        out = self.model(
            input_ids=self.ids,
            position_ids=self.pos,
            attention_mask=self.mask,
            past_key_values=self.cache,
            use_cache=True,
        )
        nxt = out.logits[:, -1, :].argmax(-1)
        self.tokens.index_copy_(1, self.count, nxt[:, None])
        self.ids.copy_(nxt[:, None])
        self.pos.add_(1)
        self.count.add_(1)
        del torch

    def prefill(self, ids: Any, mask: Any) -> None:
        import torch

        self.cache.reset()
        n = ids.shape[1]
        self.mask.fill_(1)
        self.mask[:, :n] = mask
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        out = self.model(
            input_ids=ids,
            position_ids=pos,
            attention_mask=self.mask,
            past_key_values=self.cache,
            use_cache=True,
        )
        nxt = out.logits[:, -1, :].argmax(-1)
        self.count.zero_()
        self.tokens.index_copy_(1, self.count, nxt[:, None])
        self.count.add_(1)
        self.ids.copy_(nxt[:, None])
        self.pos.copy_(mask.sum(-1, keepdim=True))
        del torch

    def _filled(self) -> list[Any]:
        return [layer.cumulative_length.clone() for layer in self.cache.layers]

    def _restore(self, filled: list[Any], ids: Any, pos: Any, count: Any) -> None:
        for layer, v in zip(self.cache.layers, filled, strict=True):
            layer.cumulative_length.copy_(v)
        self.ids.copy_(ids)
        self.pos.copy_(pos)
        self.count.copy_(count)

    def capture(self) -> float:
        """Warm-up steps on a side stream, then the capture; the cache and buffers put back as before."""
        import torch

        t = time.perf_counter()
        saved = (self._filled(), self.ids.clone(), self.pos.clone(), self.count.clone())
        if self.device != "cuda":
            return 0.0
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(2):
                self._step()
        torch.cuda.current_stream().wait_stream(s)
        self._restore(*saved)
        torch.cuda.synchronize()
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self._step()
        torch.cuda.synchronize()
        return time.perf_counter() - t

    def run(self, steps: int) -> Any:
        for _ in range(steps):
            if self.graph is not None:
                self.graph.replay()
            else:
                self._step()
        _sync(self.device)
        return self.tokens[:, : int(self.count.item())].clone()


def part_graph(
    fh: Any, model: Any, device: str, batches: list[int], prompt: int, new: int, max_len: int
) -> None:
    import torch

    model.set_attn_implementation(GRAPH_ATTN)
    for b in batches:
        lengths = [prompt - i * prompt // (2 * b) for i in range(b)]
        ids, mask = prompts(model, b, lengths, device)
        try:
            gd = GraphDecoder(model, b, max_len, device)
            with torch.no_grad():
                _sync(device)
                t = time.perf_counter()
                gd.prefill(ids, mask)
                _sync(device)
                pre = time.perf_counter() - t
                cap = gd.capture()
                # the first replays (cuBLAS / allocator first-use), then timed
                gd.run(2)
                gd.prefill(ids, mask)
                t = time.perf_counter()
                toks = gd.run(new - 1)
                step = (time.perf_counter() - t) / (new - 1)
            mem = torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else None
            emit(
                fh,
                part="graph",
                batch=b,
                prefill_s=pre,
                capture_s=cap,
                ms_per_step=step * 1e3,
                ms_per_token=step * 1e3 / b,
                steps=new - 1,
                peak_gib=mem,
            )
            # greedy parity against transformers' dynamic path (cudaload_sdpa)
            model.set_attn_implementation("cudaload_sdpa")
            n = min(new, 48)
            _, ref = timed_generate(model, ids, mask, n, device)
            model.set_attn_implementation(GRAPH_ATTN)
            ref_new = ref[:, ids.shape[1] :]
            same = []
            for row in range(b):
                k = 0
                while k < n and int(ref_new[row, k]) == int(toks[row, k]):
                    k += 1
                same.append(k)
            emit(fh, part="graph-parity", batch=b, compared=n, equal_prefix=same)
            del gd
        except Exception as e:  # an investigation: record and go on
            emit(
                fh,
                part="graph",
                batch=b,
                error=f"{type(e).__name__}: {e}"[:600],
                tb=traceback.format_exc()[-1500:],
            )
        if device == "cuda":
            torch.cuda.empty_cache()


def part_cgb(fh: Any, model: Any, device: str, prompt: int, new: int, max_len: int) -> None:
    from transformers import CompileConfig

    model.set_attn_implementation("cudaload_sdpa")
    gc = model.generation_config
    gc.cache_implementation = "static"
    gc.max_cache_len = max_len
    gc.compile_config = CompileConfig(backend="cudagraphs", mode=None, fullgraph=True)
    ids, mask = prompts(model, 1, [prompt], device)
    try:
        first, _ = timed_generate(model, ids, mask, 16, device)
        emit(fh, part="cgb", call="first 16", s=first)
        for _ in range(2):
            pre, _ = timed_generate(model, ids, mask, 1, device)
            call, _ = timed_generate(model, ids, mask, new, device)
            emit(fh, part="cgb", prefill_s=pre, call_s=call, ms_per_token=(call - pre) / (new - 1) * 1e3)
    except Exception as e:
        emit(fh, part="cgb", error=f"{type(e).__name__}: {e}"[:600], tb=traceback.format_exc()[-1500:])
    finally:
        gc.cache_implementation = None
        gc.compile_config = None
        gc.max_cache_len = None


def part_prod(
    fh: Any, model: Any, device: str, prompt: int, new: int, max_len: int, batches: list[int]
) -> dict[str, Any]:
    """cudaload's graphed decode as a user's generate() meets it: transformers' static cache, cudaload's late-stop
    loop with each decode step replayed from ``DecodeGraphs`` (each call captures: a new static cache per call).
    Parity: the dynamic path's greedy tokens, and its top-2 logit margin where the two first differ."""
    from cudaload.execute.runtime.decode_loop import graphed_sample
    from cudaload.execute.runtime.graphed_step import DecodeGraphs

    model.set_attn_implementation("cudaload_sdpa")
    graphs = DecodeGraphs(model)
    settings = {
        "cache_implementation": "static",
        "max_cache_len": max_len,
        "disable_compile": True,
        "custom_generate": graphed_sample(graphs.step),
    }
    gen = type(model).generate
    results: dict[str, Any] = {"max_len": max_len, "ms": [], "capture": []}
    for b in batches:
        lengths = [prompt - i * prompt // (2 * b) for i in range(b)]
        ids, mask = prompts(model, b, lengths, device)
        try:
            for i in range(3):
                _sync(device)
                t = time.perf_counter()
                gen(model, input_ids=ids, attention_mask=mask, max_new_tokens=1, do_sample=False, **settings)
                _sync(device)
                pre = time.perf_counter() - t
                t = time.perf_counter()
                out = gen(
                    model,
                    input_ids=ids,
                    attention_mask=mask,
                    max_new_tokens=new,
                    min_new_tokens=new,
                    do_sample=False,
                    **settings,
                )
                _sync(device)
                call = time.perf_counter() - t
                ms = (call - pre) / (new - 1) * 1e3
                emit(
                    fh,
                    part="prod",
                    batch=b,
                    call=i,
                    prefill_s=pre,
                    call_s=call,
                    ms_per_step=ms,
                    captures=list(graphs.captures),
                )
                if b == 1 and graphs.captures:
                    results["ms"].append(ms)
                    results["capture"].append(graphs.captures[-1].get("seconds"))
            n = min(new, 48)
            ref = gen(
                model,
                input_ids=ids,
                attention_mask=mask,
                max_new_tokens=n,
                min_new_tokens=n,
                do_sample=False,
                output_scores=True,
                return_dict_in_generate=True,
            )
            got = out[:, ids.shape[1] : ids.shape[1] + n]
            ref_new = ref.sequences[:, ids.shape[1] :]
            same, margins = [], []
            for row in range(b):
                k = 0
                while k < n and int(ref_new[row, k]) == int(got[row, k]):
                    k += 1
                same.append(k)
                if k < n:
                    top = ref.scores[k][row].float().topk(2).values
                    margins.append(round(float(top[0] - top[1]), 5))
            emit(fh, part="prod-parity", batch=b, compared=n, equal_prefix=same, margin_at_divergence=margins)
        except Exception as e:  # an investigation: record and go on
            emit(
                fh,
                part="prod",
                batch=b,
                error=f"{type(e).__name__}: {e}"[:600],
                tb=traceback.format_exc()[-1500:],
            )
    return results


def record(fh: Any, priors: str, res: dict[str, Any], source: str) -> None:
    """Put the graphed decode measured here into the priors' decode record of this GPU (by its name)."""
    import torch

    ms, cap = res.get("ms") or [], [c for c in res.get("capture") or [] if c is not None]
    if not ms or not cap:
        emit(fh, part="record", skipped="no graphed measurement")
        return
    major, minor = torch.cuda.get_device_capability()
    gpu = f"{torch.cuda.get_device_name()}/sm{major}{minor}"
    d = json.loads(Path(priors).read_text())
    recs = [r for r in d.get("decode", []) if r.get("gpu") == gpu]
    if not recs:
        emit(fh, part="record", skipped=f"no decode record for {gpu}")
        return
    r = recs[0]
    r["graphed_ms_per_token"] = [[res["max_len"], round(x, 2)] for x in ms]
    r["graph_capture_s"] = round(statistics.median(cap), 3)
    r["source"] = r["source"].split(" || graphed:")[0] + (
        f" || graphed: {source}, {len(ms)} calls at batch 1 (640+300, static cache of {res['max_len']:,} slots), "
        "(call - its prefill) / 299; capture: the median of theirs"
    )
    Path(priors).write_text(json.dumps(d, indent=1, ensure_ascii=False) + "\n")
    emit(
        fh,
        part="record",
        gpu=gpu,
        graphed_ms_per_token=r["graphed_ms_per_token"],
        capture=r["graph_capture_s"],
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", default="8b", choices=["8b", "0.6b", "tiny"])
    ap.add_argument("--out", required=True)
    ap.add_argument("--work", default=os.environ.get("CUDALOAD_BENCH_WORK", "/tmp/cudaload-bench"))
    ap.add_argument("--parts", default="dyn,graph,prod,cgb")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--max-len", type=int, default=4096)
    ap.add_argument("--record", help="priors.json whose decode record of this GPU gets the graphed figures")
    ap.add_argument("--record-source", default="benchmarks/investigations/decode_graphs.py's prod part")
    args = ap.parse_args(argv)
    tiny = args.shape == "tiny"
    prompt, new = (12, 8) if tiny else (640, 64)
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "a") as fh:
        t = time.perf_counter()
        model, device = load(args.shape, work)
        emit(fh, part="load", s=time.perf_counter() - t, attn=model.config._attn_implementation)
        parts = args.parts.split(",")
        if "dyn" in parts:
            part_dyn(fh, model, device, 2 if tiny else args.rounds, prompt, new)
        if "graph" in parts:
            part_graph(
                fh,
                model,
                device,
                [1, 2] if tiny else [1, 8],
                prompt,
                24 if tiny else 300,
                64 if tiny else args.max_len,
            )
        if "prod" in parts:
            res = part_prod(
                fh,
                model,
                device,
                prompt,
                24 if tiny else 300,
                64 if tiny else args.max_len,
                [1, 2] if tiny else [1, 8],
            )
            if args.record and device == "cuda":
                record(fh, args.record, res, args.record_source)
        if "cgb" in parts and not tiny:
            part_cgb(fh, model, device, prompt, 300, args.max_len)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
