#!/usr/bin/env python
"""Several GPUs (issue 17): DDP LoRA / QLoRA, FSDP2 full fine-tuning, tensor-parallel inference and a
one-process layer split, on 2 GPUs, each measured against what cudaload plans.

    python benchmarks/bench_parallel.py --out DIR [--budget-s 300] [--parts a,b,c,d,e] [--work DIR] [--smoke]

parts:
  a  DDP LoRA, Qwen3-0.6B shape: ``cudaload.load_model(intent="lora")`` on each rank under torchrun, wrapped in
     DistributedDataParallel, 20 AdamW steps on a fixed batch (loss must go down), per-GPU peak vs the plan.
  b  DDP QLoRA, same (only when bitsandbytes imports).
  c  FSDP2 full fine-tuning, Qwen3-8B shape: built on the meta device on each rank, ``fully_shard`` per
     decoder layer and at the root (bf16 compute, fp32 reduce, fp32 sharded parameters), materialised with
     ``to_empty`` and random-initialised shard by shard (no checkpoint, no full copy on any rank), fp32 AdamW,
     10 steps at batch 1 x 512, per-GPU peak vs the plan.
  d  tensor-parallel inference, Qwen3-8B shape (0.6B when the budget is short): ``from_pretrained(tp_plan="auto")``
     under torchrun against the same checkpoint on one GPU: logits within bf16 tolerance, greedy decode
     tokens/s at batch 1 and 8, interleaved.
  e  a layer split in one process seeing 2 GPUs: ``cudaload.load_model(device_map="auto")`` against
     ``from_pretrained(device_map="auto")``: load time (interleaved), memory per GPU, same logits.

Each part runs in fresh processes (``torchrun --nproc_per_node 2`` for a-d, this file with ``--worker``), so
peaks and CUDA contexts never leak between parts. The parent never touches CUDA. After every part
``DIR/results.json`` and ``DIR/results.md`` are rewritten; a part that fails records its error and the run
goes on. ``--smoke`` runs every part that can on this CPU (gloo, 2 processes, tiny Qwen3) in about a minute.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import importlib.util
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

PARTS = ("a", "b", "c", "d", "e")
TITLES = {
    "a": "a. DDP LoRA (Qwen3-0.6B shape)",
    "b": "b. DDP QLoRA (Qwen3-0.6B shape, nf4)",
    "c": "c. FSDP2 full fine-tuning (Qwen3-8B shape, fp32 AdamW)",
    "d": "d. Tensor-parallel inference vs one GPU",
    "e": "e. Layer split in one process: cudaload vs from_pretrained(device_map='auto')",
}
#: seconds each part may take on 2 x H200 (process start, imports ~10 s, included); trimmed to the budget left
PART_TIMEOUT_S = {"a": 75, "b": 90, "c": 110, "write": 120, "d": 150, "e": 90}
#: below this many seconds left, part d uses the 0.6B shape instead of writing/loading the 16 GB one
D_8B_MIN_LEFT_S = 120
#: writing the random 16 GB checkpoint (generated on the GPU, saved from host memory into the page cache)
WRITE_8B_EXPECTED_S = 60
#: logits of TP vs one GPU: bf16 has an 8-bit mantissa (relative step 2^-8 = 0.4%) and TP changes the order
#: of every row-parallel reduction over 36 layers; we accept 5% of the reference's largest |logit| and
#: argmax agreement on 95% of positions (random weights give near-uniform logits, so ties flip easily).
TP_ATOL_FRAC = 0.05
TP_ARGMAX_MIN = 0.95
HERE = Path(__file__).resolve().parent
GiB = 1 << 30


def log(msg: str) -> None:
    print(f"[bench_parallel {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def median(xs: list[float]) -> float | None:
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def spread(xs: list[float]) -> list[float] | None:
    xs = [x for x in xs if x is not None]
    return [min(xs), max(xs)] if xs else None


# ----------------------------------------------------------------------------------------------------
# worker side (runs under torchrun, or alone for part e)
# ----------------------------------------------------------------------------------------------------
class Ctx:
    """Rank, device and process group of one worker."""

    def __init__(self, smoke: bool, distributed: bool = True) -> None:
        import torch

        self.smoke = smoke
        self.rank = int(os.environ.get("RANK", "0"))
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        self.world = int(os.environ.get("WORLD_SIZE", "1"))
        self.cuda = torch.cuda.is_available() and not smoke
        self.device = torch.device(f"cuda:{self.local_rank}") if self.cuda else torch.device("cpu")
        if self.cuda:
            torch.cuda.set_device(self.device)
        self.dist = distributed and self.world > 1
        if self.dist:
            import torch.distributed as dist

            if not dist.is_initialized():
                dist.init_process_group(
                    "nccl" if self.cuda else "gloo", device_id=self.device if self.cuda else None
                )

    def sync(self) -> None:
        import torch

        if self.cuda:
            torch.cuda.synchronize(self.device)

    def barrier(self) -> None:
        if self.dist:
            import torch.distributed as dist

            dist.barrier()

    def gather(self, obj: Any) -> list[Any]:
        if not self.dist:
            return [obj]
        import torch.distributed as dist

        out: list[Any] = [None] * self.world
        dist.all_gather_object(out, obj)
        return out

    def reset_peak(self) -> None:
        import torch

        if self.cuda:
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)

    def memory(self) -> dict[str, Any]:
        import torch

        if not self.cuda:
            return {"device": str(self.device)}
        free, total = torch.cuda.mem_get_info(self.device)
        return {
            "device": str(self.device),
            "name": torch.cuda.get_device_name(self.device),
            "allocated": torch.cuda.memory_allocated(self.device),
            "peak_allocated": torch.cuda.max_memory_allocated(self.device),
            "peak_reserved": torch.cuda.max_memory_reserved(self.device),
            # what the device holds at the end, the CUDA context and NCCL's buffers included
            "device_used": total - free,
        }

    def close(self) -> None:
        if self.dist:
            import torch.distributed as dist

            dist.destroy_process_group()


def _plan_summary(make: Any) -> dict[str, Any]:
    """What cudaload plans, kept whatever shape the plan has (the parallelism field is new in issue 17)."""
    try:
        p = make()
    except Exception as e:
        return {"error": f"{type(e).__name__}: {e}"[:600]}
    out: dict[str, Any] = {
        "memory_total": p.memory.total,
        "memory_per_device": dict(p.memory.per_device),
        "memory_terms": dict(p.memory.terms),
        "quantization": p.quantization.choice,
        "placement": p.placement.to_dict()["devices"],
    }
    par = getattr(p, "parallelism", None)
    if par is not None:
        d = par.to_dict() if hasattr(par, "to_dict") else par
        out["parallelism"] = d
    return out


#: plan terms that live outside torch's caching allocator (compared with the device's used memory, not with
#: torch.cuda.max_memory_allocated)
OUTSIDE_ALLOCATOR = ("cuda_context", "nccl")


def _plan_hardware(smoke: bool) -> Any:
    """What plans are made against: the machine itself, or in --smoke a 2 x H200 profile seen from this
    torchrun rank (so the comparison code runs on a CPU too; its numbers then mean nothing)."""
    if not smoke:
        return None
    import dataclasses

    from cudaload.capabilities import Distributed
    from cudaload.profiles import hardware

    env = os.environ
    dist = Distributed(
        local_rank=int(env.get("LOCAL_RANK", "0")),
        rank=int(env.get("RANK", "0")),
        world_size=int(env.get("WORLD_SIZE", "1")),
        local_world_size=int(env.get("LOCAL_WORLD_SIZE", env.get("WORLD_SIZE", "1"))),
    )
    return dataclasses.replace(hardware("2xH200"), distributed=dist)


def _planned_terms(plan: dict[str, Any]) -> dict[str, int]:
    par = plan.get("parallelism")
    if isinstance(par, dict):
        for c in par.get("candidates", []):
            if c.get("name") == par.get("choice") and c.get("per_gpu_terms"):
                return dict(c["per_gpu_terms"])
    return {}


def _planned_allocated(plan: dict[str, Any]) -> int | None:
    """What the plan expects torch's allocator to peak at on each GPU: its per-GPU total less the terms that
    live outside the allocator (CUDA context, NCCL buffers)."""
    t = _planned_terms(plan)
    return t["total"] - sum(t.get(k, 0) for k in OUTSIDE_ALLOCATOR) if t else None


def _planned_per_gpu(plan: dict[str, Any]) -> int | None:
    """The per-GPU bytes the plan gives the chosen strategy (parallelism when planned, memory otherwise)."""
    par = plan.get("parallelism")
    if isinstance(par, dict):
        choice = par.get("choice")
        for c in par.get("candidates", []):
            if c.get("name") == choice and c.get("per_gpu_bytes"):
                return int(c["per_gpu_bytes"])
        if par.get("per_gpu_bytes"):
            return int(par["per_gpu_bytes"])
    per = plan.get("memory_per_device") or {}
    if per:
        return int(max(per.values()))
    return plan.get("memory_total")


def _input_batch(vocab: int, batch: int, seq: int, seed: int, device: Any) -> Any:
    import torch

    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, vocab, (batch, seq), generator=g).to(device)


def _train_steps(model: Any, opt: Any, ids: Any, steps: int) -> tuple[list[float], list[float]]:
    """``steps`` optimizer steps on one fixed batch (inputs as labels): each step's loss and seconds."""
    losses: list[float] = []
    step_s: list[float] = []
    for _ in range(steps):
        t = time.perf_counter()
        out = model(input_ids=ids, labels=ids)
        out.loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(float(out.loss.detach()))  # .item() synchronises: step time includes the GPU work
        step_s.append(time.perf_counter() - t)
        del out
    return losses, step_s


def w_ddp(spec: dict[str, Any]) -> dict[str, Any]:
    """Parts a and b: cudaload.load_model on each rank, DDP, a short training run on a fixed batch."""
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    import cudaload

    ctx = Ctx(spec["smoke"])
    intent = spec["intent"]
    seq, batch, steps = spec["seq_len"], spec["batch_size"], spec["steps"]
    t0 = time.perf_counter()
    model = cudaload.load_model(spec["path"], intent=intent, seq_len=seq, batch_size=batch)
    load_s = time.perf_counter() - t0
    plan = model.cudaload_plan
    targs = cudaload.training_arguments(plan)
    try:
        from cudaload.policies.parallelism import merge_training_arguments

        targs = merge_training_arguments(targs, plan)
    except ImportError:  # before issue 17's parallelism module
        pass
    # the plan's activation term assumes gradient checkpointing for every training intent
    # (policies/memory/terms.py); non-reentrant checkpointing composes with DDP
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if spec["smoke"]:
        plan_info = _plan_summary(
            lambda: cudaload.plan(
                spec["path"], hardware=_plan_hardware(True), intent=intent, seq_len=seq, batch_size=batch
            )
        )
    else:
        plan_info = _plan_summary(lambda: plan)
    ddp = DDP(
        model,
        device_ids=[ctx.local_rank] if ctx.cuda else None,
        find_unused_parameters=bool(targs.get("ddp_find_unused_parameters", False)),
    )
    params = [p for p in ddp.parameters() if p.requires_grad]
    if targs.get("optim") == "paged_adamw_8bit" and ctx.cuda:
        import bitsandbytes as bnb

        opt: Any = bnb.optim.PagedAdamW8bit(params, lr=spec["lr"])
    else:
        opt = torch.optim.AdamW(params, lr=spec["lr"], fused=ctx.cuda)
    vocab = model.config.vocab_size if hasattr(model, "config") else plan.model.vocab_size
    ids = _input_batch(vocab, batch, seq, 1000 + ctx.rank, ctx.device)
    ctx.reset_peak()
    losses, step_s = _train_steps(ddp, opt, ids, steps)
    mem = ctx.memory()
    ranks = ctx.gather({"rank": ctx.rank, "losses": losses, "memory": mem, "load_s": load_s})
    res = {
        "intent": intent,
        "world_size": ctx.world,
        "seq_len": seq,
        "batch_size_per_rank": batch,
        "steps": steps,
        "step_s_median": median(step_s[1:] or step_s),
        "step_s_spread": spread(step_s[1:] or step_s),
        "loss_first": losses[0],
        "loss_last": losses[-1],
        "loss_down": losses[-1] < losses[0],
        "ranks": ranks,
        "plan": plan_info,
        "training_arguments": {
            k: v for k, v in targs.items() if isinstance(v, (str, int, float, bool, dict))
        },
        "gradient_checkpointing": True,
        "trainable_parameters": sum(p.numel() for p in params),
        "placement": plan.placement.to_dict()["devices"],
        "load_path": (plan.verified or {}).get("load_path"),
    }
    ctx.close()
    return res


def _meta_model(config: Any, dtype: Any) -> Any:
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config, dtype=dtype)


def _fix_rotary(model: Any, device: Any) -> None:
    """``to_empty`` leaves non-persistent buffers (RoPE's inv_freq) uninitialised: rebuild those modules."""
    for name, mod in list(model.named_modules()):
        if hasattr(mod, "inv_freq") and hasattr(mod, "config"):
            parent = model.get_submodule(name.rsplit(".", 1)[0]) if "." in name else model
            setattr(parent, name.rsplit(".", 1)[-1], type(mod)(mod.config).to(device))


def w_fsdp(spec: dict[str, Any]) -> dict[str, Any]:
    """Part c: FSDP2 full fine-tuning from a meta-device skeleton, fp32 sharded parameters and AdamW."""
    import torch
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    import cudaload
    from cudaload.testing import full_config

    ctx = Ctx(spec["smoke"])
    if spec["smoke"]:
        from cudaload.testing.models import tiny_config

        config = tiny_config("qwen3")
        config.tie_word_embeddings = False
    else:
        config = full_config(spec["shape"])
    seq, batch, steps = spec["seq_len"], spec["batch_size"], spec["steps"]
    plan_info: dict[str, Any] = {}
    if ctx.rank == 0:
        plan_info = _plan_summary(
            lambda: cudaload.plan(
                spec["config_dir"],
                hardware=_plan_hardware(spec["smoke"]),
                intent="training",
                seq_len=seq,
                batch_size=batch,
            )
        )
    t0 = time.perf_counter()
    model = _meta_model(config, torch.float32)
    # HF's non-reentrant checkpointing per decoder layer composes with FSDP2 (it recomputes inside the
    # layer's all-gathered parameters)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    mp = MixedPrecisionPolicy(
        param_dtype=torch.bfloat16 if ctx.cuda else torch.float32, reduce_dtype=torch.float32
    )
    layer_cls = type(model.model.layers[0]).__name__
    for layer in model.model.layers:
        fully_shard(layer, mp_policy=mp)
    fully_shard(model, mp_policy=mp)
    model.to_empty(device=ctx.device)
    torch.manual_seed(ctx.rank)  # every rank fills its own shards: no full copy anywhere
    with torch.no_grad():
        for name, p in model.named_parameters():
            local = p.to_local() if hasattr(p, "to_local") else p
            if local.dim() == 1 and "norm" in name:
                local.fill_(1.0)
            else:
                local.normal_(0.0, 0.02)
    _fix_rotary(model, ctx.device)
    ctx.sync()
    build_s = time.perf_counter() - t0
    # fused: one kernel, no per-step temporaries the size of the states (foreach's sqrt copy of exp_avg_sq
    # would add 4 bytes/param at the step); DTensor supports it (torch/distributed/tensor/_ops/
    # _pointwise_ops.py lists aten._fused_adamw_), and training_arguments() picks adamw_torch_fused on GPUs
    opt = torch.optim.AdamW(model.parameters(), lr=spec["lr"], fused=ctx.cuda, foreach=not ctx.cuda)
    ids = _input_batch(config.vocab_size, batch, seq, 2000 + ctx.rank, ctx.device)
    ctx.reset_peak()
    losses, step_s = _train_steps(model, opt, ids, steps)
    mem = ctx.memory()
    n_params = sum(p.numel() for p in model.parameters())
    local_params = sum((p.to_local() if hasattr(p, "to_local") else p).numel() for p in model.parameters())
    ranks = ctx.gather(
        {"rank": ctx.rank, "losses": losses, "memory": mem, "build_s": build_s, "local_params": local_params}
    )
    res: dict[str, Any] = {
        "shape": spec["shape"],
        "world_size": ctx.world,
        "seq_len": seq,
        "batch_size_per_rank": batch,
        "steps": steps,
        "parameters": n_params,
        "wrapped_layer_class": layer_cls,
        "mixed_precision": {"param_dtype": str(mp.param_dtype), "reduce_dtype": str(mp.reduce_dtype)},
        "step_s_median": median(step_s[1:] or step_s),
        "step_s_spread": spread(step_s[1:] or step_s),
        "loss_first": losses[0],
        "loss_last": losses[-1],
        "loss_down": losses[-1] < losses[0],
        "ranks": ranks,
        "plan": plan_info,
        # what one GPU would need for the same run without sharding: fp32 params + grads + 2 AdamW states
        "unsharded_state_bytes": n_params * 16,
    }
    ctx.close()
    return res


def _safe(fn: Any) -> Any:
    try:
        return fn()
    except Exception as e:
        return f"unavailable: {type(e).__name__}: {e}"[:300]


def _gen_time(model: Any, ids: Any, new: int, ctx: Ctx) -> float:
    import torch

    ctx.sync()
    t = time.perf_counter()
    with torch.no_grad():
        model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=new,
            min_new_tokens=new,
            do_sample=False,
            pad_token_id=0,
        )
    ctx.sync()
    return time.perf_counter() - t


def w_tp(spec: dict[str, Any]) -> dict[str, Any]:
    """Part d: from_pretrained(tp_plan="auto") under torchrun against the same checkpoint on one GPU."""
    import torch
    from transformers import AutoModelForCausalLM

    ctx = Ctx(spec["smoke"])
    path = spec["path"]
    plan_info: dict[str, Any] = {}
    if ctx.rank == 0:
        import cudaload

        hw = _plan_hardware(spec["smoke"])
        work = spec["prompt"] + spec["new_tokens"]
        plan_info = _plan_summary(lambda: cudaload.plan(path, hardware=hw, seq_len=work))
        plan_info["lower_latency"] = _plan_summary(
            lambda: cudaload.plan(path, hardware=hw, seq_len=work, lower_latency=True)
        )
    ctx.barrier()
    ctx.reset_peak()
    t0 = time.perf_counter()
    try:
        # transformers 5.17 deprecates from_pretrained(tp_plan=...) (removed in 5.18: modeling_utils.py:4136-4142)
        from transformers import DistributedConfig

        tp_kw: dict[str, Any] = {"distributed_config": DistributedConfig(tp_plan="auto")}
    except ImportError:
        tp_kw = {"tp_plan": "auto"}
    tp = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16, **tp_kw)
    tp.eval()
    ctx.sync()
    tp_load_s = time.perf_counter() - t0
    tp_mem_after_load = ctx.memory()
    ids1 = _input_batch(tp.config.vocab_size, 1, spec["prompt"], 7, ctx.device)
    with torch.no_grad():
        out = tp(ids1).logits
        tp_logits = (out.full_tensor() if hasattr(out, "full_tensor") else out).float().cpu()
    single = None
    single_load_s = None
    if ctx.rank == 0:
        t0 = time.perf_counter()
        single = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16, device_map=str(ctx.device))
        single.eval()
        ctx.sync()
        single_load_s = time.perf_counter() - t0
    ctx.barrier()
    cmp: dict[str, Any] = {}
    if single is not None:
        with torch.no_grad():
            ref = single(ids1).logits.float().cpu()
        diff = (tp_logits - ref).abs()
        absmax = float(ref.abs().max())
        agree = float((tp_logits.argmax(-1) == ref.argmax(-1)).float().mean())
        cmp = {
            "max_abs_diff": float(diff.max()),
            "mean_abs_diff": float(diff.mean()),
            "ref_abs_max": absmax,
            "ref_std": float(ref.std()),
            "argmax_agreement": agree,
            "atol_used": TP_ATOL_FRAC * absmax,
            "within_bf16_tolerance": float(diff.max()) <= TP_ATOL_FRAC * absmax and agree >= TP_ARGMAX_MIN,
        }
    new = spec["new_tokens"]
    timings: dict[str, dict[str, list[float]]] = {}
    for rep in range(spec["reps"]):
        for bs in spec["batches"]:
            ids = _input_batch(tp.config.vocab_size, bs, spec["prompt"], 100 + rep, ctx.device)
            # interleaved: TP (all ranks), then one GPU (rank 0; the others wait at the barrier)
            for which in ("tp", "single"):
                if which == "single" and ctx.rank != 0:
                    ctx.barrier()
                    continue
                model = tp if which == "tp" else single
                pre = _gen_time(model, ids, 1, ctx)
                full = _gen_time(model, ids, new, ctx)
                rec = timings.setdefault(
                    f"{which}_bs{bs}", {"prefill_s": [], "total_s": [], "decode_tok_s": []}
                )
                rec["prefill_s"].append(pre)
                rec["total_s"].append(full)
                rec["decode_tok_s"].append(bs * (new - 1) / max(full - pre, 1e-9))
                if which == "single":
                    ctx.barrier()
    summary = {
        k: {
            "decode_tok_s_median": median(v["decode_tok_s"]),
            "decode_tok_s_spread": spread(v["decode_tok_s"]),
            "prefill_s_median": median(v["prefill_s"]),
            "samples": v,
        }
        for k, v in timings.items()
    }
    for bs in spec["batches"]:
        a, b = summary.get(f"tp_bs{bs}"), summary.get(f"single_bs{bs}")
        if a and b and a["decode_tok_s_median"] and b["decode_tok_s_median"]:
            summary[f"tp_vs_single_bs{bs}"] = a["decode_tok_s_median"] / b["decode_tok_s_median"]
    mem = ctx.memory()
    ranks = ctx.gather({"rank": ctx.rank, "memory_after_load": tp_mem_after_load, "memory_end": mem})
    res = {
        "path": path,
        "world_size": ctx.world,
        "tp_plan": _safe(lambda: {k: str(v) for k, v in dict(tp.tp_plan).items()}),
        "tp_load_s": tp_load_s,
        "single_load_s": single_load_s,
        "logits": cmp,
        "decode": summary,
        "prompt": spec["prompt"],
        "new_tokens": new,
        "ranks": ranks,
        "plan_single_process": plan_info,
        "note": "rank 0 also holds the one-GPU reference model, so its memory_end includes it",
    }
    ctx.close()
    return res


def w_split(spec: dict[str, Any]) -> dict[str, Any]:
    """Part e: one process, 2 GPUs: cudaload.load_model(device_map="auto") vs from_pretrained(device_map="auto")."""
    import gc

    import torch
    import transformers

    import cudaload
    import cudaload.execute  # imported before the clock, like the model's module below

    if spec["smoke"] or torch.cuda.device_count() < 2:
        return {"skipped": f"needs 2 GPUs in one process (sees {torch.cuda.device_count()})"}
    path = spec["path"]
    cfg = transformers.AutoConfig.from_pretrained(path)
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    MODEL_FOR_CAUSAL_LM_MAPPING[type(cfg)]  # imports the model's module: both loaders' clocks exclude it
    plan = cudaload.plan(path, device_map="auto")
    ids = _input_batch(cfg.vocab_size, 1, 64, 5, "cuda:0")
    samples: dict[str, list[float]] = {"cudaload": [], "from_pretrained": []}
    mem: dict[str, Any] = {}
    logits: dict[str, Any] = {}
    info: dict[str, Any] = {}
    for rep in range(spec["reps"]):
        for which in ("cudaload", "from_pretrained") if rep % 2 == 0 else ("from_pretrained", "cudaload"):
            for d in range(2):
                torch.cuda.synchronize(d)
                torch.cuda.reset_peak_memory_stats(d)
            t = time.perf_counter()
            if which == "cudaload":
                m = cudaload.load_model(path, device_map="auto")
                info = {
                    "load_path": m.cudaload_plan.verified.get("load_path"),
                    "devices": m.cudaload_plan.verified.get("devices"),
                }
            else:
                m = transformers.AutoModelForCausalLM.from_pretrained(
                    path, dtype=torch.bfloat16, device_map="auto"
                )
            for d in range(2):
                torch.cuda.synchronize(d)
            samples[which].append(time.perf_counter() - t)
            if which not in mem:
                mem[which] = {
                    f"cuda:{d}": {
                        "allocated": torch.cuda.memory_allocated(d),
                        "peak_allocated": torch.cuda.max_memory_allocated(d),
                    }
                    for d in range(2)
                }
                mem[which]["hf_device_map_devices"] = sorted({str(v) for v in m.hf_device_map.values()})
                with torch.no_grad():
                    logits[which] = m(ids).logits.float().cpu()
            del m
            gc.collect()
            torch.cuda.empty_cache()
    same = None
    if len(logits) == 2:
        same = float((logits["cudaload"] - logits["from_pretrained"]).abs().max())
    c, f = median(samples["cudaload"]), median(samples["from_pretrained"])
    return {
        "path": path,
        "load_s": {k: {"median": median(v), "spread": spread(v), "samples": v} for k, v in samples.items()},
        "cudaload_vs_from_pretrained": (c / f) if c and f else None,
        "memory": mem,
        "logits_max_abs_diff": same,
        "cudaload": info,
        "plan": {
            "placement": plan.placement.to_dict(),
            "per_device": dict(plan.memory.per_device),
            "load_path": plan.load_path.choice,
            "load_path_reasons": list(plan.load_path.reasons),
            "parallelism": _safe(lambda: plan.parallelism.to_dict()),
        },
    }


def w_write(spec: dict[str, Any]) -> dict[str, Any]:
    sys.path.insert(0, str(HERE))
    from run import w_write as write  # benchmarks/run.py: the same random bf16 checkpoint format

    return write(spec)


WORKERS = {"ddp": w_ddp, "fsdp": w_fsdp, "tp": w_tp, "split": w_split, "write": w_write}


def worker_main(kind: str, spec: dict[str, Any]) -> int:
    import logging

    logging.basicConfig(level=logging.WARNING)
    rank = int(os.environ.get("RANK", "0"))
    if spec.get("deadline"):
        # a rank the parent could not reach (orphaned by a killed torchrun) must not hold its GPU for long
        def _watchdog() -> None:
            time.sleep(max(float(spec["deadline"]) - time.time(), 0))
            print(f"rank {rank}: past the part's deadline, exiting", file=sys.stderr, flush=True)
            os._exit(3)

        threading.Thread(target=_watchdog, daemon=True).start()
    try:
        result = WORKERS[kind](spec)
    except Exception as e:
        traceback.print_exc()
        result = {"error": f"rank {rank}: {type(e).__name__}: {e}"[:1500]}
    # rank 0 writes the part's result; another rank writes only its error (a crash on rank 1 must show)
    target = spec["result"] if rank == 0 else f"{spec['result']}.rank{rank}"
    if rank == 0 or "error" in result:
        Path(target).write_text(json.dumps(result, default=str, indent=1))
    return 0


# ----------------------------------------------------------------------------------------------------
# parent side
# ----------------------------------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Runner:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.out = Path(args.out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.work = Path(args.work or "/tmp/cudaload-bench")
        self.work.mkdir(parents=True, exist_ok=True)
        self.t0 = time.monotonic()
        self.deadline = self.t0 + args.budget_s
        self.results: dict[str, Any] = {"meta": self.meta(), "parts": {}}

    def meta(self) -> dict[str, Any]:
        m: dict[str, Any] = {
            "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "smoke": self.args.smoke,
            "budget_s": self.args.budget_s,
            "python": sys.version.split()[0],
        }
        with contextlib.suppress(Exception):
            m["commit"] = subprocess.run(
                ["git", "rev-parse", "--short", "HEAD"], cwd=HERE, capture_output=True, text=True, timeout=10
            ).stdout.strip()
        return m

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def save(self) -> None:
        (self.out / "results.json").write_text(json.dumps(self.results, indent=1, default=str))
        (self.out / "results.md").write_text(render_markdown(self.results))

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        src = str(HERE.parent / "src")
        env["PYTHONPATH"] = src + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        env["PYTHONUNBUFFERED"] = "1"
        env.setdefault("HF_HUB_OFFLINE", "1")
        env.setdefault("TOKENIZERS_PARALLELISM", "false")
        env.setdefault("OMP_NUM_THREADS", "1" if self.args.smoke else "4")
        return env

    def launch(self, kind: str, spec: dict[str, Any], *, nproc: int | None, timeout: float) -> dict[str, Any]:
        result = self.out / f".{kind}-{spec.get('part', kind)}.json"
        for f in [result, *self.out.glob(result.name + ".rank*")]:
            f.unlink(missing_ok=True)
        spec = {
            **spec,
            "result": str(result),
            "smoke": self.args.smoke,
            "deadline": time.time() + max(timeout, 1) + 15,
        }
        me = [os.path.abspath(__file__), "--worker", kind, "--spec", json.dumps(spec)]
        if nproc:
            cmd = [
                sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc),
                "--master_addr", "127.0.0.1", "--master_port", str(_free_port()), *me,
            ]  # fmt: skip
        else:
            cmd = [sys.executable, *me]
        t = time.monotonic()
        # own session: on a timeout the whole tree (torchrun and every rank) is killed, so no orphaned rank
        # keeps a GPU busy for the next part
        proc = subprocess.Popen(
            cmd,
            env=self.env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        try:
            output, _ = proc.communicate(timeout=max(timeout, 1))
            rc: int | str = proc.returncode
        except subprocess.TimeoutExpired:
            # torchrun starts its ranks in sessions of their own: SIGTERM lets it stop them; the group kill
            # then takes whatever is left, and each worker's own deadline (see worker_main) the rest
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGTERM)
            try:
                output, _ = proc.communicate(timeout=10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                output, _ = proc.communicate()
            rc = f"killed after the part's {timeout:.0f} s limit"
        tail = (output or "")[-3000:]
        wall = time.monotonic() - t
        res: dict[str, Any]
        if result.exists():
            res = json.loads(result.read_text())
        else:
            res = {"error": f"no result (exit {rc} after {wall:.0f} s)"}
        for f in sorted(self.out.glob(result.name + ".rank*")):
            res.setdefault("rank_errors", []).append(json.loads(f.read_text()).get("error"))
        if "error" in res or res.get("rank_errors"):
            res["output_tail"] = tail
        res["wall_s"] = round(wall, 2)
        return res

    def budget_for(self, part: str) -> float:
        return min(
            PART_TIMEOUT_S[part] * (0.5 if self.args.smoke else 1.0) + (60 if self.args.smoke else 0),
            self.left() - 5,
        )

    def checkpoint(self, shape: str) -> str:
        """A random bf16 checkpoint, written once and reused (same folder and rule as benchmarks/run.py)."""
        if self.args.smoke:
            path = self.work / "tiny-qwen3"
            if not (path / "config.json").exists():
                from cudaload.testing import make_tiny

                make_tiny("qwen3", path, dtype="bfloat16")
            return str(path)
        path = self.work / shape
        done = (path / "config.json").exists() and any(
            (path / f).exists() for f in ("model.safetensors", "model.safetensors.index.json")
        )
        if done:
            self.results["meta"].setdefault("checkpoints", {})[shape] = {"path": str(path), "reused": True}
            return str(path)
        log(f"writing the {shape} checkpoint to {path}")
        res = self.launch(
            "write",
            {"path": str(path), "config": shape, "part": shape},
            nproc=None,
            timeout=min(PART_TIMEOUT_S["write"], self.left() - 5),
        )
        if "error" in res:
            raise RuntimeError(f"could not write the {shape} checkpoint: {res['error']}")
        self.results["meta"].setdefault("checkpoints", {})[shape] = {
            **res,
            "path": str(path),
            "reused": False,
        }
        return str(path)

    def config_dir(self, shape: str) -> str:
        d = self.work / "configs" / shape
        if not (d / "config.json").exists():
            from cudaload.testing import full_config

            full_config(shape).save_pretrained(d)
        return str(d)

    def part(self, p: str) -> dict[str, Any]:
        smoke = self.args.smoke
        n = 2
        if p in ("a", "b"):
            if p == "b":
                # found, not imported: importing bitsandbytes initialises CUDA, and the parent never does
                if importlib.util.find_spec("bitsandbytes") is None:
                    return {"skipped": "bitsandbytes is not installed"}
                if smoke:
                    return {"skipped": "QLoRA needs CUDA (bitsandbytes' 4-bit kernels)"}
            path = self.checkpoint("Qwen3-0.6B")
            spec = {
                "part": p,
                "path": path,
                "intent": "lora" if p == "a" else "qlora",
                "seq_len": 64 if smoke else 512,
                "batch_size": 2,
                "steps": 6 if smoke else 20,
                "lr": 1e-3,
            }
            return self.launch("ddp", spec, nproc=n, timeout=self.budget_for(p))
        if p == "c":
            spec = {
                "part": p,
                "shape": "tiny-qwen3" if smoke else "Qwen3-8B",
                "config_dir": self.checkpoint("tiny") if smoke else self.config_dir("Qwen3-8B"),
                "seq_len": 64 if smoke else 512,
                "batch_size": 1,
                "steps": 4 if smoke else 10,
                "lr": 3e-5 if not smoke else 1e-3,
            }
            return self.launch("fsdp", spec, nproc=n, timeout=self.budget_for(p))
        if p == "d":
            shape = {"8b": "Qwen3-8B", "0.6b": "Qwen3-0.6B"}.get(self.args.tp_shape, "Qwen3-8B")
            ready = (self.work / shape / "config.json").exists()
            # "or the 0.6B shape if time is short": writing 16 GB and loading it twice needs the time
            need = D_8B_MIN_LEFT_S + (0 if ready else WRITE_8B_EXPECTED_S)
            if not smoke and self.args.tp_shape == "auto" and self.left() < need:
                shape = "Qwen3-0.6B"
            path = self.checkpoint(shape)
            spec = {
                "part": p,
                "path": path,
                "prompt": 32 if smoke else 128,
                "new_tokens": 4 if smoke else 24,
                "batches": [1, 8],
                "reps": 1 if smoke else 3,
            }
            res = self.launch("tp", spec, nproc=n, timeout=self.budget_for(p))
            res["shape"] = "tiny-qwen3" if smoke else shape
            return res
        if p == "e":
            if smoke:
                return {"skipped": "needs 2 GPUs in one process"}
            shape = "Qwen3-8B" if (self.work / "Qwen3-8B" / "config.json").exists() else "Qwen3-0.6B"
            path = self.checkpoint(shape)
            res = self.launch(
                "split", {"part": p, "path": path, "reps": 3}, nproc=None, timeout=self.budget_for(p)
            )
            res["shape"] = shape
            return res
        raise ValueError(p)

    def run(self) -> int:
        parts = self.args.parts
        log(f"parts {','.join(parts)}; budget {self.args.budget_s:.0f} s; out {self.out}")
        for p in parts:
            if self.left() < 15:
                self.results["parts"][p] = {"skipped": "time budget used up"}
                self.save()
                continue
            log(f"part {TITLES[p]} ({self.left():.0f} s left)")
            t = time.monotonic()
            try:
                res = self.part(p)
            except Exception as e:
                traceback.print_exc()
                res = {"error": f"{type(e).__name__}: {e}"[:1500]}
            res.setdefault("wall_s", round(time.monotonic() - t, 2))
            self.results["parts"][p] = res
            self.save()
            log(f"part {p}: {summary_line(p, res)}")
        self.results["meta"]["total_s"] = round(time.monotonic() - self.t0, 1)
        self.save()
        print(render_markdown(self.results), flush=True)
        return 0


# ----------------------------------------------------------------------------------------------------
# report
# ----------------------------------------------------------------------------------------------------
def g(n: Any) -> str:
    return "-" if n is None else f"{n / GiB:.2f}"


def f3(x: Any) -> str:
    return "-" if x is None else f"{x:.3g}"


def _per_rank_peaks(res: dict[str, Any], key: str = "memory") -> list[int | None]:
    return [r.get(key, {}).get("peak_allocated") for r in res.get("ranks", [])]


def summary_line(p: str, res: dict[str, Any]) -> str:
    if "skipped" in res:
        return f"skipped: {res['skipped']}"
    if "error" in res:
        return f"error: {res['error'][:300]}"
    if p in ("a", "b", "c"):
        peaks = _per_rank_peaks(res)
        return (
            f"loss {res['loss_first']:.3f} -> {res['loss_last']:.3f}; step {f3(res['step_s_median'])} s; "
            f"peak allocated per GPU {', '.join(g(x) for x in peaks)} GiB; plan "
            f"{g(_planned_allocated(res.get('plan', {})))} GiB (allocator part of "
            f"{g(_planned_per_gpu(res.get('plan', {})))})"
        )
    if p == "d":
        d = res.get("decode", {})
        return (
            f"logits {res.get('logits', {}).get('within_bf16_tolerance')}; TP/one-GPU decode bs1 "
            f"{f3(d.get('tp_vs_single_bs1'))}x, bs8 {f3(d.get('tp_vs_single_bs8'))}x"
        )
    if p == "e":
        return f"load cudaload/from_pretrained {f3(res.get('cudaload_vs_from_pretrained'))}x"
    return ""


def render_markdown(r: dict[str, Any]) -> str:
    m = r["meta"]
    lines = [
        "# Several GPUs: DDP, FSDP2, tensor parallel, layer split (benchmarks/bench_parallel.py)",
        "",
        f"{m['date']}, commit {m.get('commit', '?')}, budget {m['budget_s']} s"
        + (", SMOKE (CPU, gloo, tiny model: no figure here means anything)" if m["smoke"] else ""),
        "",
    ]
    for p, res in r["parts"].items():
        lines += [f"## {TITLES[p]}", ""]
        if "skipped" in res:
            lines += [f"skipped: {res['skipped']}", ""]
            continue
        if "error" in res:
            lines += [f"**error**: `{res['error'][:800]}`", ""]
            if res.get("rank_errors"):
                lines += [f"other ranks: `{str(res['rank_errors'])[:600]}`", ""]
            continue
        if p in ("a", "b", "c"):
            plan = res.get("plan", {})
            planned = _planned_per_gpu(plan)
            lines += [
                f"world size {res['world_size']}, batch {res['batch_size_per_rank']} x {res['seq_len']} per rank, "
                f"{res['steps']} steps: loss {res['loss_first']:.4f} -> {res['loss_last']:.4f} "
                f"({'down' if res['loss_down'] else 'NOT down'}); step {f3(res['step_s_median'])} s "
                f"(spread {res.get('step_s_spread')})",
                "",
                "| rank | device | peak allocated GiB | plan, allocator part GiB | peak/plan | peak reserved GiB "
                "| device used at end GiB | plan per GPU GiB |",
                "|---|---|---|---|---|---|---|---|",
            ]
            alloc_plan = _planned_allocated(plan)
            for rk in res.get("ranks", []):
                mem = rk.get("memory", {})
                peak = mem.get("peak_allocated")
                ratio = peak / alloc_plan if peak and alloc_plan else None
                lines.append(
                    f"| {rk['rank']} | {mem.get('device')} | {g(peak)} | {g(alloc_plan)} | {f3(ratio)} | "
                    f"{g(mem.get('peak_reserved'))} | {g(mem.get('device_used'))} | {g(planned)} |"
                )
            terms = _planned_terms(plan)
            if terms:
                lines.append(
                    "\nplanned per GPU: " + ", ".join(f"{k} {g(v)}" for k, v in terms.items() if k != "total")
                )
            if plan.get("error"):
                lines.append(f"\nplan failed: `{plan['error']}`")
            if isinstance(plan.get("parallelism"), dict):
                lines.append(f"\nplan.parallelism.choice = {plan['parallelism'].get('choice')}")
            lines.append("")
        elif p == "d":
            lg = res.get("logits", {})
            lines += [
                f"checkpoint {res.get('path')}; TP load {f3(res.get('tp_load_s'))} s, one-GPU load "
                f"{f3(res.get('single_load_s'))} s",
                "",
                f"logits (batch 1 x {res.get('prompt')}): max |diff| {f3(lg.get('max_abs_diff'))} against "
                f"max |logit| {f3(lg.get('ref_abs_max'))} (tolerance {f3(lg.get('atol_used'))}), argmax agreement "
                f"{f3(lg.get('argmax_agreement'))}: **{'within' if lg.get('within_bf16_tolerance') else 'NOT within'}"
                " bf16 tolerance**",
                "",
                f"| greedy decode, {res.get('new_tokens')} new tokens | tokens/s median | spread | prefill s |",
                "|---|---|---|---|",
            ]
            for k, v in res.get("decode", {}).items():
                if isinstance(v, dict):
                    lines.append(
                        f"| {k} | {f3(v['decode_tok_s_median'])} | {v['decode_tok_s_spread']} | "
                        f"{f3(v['prefill_s_median'])} |"
                    )
            for k, v in res.get("decode", {}).items():
                if not isinstance(v, dict):
                    lines.append(f"\n{k}: {f3(v)}x")
            lines.append("")
            ll = res.get("plan_single_process", {}).get("lower_latency", {})
            tpt = {}
            for c in (ll.get("parallelism") or {}).get("candidates", []):
                if c.get("name") == "tp" and c.get("per_gpu_terms"):
                    tpt = c["per_gpu_terms"]
            planned_w = (tpt.get("sharded_weights", 0) + tpt.get("replicated_weights", 0)) or None
            lines.append(
                f"plan: {(res.get('plan_single_process', {}).get('parallelism') or {}).get('choice')} by default, "
                f"{(ll.get('parallelism') or {}).get('choice')} with lower_latency=True"
            )
            for rk in res.get("ranks", []):
                lines.append(
                    f"rank {rk['rank']}: TP model allocated {g(rk['memory_after_load'].get('allocated'))} GiB after "
                    f"load; the plan's TP weights per GPU {g(planned_w)} GiB"
                )
            lines.append("")
        elif p == "e":
            ls = res.get("load_s", {})
            lines += [
                f"checkpoint {res.get('path')}; cudaload went through {res.get('cudaload', {}).get('load_path')}",
                "",
                "| loader | load s median | spread | cuda:0 GiB | cuda:1 GiB |",
                "|---|---|---|---|---|",
            ]
            for k in ("cudaload", "from_pretrained"):
                mem = res.get("memory", {}).get(k, {})
                lines.append(
                    f"| {k} | {f3(ls.get(k, {}).get('median'))} | {ls.get(k, {}).get('spread')} | "
                    f"{g(mem.get('cuda:0', {}).get('allocated'))} | {g(mem.get('cuda:1', {}).get('allocated'))} |"
                )
            lines += [
                "",
                f"cudaload / from_pretrained: {f3(res.get('cudaload_vs_from_pretrained'))}x; "
                f"logits max |diff| {f3(res.get('logits_max_abs_diff'))}; plan per device "
                f"{ {k: g(v) for k, v in res.get('plan', {}).get('per_device', {}).items()} } GiB",
                "",
            ]
        lines.append(f"(part wall time {res.get('wall_s')} s)\n")
    if "total_s" in m:
        lines.append(f"total {m['total_s']} s")
    return "\n".join(lines) + "\n"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", help="directory for results.json and results.md")
    p.add_argument(
        "--budget-s", type=float, default=300.0, help="stop starting parts after this (default 300)"
    )
    p.add_argument(
        "--parts", type=lambda s: [x.strip() for x in s.split(",") if x.strip()], default=list(PARTS)
    )
    p.add_argument("--work", help="where checkpoints are written and reused (default /tmp/cudaload-bench)")
    p.add_argument(
        "--tp-shape",
        choices=["auto", "8b", "0.6b"],
        default="auto",
        help="part d's shape (auto: 8B unless the budget left cannot write and load it)",
    )
    p.add_argument("--smoke", action="store_true", help="CPU, gloo, tiny model: proves the script runs")
    p.add_argument("--worker", choices=sorted(WORKERS), help=argparse.SUPPRESS)
    p.add_argument("--spec", help=argparse.SUPPRESS)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.worker:
        return worker_main(args.worker, json.loads(args.spec))
    if not args.out:
        build_parser().error("--out is required")
    bad = [p for p in args.parts if p not in PARTS]
    if bad:
        build_parser().error(f"unknown parts {bad}; choose from {','.join(PARTS)}")
    sys.path.insert(0, str(HERE.parent / "src"))
    return Runner(args).run()


if __name__ == "__main__":
    sys.exit(main())
