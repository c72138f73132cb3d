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
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

SECTIONS = ("load", "choice", "memory", "overheads", "firstuse")
ALL_SECTIONS = (*SECTIONS, "plot")
TITLES = {
    "load": "1. Load: time to a ready model, peak GPU and host memory",
    "choice": "2. Choice quality: cudaload's attention choice against every usable backend",
    "memory": "3. Memory: the plan's estimates against measured peaks",
    "overheads": "4. Overheads: import, detect(), plan()",
    "firstuse": "5. First-use costs: FA4 JIT in time to first token, with and without warm-up",
    "plot": "6. Plot",
}
#: --shapes names -> full-size config names in cudaload.testing.FULL_SHAPES
SHAPES = {"0.6b": "Qwen3-0.6B", "8b": "Qwen3-8B"}
QUANTS = ("bf16", "int8", "nf4")
#: what cudaload.load_model / plan get for each --quant name
CUDALOAD_QUANT = {"bf16": "none", "int8": "int8", "nf4": "nf4"}
#: configs planned in the overheads section (70B is never loaded, only planned)
PLAN_CONFIGS = ("Qwen3-0.6B", "Qwen3-8B", "Llama-3.1-70B")
#: usable backends the choice section leaves out unless cudaload chooses them or --backends names them
UNTIMED_BY_DEFAULT = ("flex_attention",)
GOAL_CHOICE = 0.95  # cudaload's backend at least this fraction of the fastest
GOAL_MEMORY = 0.05  # estimates within 5% of measured peaks
GOAL_IMPORT_MS = 50.0
GOAL_DETECT_MS = 100.0
GOAL_PLAN_S = 1.0
RESULT_TAG = "BENCH-RESULT "
SHARD_BYTES = 4 * 2**30  # like the Hub's Qwen3-8B: a handful of ~4 GB shards with an index


# ----------------------------------------------------------------------------------------------------
# small pure helpers (unit-tested in tests/test_benchmarks.py)
# ----------------------------------------------------------------------------------------------------
def median(xs: Iterable[float | None]) -> float | None:
    vals = [x for x in xs if x is not None]
    return statistics.median(vals) if vals else None


def ratio(a: float | None, b: float | None) -> float | None:
    """a / b, or None when either is missing or b is zero."""
    if a is None or b is None or b == 0:
        return None
    return a / b


def csv(value: str) -> list[str]:
    return [v.strip() for v in value.split(",") if v.strip()]


def fmt(x: Any, digits: int = 3) -> str:
    if x is None:
        return "-"
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, float):
        return f"{x:.{digits}g}" if abs(x) < 1000 else f"{x:.0f}"
    return str(x)


def gib(n: float | None) -> str:
    return "-" if n is None else f"{n / 2**30:.2f}"


def human(n: float | None) -> str:
    """Bytes for a table cell: GiB for model-sized numbers, smaller units for the tiny CI shapes."""
    if n is None:
        return "-"
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= size:
            return f"{n / size:.3g} {unit}" if abs(n) < 1000 * size else f"{n / size:.0f} {unit}"
    return f"{n:.0f} B"


def md_table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for r in rows:
        out.append("| " + " | ".join(fmt(c) for c in r) + " |")
    return out


def within(r: float | None, tol: float) -> bool | None:
    return None if r is None else abs(r - 1.0) <= tol


# ----------------------------------------------------------------------------------------------------
# worker side: one measurement per fresh process; prints one RESULT_TAG line of JSON
# ----------------------------------------------------------------------------------------------------
def _device() -> str:
    import torch

    return "cuda:0" if torch.cuda.is_available() else "cpu"


def _sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize(device)


def _rss_now() -> int | None:
    try:
        with open("/proc/self/statm", encoding="ascii") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def _rss_peak() -> int:
    """This process image's peak RSS (VmHWM). Not getrusage's ru_maxrss: a worker started by fork+exec
    inherits its parent's ru_maxrss, so a parent that once held a big checkpoint would show in every worker."""
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def _bnb_config(quant: str) -> Any:
    """The quantization_config a careful transformers user writes (explicit: not bnb's fp4/fp32 defaults)."""
    import torch
    from transformers import BitsAndBytesConfig

    if quant == "int8":
        return BitsAndBytesConfig(load_in_8bit=True)
    if quant == "nf4":
        return BitsAndBytesConfig(
            load_in_4bit=True,
            bnb_4bit_quant_type="nf4",
            bnb_4bit_use_double_quant=True,
            bnb_4bit_compute_dtype=torch.bfloat16,
        )
    return None


def _input_ids(model: Any, batch: int, length: int, device: str) -> Any:
    import torch

    g = torch.Generator().manual_seed(1234)
    vocab = int(model.config.vocab_size)
    # ids >= 4 so no special token (pad/bos/eos of the tiny tokenizer) lands in the prompt
    return torch.randint(4, vocab, (batch, length), generator=g).to(device)


def w_write(spec: dict[str, Any]) -> dict[str, Any]:
    """Write a random bf16 checkpoint of a full-size shape as safetensors (sharded above SHARD_BYTES)."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM

    from cudaload.testing import full_config

    out = Path(spec["path"])
    out.mkdir(parents=True, exist_ok=True)
    config = full_config(spec["config"])
    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(config)
    # named_parameters() yields a tied weight once (under its first name), as save_pretrained stores it
    names = {n: tuple(p.shape) for n, p in skeleton.named_parameters()}
    persistent = set(skeleton.state_dict())
    names.update({n: tuple(b.shape) for n, b in skeleton.named_buffers() if n in persistent})
    gen_device = "cuda:0" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    t0 = time.perf_counter()
    shards: list[dict[str, Any]] = [{}]
    sizes = [0]
    for name, shape in names.items():
        n = 1
        for d in shape:
            n *= d
        if sizes[-1] and sizes[-1] + 2 * n > int(spec.get("shard_bytes", SHARD_BYTES)):
            shards.append({})
            sizes.append(0)
        shards[-1][name] = shape
        sizes[-1] += 2 * n
    weight_map: dict[str, str] = {}
    total = 0
    for i, shard in enumerate(shards):
        fname = (
            "model.safetensors" if len(shards) == 1 else f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        )
        tensors = {}
        for name, shape in shard.items():
            if len(shape) == 1 and "norm" in name:
                t = torch.ones(shape, dtype=torch.bfloat16, device=gen_device)
            else:
                # small values keep random-weight activations finite through every layer
                t = torch.randn(shape, dtype=torch.bfloat16, device=gen_device).mul_(0.02)
            tensors[name] = t.cpu()
            weight_map[name] = fname
            total += tensors[name].numel() * 2
        save_file(tensors, str(out / fname), metadata={"format": "pt"})
        del tensors
    if len(shards) > 1:
        (out / "model.safetensors.index.json").write_text(
            json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=1)
        )
    config.save_pretrained(out)  # no global sync: a cold measurement fsyncs the files it evicts
    return {
        "bytes": total,
        "files": len(shards),
        "seconds": time.perf_counter() - t0,
        "generated_on": gen_device,
    }


def _preimport(path: str, *, cudaload_modules: bool, quant: str = "bf16") -> float:
    """Import what a load imports lazily, so load times compare loading, not module imports (timed apart).

    The model's modeling module (both sides import it on first use), bitsandbytes for quantized loads, and
    cudaload's own modules for the cudaload side. An attention package (flash_attn.cute) is not pre-imported:
    its import is part of what choosing it costs.
    """
    import importlib

    import transformers

    t = time.perf_counter()
    config = transformers.AutoConfig.from_pretrained(path)
    _ = transformers.AutoModelForCausalLM._model_mapping[type(config)]  # imports modeling_<type>
    import transformers.generation

    if quant != "bf16":
        import bitsandbytes  # noqa: F401
    if cudaload_modules:
        for mod in ("cudaload.detection", "cudaload.planner", "cudaload.execute", "cudaload.fastload"):
            with contextlib.suppress(ImportError):
                importlib.import_module(mod)
    return time.perf_counter() - t


def w_load(spec: dict[str, Any]) -> dict[str, Any]:
    """Time one load to a ready model: cudaload.load_model or plain from_pretrained."""
    import torch
    import transformers

    import cudaload

    device = _device()
    cuda = device.startswith("cuda")
    quant = spec["quant"]
    imports_s = _preimport(spec["path"], cudaload_modules=spec["method"] == "cudaload", quant=quant)
    rss_before = _rss_now()
    if cuda:
        torch.cuda.init()  # context creation is not load time, for either side
        torch.cuda.reset_peak_memory_stats()
    out: dict[str, Any] = {"device": device}
    t0 = time.perf_counter()
    if spec["method"] == "cudaload":
        model = cudaload.load_model(spec["path"], quantization=CUDALOAD_QUANT[quant])
        _sync(device)
        seconds = time.perf_counter() - t0
        plan = model.cudaload_plan
        v = plan.verified or {}
        out.update(
            {
                "load_path": v.get("load_path"),
                "verified_load_seconds": v.get("load_seconds"),
                "attention": plan.attention.choice,
                "dtype": plan.dtype.choice,
                "quantization": plan.quantization.choice,
                "notes": v.get("notes"),
            }
        )
    else:
        kw: dict[str, Any] = {
            "dtype": torch.bfloat16 if cuda else torch.float32,
            "device_map": "cuda" if cuda else "cpu",
        }
        qcfg = _bnb_config(quant)
        if qcfg is not None:
            kw["quantization_config"] = qcfg
        model = transformers.AutoModelForCausalLM.from_pretrained(spec["path"], **kw)
        _sync(device)
        seconds = time.perf_counter() - t0
        out["kwargs"] = {k: str(v) for k, v in kw.items()}
    out.update(
        {"seconds": seconds, "imports_s": imports_s, "rss_before": rss_before, "rss_peak": _rss_peak()}
    )
    if cuda:
        out.update(
            {
                "gpu_peak": torch.cuda.max_memory_allocated(),
                "gpu_final": torch.cuda.memory_allocated(),
                "gpu_reserved_peak": torch.cuda.max_memory_reserved(),
            }
        )
    return out


def _time_call(fn: Callable[[], Any], device: str) -> float:
    """Seconds for fn(): CUDA events on a GPU (launch queue included), perf_counter on CPU."""
    import torch

    if device.startswith("cuda"):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize(device)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize(device)
        return float(start.elapsed_time(end)) / 1000.0
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def w_choice(spec: dict[str, Any]) -> dict[str, Any]:
    """Time every requested attention backend on one loaded model: prefill ms and greedy decode tokens/s."""
    import torch
    import transformers

    device = _device()
    cuda = device.startswith("cuda")
    model = transformers.AutoModelForCausalLM.from_pretrained(
        spec["path"],
        dtype=torch.bfloat16 if cuda else torch.float32,
        device_map=device,
        attn_implementation="sdpa",
    )
    model.eval()
    new = int(spec["new_tokens"])
    rows: list[dict[str, Any]] = []
    for backend in spec["backends"]:
        try:
            model.set_attn_implementation(backend)
        except Exception as e:  # a backend that cannot be set is a result, not a crash
            rows.extend(
                {"backend": backend, "work": w["name"], "error": f"{type(e).__name__}: {e}"[:300]}
                for w in spec["works"]
            )
            continue
        for w in spec["works"]:
            row: dict[str, Any] = {
                "backend": backend,
                "work": w["name"],
                "batch": w["batch"],
                "prompt": w["prompt"],
                "new_tokens": new,
            }
            try:
                ids = _input_ids(model, w["batch"], w["prompt"], device)
                mask = torch.ones_like(ids)
                gen_kw = {
                    "max_new_tokens": new,
                    "min_new_tokens": new,
                    "do_sample": False,
                    "pad_token_id": 0,
                    "attention_mask": mask,
                }

                def prefill(ids: Any = ids, mask: Any = mask) -> None:
                    model(input_ids=ids, attention_mask=mask, use_cache=True, logits_to_keep=1)

                def generate(ids: Any = ids, gen_kw: dict[str, Any] = gen_kw) -> None:
                    model.generate(ids, **gen_kw)

                with torch.no_grad():
                    # warm-up: first calls pay JIT compiles (FA4), allocator growth and cuBLAS heuristics
                    t_first = _time_call(prefill, device)
                    model.generate(
                        ids,
                        max_new_tokens=2,
                        min_new_tokens=2,
                        do_sample=False,
                        pad_token_id=0,
                        attention_mask=mask,
                    )
                    pre = [_time_call(prefill, device) for _ in range(int(spec["prefill_reps"]))]
                    gens = [_time_call(generate, device) for _ in range(int(spec["generate_reps"]))]
                p, g = median(pre), median(gens)
                assert p is not None and g is not None
                # decode = generate minus its prefill; tokens after the first, summed over the batch
                decode_s = max(g - p, 1e-9)
                row.update(
                    {
                        "prefill_ms": p * 1000,
                        "generate_s": g,
                        "first_prefill_s": t_first,
                        "decode_tok_s": w["batch"] * (new - 1) / decode_s,
                    }
                )
            except Exception as e:
                row["error"] = f"{type(e).__name__}: {e}"[:300]
                if cuda:
                    torch.cuda.empty_cache()
            rows.append(row)
    return {"device": device, "rows": rows}


def w_memory(spec: dict[str, Any]) -> dict[str, Any]:
    """Load through cudaload, then run a forward at each planned (batch, seq_len); peaks for both."""
    import torch

    import cudaload

    torch.cuda.init()
    free0, total_mem = torch.cuda.mem_get_info()
    torch.cuda.reset_peak_memory_stats()
    model = cudaload.load_model(spec["path"], quantization=CUDALOAD_QUANT[spec["quant"]])
    torch.cuda.synchronize()
    free1, _ = torch.cuda.mem_get_info()
    load = {
        "gpu_peak": torch.cuda.max_memory_allocated(),
        "gpu_final": torch.cuda.memory_allocated(),
        "gpu_reserved": torch.cuda.memory_reserved(),
        "device_used": total_mem - free1,
        "device_used_before_load": total_mem - free0,
    }
    # what the process holds outside torch's allocator: the CUDA context, cuBLAS/cuDNN workspaces, libraries
    load["outside_allocator"] = load["device_used"] - load["gpu_reserved"]
    forwards = []
    for w in spec["works"]:
        row: dict[str, Any] = {"work": w["name"], "batch": w["batch"], "seq_len": w["seq_len"]}
        try:
            ids = _input_ids(model, w["batch"], w["seq_len"], "cuda:0")
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
            with torch.no_grad():
                # as generate() runs its prefill: KV cache kept, logits for the last position only
                out = model(
                    input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=True, logits_to_keep=1
                )
            torch.cuda.synchronize()
            free2, _ = torch.cuda.mem_get_info()
            row.update(
                {
                    "gpu_peak": torch.cuda.max_memory_allocated(),
                    "gpu_reserved_peak": torch.cuda.max_memory_reserved(),
                    "device_used": total_mem - free2,
                }
            )
            del out
        except Exception as e:
            row["error"] = f"{type(e).__name__}: {e}"[:300]
        forwards.append(row)
    plan = model.cudaload_plan
    return {
        "load": load,
        "forwards": forwards,
        "attention": plan.attention.choice,
        "quantization": plan.quantization.choice,
    }


def w_overheads(spec: dict[str, Any]) -> dict[str, Any]:
    """import cudaload after torch, detect() cold and warm, plan() of full-size configs."""
    t0 = time.perf_counter()
    import torch

    before = set(sys.modules)  # torch itself imports pynvml: count only what cudaload adds
    t1 = time.perf_counter()
    import cudaload

    t2 = time.perf_counter()
    heavy = sorted(
        m
        for m in ("transformers", "accelerate", "safetensors", "pynvml")
        if m in sys.modules and m not in before
    )
    out: dict[str, Any] = {
        "import_torch_s": t1 - t0,
        "import_cudaload_s": t2 - t1,
        "heavy_modules_after_import": heavy,
        "cuda_initialized_after_import": bool(torch.cuda.is_initialized()),
    }
    if spec.get("import_only"):
        return out
    t = time.perf_counter()
    caps = cudaload.detect()
    out["detect_cold_s"] = time.perf_counter() - t
    warm = []
    for _ in range(5):
        t = time.perf_counter()
        cudaload.detect()
        warm.append(time.perf_counter() - t)
    out["detect_warm_s"] = median(warm)
    out["cuda_initialized_after_detect"] = bool(torch.cuda.is_initialized())
    # plan() imports transformers on first use; timed apart so each plan's first call is the planning itself
    t = time.perf_counter()
    import transformers  # noqa: F401

    out["import_transformers_s"] = time.perf_counter() - t
    plans = []
    for cfg_name, cfg_dir in spec["configs"].items():
        for hw_name in spec["hardware"]:
            hw: Any = caps if hw_name == "detected" else hw_name
            row: dict[str, Any] = {"config": cfg_name, "hardware": hw_name}
            times = []
            for _ in range(int(spec["reps"])):
                t = time.perf_counter()
                try:
                    p = cudaload.plan(cfg_dir, hardware=hw)
                    row["outcome"] = (
                        f"{p.dtype.choice}, {p.attention.choice}, quant={p.quantization.choice}, "
                        f"{p.placement.device_map if isinstance(p.placement.device_map, str) else 'split'}"
                    )
                except cudaload.CudaloadError as e:  # planning an impossible fit still costs planning time
                    row["outcome"] = f"{type(e).__name__}: {e.message}"[:200]
                except Exception as e:
                    row["error"] = f"{type(e).__name__}: {e}"[:300]
                    break
                times.append(time.perf_counter() - t)
            if times:
                row.update({"first_s": times[0], "warm_s": median(times[1:]) if len(times) > 1 else None})
            plans.append(row)
    out["plans"] = plans
    return out


def w_firstuse(spec: dict[str, Any]) -> dict[str, Any]:
    """Load with cudaload (attn forced, warmup on/off), then time-to-first-token twice."""
    import torch

    import cudaload

    torch.cuda.init()
    imports_s = _preimport(spec["path"], cudaload_modules=True)
    t0 = time.perf_counter()
    model = cudaload.load_model(spec["path"], attn=spec["backend"], warmup=bool(spec["warmup"]))
    torch.cuda.synchronize()
    load_s = time.perf_counter() - t0
    ids = _input_ids(model, 1, int(spec["prompt"]), "cuda:0")
    ttft = []
    with torch.no_grad():
        for _ in range(2):
            t = time.perf_counter()
            model.generate(
                ids, attention_mask=torch.ones_like(ids), max_new_tokens=1, do_sample=False, pad_token_id=0
            )
            torch.cuda.synchronize()
            ttft.append(time.perf_counter() - t)
    return {
        "load_s": load_s,
        "imports_s": imports_s,
        "ttft_first_s": ttft[0],
        "ttft_second_s": ttft[1],
        # what the first token paid over a warm one: the JIT compile (0 when a warm-up or a cache paid it)
        "first_token_extra_s": ttft[0] - ttft[1],
        "ready_plus_first_token_s": load_s + ttft[0],
        "attention": model.config._attn_implementation,
    }


WORKERS: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    "write": w_write,
    "load": w_load,
    "choice": w_choice,
    "memory": w_memory,
    "overheads": w_overheads,
    "firstuse": w_firstuse,
}


def worker_main(kind: str, spec_json: str) -> int:
    import logging

    logging.basicConfig(level=logging.WARNING)
    try:
        result = WORKERS[kind](json.loads(spec_json))
    except Exception as e:
        traceback.print_exc()
        result = {"error": f"{type(e).__name__}: {e}"[:1000]}
    print(RESULT_TAG + json.dumps(result, default=str), flush=True)
    return 0


# ----------------------------------------------------------------------------------------------------
# parent side
# ----------------------------------------------------------------------------------------------------
class Runner:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.out = Path(args.out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.work = Path(args.work or os.path.join(tempfile.gettempdir(), "cudaload-bench"))
        self.work.mkdir(parents=True, exist_ok=True)
        self.t0 = time.perf_counter()
        self.env = dict(os.environ)
        # the benchmark machines have no Hub: say so up front instead of waiting on network timeouts
        self.env.setdefault("HF_HUB_OFFLINE", "1")
        self.env.setdefault("TOKENIZERS_PARALLELISM", "false")
        # a private probe cache: first-use numbers must not depend on what earlier runs left in ~/.cache
        self.env["CUDALOAD_CACHE"] = str(self.work / f"probe-cache-{os.getpid()}")
        self.caps: Any = None
        self.has_gpu = False
        self.results: dict[str, Any] = {"meta": {}, "machine": {}, "sections": {}}
        self.paths: dict[str, str] = {}

    # -- plumbing ------------------------------------------------------------------------
    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def over_budget(self) -> bool:
        return self.args.budget_s > 0 and self.elapsed() > self.args.budget_s

    def log(self, msg: str) -> None:
        print(f"[{self.elapsed():6.1f}s] {msg}", file=sys.stderr, flush=True)

    def worker(self, kind: str, spec: dict[str, Any], timeout: float | None = None) -> dict[str, Any]:
        cmd = [sys.executable, os.path.abspath(__file__), "--worker", kind, "--spec", json.dumps(spec)]
        limit = timeout or self.args.worker_timeout_s
        if self.args.budget_s > 0:
            # a measurement started just inside the budget may overrun it by two minutes, not more: the
            # caller's hard cap (10 min on the H200) must still find results.json written
            limit = min(limit, max(60.0, self.args.budget_s + 120.0 - self.elapsed()))
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, env=self.env, timeout=limit)
        except subprocess.TimeoutExpired:
            return {"error": f"worker {kind} timed out after {limit:.0f} s"}
        for line in reversed(proc.stdout.splitlines()):
            if line.startswith(RESULT_TAG):
                res: dict[str, Any] = json.loads(line[len(RESULT_TAG) :])
                if "error" in res:
                    res["stderr_tail"] = proc.stderr[-1500:]
                return res
        return {
            "error": f"worker {kind} exited {proc.returncode} without a result",
            "stderr_tail": proc.stderr[-1500:],
        }

    def section(self, name: str) -> dict[str, Any]:
        sec: dict[str, Any] = self.results["sections"][name]
        return sec

    def save(self) -> None:
        self.results["meta"]["elapsed_s"] = round(self.elapsed(), 1)
        tmp = self.out / "results.json.tmp"
        tmp.write_text(json.dumps(self.results, indent=1, default=str))
        os.replace(tmp, self.out / "results.json")
        (self.out / "results.md").write_text(render_markdown(self.results))

    def evict(self, path: str) -> tuple[bool, str, float | None]:
        """Drop one checkpoint's files from the page cache (fsync + fadvise, no root needed; see
        pagecache.py): (done, how or why not, fraction of its pages still cached afterwards)."""
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        import pagecache

        files = pagecache.files_of(path)
        ok, how = pagecache.evict(files)
        return ok, how, pagecache.resident_fraction(files) if ok else None

    # -- set-up ------------------------------------------------------------------------
    def collect_meta(self) -> None:
        from importlib import metadata

        versions: dict[str, str | None] = {}
        for dist in (
            "torch",
            "transformers",
            "accelerate",
            "safetensors",
            "huggingface-hub",
            "kernels",
            "bitsandbytes",
            "flash-attn",
            "flash-attn-3",
            "flash-attn-4",
            "peft",
            "nvidia-ml-py",
        ):
            try:
                versions[dist] = metadata.version(dist)
            except metadata.PackageNotFoundError:
                versions[dist] = None
        import cudaload

        versions["cudaload"] = cudaload.__version__
        commit = None
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            commit = (
                subprocess.run(
                    ["git", "rev-parse", "--short", "HEAD"],
                    capture_output=True,
                    text=True,
                    cwd=os.path.dirname(os.path.abspath(__file__)),
                    timeout=10,
                ).stdout.strip()
                or None
            )
        self.results["meta"] = {
            "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "command": " ".join([os.path.basename(sys.executable), *sys.argv]),
            "small": self.args.small,
            "sections": self.args.sections,
            "shapes": self.args.shape_list,
            "quant": self.args.quant_list,
            "reps": self.args.reps,
            "budget_s": self.args.budget_s,
            "git_commit": commit,
            "python": platform.python_version(),
            "platform": platform.platform(),
            "cpu_count": os.cpu_count(),
            "versions": versions,
            "hf_hub_offline": self.env.get("HF_HUB_OFFLINE"),
        }
        try:
            self.caps = cudaload.detect()
            self.results["machine"] = self.caps.to_dict()
            self.has_gpu = bool(self.caps.has_gpu)
        except Exception as e:  # the runner must still say what it could measure
            self.results["machine"] = {"error": f"detect() failed: {type(e).__name__}: {e}"[:500]}
            import torch

            self.has_gpu = bool(torch.cuda.is_available())

    def usable(self, dist: str, module: str) -> bool:
        if self.caps is not None:
            return bool(self.caps.usable(dist))
        import importlib.util

        return importlib.util.find_spec(module) is not None

    def checkpoint(self, shape: str) -> str:
        """Path of a checkpoint for a --shapes name; written once per machine and reused."""
        if self.args.small:
            path = self.work / "tiny-qwen3"
            if not (path / "config.json").exists():
                from cudaload.testing import make_tiny

                make_tiny("qwen3", path, dtype="bfloat16")
            return str(path)
        # Same directory and reuse rule as benchmarks/bench_fastload.py (Task D): whichever runs first writes
        # the 16 GB checkpoint, the other reuses it. config.json is written last, so its presence means done.
        path = self.work / SHAPES[shape]
        done = (path / "config.json").exists() and any(
            (path / f).exists() for f in ("model.safetensors", "model.safetensors.index.json")
        )
        if done:
            self.results["meta"].setdefault("checkpoints", {})[shape] = {"path": str(path), "reused": True}
            return str(path)
        self.log(f"writing the {SHAPES[shape]} checkpoint to {path}")
        res = self.worker("write", {"path": str(path), "config": SHAPES[shape]}, timeout=400)
        if "error" in res:
            raise RuntimeError(f"could not write the {shape} checkpoint: {res['error']}")
        self.log(f"wrote {res['bytes'] / 1e9:.1f} GB in {res['seconds']:.1f} s")
        self.results["meta"].setdefault("checkpoints", {})[shape] = {
            **res,
            "path": str(path),
            "reused": False,
        }
        return str(path)

    def shape_label(self, shape: str) -> str:
        return "tiny-qwen3" if self.args.small else SHAPES[shape]

    def works(self) -> list[dict[str, Any]]:
        if self.args.small:
            return [
                {"name": "bs1 p32", "batch": 1, "prompt": 32},
                {"name": "bs2 p64", "batch": 2, "prompt": 64},
            ]
        return [
            {"name": "bs1 p512", "batch": 1, "prompt": 512},
            {"name": "bs8 p2048", "batch": 8, "prompt": 2048},
        ]

    # -- sections ------------------------------------------------------------------------
    def run(self) -> int:
        self.collect_meta()
        for name in ALL_SECTIONS:
            wanted = name in self.args.sections or (name == "plot" and not self.args.no_plot)
            self.results["sections"][name] = {
                "title": TITLES[name],
                "status": "pending" if wanted else "skipped: not requested",
            }
        self.save()
        for name in SECTIONS:
            if name not in self.args.sections:
                continue
            self.log(f"section {name}")
            sec = self.section(name)
            sec["status"] = "running"
            try:
                getattr(self, f"s_{name}")(sec)
                if sec["status"] == "running":
                    sec["status"] = "ok"
            except Exception as e:  # one broken section must not cost the others
                sec["status"] = f"error: {type(e).__name__}: {e}"[:500]
                sec["traceback"] = traceback.format_exc()[-3000:]
            self.save()
        if not self.args.no_plot:
            sec = self.section("plot")
            try:
                sec["status"] = make_plot(self.results, self.out / "plot.png")
            except Exception as e:
                sec["status"] = f"error: {type(e).__name__}: {e}"[:500]
        self.save()
        self.log(f"done: {self.out / 'results.md'}")
        return 0

    def _skip_gpu(self, sec: dict[str, Any]) -> bool:
        if not self.has_gpu:
            sec["status"] = "skipped: no GPU"
            return True
        return False

    def quant_status(self) -> dict[str, str | None]:
        """quant name -> None when measurable here, else why not."""
        out: dict[str, str | None] = {}
        for q in self.args.quant_list:
            if q == "bf16":
                out[q] = None
            elif not self.has_gpu:
                out[q] = "skipped: no GPU (bitsandbytes quantizes on CUDA)"
            elif not self.usable("bitsandbytes", "bitsandbytes"):
                why = self.caps.package("bitsandbytes").reason if self.caps is not None else "not importable"
                out[q] = f"skipped: bitsandbytes not usable ({why}); on the H200 `source .whl/env.sh` first"
            else:
                out[q] = None
        return out

    def s_load(self, sec: dict[str, Any]) -> None:
        reps = self.args.reps
        cold_ok, cold_why = False, "--cold off"
        if self.args.cold == "on" or (self.args.cold == "auto" and not self.args.small):
            cold_ok = hasattr(os, "posix_fadvise") or os.access("/proc/sys/vm/drop_caches", os.W_OK)
            cold_why = "" if cold_ok else "neither posix_fadvise nor a writable drop_caches here"
        elif self.args.small:
            cold_why = "--small (dropping the page cache would slow everything else on a CI machine)"
        sec["cold"] = "measured" if cold_ok else f"cold not measured: {cold_why}"
        sec["device"] = "cuda:0" if self.has_gpu else "cpu"
        qstat = self.quant_status()
        sec["quant_skipped"] = {q: why for q, why in qstat.items() if why}
        samples: list[dict[str, Any]] = []
        sec["samples"] = samples
        sec["skipped"] = []
        for shape in self.args.shape_list:
            path = self.checkpoint(shape)
            for quant in self.args.quant_list:
                if qstat[quant]:
                    continue
                # 8B quantized loads take 4-20 s each: one rep keeps the full run inside its time cap
                n = 1 if (shape == "8b" and quant != "bf16") else reps
                plan_: list[tuple[str, str]] = []
                for i in range(n):
                    order = ("transformers", "cudaload") if i % 2 == 0 else ("cudaload", "transformers")
                    plan_ += [("warm", m) for m in order]
                # cold 8B quantized loads would cost ~1 min each: the 8B cold figure is measured in bf16
                if cold_ok and (shape != "8b" or quant == "bf16"):
                    plan_ += [("cold", "transformers"), ("cold", "cudaload")]
                for cache, method in plan_:
                    tag = {"shape": self.shape_label(shape), "quant": quant, "cache": cache, "method": method}
                    if self.over_budget():
                        sec["skipped"].append(
                            {**tag, "why": f"time budget ({self.args.budget_s:.0f} s) reached"}
                        )
                        continue
                    resident: float | None = None
                    if cache == "cold":
                        ok, why, resident = self.evict(path)
                        if not ok:
                            sec["skipped"].append({**tag, "why": why})
                            continue
                        sec["cold"] = f"measured (page cache dropped by {why})"
                    elif not any(s["shape"] == tag["shape"] and s["quant"] == quant for s in samples):
                        # the first warm sample of a checkpoint must not be the one that reads it from disk
                        self._read_through(path)
                    self.log(f"load {tag}")
                    res = self.worker("load", {"path": path, "method": method, "quant": quant})
                    samples.append(
                        {**tag, **res, **({"resident_before": resident} if cache == "cold" else {})}
                    )
                    self.save()
        sec["summary"] = summarize_load(samples)
        if sec["skipped"] or sec["quant_skipped"]:
            sec["status"] = "partial"

    def _read_through(self, path: str) -> None:
        for f in sorted(Path(path).glob("*.safetensors")):
            with open(f, "rb") as fh:
                while fh.read(64 * 2**20):
                    pass

    def plan_for(self, path: str, **kw: Any) -> Any:
        import cudaload

        return (
            cudaload.plan(path, hardware=self.caps, **kw)
            if self.caps is not None
            else cudaload.plan(path, **kw)
        )

    def s_choice(self, sec: dict[str, Any]) -> None:
        new_tokens = 4 if self.args.small else self.args.new_tokens
        sec.update(
            {
                "device": "cuda:0" if self.has_gpu else "cpu",
                "new_tokens": new_tokens,
                "timing": "torch.cuda.Event" if self.has_gpu else "time.perf_counter (CPU)",
                "dtype": "bfloat16" if self.has_gpu else "float32",
                "rows": [],
                "summary": [],
            }
        )
        for shape in self.args.shape_list:
            if self.over_budget():
                sec.setdefault("skipped", []).append({"shape": shape, "why": "time budget reached"})
                sec["status"] = "partial"
                continue
            path = self.checkpoint(shape)
            label = self.shape_label(shape)
            works = self.works()
            choices: dict[str, str | None] = {}
            backends = ["sdpa", "eager"]
            for w in works:
                try:
                    p = self.plan_for(path, seq_len=w["prompt"] + new_tokens, batch_size=w["batch"])
                    choices[w["name"]] = p.attention.choice
                    backends += [c.name for c in p.attention.candidates if c.ok and c.name not in backends]
                except Exception as e:
                    choices[w["name"]] = None
                    sec.setdefault("plan_errors", []).append(
                        f"{label} {w['name']}: {type(e).__name__}: {e}"[:300]
                    )
            if not any(choices.values()):
                # the planner could not answer: still time what this machine has, from the detected packages
                for dist, mod, name in (
                    ("flash-attn-4", "flash_attn.cute", "flash_attention_4"),
                    ("flash-attn-3", "flash_attn_interface", "flash_attention_3"),
                    ("flash-attn", "flash_attn", "flash_attention_2"),
                ):
                    if self.has_gpu and self.usable(dist, mod) and name not in backends:
                        backends.append(name)
            if self.args.backends:
                backends = list(self.args.backends)
            else:
                # transformers runs flex_attention through torch.compile, which compiles again for each new
                # length: a decode loop would spend the whole budget compiling. Timed when it is the choice.
                slow = [b for b in backends if b in UNTIMED_BY_DEFAULT and b not in choices.values()]
                backends = [b for b in backends if b not in slow]
                for b in slow:
                    sec.setdefault("not_timed", {})[b] = (
                        "compiles per input length under torch.compile; pass --backends to time it"
                    )
            self.log(f"choice {label}: {backends}")
            spec = {
                "path": path,
                "backends": backends,
                "new_tokens": new_tokens,
                "works": [{"name": w["name"], "batch": w["batch"], "prompt": w["prompt"]} for w in works],
                "prefill_reps": 1 if self.args.small else 3,
                "generate_reps": 1 if self.args.small else 2,
            }
            res = self.worker("choice", spec)
            if "error" in res:
                sec["rows"].append({"shape": label, **res})
                sec["status"] = "partial"
                continue
            rows = [{"shape": label, **r} for r in res["rows"]]
            sec.setdefault("choices", {})[label] = choices
            sec["rows"] += rows
            sec["summary"] += summarize_choice(label, rows, choices)
            self.save()

    def s_memory(self, sec: dict[str, Any]) -> None:
        works = [{"name": w["name"], "batch": w["batch"], "seq_len": w["prompt"]} for w in self.works()]
        qstat = self.quant_status()
        sec["quant_skipped"] = {q: why for q, why in qstat.items() if why}
        sec["rows"] = []
        sec["measured"] = "yes" if self.has_gpu else "skipped: no GPU (estimates only)"
        for shape in self.args.shape_list:
            path = self.checkpoint(shape)
            label = self.shape_label(shape)
            for quant in self.args.quant_list:
                if qstat[quant]:
                    continue
                estimates: dict[str, Any] = {}
                for w in works:
                    try:
                        p = self.plan_for(
                            path,
                            quantization=CUDALOAD_QUANT[quant],
                            seq_len=w["seq_len"],
                            batch_size=w["batch"],
                        )
                        estimates[w["name"]] = p.memory.to_dict()
                    except Exception as e:
                        estimates[w["name"]] = {"error": f"{type(e).__name__}: {e}"[:300]}
                measured: dict[str, Any] | None = None
                if self.has_gpu:
                    if self.over_budget():
                        measured = {"error": "skipped: time budget reached"}
                    else:
                        self.log(f"memory {label} {quant}")
                        measured = self.worker("memory", {"path": path, "quant": quant, "works": works})
                sec["rows"] += compare_memory(label, quant, works, estimates, measured)
                self.save()
        if not self.has_gpu or sec["quant_skipped"]:
            sec["status"] = "partial"

    def s_overheads(self, sec: dict[str, Any]) -> None:
        reps = 1 if self.args.small else 5
        cfg_dirs: dict[str, str] = {}
        from cudaload.testing import full_config

        for name in PLAN_CONFIGS:
            d = self.work / "configs" / name
            if not (d / "config.json").exists():
                full_config(name).save_pretrained(d)
            cfg_dirs[name] = str(d)
        spec = {"configs": cfg_dirs, "hardware": ["detected", "8xH100-80GB"], "reps": 1 + reps}
        full = self.worker("overheads", spec)
        imports = [full] + [self.worker("overheads", {"import_only": True}) for _ in range(reps - 1)]
        sec["import"] = {
            "samples_ms": [r.get("import_cudaload_s", 0) * 1000 for r in imports if "error" not in r],
            "torch_ms": median(r.get("import_torch_s") for r in imports if "error" not in r),
            "heavy_modules_after_import": full.get("heavy_modules_after_import"),
            "cuda_initialized_after_import": full.get("cuda_initialized_after_import"),
        }
        sec["import"]["median_ms"] = median(sec["import"]["samples_ms"])
        if sec["import"]["torch_ms"] is not None:
            sec["import"]["torch_ms"] *= 1000
        sec["detect"] = {
            k: full.get(k) for k in ("detect_cold_s", "detect_warm_s", "cuda_initialized_after_detect")
        }
        sec["import_transformers_s"] = full.get("import_transformers_s")
        sec["plans"] = full.get("plans", [])
        if "error" in full:
            sec["status"] = f"error: {full['error']}"[:500]
            sec["stderr_tail"] = full.get("stderr_tail")
        sec["goals"] = {
            "import_ms<50": (sec["import"]["median_ms"] or 1e9) < GOAL_IMPORT_MS,
            "detect_warm_ms<100": (full.get("detect_warm_s") or 1e9) * 1000 < GOAL_DETECT_MS,
            "plan_70b_s<1": all(
                (r.get("first_s") or 1e9) < GOAL_PLAN_S
                for r in sec["plans"]
                if r["config"] == "Llama-3.1-70B"
            )
            and bool(sec["plans"]),
        }

    def s_firstuse(self, sec: dict[str, Any]) -> None:
        if self._skip_gpu(sec):
            return
        if not self.usable("flash-attn-4", "flash_attn.cute"):
            sec["status"] = (
                "skipped: flash-attn-4 not usable here; on the H200 `source .whl/env.sh` with the fa4 "
                "wheels (they cannot travel with bitsandbytes)"
            )
            return
        shape = self.args.shape_list[0]
        path = self.checkpoint(shape)
        sec["shape"] = self.shape_label(shape)
        sec["prompt"] = 512
        rows = []
        # warmup=True first: it forces the probe forward and records the verdict, so the warmup=False load
        # after it finds a cached verdict, skips the probe, and pays the JIT at its first token (usual case).
        for backend in ("flash_attention_4", "sdpa"):
            for warmup in (True, False):
                if self.over_budget():
                    rows.append(
                        {"backend": backend, "warmup": warmup, "error": "skipped: time budget reached"}
                    )
                    continue
                self.log(f"firstuse {backend} warmup={warmup}")
                res = self.worker(
                    "firstuse", {"path": path, "backend": backend, "warmup": warmup, "prompt": 512}
                )
                rows.append({"backend": backend, "warmup": warmup, **res})
                self.save()
        sec["rows"] = rows


# ----------------------------------------------------------------------------------------------------
# summaries (pure: results in, rows out)
# ----------------------------------------------------------------------------------------------------
def summarize_load(samples: list[dict[str, Any]]) -> list[dict[str, Any]]:
    keys: list[tuple[str, str, str]] = []
    for s in samples:
        k = (s["shape"], s["quant"], s["cache"])
        if k not in keys:
            keys.append(k)
    out = []
    for shape, quant, cache in keys:
        row: dict[str, Any] = {"shape": shape, "quant": quant, "cache": cache}
        for m in ("transformers", "cudaload"):
            ss = [
                s
                for s in samples
                if (s["shape"], s["quant"], s["cache"], s["method"]) == (shape, quant, cache, m)
            ]
            ok = [s for s in ss if "error" not in s]
            row[m] = {
                "n": len(ok),
                "seconds": median(s["seconds"] for s in ok),
                "samples": [s["seconds"] for s in ok],
                "gpu_peak": median(s.get("gpu_peak") for s in ok),
                "gpu_final": median(s.get("gpu_final") for s in ok),
                "rss_peak": median(s.get("rss_peak") for s in ok),
                "rss_before": median(s.get("rss_before") for s in ok),
                "errors": [s["error"] for s in ss if "error" in s],
            }
            if m == "cudaload":
                row[m]["load_path"] = next((s.get("load_path") for s in ok), None)
        row["ratio"] = ratio(row["cudaload"]["seconds"], row["transformers"]["seconds"])
        out.append(row)
    return out


#: metrics where a smaller number is better (times); the others are rates
_LOWER_IS_BETTER = {"prefill_ms", "generate_s"}


def _better(metric: str, a: float, b: float) -> bool:
    return a < b if metric in _LOWER_IS_BETTER else a > b


def summarize_choice(
    shape: str, rows: list[dict[str, Any]], choices: dict[str, str | None]
) -> list[dict[str, Any]]:
    """Per work size and metric: fastest backend, cudaload's choice, ratios (1.0 = as fast as the fastest)."""
    out = []
    for work, choice in choices.items():
        wr = [r for r in rows if r["work"] == work and "error" not in r]
        # generate_s: the whole generate() call (prefill + every new token), what a user waits for
        metrics = ["decode_tok_s"] + (["prefill_ms"] if not work.startswith("bs1") else []) + ["generate_s"]
        for metric in metrics:
            vals = {r["backend"]: r[metric] for r in wr if r.get(metric) is not None}
            best = None
            for b, v in vals.items():
                if best is None or _better(metric, v, vals[best]):
                    best = b

            def speed(v: float | None, metric: str = metric) -> float | None:
                # a "higher is better" number for both metrics, so ratios read the same way
                if v is None:
                    return None
                return 1.0 / v if metric in _LOWER_IS_BETTER else v

            chosen = vals.get(choice) if choice else None
            r_best = ratio(speed(chosen), speed(vals.get(best))) if best else None
            out.append(
                {
                    "shape": shape,
                    "work": work,
                    "metric": metric,
                    "cudaload_choice": choice,
                    "fastest": best,
                    "values": vals,
                    "choice_vs_fastest": r_best,
                    "choice_vs_sdpa": ratio(speed(chosen), speed(vals.get("sdpa"))),
                    "meets_goal": None if r_best is None else r_best >= GOAL_CHOICE,
                    "note": None
                    if choice is None or choice in vals
                    else f"{choice} was not timed (failed or not usable)",
                }
            )
    return out


def compare_memory(
    shape: str,
    quant: str,
    works: list[dict[str, Any]],
    estimates: dict[str, Any],
    measured: dict[str, Any] | None,
) -> list[dict[str, Any]]:
    """Estimate / measured, term by term where a measurement isolates the term.

    ``weights`` is compared with what stays allocated after the load; each work size's ``total`` with the
    device memory the process uses at the forward's peak (allocator peak reserved + what lives outside the
    allocator: CUDA context, libraries); ``total - cuda_context`` with the allocator's peak allocated.
    """
    rows = []
    first = estimates[works[0]["name"]] if works else {}
    terms = first.get("terms", {}) if isinstance(first, dict) else {}
    load = (measured or {}).get("load")
    base: dict[str, Any] = {"shape": shape, "quant": quant}
    if measured is not None and "error" in measured:
        base["measure_error"] = measured["error"]
    rows.append(
        {
            **base,
            "what": "weights (after load)",
            "estimate": terms.get("weights"),
            "measured": load.get("gpu_final") if load else None,
            "estimate_error": first.get("error") if isinstance(first, dict) else None,
        }
    )
    rows.append(
        {
            **base,
            "what": "load peak (allocated) vs weights",
            "estimate": terms.get("weights"),
            "measured": load.get("gpu_peak") if load else None,
        }
    )
    for w in works:
        est = estimates.get(w["name"], {})
        fw = next((f for f in (measured or {}).get("forwards", []) if f["work"] == w["name"]), None)
        t = est.get("terms", {})
        ctx = int(t.get("cuda_context", 0) or 0)
        total = est.get("total")
        dev_measured = None
        if fw and load and "gpu_reserved_peak" in fw:
            dev_measured = fw["gpu_reserved_peak"] + load["outside_allocator"]
        rows.append(
            {
                **base,
                "what": f"{w['name']}: total (device) vs used at forward peak",
                "estimate": total,
                "measured": dev_measured,
                "terms": t,
                "estimate_error": est.get("error"),
                "forward_error": fw.get("error") if fw else None,
            }
        )
        rows.append(
            {
                **base,
                "what": f"{w['name']}: total - cuda_context vs allocated peak",
                "estimate": None if total is None else total - ctx,
                "measured": fw.get("gpu_peak") if fw else None,
            }
        )
    for r in rows:
        r["ratio"] = ratio(r.get("estimate"), r.get("measured"))
        r["within_5pct"] = within(r["ratio"], GOAL_MEMORY)
    return rows


# ----------------------------------------------------------------------------------------------------
# output
# ----------------------------------------------------------------------------------------------------
def _status_line(sec: dict[str, Any]) -> str:
    st = str(sec.get("status", "?"))
    return f"_{st}_" if st != "ok" else "_ok_"


def render_markdown(res: dict[str, Any]) -> str:
    meta, machine, secs = res.get("meta", {}), res.get("machine", {}), res.get("sections", {})
    v = meta.get("versions", {})
    lines = ["# cudaload benchmarks", ""]
    lines.append(
        f"- date: {meta.get('date')}; commit {meta.get('git_commit')}; elapsed {meta.get('elapsed_s')} s; "
        f"{'--small (CPU/CI shapes)' if meta.get('small') else 'full shapes'}"
    )
    lines.append(f"- command: `{meta.get('command')}`")
    lines.append("- versions: " + ", ".join(f"{k} {val}" for k, val in v.items() if val))
    gpus = machine.get("gpus") or []
    if gpus:
        lines.append(
            "- GPUs: "
            + "; ".join(
                f"{g.get('name')} (sm{g['compute_capability'][0]}{g['compute_capability'][1]}, "
                f"{g.get('total_memory', 0) / 2**30:.0f} GiB)"
                for g in gpus
            )
        )
    elif "error" in machine:
        lines.append(f"- machine: {machine['error']}")
    else:
        lines.append("- GPUs: none (CPU)")
    lines.append(
        f"- host: {meta.get('cpu_count')} CPUs, {gib(machine.get('host_memory'))} GiB, "
        f"Python {meta.get('python')}; full snapshot in results.json (`machine`)"
    )
    lines.append("")
    for name in ALL_SECTIONS:
        sec = secs.get(name, {"status": "missing"})
        lines += [f"## {TITLES[name]}", "", _status_line(sec), ""]
        renderer = {
            "load": _md_load,
            "choice": _md_choice,
            "memory": _md_memory,
            "overheads": _md_overheads,
            "firstuse": _md_firstuse,
            "plot": _md_plot,
        }[name]
        if not str(sec.get("status", "")).startswith("skipped"):
            try:
                lines += renderer(sec)
            except Exception as e:  # a half-filled section (run killed mid-way) still renders the rest
                lines.append(f"(could not render: {type(e).__name__}: {e})")
        lines.append("")
    return "\n".join(lines)


def _md_load(sec: dict[str, Any]) -> list[str]:
    baseline = (
        "dtype=torch.bfloat16, device_map='cuda', quantization_config=..."
        if sec.get("device") != "cpu"
        else "dtype=torch.float32, device_map='cpu'"
    )
    out = [
        f"Device {sec.get('device')}; {sec.get('cold')}. "
        "Ratio = cudaload / transformers (below 1 is faster). "
        f"transformers = `AutoModelForCausalLM.from_pretrained(path, {baseline})`; "
        "cudaload = `cudaload.load_model(path, quantization=...)`. tf = transformers, cl = cudaload. "
        "Each sample is a fresh process; time excludes module imports (pre-imported and timed apart: "
        "`imports_s` in results.json) and CUDA context creation; RSS peak is the whole process's.",
        "",
    ]
    rows = []
    merged_runs = any(x.get("run") for x in sec.get("samples", []))
    for r in sec.get("summary", []):
        if merged_runs:
            r = {
                **r,
                "run": ", ".join(
                    dict.fromkeys(
                        x["run"]
                        for x in sec["samples"]
                        if (x["shape"], x["quant"], x["cache"]) == (r["shape"], r["quant"], r["cache"])
                    )
                ),
            }
        t, c = r["transformers"], r["cudaload"]
        rows.append(
            [
                r["shape"],
                r["quant"],
                r["cache"],
                t["seconds"],
                c["seconds"],
                r["ratio"],
                human(t["gpu_peak"]),
                human(c["gpu_peak"]),
                human(t["rss_peak"]),
                human(c["rss_peak"]),
                c.get("load_path"),
                f"{t['n']}/{c['n']}",
                *([r.get("run")] if merged_runs else []),
            ]
        )
    out += md_table(
        [
            "shape",
            "quant",
            "cache",
            "transformers s",
            "cudaload s",
            "ratio",
            "GPU peak tf",
            "GPU peak cl",
            "RSS peak tf",
            "RSS peak cl",
            "cudaload path",
            "n tf/cl",
            *(["run"] if merged_runs else []),
        ],
        rows,
    )
    errs = [
        (r["shape"], r["quant"], m, e)
        for r in sec.get("summary", [])
        for m in ("transformers", "cudaload")
        for e in r[m]["errors"]
    ]
    for shape, quant, m, e in errs:
        out.append(f"- error ({shape} {quant} {m}): {e.splitlines()[0] if e else e}")
    for q, why in (sec.get("quant_skipped") or {}).items():
        out.append(f"- {q}: {why}")
    for s in sec.get("skipped", []):
        out.append(f"- skipped {s['shape']} {s['quant']} {s['cache']} {s['method']}: {s['why']}")
    return out


def _md_choice(sec: dict[str, Any]) -> list[str]:
    out = [
        f"Device {sec.get('device')}, {sec.get('dtype')}, "
        f"greedy generate with {sec.get('new_tokens')} new tokens; "
        f"timing {sec.get('timing')}, after a warm-up. decode tok/s is summed over the batch. "
        f"Goal: cudaload's choice >= {GOAL_CHOICE}x the fastest.",
        "",
    ]
    rows = []
    for s in sec.get("summary", []):
        vals = ", ".join(f"{b} {fmt(v)}" for b, v in s["values"].items())
        rows.append(
            [
                s["shape"],
                s["work"],
                s["metric"],
                s["cudaload_choice"],
                s["fastest"],
                s["choice_vs_fastest"],
                s["choice_vs_sdpa"],
                s["meets_goal"],
                vals,
            ]
        )
    out += md_table(
        [
            "shape",
            "work",
            "metric",
            "cudaload",
            "fastest",
            "vs fastest",
            "vs sdpa",
            "goal met",
            "all backends",
        ],
        rows,
    )
    for r in sec.get("rows", []):
        if "error" in r:
            out.append(
                f"- {r.get('shape')} {r.get('backend', '')} {r.get('work', '')}: {r['error'].splitlines()[0]}"
            )
    for b, why in (sec.get("not_timed") or {}).items():
        out.append(f"- {b} not timed: {why}")
    for shape, run in (sec.get("sources") or {}).items():
        out.append(f"- {shape}: measured in {run}")
    for e in sec.get("plan_errors", []):
        out.append(f"- plan() failed: {e.splitlines()[0]}")
    for s in sec.get("summary", []):
        if s.get("note"):
            out.append(f"- {s['shape']} {s['work']}: {s['note']}")
    return out


def _md_memory(sec: dict[str, Any]) -> list[str]:
    out = [
        f"Measured: {sec.get('measured')}. Ratio = estimate / measured; goal within {GOAL_MEMORY:.0%}. "
        "Forwards run as generate()'s prefill (KV cache kept, last-position logits).",
        "",
    ]
    rows = [
        [
            r["shape"],
            r["quant"],
            r["what"],
            human(r.get("estimate")),
            human(r.get("measured")),
            r.get("ratio"),
            r.get("within_5pct"),
        ]
        for r in sec.get("rows", [])
    ]
    out += md_table(["shape", "quant", "what", "estimate", "measured", "ratio", "within 5%"], rows)
    seen = set()
    for r in sec.get("rows", []):
        for k in ("estimate_error", "forward_error", "measure_error"):
            if r.get(k) and (k, r[k]) not in seen:
                seen.add((k, r[k]))
                out.append(f"- {r['shape']} {r['quant']} {k}: {str(r[k]).splitlines()[0]}")
    for q, why in (sec.get("quant_skipped") or {}).items():
        out.append(f"- {q}: {why}")
    terms = next((r.get("terms") for r in sec.get("rows", []) if r.get("terms")), None)
    if terms:
        out.append(
            "- estimate terms (first row with terms): "
            + ", ".join(f"{k} {human(v)}" for k, v in terms.items())
        )
    return out


def _md_overheads(sec: dict[str, Any]) -> list[str]:
    imp, det = sec.get("import", {}), sec.get("detect", {})
    out = [
        f"- `import cudaload` after `import torch`: median {fmt(imp.get('median_ms'))} ms "
        f"(samples {', '.join(fmt(x) for x in imp.get('samples_ms', []))}; goal < {GOAL_IMPORT_MS:.0f} ms); "
        f"`import torch` {fmt(imp.get('torch_ms'))} ms; heavy modules pulled in: "
        f"{imp.get('heavy_modules_after_import') or 'none'}; "
        f"CUDA initialised: {fmt(imp.get('cuda_initialized_after_import'))}",
        f"- `detect()`: cold (first call in a process) {fmt(_ms(det.get('detect_cold_s')))} ms, warm "
        f"{fmt(_ms(det.get('detect_warm_s')))} ms (goal < {GOAL_DETECT_MS:.0f} ms); CUDA initialised: "
        f"{fmt(det.get('cuda_initialized_after_detect'))}",
        "- plan() imports transformers on its first use in a process: "
        f"{fmt(_ms(sec.get('import_transformers_s')))} "
        "ms, timed apart from the plans below (first = first plan of that config in the process)",
        "",
    ]
    rows = [
        [
            r["config"],
            r["hardware"],
            _ms(r.get("first_s")),
            _ms(r.get("warm_s")),
            r.get("outcome") or r.get("error"),
        ]
        for r in sec.get("plans", [])
    ]
    out += md_table(["config", "hardware", "plan() first ms", "plan() warm ms", "outcome"], rows)
    goals = sec.get("goals")
    if goals:
        out.append("")
        out.append("Goals: " + ", ".join(f"{k}: {'met' if v else 'NOT met'}" for k, v in goals.items()))
    return out


def _ms(s: float | None) -> float | None:
    return None if s is None else s * 1000


def _md_firstuse(sec: dict[str, Any]) -> list[str]:
    out = [
        *([f"From {sec['run']}.", ""] if sec.get("run") else []),
        f"{sec.get('shape')}, bs1, {sec.get('prompt')}-token prompt; `cudaload.load_model(path, attn=..., "
        "warmup=...)` then `generate(max_new_tokens=1)` twice. Ready + first token is what a user waits for.",
        "",
    ]
    rows = [
        [
            r["backend"],
            r["warmup"],
            r.get("load_s"),
            r.get("ttft_first_s"),
            r.get("ttft_second_s"),
            r.get("first_token_extra_s"),
            r.get("ready_plus_first_token_s"),
            r.get("error", "").splitlines()[0] if r.get("error") else None,
        ]
        for r in sec.get("rows", [])
    ]
    out += md_table(
        [
            "backend",
            "warmup",
            "load s",
            "first token s (1st)",
            "first token s (2nd)",
            "1st - 2nd (JIT) s",
            "ready + first token s",
            "error",
        ],
        rows,
    )
    for part in sec.get("also", []):
        out += ["", *_md_firstuse({**part, "also": []})]
    return out


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


# ----------------------------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--out", help="directory for results.json, results.md, plot.png")
    p.add_argument(
        "--small", action="store_true", help="CPU/CI: tiny shapes, 1 rep, GPU-only sections skipped"
    )
    p.add_argument(
        "--sections", default=",".join(SECTIONS), help=f"comma-separated subset of {','.join(SECTIONS)}"
    )
    p.add_argument(
        "--shapes", default="0.6b,8b", help="comma-separated subset of 0.6b,8b (ignored with --small)"
    )
    p.add_argument("--quant", default="bf16,int8,nf4", help="comma-separated subset of bf16,int8,nf4")
    p.add_argument(
        "--reps", type=int, default=None, help="load samples per method (default 3; 1 with --small)"
    )
    p.add_argument("--new-tokens", type=int, default=32, help="greedy tokens generated per timed generate()")
    p.add_argument(
        "--cold",
        choices=["auto", "on", "off"],
        default="auto",
        help="drop the page cache for cold loads (auto: on for full runs when root, off with --small)",
    )
    p.add_argument(
        "--budget-s",
        type=float,
        default=None,
        help="stop starting measurements after this many seconds (default 450; 0 = no limit)",
    )
    p.add_argument("--worker-timeout-s", type=float, default=300.0)
    p.add_argument(
        "--work", help="where checkpoints are written and reused (default: $TMPDIR/cudaload-bench)"
    )
    p.add_argument(
        "--backends",
        type=csv,
        default=None,
        help="attention backends to time in the choice section (default: sdpa, eager and every valid candidate "
        "of cudaload's plan except flex_attention)",
    )
    p.add_argument("--no-plot", action="store_true")
    p.add_argument(
        "--merge",
        nargs="+",
        metavar="RESULTS_JSON",
        help="combine the results.json of split runs into --out (results.json, results.md, plot.png)",
    )
    p.add_argument("--worker", choices=sorted(WORKERS), help=argparse.SUPPRESS)
    p.add_argument("--spec", help=argparse.SUPPRESS)
    return p


def _run_label(path: str) -> str:
    """A results.json's name in a merged table: its folder (e.g. ``run8-load-8b``)."""
    return Path(path).resolve().parent.name


def _merge_load(ran: list[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    """Samples per (shape, quant, cache) from the first run that measured that row; summary recomputed."""
    base = dict(ran[0][1])
    samples: list[dict[str, Any]] = []
    have: set[tuple[str, str, str]] = set()
    colds: list[str] = []
    for label, sec in ran:
        mine = [x for x in sec.get("samples", []) if (x["shape"], x["quant"], x["cache"]) not in have]
        if mine:
            samples += [{**x, "run": label} for x in mine]
            have |= {(x["shape"], x["quant"], x["cache"]) for x in mine}
            if sec.get("cold"):
                colds.append(f"{label}: {sec['cold']}")
    skipped = []
    for _, sec in ran:
        for x in sec.get("skipped", []):
            if (x["shape"], x["quant"], x["cache"]) not in have and x not in skipped:
                skipped.append(x)
    base.update(samples=samples, summary=summarize_load(samples), skipped=skipped, cold="; ".join(colds))
    base["status"] = "partial" if skipped else "ok"
    return base


def _merge_choice(ran: list[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    """Rows per shape from the first run that timed that shape; summary recomputed (new metrics included)."""
    base = dict(ran[0][1])
    rows: list[dict[str, Any]] = []
    summary: list[dict[str, Any]] = []
    sources: dict[str, str] = {}
    not_timed: dict[str, str] = {}
    for label, sec in ran:
        for shape in dict.fromkeys(r.get("shape") for r in sec.get("rows", [])):
            if shape is None or shape in sources:
                continue
            sources[shape] = label
            mine = [{**r, "run": label} for r in sec["rows"] if r.get("shape") == shape]
            rows += mine
            choices = dict((sec.get("choices") or {}).get(shape) or {})
            for x in sec.get("summary", []):
                if x["shape"] == shape:
                    choices.setdefault(x["work"], x["cudaload_choice"])
            summary += summarize_choice(shape, [r for r in mine if "error" not in r], choices)
        not_timed.update(sec.get("not_timed") or {})
    base.update(rows=rows, summary=summary, sources=sources, not_timed=not_timed)
    return base


def _merge_firstuse(ran: list[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    """One table per shape, each from the first run that measured it."""
    seen: set[str] = set()
    parts = []
    for label, sec in ran:
        if sec.get("shape") and sec["shape"] not in seen:
            seen.add(sec["shape"])
            parts.append({**sec, "run": label})
    base = dict(parts[0]) if parts else dict(ran[0][1])
    base["also"] = parts[1:]
    return base


def merge(paths: Sequence[str], out: Path, plot: bool = True) -> dict[str, Any]:
    """Combine results.json files of split runs (e.g. one with the quant wheels, one with FA4) into one.

    Load rows (shape, quant, cache), choice shapes and first-use shapes come from the first file that
    measured them, so a later run fills what an earlier one lacked and a newer file listed first replaces
    older rows; every row keeps the name of its run. Other sections come whole from the first file that ran
    them; meta and machine from the first file, with every file's meta kept under ``meta.merged_from``.
    """
    runs = [json.loads(Path(p).read_text()) for p in paths]
    labels = [_run_label(p) for p in paths]
    merged: dict[str, Any] = {"meta": dict(runs[0].get("meta", {})), "machine": runs[0].get("machine", {})}
    merged["meta"]["merged_from"] = [
        {"file": str(p), "run": lb, **r.get("meta", {})} for p, lb, r in zip(paths, labels, runs, strict=True)
    ]
    sections: dict[str, Any] = {}
    for name in SECTIONS:
        ran = [
            (lb, r["sections"][name])
            for lb, r in zip(labels, runs, strict=True)
            if name in r.get("sections", {})
        ]
        done = [
            (lb, s)
            for lb, s in ran
            if not str(s.get("status", "")).startswith(("skipped: not requested", "pending", "missing"))
        ]
        if not done:
            sections[name] = ran[0][1] if ran else {"title": TITLES[name], "status": "missing"}
        elif name == "load":
            sections[name] = _merge_load(done)
        elif name == "choice":
            sections[name] = _merge_choice(done)
        elif name == "firstuse":
            sections[name] = _merge_firstuse(done)
        else:
            sections[name] = {**done[0][1], "run": done[0][0]}
    sections["plot"] = {"title": TITLES["plot"], "status": "skipped: not requested"}
    merged["sections"] = sections
    out.mkdir(parents=True, exist_ok=True)
    if plot:
        sections["plot"]["status"] = make_plot(merged, out / "plot.png")
    (out / "results.json").write_text(json.dumps(merged, indent=1, default=str))
    (out / "results.md").write_text(render_markdown(merged))
    return merged


def main(argv: Sequence[str] | None = None) -> int:
    p = build_parser()
    args = p.parse_args(argv)
    if args.worker:
        return worker_main(args.worker, args.spec or "{}")
    if not args.out:
        p.error("--out is required")
    if args.merge:
        merge(args.merge, Path(args.out), plot=not args.no_plot)
        return 0
    args.sections = csv(args.sections)
    bad = [s for s in args.sections if s not in SECTIONS]
    args.shape_list = ["tiny"] if args.small else csv(args.shapes)
    args.quant_list = csv(args.quant)
    bad += [s for s in args.shape_list if s not in SHAPES and s != "tiny"]
    bad += [q for q in args.quant_list if q not in QUANTS]
    if bad:
        p.error(f"unknown names: {', '.join(bad)}")
    if args.reps is None:
        args.reps = 1 if args.small else 3
    if args.budget_s is None:
        args.budget_s = 0.0 if args.small else 450.0
    return Runner(args).run()


if __name__ == "__main__":
    sys.exit(main())
