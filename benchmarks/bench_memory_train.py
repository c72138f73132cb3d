#!/usr/bin/env python
"""Training memory, measured: the figures cudaload's training estimate is held against (issue 15).

    python benchmarks/bench_memory_train.py --out DIR [--device cuda:1] [--budget-s 480]
                                            [--groups qlora8b,bisect_qlora8b,...] [--cards 24,48,80] [--smoke]

For each point (model shape x mode x optimizer x seq_len x batch x gradient checkpointing x attention) it runs
``--steps`` (>= 2) real optimizer steps (forward with ``labels`` so transformers computes its own fp32 loss,
backward, ``optimizer.step()``, ``zero_grad(set_to_none=True)``) and records the allocator's peaks
(``torch.cuda.max_memory_allocated`` / ``max_memory_reserved``, reset per point), the bytes allocated before
the point (the model) and after the last step (model + optimizer states), the time, or the out-of-memory error
it hit. Modes:

- LoRA and QLoRA train with ``adamw_torch_fused`` (Trainer's default).
- ``lora``: bf16 model, PEFT LoRA r=16, alpha 32, on every linear layer but the head (``target_modules="all-linear"``).
- ``qlora``: nf4, double quantization, bf16 compute (``BitsAndBytesConfig``), ``prepare_model_for_kbit_training``
  (which casts every non-4-bit parameter -- embeddings, norms, the head -- to fp32), then the same LoRA.
- ``full``: every parameter trained. ``adamw_torch_fused`` (Trainer's default optim on torch >= 2.8) and
  ``adamw_torch`` (foreach) as cudaload assumes: fp32 weights (master) and fp32 AdamW states, bf16 autocast
  (what Trainer does with ``bf16=True`` on a model kept in fp32); the other optimizers
  (``adamw_8bit``, ``paged_adamw_8bit`` from bitsandbytes; ``adafactor`` as Trainer builds it; ``sgd`` without
  momentum) on a bf16 model, the way people fit full fine-tunes with them. ``adamw_torch_bf16`` is AdamW on a
  bf16 model (states in bf16), for the term.

Then the fit boundary: an emulated card (``torch.cuda.set_per_process_memory_fraction(card / total)``; the CUDA
context lives outside that fraction and is recorded as ``context_bytes``) and a bisection for the longest
``seq_len`` (a multiple of 256) that trains ``--steps`` steps, for 8B QLoRA batch 1 with gradient checkpointing
and for the 0.6B full fine-tune, per card.

Everything runs in one process, one model per group, points ordered so the most informative come first; a point
predicted to overrun ``--budget-s`` (from the seconds per token measured so far) is skipped with that reason.
``DIR/results.json`` and ``DIR/results.md`` are rewritten after every point, so a killed run keeps what it had.

``--smoke``: CPU, a tiny Qwen3 config, a fake memory meter (bytes = model + a per-token cost) with fake cards,
so the OOM handling and the bisection run in seconds without a GPU.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import gc
import json
import os
import platform
import shutil
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

GiB = 1 << 30
MiB = 1 << 20
SHAPES = {"0.6b": "Qwen3-0.6B", "8b": "Qwen3-8B"}
LORA = {"r": 16, "lora_alpha": 32, "lora_dropout": 0.05, "target_modules": "all-linear", "bias": "none"}
#: the groups in the order they run (most informative first); each names the shape, mode and its points
GROUP_ORDER = (
    "qlora8b",
    "bisect_qlora8b",
    "lora8b",
    "full06",
    "bisect_full06",
    "lora06",
    "qlora06",
    "full8b",
)
#: a group that also bisects runs its batch-1 checkpointed points, then the bisection (same model, no reload),
#: then the rest of its grid; ``bisect_*`` alone runs only the bisection
BISECT_IN = {"qlora8b": "bisect_qlora8b", "full06": "bisect_full06"}
SEQS = (512, 2048, 8192, 16384)
#: optimizers measured on fp32 weights (mixed precision with fp32 master weights, bf16 autocast)
MASTER_FP32 = ("adamw_torch_fused", "adamw_torch")
ALIGN = 256
TAG = "[bench-memory-train]"


def log(msg: str) -> None:
    print(f"{TAG} {msg}", flush=True)


# ----------------------------------------------------------------------------------------------------------
# what to run
# ----------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Point:
    shape: str
    mode: str  # lora | qlora | full
    optim: str  # adamw_torch | adamw_torch_bf16 | adamw_8bit | paged_adamw_8bit | adafactor | sgd
    seq_len: int
    batch: int
    gc: bool
    attn: str = "sdpa"

    @property
    def key(self) -> str:
        return (
            f"{self.shape}/{self.mode}/{self.optim}/s{self.seq_len}/b{self.batch}/"
            f"{'gc' if self.gc else 'nogc'}/{self.attn}"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "shape": self.shape,
            "mode": self.mode,
            "optim": self.optim,
            "seq_len": self.seq_len,
            "batch": self.batch,
            "gradient_checkpointing": self.gc,
            "attn": self.attn,
        }


def grid(shape: str, mode: str, optim: str, seqs: Sequence[int]) -> list[Point]:
    """Most informative first: batch 1 with checkpointing over the lengths, then batch 4, then without
    checkpointing (short first: long ones without it are the likeliest OOMs), then eager at short lengths."""
    pts: list[Point] = []
    pts += [Point(shape, mode, optim, s, 1, True) for s in seqs]
    pts += [Point(shape, mode, optim, s, 4, True) for s in seqs]
    pts += [Point(shape, mode, optim, s, 1, False) for s in seqs]
    pts += [Point(shape, mode, optim, s, 4, False) for s in seqs]
    short = [s for s in seqs if s <= 2048] or list(seqs[:1])
    pts += [Point(shape, mode, optim, s, 1, True, "eager") for s in short]
    pts += [Point(shape, mode, optim, short[-1], 4, False, "eager")]
    return pts


def is_primary(pt: Point, grid_optim: str, seqs: Sequence[int]) -> bool:
    """The first pass: batch 1 with checkpointing over every length, the other optimizers, and one point each
    without checkpointing and with eager attention (2048 tokens, or the second length)."""
    mid = seqs[1] if len(seqs) > 1 else seqs[0]
    if pt.optim != grid_optim:
        return True
    if pt.batch == 1 and pt.gc and pt.attn == "sdpa":
        return True
    return (
        pt.batch == 1
        and pt.seq_len == mid
        and (not pt.gc or pt.attn == "eager")
        and (pt.gc or pt.attn == "sdpa")
    )


def group_points(group: str, seqs: Sequence[int], shapes: dict[str, str]) -> list[Point]:
    s8, s06 = "8b", "0.6b"
    if group == "qlora8b":
        return grid(s8, "qlora", "adamw_torch_fused", seqs)
    if group == "lora8b":
        return grid(s8, "lora", "adamw_torch_fused", seqs)
    if group == "lora06":
        return grid(s06, "lora", "adamw_torch_fused", seqs)
    if group == "qlora06":
        return grid(s06, "qlora", "adamw_torch_fused", seqs)
    if group == "full06":
        pts = grid(s06, "full", "adamw_torch_fused", seqs)
        # the other optimizers: the optimizer term shows at a short length (activations small)
        for opt in ("adamw_torch", "adamw_8bit", "paged_adamw_8bit", "adafactor", "sgd", "adamw_torch_bf16"):
            pts += [Point(s06, "full", opt, seqs[0], 1, True), Point(s06, "full", opt, seqs[1], 1, True)]
        return pts
    if group == "full8b":
        # fp32 AdamW with fp32 master weights: 16 B/param = ~131 GB for 8.2 G parameters; only the smallest point
        pts = [Point(s8, "full", "adamw_torch_fused", seqs[0], 1, True)]
        for opt in ("adamw_8bit", "paged_adamw_8bit", "adafactor", "sgd"):
            pts += [Point(s8, "full", opt, seqs[0], 1, True), Point(s8, "full", opt, seqs[1], 1, True)]
        return pts
    return []


BISECTIONS = {
    # group -> (shape, mode, optim, batch, gc)
    "bisect_qlora8b": ("8b", "qlora", "adamw_torch_fused", 1, True),
    "bisect_full06": ("0.6b", "full", "adamw_torch_fused", 1, True),
}


# ----------------------------------------------------------------------------------------------------------
# memory meters: the real one (CUDA caching allocator) and a fake one for --smoke
# ----------------------------------------------------------------------------------------------------------
class CudaMeter:
    def __init__(self, device: str) -> None:
        import torch

        self.torch = torch
        self.device = torch.device(device)
        torch.cuda.set_device(self.device)
        self.total = int(torch.cuda.get_device_properties(self.device).total_memory)
        self.limit: int | None = None

    def sync(self) -> None:
        self.torch.cuda.synchronize(self.device)

    def clear(self) -> None:
        gc.collect()
        self.torch.cuda.empty_cache()

    def reset(self) -> None:
        self.sync()
        self.torch.cuda.reset_peak_memory_stats(self.device)

    def allocated(self) -> int:
        return int(self.torch.cuda.memory_allocated(self.device))

    def reserved(self) -> int:
        return int(self.torch.cuda.memory_reserved(self.device))

    def peaks(self) -> tuple[int, int]:
        self.sync()
        return (
            int(self.torch.cuda.max_memory_allocated(self.device)),
            int(self.torch.cuda.max_memory_reserved(self.device)),
        )

    def device_used(self) -> int:
        free, total = self.torch.cuda.mem_get_info(self.device)
        return int(total - free)

    def context_bytes(self) -> int:
        """Device memory used outside the caching allocator (context, cuBLAS workspaces, ...), measured with
        nothing else of ours allocated; on a shared GPU other processes would count too."""
        self.clear()
        return self.device_used() - int(self.torch.cuda.memory_reserved(self.device))

    def set_card(self, card_bytes: int | None) -> None:
        frac = 1.0 if card_bytes is None else min(card_bytes / self.total, 1.0)
        self.clear()
        self.torch.cuda.set_per_process_memory_fraction(frac, self.device)
        self.limit = card_bytes

    def after_step(self, tokens: int) -> None:
        return None


class FakeMeter:
    """--smoke: a made-up peak (what is allocated + a per-token activation cost) checked against a fake card."""

    def __init__(self, per_token: int = 64 * 1024) -> None:
        self.total = 8 * GiB
        self.limit: int | None = None
        self.per_token = per_token
        self.base = 0
        self._peak = 0

    def sync(self) -> None:
        return None

    def clear(self) -> None:
        gc.collect()

    def reset(self) -> None:
        self._peak = 0

    def allocated(self) -> int:
        return self.base

    def reserved(self) -> int:
        return self.base

    def peaks(self) -> tuple[int, int]:
        return self._peak, self._peak

    def device_used(self) -> int:
        return self._peak

    def context_bytes(self) -> int:
        return 0

    def set_card(self, card_bytes: int | None) -> None:
        self.limit = card_bytes

    def after_step(self, tokens: int) -> None:
        import torch

        peak = self.base + tokens * self.per_token
        self._peak = max(self._peak, peak)
        if self.limit is not None and peak > self.limit:
            raise torch.OutOfMemoryError(f"fake card of {self.limit} bytes: {peak} needed")


Meter = CudaMeter | FakeMeter


# ----------------------------------------------------------------------------------------------------------
# models
# ----------------------------------------------------------------------------------------------------------
def config_for(shape: str, smoke: bool) -> Any:
    from cudaload.testing import full_config, tiny_config

    if smoke:
        # the shared tiny Qwen3 with room for the smoke run's sequence lengths
        return tiny_config(
            "qwen3", vocab_size=512, max_position_embeddings=4096, architectures=["Qwen3ForCausalLM"]
        )

    return full_config(SHAPES[shape])


def bnb_usable() -> tuple[bool, str | None]:
    try:
        import bitsandbytes  # noqa: F401
        import torch

        if not torch.cuda.is_available():
            return False, "bitsandbytes needs CUDA here"
        return True, None
    except Exception as e:
        return False, f"bitsandbytes not importable: {type(e).__name__}: {e}"


def peft_usable() -> tuple[bool, str | None]:
    try:
        import peft  # noqa: F401

        return True, None
    except Exception as e:
        return False, f"peft not importable: {type(e).__name__}: {e}"


def build_model(config: Any, dtype_name: str, device: str) -> Any:
    """Random weights from the config, made directly on the device (no checkpoint)."""
    import torch
    from transformers import AutoModelForCausalLM

    dtype = getattr(torch, dtype_name)
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation="sdpa")
    model.config.use_cache = False
    return model


def quantized_model(config: Any, device: str, work: Path) -> tuple[Any, dict[str, Any]]:
    """nf4 (double quant, bf16 compute) through from_pretrained: bitsandbytes quantizes while loading, so a
    random bf16 checkpoint is written first (made on the device, reused under --work)."""
    import torch
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    arch = (config.architectures or ["model"])[0]
    path = work / f"{arch}-{config.num_hidden_layers}L-{config.hidden_size}h-{config.vocab_size}v"
    info: dict[str, Any] = {"checkpoint": str(path)}
    if not (path / "config.json").exists():
        t0 = time.perf_counter()
        m = build_model(config, "bfloat16", device)
        with torch.no_grad():
            for n, p in m.named_parameters():
                if p.dim() > 1:
                    p.mul_(0.5)  # keep the random activations finite (std 0.01 at init, halved)
                _ = n
        tmp = path.with_name(path.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        m.save_pretrained(tmp)
        del m
        gc.collect()
        torch.cuda.empty_cache()
        os.replace(tmp, path)
        info["write_s"] = time.perf_counter() - t0
    qc = BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type="nf4",
        bnb_4bit_use_double_quant=True,
        bnb_4bit_compute_dtype=torch.bfloat16,
    )
    t0 = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(
        str(path),
        quantization_config=qc,
        dtype=torch.bfloat16,
        device_map={"": device},
        attn_implementation="sdpa",
    )
    info["load_s"] = time.perf_counter() - t0
    model.config.use_cache = False
    return model, info


@dataclass
class Prepared:
    model: Any
    trainable: list[Any]
    info: dict[str, Any] = field(default_factory=dict)
    autocast: bool = False


def prepare(shape: str, mode: str, optim: str, *, device: str, smoke: bool, work: Path) -> Prepared:
    """The model for a (shape, mode, optim) family; only what the mode trains requires grad."""
    config = config_for(shape, smoke)
    info: dict[str, Any] = {}
    if mode == "qlora":
        from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training

        model, info = quantized_model(config, device, work)
        # as users do it: freeze, cast every non-4-bit parameter to fp32, checkpointing toggled per point
        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
        model = get_peft_model(model, LoraConfig(task_type="CAUSAL_LM", **LORA))
        autocast = False
    elif mode == "lora":
        from peft import LoraConfig, get_peft_model

        model = build_model(config, "bfloat16", device)
        model = get_peft_model(model, LoraConfig(task_type="CAUSAL_LM", **LORA))
        autocast = False
    else:
        master = optim in MASTER_FP32
        model = build_model(config, "float32" if master else "bfloat16", device)
        autocast = master
    trainable = [p for p in model.parameters() if p.requires_grad]
    info["trainable_params"] = sum(p.numel() for p in trainable)
    info["params"] = sum(p.numel() for p in model.parameters())
    info["param_dtypes"] = sorted({str(p.dtype).replace("torch.", "") for p in model.parameters()})
    return Prepared(model, trainable, info, autocast)


def make_optimizer(name: str, params: list[Any]) -> Any:
    """The optimizer TrainingArguments(optim=name) builds (transformers' Trainer.get_optimizer_cls_and_kwargs)."""
    import torch

    lr = 1e-5
    if name in ("adamw_torch_fused", "adamw_torch_bf16"):
        # Trainer's default optim on torch >= 2.8 (transformers 5.17 training_args.py:804-809): one fused kernel
        return torch.optim.AdamW(params, lr=lr, fused=True)
    if name == "adamw_torch":
        # the foreach implementation: torch._foreach_sqrt makes a full copy of exp_avg_sq during step()
        return torch.optim.AdamW(params, lr=lr, foreach=bool(params) and params[0].is_cuda)
    if name == "adamw_8bit":
        import bitsandbytes as bnb

        return bnb.optim.AdamW8bit(params, lr=lr)
    if name == "paged_adamw_8bit":
        import bitsandbytes as bnb

        return bnb.optim.PagedAdamW8bit(params, lr=lr)
    if name == "adafactor":
        from transformers.optimization import Adafactor

        # Trainer's optim="adafactor": scale_parameter=False, relative_step=False
        return Adafactor(params, lr=lr, scale_parameter=False, relative_step=False)
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr)  # Trainer's optim="sgd": no momentum
    raise ValueError(f"unknown optimizer {name}")


def set_gc(model: Any, on: bool) -> None:
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    if on:
        base.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    elif base.is_gradient_checkpointing:
        base.gradient_checkpointing_disable()


def set_attn(model: Any, attn: str) -> None:
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    if hasattr(base, "set_attn_implementation"):
        base.set_attn_implementation(attn)
    else:  # older transformers read the config at every forward
        base.config._attn_implementation = attn


def is_oom(e: BaseException) -> bool:
    import torch

    if isinstance(e, torch.OutOfMemoryError):
        return True
    msg = str(e).lower()
    return "out of memory" in msg or "cudaerrormemoryallocation" in msg


def train_steps(
    prep: Prepared,
    optim: str,
    batch: int,
    seq_len: int,
    steps: int,
    meter: Meter,
    device: str,
    row: dict[str, Any],
) -> float:
    """``steps`` optimizer steps; returns seconds. Raises on OOM (the caller cleans up)."""
    import torch

    model = prep.model
    model.train()
    g = torch.Generator().manual_seed(1234)
    vocab = int(getattr(model.config, "vocab_size", 0) or model.get_input_embeddings().num_embeddings)
    ids = torch.randint(4, vocab, (batch, seq_len), generator=g).to(device)
    opt = make_optimizer(optim, prep.trainable)
    t0 = time.perf_counter()
    try:
        for _ in range(steps):
            ctx = (
                torch.autocast(device_type=torch.device(device).type, dtype=torch.bfloat16)
                if prep.autocast
                else contextlib.nullcontext()
            )
            with ctx:
                # only the loss survives the forward, as in Trainer.training_step (the logits are not kept)
                loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            del loss
            opt.step()
            opt.zero_grad(set_to_none=True)
            meter.after_step(batch * seq_len)
        meter.sync()
        # paged optimizer states are CUDA managed memory, outside the caching allocator: seen only here
        row["device_used_after"] = meter.device_used()
        row["reserved_after"] = meter.reserved()
        return time.perf_counter() - t0
    finally:
        opt.zero_grad(set_to_none=True)
        for p in prep.trainable:
            p.grad = None
        opt.state.clear()
        del opt


def measure(prep: Prepared, pt: Point, steps: int, meter: Meter, device: str) -> dict[str, Any]:
    set_gc(prep.model, pt.gc)
    set_attn(prep.model, pt.attn)
    meter.clear()
    before = meter.allocated()
    meter.reset()
    row: dict[str, Any] = {**pt.to_dict(), "key": pt.key, "steps": steps, "allocated_before": before}
    err: BaseException | None = None
    try:
        row["seconds"] = train_steps(prep, pt.optim, pt.batch, pt.seq_len, steps, meter, device, row)
    except Exception as e:
        err = e
    alloc, reserved = meter.peaks()
    row["peak_allocated"] = alloc
    row["peak_reserved"] = reserved
    if err is not None:
        row["oom"] = is_oom(err)
        row["error"] = f"{type(err).__name__}: {str(err)[:300]}"
        if not row["oom"]:
            row["traceback"] = "".join(traceback.format_exception(err))[-2000:]
        err = None
    else:
        row["oom"] = False
        row["allocated_after"] = meter.allocated()
    meter.clear()
    return row


# ----------------------------------------------------------------------------------------------------------
# the runner
# ----------------------------------------------------------------------------------------------------------
class Runner:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.t0 = time.perf_counter()
        self.out = Path(args.out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.work = Path(args.work)
        self.smoke = bool(args.smoke)
        self.device = "cpu" if self.smoke else args.device
        self.seqs = [32, 64] if self.smoke else [int(s) for s in args.seqs.split(",")]
        self.cards = [int(c) for c in args.cards.split(",")]
        self.res: dict[str, Any] = {
            "meta": self.meta(),
            "points": [],
            "bisections": [],
            "skipped": [],
            "groups": {},
        }
        #: seconds per token per (shape, mode, optim family), from what ran: the budget check's prediction
        self.rate: dict[tuple[str, str], float] = {}

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def left(self) -> float:
        return self.args.budget_s - self.elapsed()

    def meta(self) -> dict[str, Any]:
        m: dict[str, Any] = {
            "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "python": platform.python_version(),
            "argv": sys.argv[1:],
            "smoke": bool(self.args.smoke),
        }
        for mod in ("torch", "transformers", "peft", "bitsandbytes", "accelerate"):
            try:
                m[mod] = __import__(mod).__version__
            except Exception:
                m[mod] = None
        try:
            import subprocess

            m["commit"] = subprocess.run(
                ["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5, check=False
            ).stdout.strip()
        except Exception:
            m["commit"] = None
        return m

    def save(self) -> None:
        self.res["elapsed_s"] = round(self.elapsed(), 1)
        tmp = self.out / "results.json.tmp"
        tmp.write_text(json.dumps(self.res, indent=1, default=str))
        os.replace(tmp, self.out / "results.json")
        (self.out / "results.md").write_text(render_markdown(self.res))

    def predict_s(self, shape: str, mode: str, tokens: int, gc_on: bool) -> float:
        r = self.rate.get((shape, mode))
        if r is None:
            return 0.0
        return r * tokens * self.args.steps * (1.35 if gc_on else 1.0)

    def note_rate(self, shape: str, mode: str, row: dict[str, Any]) -> None:
        if row.get("seconds") and not row.get("oom"):
            per = row["seconds"] / (row["batch"] * row["seq_len"] * row["steps"])
            if row["gradient_checkpointing"]:
                per /= 1.35
            old = self.rate.get((shape, mode))
            self.rate[(shape, mode)] = per if old is None else max(per, 0.5 * old + 0.5 * per)

    def skip(self, what: str, why: str) -> None:
        self.res["skipped"].append({"what": what, "why": why})
        log(f"skip {what}: {why}")

    def run(self) -> int:
        meter: Meter
        if self.smoke:
            meter = FakeMeter()
        else:
            import torch

            if not torch.cuda.is_available():
                log("no CUDA device: use --smoke on a CPU machine")
                return 2
            meter = CudaMeter(self.device)
            # the context and cuBLAS handles exist after a first matmul
            a = torch.ones(256, 256, device=self.device, dtype=torch.bfloat16)
            (a @ a).sum().item()
            del a
        self.meter = meter
        self.res["meta"]["device"] = self.device
        self.res["meta"]["device_total_bytes"] = meter.total
        self.res["meta"]["context_bytes"] = meter.context_bytes()
        if not self.smoke:
            import torch

            self.res["meta"]["device_name"] = torch.cuda.get_device_name(self.device)
        self.res["meta"]["cards_gib"] = self.cards
        self.res["meta"]["card_note"] = (
            "an emulated card is torch.cuda.set_per_process_memory_fraction(card_bytes / device_total): the "
            "caching allocator may reserve card_bytes; the CUDA context (context_bytes) is outside it, so a "
            "real card of that size has context_bytes less for tensors"
        )
        self.save()
        log(
            f"device {self.device}, total {meter.total / GiB:.1f} GiB, context {self.res['meta']['context_bytes'] / MiB:.0f} MiB"
        )
        asked = set(self.args.groups.split(","))
        # a bisect_ group asked for together with the group that carries it runs inside that group
        groups = [
            g
            for g in GROUP_ORDER
            if g in asked and not (g in BISECTIONS and any(BISECT_IN.get(h) == g for h in asked))
        ]
        if self.smoke:
            groups = [g for g in groups if not g.startswith("full8b")]
        bnb_ok, bnb_why = (False, "smoke: CPU") if self.smoke else bnb_usable()
        peft_ok, peft_why = peft_usable()
        # two passes: every group's primary points and bisections first, then the rest of every grid, so a
        # budget that runs out leaves the most informative figures of every group rather than all of one
        for phase in ("primary", "secondary"):
            for gname in groups:
                if self.left() < 5:
                    self.skip(f"{gname} ({phase})", "budget spent")
                    continue
                try:
                    self.run_group(gname, bnb_ok, bnb_why, peft_ok, peft_why, phase)
                except Exception as e:
                    self.res["groups"].setdefault(gname, {})[f"error_{phase}"] = "".join(
                        traceback.format_exception(e)
                    )[-3000:]
                    log(f"group {gname} ({phase}) failed: {type(e).__name__}: {e}")
                self.save()
        log(
            f"done in {self.elapsed():.0f} s: {len(self.res['points'])} points, {len(self.res['bisections'])} bisections"
        )
        self.save()
        return 0

    def run_group(
        self,
        gname: str,
        bnb_ok: bool,
        bnb_why: str | None,
        peft_ok: bool,
        peft_why: str | None,
        phase: str = "primary",
    ) -> None:
        if gname in BISECTIONS:
            if phase != "primary":
                return
            shape, mode, optim = BISECTIONS[gname][:3]
            pts: list[Point] = []
        else:
            every = group_points(gname, self.seqs, SHAPES)
            shape, mode = every[0].shape, every[0].mode
            optim = every[0].optim
            pts = [p for p in every if is_primary(p, optim, self.seqs) == (phase == "primary")]
            if not pts:
                return
        if mode in ("lora", "qlora") and not peft_ok:
            self.skip(gname, peft_why or "peft missing")
            return
        if mode == "qlora" and not bnb_ok:
            self.skip(gname, bnb_why or "bitsandbytes missing")
            return
        ginfo = self.res["groups"].setdefault(gname, {})
        # models by weight layout: full fine-tunes with adamw_torch train fp32 weights, the others bf16
        families: dict[bool, list[Point]] = {}
        for p in pts:
            families.setdefault(p.mode == "full" and p.optim in MASTER_FP32, []).append(p)
        if not pts:
            families = {mode == "full" and optim in MASTER_FP32: []}
        carried = BISECT_IN.get(gname)
        bis = (
            gname
            if gname in BISECTIONS
            else (carried if carried in set(self.args.groups.split(",")) and phase == "primary" else None)
        )
        for master, fpts in families.items():
            fam_optim = "adamw_torch_fused" if master else (fpts[0].optim if fpts else optim)
            t0 = time.perf_counter()
            log(
                f"{gname}: building {shape} {mode} ({'fp32 master' if master else 'bf16'}) at t={self.elapsed():.0f}s"
            )
            prep = prepare(shape, mode, fam_optim, device=self.device, smoke=self.smoke, work=self.work)
            if isinstance(self.meter, FakeMeter):
                self.meter.base = sum(p.numel() * p.element_size() for p in prep.model.parameters())
            ginfo.setdefault("models", []).append(
                {
                    **prep.info,
                    "master_fp32": master,
                    "build_s": round(time.perf_counter() - t0, 1),
                    "model_allocated": self.meter.allocated(),
                }
            )
            self.save()
            try:
                bis_here = bis is not None and (BISECTIONS[bis][1] == mode and master == (mode == "full"))
                first = (
                    sum(1 for p in fpts if p.batch == 1 and p.gc and p.attn == "sdpa" and p.optim == optim)
                    if (bis_here and gname not in BISECTIONS)
                    else len(fpts)
                )
                for pt in fpts[:first]:
                    self.run_point(prep, pt, bnb_ok, bnb_why)
                if bis_here and bis is not None:
                    bshape, bmode, boptim, bbatch, bgc = BISECTIONS[bis]
                    for card in self.cards:
                        self.bisect(prep, bis, bshape, bmode, boptim, bbatch, bgc, card)
                for pt in fpts[first:]:
                    self.run_point(prep, pt, bnb_ok, bnb_why)
            finally:
                del prep
                self.meter.set_card(None)
                self.meter.clear()

    def run_point(self, prep: Prepared, pt: Point, bnb_ok: bool, bnb_why: str | None) -> None:
        if pt.optim in ("adamw_8bit", "paged_adamw_8bit") and not bnb_ok:
            self.skip(pt.key, bnb_why or "bitsandbytes missing")
            return
        tokens = pt.batch * pt.seq_len
        pred = self.predict_s(pt.shape, pt.mode, tokens, pt.gc)
        if pred > self.left() - 3:
            self.skip(pt.key, f"predicted {pred:.0f} s, {self.left():.0f} s of the budget left")
            return
        row = measure(prep, pt, self.args.steps, self.meter, self.device)
        row["t"] = round(self.elapsed(), 1)
        row["cudaload"] = cudaload_estimate(row, self.smoke)
        self.res["points"].append(row)
        self.note_rate(pt.shape, pt.mode, row)
        status = "OOM" if row["oom"] else (row.get("error") or f"{row.get('seconds', 0):.1f} s")
        log(
            f"{pt.key}: peak alloc {row['peak_allocated'] / GiB:.2f} GiB, reserved "
            f"{row['peak_reserved'] / GiB:.2f} GiB ({status}) t={self.elapsed():.0f}s"
        )
        self.save()

    def bisect(
        self,
        prep: Prepared,
        gname: str,
        shape: str,
        mode: str,
        optim: str,
        batch: int,
        gc_on: bool,
        card_gib: int,
    ) -> None:
        card = card_gib * GiB if not self.smoke else card_gib * MiB * 4  # smoke: fake cards of 4 MiB/"GiB"
        rec: dict[str, Any] = {
            "group": gname,
            "shape": shape,
            "mode": mode,
            "optim": optim,
            "batch": batch,
            "gradient_checkpointing": gc_on,
            "attn": "sdpa",
            "card_gib": card_gib,
            "card_bytes": card,
            "context_bytes": self.res["meta"]["context_bytes"],
            "probes": [],
        }
        self.res["bisections"].append(rec)
        self.meter.set_card(card)
        # a first guess from the unlimited points: peak_reserved linear in seq_len
        guess = self.guess(shape, mode, optim, batch, gc_on, card)
        rec["first_guess"] = guess
        log(f"bisect {gname} on {card_gib} GB: first guess {guess}")

        def trains(seq: int) -> bool | None:
            pred = self.predict_s(shape, mode, batch * seq, gc_on)
            if pred > self.left() - 3:
                rec["stopped"] = f"budget: a probe at {seq} predicted {pred:.0f} s, {self.left():.0f} s left"
                return None
            pt = Point(shape, mode, optim, seq, batch, gc_on)
            row = measure(prep, pt, self.args.steps, self.meter, self.device)
            self.note_rate(shape, mode, row)
            ok = not row["oom"] and "error" not in row
            rec["probes"].append(
                {
                    "seq_len": seq,
                    "trains": ok,
                    "peak_allocated": row["peak_allocated"],
                    "peak_reserved": row["peak_reserved"],
                    "seconds": row.get("seconds"),
                    "error": row.get("error"),
                }
            )
            log(
                f"  {card_gib} GB seq {seq}: {'trains' if ok else row.get('error', 'fails')[:80]} t={self.elapsed():.0f}s"
            )
            self.save()
            if not ok and not row["oom"]:
                rec["stopped"] = f"non-OOM error at {seq}: {row.get('error')}"
                return None
            return ok

        lo, hi = bisect_longest(trains, guess, align=ALIGN, max_seq=self.args.max_seq)
        rec["longest_trains"] = lo
        rec["shortest_fails"] = hi
        rec["converged"] = hi is not None and lo is not None and hi - lo <= ALIGN
        try:
            rec["cudaload_planned"] = planned_longest(rec, self.smoke, card)
        except Exception as e:
            rec["cudaload_planned_error"] = f"{type(e).__name__}: {e}"
        self.meter.set_card(None)
        log(f"bisect {gname} {card_gib} GB: longest {lo}, shortest failing {hi}")
        self.save()

    def guess(self, shape: str, mode: str, optim: str, batch: int, gc_on: bool, card: int) -> int:
        pts = [
            (r["seq_len"], r["peak_reserved"])
            for r in self.res["points"]
            if r["shape"] == shape
            and r["mode"] == mode
            and r["optim"] == optim
            and r["batch"] == batch
            and r["gradient_checkpointing"] == gc_on
            and r["attn"] == "sdpa"
            and not r["oom"]
            and "error" not in r
        ]
        probes = [
            (p["seq_len"], p["peak_reserved"])
            for b in self.res["bisections"]
            if b["shape"] == shape and b["mode"] == mode and b["optim"] == optim and b["batch"] == batch
            for p in b["probes"]
            if p["trains"]
        ]
        return first_guess(pts + probes, card, default=4096 if not self.smoke else 256, align=ALIGN)


def first_guess(pts: Sequence[tuple[int, int]], card: int, *, default: int, align: int) -> int:
    """seq_len where a line through (seq_len, peak) points reaches ``card``; ``default`` without two points."""
    uniq = sorted(dict(pts).items())
    if len(uniq) < 2:
        return default
    (s0, p0), (s1, p1) = uniq[-2], uniq[-1]
    slope = (p1 - p0) / (s1 - s0) if s1 != s0 else 0
    if slope <= 0:
        return default
    s = s1 + (card - p1) / slope
    return max(align, int(s // align) * align)


def bisect_longest(
    trains: Callable[[int], bool | None], guess: int, *, align: int, max_seq: int
) -> tuple[int | None, int | None]:
    """(longest seq_len known to train, shortest known to fail), both multiples of ``align``.

    Starts at ``guess``, steps geometrically (x1.25 around the guess, then doubling) to bracket the boundary, then
    bisects to ``align``. ``trains`` returns None to stop (budget): the bracket so far is returned."""
    lo: int | None = None
    hi: int | None = None
    seq = max(align, (guess // align) * align)
    step = 1.25
    while True:
        ok = trains(seq)
        if ok is None:
            return lo, hi
        if ok:
            lo = seq
            if hi is not None:
                break
            if seq >= max_seq:
                return lo, hi
            nxt = min(max_seq, max(seq + align, int(seq * step) // align * align))
        else:
            hi = seq
            if lo is not None:
                break
            if seq <= align:
                return lo, hi
            nxt = max(align, min(seq - align, int(seq / step) // align * align))
        step = min(step * step, 2.0)
        seq = nxt
    while hi - lo > align:
        mid = (lo + hi) // 2 // align * align
        if mid <= lo:
            mid = lo + align
        ok = trains(mid)
        if ok is None:
            break
        if ok:
            lo = mid
        else:
            hi = mid
    return lo, hi


# ----------------------------------------------------------------------------------------------------------
# cudaload's own estimates for what was measured (pure arithmetic: no GPU)
# ----------------------------------------------------------------------------------------------------------
# bench mode/optim -> cudaload arguments: one mapping, shared with the offline comparison (its sibling)
sys.path.insert(0, str(Path(__file__).resolve().parent))
from compare_memory_train import longest_aligned, plan_args  # noqa: E402

_INFO: dict[str, Any] = {}


def _info(shape: str, smoke: bool) -> Any:
    from cudaload.model_info import model_info

    key = f"{shape}/{smoke}"
    if key not in _INFO:
        _INFO[key] = model_info(config_for(shape, smoke))
    return _INFO[key]


def cudaload_estimate(row: dict[str, Any], smoke: bool) -> dict[str, Any] | None:
    """cudaload's terms for a measured point; ``estimate_allocated`` is comparable with the allocator's peak
    (the CUDA context is outside it)."""
    args = plan_args(row["mode"], row["optim"])
    if args is None:
        return None
    try:
        from cudaload.policies.memory import allocated_bytes, estimate, reserved_bytes

        t = estimate(
            _info(row["shape"], smoke),
            dtype="bfloat16",
            seq_len=row["seq_len"],
            batch_size=row["batch"],
            attn=row["attn"],
            gradient_checkpointing=row["gradient_checkpointing"],
            **args,
        )
    except Exception as e:
        return {"error": f"{type(e).__name__}: {e}"}
    alloc, reserved = allocated_bytes(t), reserved_bytes(t)
    out: dict[str, Any] = {"terms": t, "estimate_allocated": alloc, "estimate_reserved": reserved}
    if not row.get("oom") and row.get("peak_allocated"):
        out["ratio_allocated"] = alloc / row["peak_allocated"]
        out["ratio_reserved"] = reserved / max(row["peak_reserved"], 1)
    return out


def planned_longest(rec: dict[str, Any], smoke: bool, allocator_bytes: int) -> int | None:
    """The longest seq_len (multiple of 256) cudaload plans for an emulated card whose allocator may hold
    ``allocator_bytes``: a GPU of that size plus cudaload's own context allowance (which it subtracts)."""
    args = plan_args(rec["mode"], rec["optim"])
    if args is None:
        return None
    from cudaload.capabilities import GPU, Capabilities
    from cudaload.errors import DoesNotFitError
    from cudaload.planner import plan
    from cudaload.policies.memory import CUDA_CONTEXT_BYTES

    total = allocator_bytes + CUDA_CONTEXT_BYTES
    caps = Capabilities(source="emulated", gpus=(GPU(0, "emulated", (9, 0), total, total),)).with_packages(
        ["bitsandbytes"], []
    )
    cfg = config_for(rec["shape"], smoke)
    q = args["quantization"] or "none"

    def fits(seq: int) -> bool:
        try:
            plan(
                cfg,
                hardware=caps,
                intent=args["intent"],
                quantization=q if args["intent"] != "training" else "auto",
                optimizer=args["optimizer"],
                gradient_checkpointing=rec["gradient_checkpointing"],
                attn="sdpa",
                seq_len=seq,
                batch_size=rec["batch"],
            )
            return True
        except DoesNotFitError:
            return False

    return longest_aligned(fits, ALIGN)


# ----------------------------------------------------------------------------------------------------------
# markdown
# ----------------------------------------------------------------------------------------------------------
def _g(n: Any) -> str:
    return "-" if n is None else f"{n / GiB:.2f}"


def _r(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def render_markdown(res: dict[str, Any]) -> str:
    m = res["meta"]
    out = [
        "# Training memory, measured (benchmarks/bench_memory_train.py)",
        "",
        f"{m.get('date')} on {m.get('device_name', m.get('device'))}, torch {m.get('torch')}, transformers "
        f"{m.get('transformers')}, peft {m.get('peft')}, bitsandbytes {m.get('bitsandbytes')}; CUDA context "
        f"outside the allocator {(m.get('context_bytes') or 0) / MiB:.0f} MiB; elapsed {res.get('elapsed_s')} s.",
        "",
        "## Peaks (GiB; allocator: max_memory_allocated / max_memory_reserved, reset per point)",
        "",
        "| shape | mode | optim | seq | batch | ckpt | attn | before | peak alloc | peak reserved | after | s | result "
        "| cudaload est. | est. / peak alloc |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in res["points"]:
        result = "OOM" if r["oom"] else ("error" if "error" in r else "ok")
        out.append(
            f"| {r['shape']} | {r['mode']} | {r['optim']} | {r['seq_len']} | {r['batch']} | "
            f"{'on' if r['gradient_checkpointing'] else 'off'} | {r['attn']} | {_g(r['allocated_before'])} | "
            f"{_g(r['peak_allocated'])} | {_g(r['peak_reserved'])} | {_g(r.get('allocated_after'))} | "
            f"{r.get('seconds', 0) or 0:.1f} | {result} | {_g((r.get('cudaload') or {}).get('estimate_allocated'))} | "
            f"{_r((r.get('cudaload') or {}).get('ratio_allocated'))} |"
        )
    out += ["", "## Fit boundary on emulated cards (longest seq_len that trains, multiple of 256)", ""]
    out += [
        "| group | card GB | longest trains | shortest fails | converged | cudaload plans | planned / measured "
        "| probes | note |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for b in res["bisections"]:
        probes = ", ".join(f"{p['seq_len']}{'+' if p['trains'] else 'x'}" for p in b["probes"])
        out.append(
            f"| {b['group']} | {b['card_gib']} | {b.get('longest_trains')} | {b.get('shortest_fails')} | "
            f"{b.get('converged')} | {b.get('cudaload_planned')} | "
            f"{_r(b['cudaload_planned'] / b['longest_trains'] if b.get('cudaload_planned') and b.get('longest_trains') else None)} "
            f"| {probes} | {b.get('stopped', '')} |"
        )
    if res["skipped"]:
        out += ["", "## Skipped", ""] + [f"- {s['what']}: {s['why']}" for s in res["skipped"]]
    for g, info in res["groups"].items():
        if "error" in info:
            out += ["", f"## Group {g} failed", "", "```", info["error"], "```"]
    return "\n".join(out) + "\n"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True)
    p.add_argument("--device", default="cuda:0")
    p.add_argument("--budget-s", type=float, default=480.0)
    p.add_argument("--groups", default=",".join(GROUP_ORDER), help=f"any of {', '.join(GROUP_ORDER)}")
    p.add_argument("--seqs", default=",".join(map(str, SEQS)))
    p.add_argument("--cards", default="24,48,80", help="emulated card sizes in GiB")
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--max-seq", type=int, default=131072)
    p.add_argument("--work", default="/tmp/cudaload-bench-train")
    p.add_argument("--smoke", action="store_true")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.steps < 2:
        raise SystemExit(
            "--steps must be >= 2: optimizer states appear at the first step, the second shows the steady peak"
        )
    if args.smoke:
        args.cards = "24,48" if args.cards == "24,48,80" else args.cards
        args.max_seq = min(args.max_seq, 4096)
        if args.groups == ",".join(GROUP_ORDER):
            args.groups = "full06,lora06"
    src = Path(__file__).resolve().parents[1] / "src"
    if src.is_dir() and str(src) not in sys.path:
        sys.path.insert(0, str(src))
    return Runner(args).run()


if __name__ == "__main__":
    raise SystemExit(main())
