"""Shared by every section: the names and goals, number helpers, and the worker-side helpers (device,
memory, the checkpoint writer, timing) that run inside a measurement subprocess."""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import time
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


def _status_line(sec: dict[str, Any]) -> str:
    st = str(sec.get("status", "?"))
    return f"_{st}_" if st != "ok" else "_ok_"


def _ms(s: float | None) -> float | None:
    return None if s is None else s * 1000
