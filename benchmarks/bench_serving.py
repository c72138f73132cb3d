#!/usr/bin/env python
"""Serving benchmark: many requests of mixed lengths through transformers' continuous batching, with cudaload's
serving plan and with transformers' own defaults, against plain padded ``generate()`` in fixed batches.

    python benchmarks/bench_serving.py --out DIR [--budget-s 300] [--device cuda:0] [--shapes Qwen3-0.6B,Qwen3-8B]
    python benchmarks/bench_serving.py --smoke --out /tmp/serving-smoke      # CPU, tiny model, seconds

Workload (fixed seed): 64 requests, prompt lengths uniform in [128, 2048] tokens, new tokens uniform in [128, 256];
all requests arrive at t=0; greedy; EOS disabled so every request generates exactly its new-token count.

Configurations, one model at a time (random bf16 weights built on the device from cudaload.testing.shapes):
  plan       transformers' continuous batching with the settings of cudaload's serving plan
             (``cudaload.plan(config, intent="serving", ...).serving``; ``--settings JSON`` overrides or replaces it)
  default    transformers' continuous batching with its defaults (ContinuousBatchingConfig(), the model loaded with
             its default attention, the same WorkloadHints that ``generate_batch`` would pass)
  padded32 / padded8
             ``generate()`` on fixed batches in request order, left padding + attention_mask, each batch generating
             its longest request's count; a request's latency is its batch's completion time since t=0; only the
             tokens each request asked for count as generated
  extra variants (``--variants``): the plan's settings with some keys replaced, run while budget remains; a
             variant with ``"bare": true`` starts from transformers' defaults instead of the plan's settings

Agreement: each continuous-batching run keeps every request's first generated tokens; a configuration's
``agree_first`` is the share of requests whose first token equals the ``plan`` run's (greedy on random weights:
implementations that compute the same attention agree on nearly every request; a broken path agrees on few).

Per configuration: throughput (requested tokens generated / wall seconds from submission to the last completion),
per-request latency p50/p95, peak GPU memory (allocated and reserved), OOMs caught and recorded, decode step time
(continuous batching: median gap between a request's consecutive tokens; padded: batch time / steps) beside the
bandwidth bound (weight bytes / HBM bandwidth per decode step). JSON + markdown rewritten after every configuration.
Repetitions interleave the configurations (plan, default, padded..., plan, default, ...); medians and spread reported.
The budget is shared out over what is left; a padded run that hits its share stops after the current batch and is
reported as partial (throughput over the completed batches).

--smoke runs on CPU with a tiny Qwen3: continuous batching (paged|sdpa) and padded generate() both run on CPU;
CUDA graphs, asynchronous batching and peak GPU memory do not exist there, so those fields are null.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import json
import math
import os
import random
import statistics
import sys
import time
import traceback
from pathlib import Path
from typing import Any

#: HBM3e bandwidth of one H200 (NVIDIA's datasheet figure), for the decode bound
H200_HBM_BYTES_S = 4.8e12

PADDED_BATCHES = (32, 8)

#: after the compared configurations, while budget remains: the plan with its CUDA-graph / async choices undone,
#: so one run shows what each of them is worth ('{}' to skip)
DEFAULT_VARIANTS: dict[str, dict[str, Any]] = {
    "no-graphs": {"use_cuda_graph": False, "use_async_batching": False},
    "no-async": {"use_async_batching": False},
}


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


# ------------------------------------------------------------------------------------------------------------------
# pure helpers (tested on CPU)
# ------------------------------------------------------------------------------------------------------------------
def workload(
    n: int, *, seed: int, vocab: int, prompt: tuple[int, int], new: tuple[int, int]
) -> list[tuple[list[int], int]]:
    """``n`` requests: (prompt token ids, new-token count), lengths uniform in the closed ranges, fixed seed.
    Token ids avoid the first and last 10 ids (special tokens in real vocabularies)."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        plen = rng.randint(*prompt)
        k = rng.randint(*new)
        ids = [rng.randrange(10, max(11, vocab - 10)) for _ in range(plen)]
        out.append((ids, k))
    return out


def percentile(xs: list[float], q: float) -> float | None:
    """Linear-interpolated percentile (q in [0, 100]); None for an empty list."""
    if not xs:
        return None
    s = sorted(xs)
    pos = (len(s) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def weight_bytes(model: Any) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


def decode_bound(wbytes: int, bandwidth: float, concurrency: int) -> dict[str, float]:
    """The bandwidth floor of one decode step (every weight read once) and the tokens/s it allows at a concurrency."""
    step_s = wbytes / bandwidth
    return {
        "step_ms": step_s * 1e3,
        "tokens_s_at_concurrency": concurrency / step_s,
        "concurrency": concurrency,
    }


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Median and spread of the repetitions of one configuration (only completed, non-OOM runs count)."""
    ok = [r for r in runs if r.get("tokens_s") is not None and not r.get("oom") and not r.get("error")]

    def med(key: str) -> float | None:
        vals = [r[key] for r in ok if r.get(key) is not None]
        return statistics.median(vals) if vals else None

    tps = [r["tokens_s"] for r in ok]
    return {
        "runs": len(runs),
        "ok_runs": len(ok),
        "ooms": sum(1 for r in runs if r.get("oom")),
        "errors": sum(1 for r in runs if r.get("error") and not r.get("oom")),
        "partial": any(r.get("partial") for r in ok),
        "tokens_s": med("tokens_s"),
        "tokens_s_min": min(tps) if tps else None,
        "tokens_s_max": max(tps) if tps else None,
        "tokens_s_incl_setup": med("tokens_s_incl_setup"),
        "p50_s": med("p50_s"),
        "p95_s": med("p95_s"),
        "decode_step_ms": med("decode_step_ms"),
        "setup_s": med("setup_s"),
        "peak_alloc_gib": med("peak_alloc_gib"),
        "peak_reserved_gib": med("peak_reserved_gib"),
        "agree_first": med("agree_first"),
    }


def is_oom(err: BaseException | str) -> bool:
    text = str(err).lower()
    return "out of memory" in text or "outofmemory" in text or isinstance(err, MemoryError)


def cb_kwargs_from(settings: dict[str, Any]) -> tuple[str | None, dict[str, Any]]:
    """Split a settings dict into (attention implementation, ContinuousBatchingConfig kwargs). Accepts either the
    serving section's dict (``attn_implementation`` + ``continuous_batching``) or a flat dict of config fields."""
    attn = settings.get("attn_implementation")
    if "continuous_batching" in settings:
        kw = dict(settings["continuous_batching"])
    else:
        kw = {k: v for k, v in settings.items() if k != "attn_implementation"}
    if isinstance(kw.get("use_cuda_graph"), list):
        kw["use_cuda_graph"] = tuple(kw["use_cuda_graph"])
    return attn, kw


# ------------------------------------------------------------------------------------------------------------------
# device side
# ------------------------------------------------------------------------------------------------------------------
class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.t0 = time.perf_counter()
        self.out = Path(args.out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.results: dict[str, Any] = {"meta": {}, "models": {}}

    # budget
    def left(self) -> float:
        return self.args.budget_s - (time.perf_counter() - self.t0)

    def save(self) -> None:
        self.results["meta"]["elapsed_s"] = round(time.perf_counter() - self.t0, 1)
        tmp = self.out / "serving.json.tmp"
        tmp.write_text(json.dumps(self.results, indent=1, default=str))
        os.replace(tmp, self.out / "serving.json")
        (self.out / "serving.md").write_text(render_markdown(self.results))

    # memory
    def reset_peak(self) -> None:
        import torch

        gc.collect()
        if self.cuda:
            torch.cuda.synchronize(self.device)
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(self.device)

    def peaks(self) -> dict[str, float | None]:
        import torch

        if not self.cuda:
            return {"peak_alloc_gib": None, "peak_reserved_gib": None}
        torch.cuda.synchronize(self.device)
        return {
            "peak_alloc_gib": torch.cuda.max_memory_allocated(self.device) / 2**30,
            "peak_reserved_gib": torch.cuda.max_memory_reserved(self.device) / 2**30,
        }

    def setup(self) -> None:
        import torch

        self.device = torch.device(self.args.device)
        self.cuda = self.device.type == "cuda"
        if self.cuda:
            torch.cuda.set_device(self.device)
        from importlib import metadata

        vers = {}
        for d in ("torch", "transformers", "flash-attn", "flash-attn-4", "kernels"):
            try:
                vers[d] = metadata.version(d)
            except metadata.PackageNotFoundError:
                vers[d] = None
        self.results["meta"] = {
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "command": " ".join([os.path.basename(sys.executable), *sys.argv]),
            "device": torch.cuda.get_device_name(self.device) if self.cuda else "cpu",
            "versions": vers,
            "budget_s": self.args.budget_s,
            "requests": self.args.requests,
            "prompt_range": self.args.prompt,
            "new_range": self.args.new,
            "seed": self.args.seed,
            "smoke": self.args.smoke,
            "bandwidth_bytes_s": self.args.bandwidth,
        }

    # model
    def config_for(self, shape: str) -> Any:
        if self.args.smoke:
            from cudaload.testing.models import tiny_config

            return tiny_config("qwen3")
        from cudaload.testing import full_config

        return full_config(shape)

    def build(self, shape: str, config: Any) -> Any:
        import torch
        from transformers import AutoModelForCausalLM

        dtype = torch.float32 if self.args.smoke else torch.bfloat16
        t = time.perf_counter()
        # random weights made directly on the device: no checkpoint, no Hub
        with torch.device(self.device):
            model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation="sdpa")
        model.eval()
        gcfg = model.generation_config
        gcfg.do_sample = False
        gcfg.eos_token_id = None  # every request generates exactly its count
        gcfg.pad_token_id = 0
        gcfg.temperature = None
        gcfg.top_p = None
        gcfg.top_k = None
        model.config.eos_token_id = None
        log(f"{shape}: built in {time.perf_counter() - t:.1f}s ({weight_bytes(model) / 1e9:.2f} GB)")
        return config, model

    def plan_settings(self, config: Any, reqs: list[tuple[list[int], int]]) -> tuple[dict[str, Any], Any]:
        """The serving plan's settings (attention implementation + ContinuousBatchingConfig kwargs)."""
        if self.args.settings:
            raw = self.args.settings
            return json.loads(Path(raw).read_text() if os.path.exists(raw) else raw), "from --settings"
        try:
            import cudaload

            longest = max(len(p) + k for p, k in reqs)
            p = cudaload.plan(config, intent="serving", seq_len=longest, batch_size=len(reqs))
            serving = getattr(p, "serving", None)
            if serving is None:
                return (
                    {},
                    "plan has no serving section (intent serving not implemented): transformers defaults",
                )
            from dataclasses import fields

            from transformers.generation.configuration_utils import ContinuousBatchingConfig

            names = [f.name for f in fields(ContinuousBatchingConfig)]
            return dict(serving.settings(names)), serving.to_dict()
        except Exception as e:  # the benchmark still compares the rest
            return {}, f"plan failed: {type(e).__name__}: {e}"

    # runs
    def run_cb(
        self,
        model: Any,
        reqs: list[tuple[list[int], int]],
        attn: str | None,
        cb_kw: dict[str, Any],
        cap_s: float,
    ) -> dict[str, Any]:
        from transformers.generation.configuration_utils import ContinuousBatchingConfig
        from transformers.generation.continuous_batching.utils import WorkloadHints

        model.set_attn_implementation(attn or "sdpa")
        hints = WorkloadHints(
            max_prompt_length=max(len(p) for p, _ in reqs),
            max_generated_length=max(k for _, k in reqs),
            num_requests=len(reqs),
        )
        res: dict[str, Any] = {"attn_requested": attn or "sdpa (model default)", "cb_config_in": cb_kw}
        self.reset_peak()
        t_setup = time.perf_counter()
        cm = model.continuous_batching_context_manager(
            generation_config=model.generation_config,
            continuous_batching_config=ContinuousBatchingConfig(**cb_kw),
            block=True,
            timeout=30,
            workload_hints=hints,
        )
        done: dict[str, Any] = {}
        try:
            with cm as manager:
                res["setup_s"] = time.perf_counter() - t_setup
                resolved = manager.continuous_batching_config
                res["cb_config_resolved"] = {
                    k: getattr(resolved, k, None)
                    for k in (
                        "block_size",
                        "num_blocks",
                        "max_batch_tokens",
                        "max_requests_per_batch",
                        "max_blocks_per_request",
                        "use_cuda_graph",
                        "use_async_batching",
                        "max_memory_percent",
                        "q_padding_interval_size",
                        "kv_padding_interval_size",
                    )
                }
                res["attn_used"] = model.config._attn_implementation
                t0 = time.perf_counter()
                ids = {}
                for i, (p, k) in enumerate(reqs):
                    rid = manager.add_request(
                        p, request_id=f"r{i}", max_new_tokens=k, eos_token_id=-1, record_timestamps=True
                    )
                    ids[rid] = i
                deadline = t0 + cap_s
                while len(done) < len(reqs):
                    r = manager.get_result(timeout=1.0)
                    if r is not None and r.is_finished():
                        done[r.request_id] = r
                    elif r is None and not manager.is_running():
                        res["error"] = "generation thread stopped"
                        break
                    if time.perf_counter() > deadline:
                        res["partial"] = True
                        break
        except Exception as e:
            res["error"] = f"{type(e).__name__}: {str(e)[:400]}"
            res["oom"] = is_oom(e)
            res.update(self.peaks())
            return res
        res.update(self.peaks())
        errors = [r.error for r in done.values() if r.error]
        if errors:
            res["error"] = f"{len(errors)} requests failed: {str(errors[0])[:300]}"
            res["oom"] = any(is_oom(e) for e in errors)
        good = [r for r in done.values() if not r.error]
        res["first_tokens"] = {r.request_id: list(r.generated_tokens[:4]) for r in good}
        wrong = [r.request_id for r in good if len(r.generated_tokens) != reqs[ids[r.request_id]][1]]
        if wrong:
            res["wrong_lengths"] = len(wrong)
        if good:
            last = max(r.lifespan[1] for r in good)
            res["wall_s"] = last - t0
            res["completed"] = len(good)
            res["generated_tokens"] = sum(len(r.generated_tokens) for r in good)
            res["tokens_s"] = res["generated_tokens"] / res["wall_s"] if res["wall_s"] > 0 else None
            # the manager's set-up (cache allocation, CUDA-graph warm-up captures) counted too
            res["tokens_s_incl_setup"] = res["generated_tokens"] / (res["wall_s"] + res.get("setup_s", 0.0))
            lat = [r.lifespan[1] - t0 for r in good]
            res["p50_s"], res["p95_s"] = percentile(lat, 50), percentile(lat, 95)
            gaps = []
            for r in good:
                ts = r.timestamps or []
                gaps.extend(b - a for a, b in itertools.pairwise(ts))
            res["decode_step_ms"] = statistics.median(gaps) * 1e3 if gaps else None
        if res.get("partial") and good:
            res["partial_note"] = f"stopped at its time share: {len(good)}/{len(reqs)} requests completed"
        del done
        return res

    def run_padded(
        self, model: Any, reqs: list[tuple[list[int], int]], batch: int, cap_s: float
    ) -> dict[str, Any]:
        import torch

        model.set_attn_implementation("sdpa")
        res: dict[str, Any] = {"batch": batch}
        self.reset_peak()
        lat: list[float] = []
        gen = 0
        steps_ms: list[float] = []
        t0 = time.perf_counter()
        try:
            for start in range(0, len(reqs), batch):
                chunk = reqs[start : start + batch]
                width = max(len(p) for p, _ in chunk)
                k = max(n for _, n in chunk)
                ids = torch.zeros((len(chunk), width), dtype=torch.long)
                mask = torch.zeros((len(chunk), width), dtype=torch.long)
                for j, (p, _) in enumerate(chunk):
                    ids[j, width - len(p) :] = torch.tensor(p)
                    mask[j, width - len(p) :] = 1
                tb = time.perf_counter()
                with torch.no_grad():
                    out = model.generate(
                        input_ids=ids.to(self.device),
                        attention_mask=mask.to(self.device),
                        max_new_tokens=k,
                        min_new_tokens=k,
                        do_sample=False,
                        pad_token_id=0,
                        eos_token_id=None,
                    )
                if self.cuda:
                    torch.cuda.synchronize(self.device)
                now = time.perf_counter()
                if out.shape[1] - width != k:
                    res["wrong_lengths"] = True
                del out
                steps_ms.append((now - tb) / k * 1e3)
                lat.extend([now - t0] * len(chunk))
                gen += sum(n for _, n in chunk)
                if now - t0 > cap_s and start + batch < len(reqs):
                    res["partial"] = True
                    res["partial_note"] = (
                        f"stopped at its time share after {len(lat)}/{len(reqs)} requests; throughput over those"
                    )
                    break
        except Exception as e:
            res["error"] = f"{type(e).__name__}: {str(e)[:400]}"
            res["oom"] = is_oom(e)
        t_end = time.perf_counter()
        res.update(self.peaks())
        if lat:
            res["completed"] = len(lat)
            res["generated_tokens"] = gen
            res["wall_s"] = max(lat)
            res["tokens_s"] = gen / max(lat)
            res["p50_s"], res["p95_s"] = percentile(lat, 50), percentile(lat, 95)
            # whole-batch time / steps: includes the prefill, so an upper bound on the decode step
            res["decode_step_ms"] = statistics.median(steps_ms)
        res["elapsed_s"] = t_end - t0
        return res

    def warm(self, model: Any) -> None:
        import torch

        model.set_attn_implementation("sdpa")
        ids = torch.randint(10, 100, (2, 32), device=self.device)
        with torch.no_grad():
            model.generate(input_ids=ids, max_new_tokens=4, min_new_tokens=4, do_sample=False, pad_token_id=0)

    def main(self) -> None:
        import torch

        self.setup()
        a = self.args
        shapes = a.shapes if not a.smoke else ["tiny-qwen3"]
        variants: dict[str, dict[str, Any]] = json.loads(a.variants) if a.variants else {}
        for si, shape in enumerate(shapes):
            if self.left() < 20:
                self.results["models"][shape] = {"skipped": "budget"}
                self.save()
                continue
            entry: dict[str, Any] = {"configs": {}, "runs": []}
            self.results["models"][shape] = entry
            config = self.config_for(shape)
            vocab = int(config.vocab_size)
            reqs = workload(a.requests, seed=a.seed, vocab=vocab, prompt=tuple(a.prompt), new=tuple(a.new))
            entry["requested_tokens"] = sum(k for _, k in reqs)
            # planned before the model exists, as a user plans before loading (the device is still free)
            settings, plan_info = self.plan_settings(config, reqs)
            entry["plan_settings"] = settings
            entry["plan_serving"] = plan_info
            log(f"{shape}: plan settings {settings}")
            try:
                config, model = self.build(shape, config)
            except Exception as e:
                entry["error"] = f"build: {type(e).__name__}: {e}"
                entry["oom"] = is_oom(e)
                self.save()
                continue
            wb = weight_bytes(model)
            entry["weight_bytes"] = wb
            entry["bound"] = decode_bound(wb, a.bandwidth, min(a.requests, 64))
            self.warm(model)
            order: list[tuple[str, Any]] = [("plan", settings), ("default", {})]
            order += [(f"padded{b}", b) for b in a.padded]
            order += [
                (
                    f"plan+{name}",
                    {
                        **cb_kwargs_from(settings)[1],
                        **v,
                        "attn_implementation": v.get("attn_implementation", cb_kwargs_from(settings)[0]),
                    },
                )
                if not v.get("bare")
                else (f"default+{name}", {k: x for k, x in v.items() if k != "bare"})
                for name, v in variants.items()
            ]
            n_main = 2 + len(a.padded)
            # the budget left is shared by this model and the ones after it
            share = self.left() / (len(shapes) - si)
            t_model = time.perf_counter()
            for rep in range(a.reps):
                for oi, (name, what) in enumerate(order):
                    left_model = share - (time.perf_counter() - t_model)
                    # the compared configurations first: variants share what the last repetition leaves
                    remaining = n_main * (a.reps - rep) - oi if oi < n_main else len(order) - oi
                    cap = max(10.0, left_model / max(1, remaining))
                    if oi >= n_main and rep < a.reps - 1:
                        continue  # variants run once, after the last repetition of the compared configurations
                    if left_model < 5 or self.left() < 5:
                        entry["runs"].append({"config": name, "rep": rep, "skipped": "budget"})
                        continue
                    log(f"{shape} rep {rep} {name}: time share {cap:.0f}s")
                    try:
                        if name.startswith("padded"):
                            r = self.run_padded(model, reqs, int(what), cap)
                        else:
                            attn, kw = cb_kwargs_from(what)
                            # a bench-only switch, not a ContinuousBatchingConfig field: torch's cuDNN SDPA
                            # backend off for this run (it builds a plan per new KV length on torch 2.11)
                            cudnn = kw.pop("sdpa_cudnn", None)
                            if a.smoke:
                                # on CPU transformers sizes the cache from host RAM (90% of what is free): the
                                # smoke run caps it instead of zero-filling gigabytes on a shared machine
                                kw = {"num_blocks": 64, "max_batch_tokens": 256, **kw}
                            if cudnn is False and self.cuda:
                                torch.backends.cuda.enable_cudnn_sdp(False)
                            try:
                                r = self.run_cb(model, reqs, attn, kw, cap)
                            finally:
                                if cudnn is False and self.cuda:
                                    torch.backends.cuda.enable_cudnn_sdp(True)
                    except Exception as e:  # recorded, never fatal
                        r = {
                            "error": f"{type(e).__name__}: {str(e)[:400]}",
                            "oom": is_oom(e),
                            "trace": traceback.format_exc()[-800:],
                        }
                    r.update({"config": name, "rep": rep})
                    ref = next(
                        (
                            x.get("first_tokens")
                            for x in entry["runs"]
                            if x.get("config") == "plan" and x.get("first_tokens")
                        ),
                        None,
                    )
                    if ref and r.get("first_tokens"):
                        same = [ref[k][:1] == t[:1] for k, t in r["first_tokens"].items() if k in ref]
                        r["agree_first"] = sum(same) / len(same) if same else None
                    entry["runs"].append(r)
                    log(
                        f"  -> {fmt(r.get('tokens_s'))} tok/s p50 {fmt(r.get('p50_s'))}s p95 {fmt(r.get('p95_s'))}s"
                        f" peak {fmt(r.get('peak_alloc_gib'))} GiB"
                        + (f" ERROR {r['error']}" if r.get("error") else "")
                        + (" (partial)" if r.get("partial") else "")
                    )
                    entry["configs"] = {
                        n: summarize(
                            [x for x in entry["runs"] if x.get("config") == n and "skipped" not in x]
                        )
                        for n, _ in order
                    }
                    self.save()
            del model
            gc.collect()
            if self.cuda:
                torch.cuda.empty_cache()
        self.save()
        log(f"done in {time.perf_counter() - self.t0:.0f}s -> {self.out / 'serving.json'}")


def fmt(x: Any, digits: int = 3) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:.{digits}g}"
    return str(x)


def render_markdown(results: dict[str, Any]) -> str:
    m = results.get("meta", {})
    lines = [
        "# Serving benchmark",
        "",
        f"{m.get('date')} on {m.get('device')}, {m.get('versions')}; {m.get('requests')} requests, prompts "
        f"{m.get('prompt_range')}, new tokens {m.get('new_range')}, seed {m.get('seed')}; elapsed {m.get('elapsed_s')} s",
        "",
    ]
    for shape, e in results.get("models", {}).items():
        lines.append(f"## {shape}")
        if "skipped" in e or "error" in e:
            lines += [f"{e.get('skipped') or e.get('error')}", ""]
            continue
        b = e.get("bound", {})
        lines.append(
            f"weights {e.get('weight_bytes', 0) / 1e9:.2f} GB; decode bandwidth bound {fmt(b.get('step_ms'))} ms/step "
            f"= {fmt(b.get('tokens_s_at_concurrency'))} tok/s at {b.get('concurrency')} concurrent requests; "
            f"plan settings `{json.dumps(e.get('plan_settings'))}`"
        )
        lines += [
            "",
            "| config | tok/s (median) | min-max | vs best padded | vs default | p50 s | p95 s | decode ms/step "
            "| bound ms/step | setup s | tok/s incl. setup | peak alloc GiB | first token = plan's | runs ok/all | OOM "
            "| partial |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        cfgs = e.get("configs", {})
        pads = [c.get("tokens_s") for n, c in cfgs.items() if n.startswith("padded") and c.get("tokens_s")]
        base_pad = max(pads) if pads else None  # the best padded generate() batch
        base_def = (cfgs.get("default") or {}).get("tokens_s")
        for name, s in cfgs.items():
            t = s.get("tokens_s")
            lines.append(
                f"| {name} | {fmt(t, 4)} | {fmt(s.get('tokens_s_min'), 4)}-{fmt(s.get('tokens_s_max'), 4)} "
                f"| {fmt(t / base_pad if t and base_pad else None)}x | {fmt(t / base_def if t and base_def else None)}x "
                f"| {fmt(s.get('p50_s'))} | {fmt(s.get('p95_s'))} | {fmt(s.get('decode_step_ms'))} "
                f"| {fmt(b.get('step_ms'))} | {fmt(s.get('setup_s'))} | {fmt(s.get('tokens_s_incl_setup'), 4)} "
                f"| {fmt(s.get('peak_alloc_gib'))} | {fmt(s.get('agree_first'))} "
                f"| {s.get('ok_runs')}/{s.get('runs')} | {s.get('ooms')} | {s.get('partial')} |"
            )
        errs = [
            f"{r.get('config')} rep {r.get('rep')}: {r['error']}" for r in e.get("runs", []) if r.get("error")
        ]
        if errs:
            lines += ["", "Errors:", *[f"- {x}" for x in errs]]
        lines.append("")
    return "\n".join(lines) + "\n"


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--budget-s", type=float, default=300.0)
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--smoke", action="store_true", help="CPU, tiny Qwen3, 8 short requests")
    ap.add_argument("--shapes", default="Qwen3-0.6B,Qwen3-8B")
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--prompt", type=int, nargs=2, default=[128, 2048], metavar=("MIN", "MAX"))
    ap.add_argument("--new", type=int, nargs=2, default=[128, 256], metavar=("MIN", "MAX"))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument(
        "--padded", default="32,8", help="padded generate() batch sizes, comma-separated ('' for none)"
    )
    ap.add_argument(
        "--bandwidth", type=float, default=H200_HBM_BYTES_S, help="HBM bytes/s for the decode bound"
    )
    ap.add_argument(
        "--settings",
        default=None,
        help="JSON (or a file) replacing the plan's settings: {'attn_implementation': ..., "
        "'continuous_batching': {ContinuousBatchingConfig kwargs}} or a flat dict of those kwargs",
    )
    ap.add_argument(
        "--variants",
        default=json.dumps(DEFAULT_VARIANTS),
        help="JSON {name: {kwargs replacing the plan's}}: extra continuous-batching runs while budget remains",
    )
    a = ap.parse_args(argv)
    a.shapes = [s for s in a.shapes.split(",") if s]
    a.padded = [int(x) for x in a.padded.split(",") if x]
    if a.smoke:
        a.device = "cpu"
        if a.requests == 64:
            a.requests = 8
        if a.prompt == [128, 2048]:
            a.prompt = [8, 48]
        if a.new == [128, 256]:
            a.new = [4, 8]
        a.padded = [4] if a.padded == [32, 8] else a.padded
        a.budget_s = min(a.budget_s, 120.0)
    return a


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    Bench(parse(argv)).main()
    return 0


if __name__ == "__main__":
    sys.exit(main())
