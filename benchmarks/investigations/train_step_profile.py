#!/usr/bin/env python
"""Where a short packed LoRA step's time goes (issue 44, item 1): host or GPU, and which kernels.

One process: ``load_model(path, intent="lora", seq_len=S, batch_size=B)`` + ``training_setup(model, data)`` +
``transformers.Trainer`` on short chat-like data (log-normal lengths, median ``--median``), as bench_train.py's
cudaload method runs it. After ``--warmup`` steps, torch.profiler (CUDA activity only, so the host is not slowed)
records ``--steps`` steps. Per step: wall seconds, real tokens, the GPU's kernel time (sum of kernels' device
time; the GPU is idle for the rest of the wall), the number of kernels, and the kernel time by kind (GEMM,
attention, optimizer, loss, elementwise/other) with the top kernels.

    python benchmarks/investigations/train_step_profile.py --shape 8b --out OUT/train_profile.json
    python benchmarks/investigations/train_step_profile.py --shape tiny --out /tmp/tp.json   # CPU smoke

``--attn NAME`` loads with that attention (``attn_implementation=``) instead of the plan's choice.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

KINDS = (
    ("attention", ("flash", "fmha", "attention", "cudnn", "sdpa")),
    ("gemm", ("gemm", "cutlass", "xmma", "nvjet", "cublas", "sm90_", "sm80_", "ampere", "hopper")),
    ("optimizer", ("adam", "foreach", "multi_tensor")),
    ("loss", ("cross_entropy", "nll_loss", "log_softmax", "softmax_backward")),
)


def kind(name: str) -> str:
    low = name.lower()
    for k, keys in KINDS:
        if any(x in low for x in keys):
            return k
    return "other"


def data(n: int, median: int, longest: int, vocab: int) -> list[dict[str, Any]]:
    rng = random.Random(0)
    out = []
    for _ in range(n):
        k = max(16, min(longest, round(rng.lognormvariate(math.log(median), 0.8))))
        out.append({"input_ids": [rng.randrange(10, vocab - 10) for _ in range(k)]})
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", default="8b", choices=["8b", "0.6b", "tiny"])
    ap.add_argument("--out", required=True)
    ap.add_argument("--work", default=os.environ.get("CUDALOAD_BENCH_WORK", "/tmp/cudaload-bench"))
    ap.add_argument("--median", type=int, default=110)
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--attn")
    ap.add_argument("--intent", default="lora")
    ap.add_argument("--compile-layers", action="store_true", help="torch.compile each decoder layer")
    args = ap.parse_args(argv)

    import torch
    from transformers import AutoConfig, Trainer, TrainerCallback, TrainingArguments

    import cudaload

    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    if args.shape == "tiny":
        from cudaload.testing import make_tiny

        path = str(make_tiny("qwen3", work / "tiny"))
        seq = 64
    else:
        from benchlib.common import w_write

        name = {"8b": "Qwen3-8B", "0.6b": "Qwen3-0.6B"}[args.shape]
        path = str(work / name)
        if not (Path(path) / "config.json").exists():
            w_write({"path": path, "config": name})
        seq = args.seq_len
    cuda = torch.cuda.is_available()
    vocab = AutoConfig.from_pretrained(path).vocab_size
    examples = data(40 * args.batch, args.median if args.shape != "tiny" else 20, seq, vocab)
    kw: dict[str, Any] = {"attn_implementation": args.attn} if args.attn else {}
    t0 = time.perf_counter()
    model = cudaload.load_model(path, intent=args.intent, seq_len=seq, batch_size=args.batch, **kw)
    setup = cudaload.training_setup(model, examples)
    plan = model.cudaload_plan
    compiled = 0
    if args.compile_layers:
        # regional compile: each decoder layer's forward (and so its backward) through torch.compile, one graph
        # for all of them (same code; parameters are inputs), dynamic in the packed row's length
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        for layer in base.model.layers:
            layer.compile(dynamic=True)
            compiled += 1
    res: dict[str, Any] = {
        "shape": args.shape,
        "load_s": time.perf_counter() - t0,
        "attention": plan.attention.choice,
        "layout": plan.training.layout.choice if plan.training else None,
        "tokens_per_step": plan.training.step.tokens if plan.training else None,
        "checkpointing": plan.gradient_checkpointing.choice if plan.gradient_checkpointing else None,
        "pack": setup.describe(),
        "compiled_layers": compiled,
        "steps": [],
    }
    targs = dict(setup.arguments)
    total = args.warmup + args.steps
    targs.update(
        output_dir=str(work / "trainer-profile"),
        max_steps=total,
        report_to=[],
        save_strategy="no",
        logging_strategy="no",
        disable_tqdm=True,
        dataloader_num_workers=0,
        seed=0,
    )
    tokens: list[int] = []

    def counted(features: Any) -> Any:
        b = setup.data_collator(features)
        m = b.get("attention_mask")
        tokens.append(int(m.sum()) if m is not None else int(b["input_ids"].numel()))
        return b

    from torch.profiler import ProfilerActivity, profile

    ends: list[float] = []
    state: dict[str, Any] = {}

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    class Clock(TrainerCallback):  # type: ignore[misc]
        def on_train_begin(self, a: Any, s: Any, c: Any, **k: Any) -> None:
            sync()
            ends.append(time.perf_counter())

        def on_step_end(self, a: Any, s: Any, c: Any, **k: Any) -> None:
            sync()
            ends.append(time.perf_counter())
            if s.global_step == args.warmup:
                acts = [ProfilerActivity.CUDA] if cuda else [ProfilerActivity.CPU]
                state["prof"] = profile(activities=acts)
                state["prof"].__enter__()
            if s.global_step == total and "prof" in state:
                state["prof"].__exit__(None, None, None)

    trainer = Trainer(
        model=model,
        args=TrainingArguments(**targs),
        train_dataset=setup.train_dataset,
        data_collator=counted,
        callbacks=[Clock()],
    )
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    trainer.train()
    durs = [b - a for a, b in itertools.pairwise(ends)]
    timed = list(range(args.warmup, len(durs)))
    res["step_s"] = durs
    res["step_tokens"] = tokens[: len(durs)]
    res["tokens_per_s"] = sum(tokens[i] for i in timed) / sum(durs[i] for i in timed) if timed else None
    res["peak_gib"] = torch.cuda.max_memory_allocated() / 2**30 if cuda else None
    prof = state.get("prof")
    if prof is not None:
        evs = prof.key_averages()
        dev = "self_device_time_total" if cuda else "self_cpu_time_total"
        by_kind: dict[str, float] = {}
        count = 0
        for e in evs:
            t = getattr(e, dev)
            if t <= 0:
                continue
            by_kind[kind(e.key)] = by_kind.get(kind(e.key), 0.0) + t / 1e6 / args.steps
            count += e.count
        res["gpu_s_per_step"] = sum(by_kind.values())
        res["wall_s_per_step"] = statistics.mean(durs[i] for i in timed) if timed else None
        res["kernel_s_by_kind"] = by_kind
        res["kernels_per_step"] = count / args.steps
        res["top"] = [
            (e.key[:90], round(getattr(e, dev) / 1e3 / args.steps, 2), e.count // args.steps)
            for e in sorted(evs, key=lambda e: -getattr(e, dev))[:20]
        ]
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(res, indent=1, default=str))
    print(
        json.dumps({k: v for k, v in res.items() if k not in ("top", "step_s", "step_tokens")}, default=str)
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
