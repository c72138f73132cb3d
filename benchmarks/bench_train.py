#!/usr/bin/env python
"""Fine-tuning speed and memory: the plain recipe against what cudaload hands the trainer (issue 33).

    python benchmarks/bench_train.py --out DIR [--shapes 8b,0.6b] [--modes lora,qlora] [--dists chat,docs]
                                     [--budget-s 540] [--work /tmp/cudaload-bench] [--smoke]

For each (shape, mode, length distribution) two fresh processes train the same synthetic data with
``transformers.Trainer``, interleaved (plain, then cudaload):

- ``plain``: the recipe people run. LoRA: ``from_pretrained(bf16)`` (sdpa), PEFT LoRA r=16 / alpha 32 / dropout 0
  on every linear layer, padded batches of 8 (right padding to the batch's longest), gradient checkpointing
  (non-reentrant), Trainer's fused AdamW, bf16. QLoRA: nf4 with double quantization and bf16 compute,
  ``prepare_model_for_kbit_training`` (fp32 cast, checkpointing), the same LoRA, paged 8-bit AdamW.
- ``cudaload``: ``load_model(path, intent=mode, seq_len=S, batch_size=8)`` and ``training_setup(model, data)``:
  its arguments, collator and (packed) data set, nothing else.
- ``cudaload-varlen``, ``cudaload-sdpa-packed``, ``cudaload-sdpa-padded`` (issue 44): the same with the attention
  and the layout pinned (:data:`VARIANTS`): torch's own varlen flash kernels on packed steps (no flash-attn
  package), sdpa on packed steps (a block-diagonal mask from the position ids), sdpa on padded batches; each
  planned as cudaload plans it otherwise, on the same data. ``--methods cudaload-varlen,cudaload-sdpa-packed,
  cudaload-sdpa-padded`` gives tokens/s for each in one command (results.md's "Attention and layout" table).
  ``cudaload-chunked``: the same plan with cudaload's chunked loss asked for (``loss="cudaload_chunked"``).
  ``cudaload-fill``: ``load_model`` without ``batch_size``: the plan fills each packed step with as many
  sequences as its token bound takes (the ``sequences_per_step`` decision), as TRL's packing fills its rows.
- ``cudaload-compiled``: ``cudaload`` with ``training_setup(..., compile_layers=True)``: each decoder layer
  compiled, as the plan takes it on a data set long enough to repay the compile (the first step pays it). Any
  method above ending in ``-compiled`` (``cudaload-varlen-compiled``) is that method with its layers compiled.
- ``cudaload-trl`` (issue 44 item 5): the same ``load_model``, then TRL's ``SFTTrainer`` with
  ``SFTConfig(**sft_config_arguments(plan))`` on the same examples (a ``datasets.Dataset`` of ``input_ids``, which
  TRL takes as tokenized): TRL packs them itself (best-fit decreasing into rows of the plan's tokens_per_step,
  padding-free, one row a step), computes the loss through its own chunked LM head and logs entropy and token
  accuracy each step. ``cudaload-trl-compiled``: ``training_setup(model, compile_layers=True)`` (no data set)
  first, so the layers are compiled, then the same. ``--methods cudaload,cudaload-trl`` compares the two paths.

Measured over ``--steps`` optimizer steps after ``--warmup``: real (non-padding) tokens per second (the steps'
tokens over their wall time, data loading included, CUDA synchronised at each step's end), the spread of
per-step rates, the allocator's peaks over the whole run, and for cudaload the memory its plan predicted (the
bound it planned for) and its memory model at the largest step the run met, beside the measured peak.

Distributions (token ids random; log-normal lengths clipped to [lo, S]): ``chat`` median 200 (S 2048),
``instruct`` median 420 (S 2048: issue 33's table), ``docs`` median 1,500 (S 4096).

``--prompt-frac F``: each example's first F of tokens labelled -100 (a masked prompt; the plain recipe's padded
batches and cudaload's collators both take the labels; TRL's path does not read them).

Writes ``DIR/results.json`` and ``DIR/results.md`` after every run. ``--smoke``: CPU, a tiny Qwen3, two steps
(checks the machinery, not the numbers).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import itertools
import json
import math
import platform
import random
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

GiB = 1 << 30
TAG = "BENCH-TRAIN "
SHAPES = {"0.6b": "Qwen3-0.6B", "8b": "Qwen3-8B"}
#: name -> (median tokens, log-normal sigma, shortest, longest = the seq_len declared)
DISTS = {
    "chat": (200, 0.9, 16, 2048),
    "instruct": (420, 0.8, 16, 2048),
    "docs": (1500, 0.5, 128, 4096),
}
BATCH = 8
LORA = {"r": 16, "lora_alpha": 32, "lora_dropout": 0.0, "target_modules": "all-linear", "bias": "none"}
#: cudaload methods with the attention and batch layout pinned (load_model keywords), for issue 44's comparison
VARIANTS: dict[str, dict[str, str]] = {
    "cudaload-varlen": {"attn": "cudaload_varlen", "batch_layout": "packed"},
    "cudaload-sdpa-packed": {"attn": "sdpa", "batch_layout": "packed"},
    "cudaload-sdpa-padded": {"attn": "sdpa", "batch_layout": "padded"},
    # the plan with cudaload's chunked loss asked for (taken on its own only where memory is short): its speed
    # against transformers' loss on the same data
    "cudaload-chunked": {"loss": "cudaload_chunked"},
}
#: methods that leave batch_size out of load_model (the plan fills each packed step to its token bound)
UNDECLARED = ("cudaload-fill",)


def lengths(dist: str, n: int, seed: int = 0, cap: int | None = None) -> list[int]:
    med, sigma, lo, hi = DISTS[dist]
    hi = min(hi, cap or hi)
    lo = min(lo, hi)
    rng = random.Random(seed)
    return [max(lo, min(hi, round(rng.lognormvariate(math.log(med), sigma)))) for _ in range(n)]


def make_data(
    dist: str, n: int, vocab: int, seed: int = 0, cap: int | None = None, prompt_frac: float = 0.0
) -> list[dict[str, Any]]:
    """``n`` examples of random ids; with ``prompt_frac`` > 0 each has ``labels`` with its first ``prompt_frac``
    of tokens -100 (a prompt that a chat template masks: only the answer is learnt)."""
    rng = random.Random(seed + 1)
    rows: list[dict[str, Any]] = []
    for k in lengths(dist, n, seed, cap):
        ids = [rng.randrange(10, vocab - 10) for _ in range(k)]
        row: dict[str, Any] = {"input_ids": ids}
        if prompt_frac > 0:
            p = min(k - 1, round(k * prompt_frac))
            row["labels"] = [-100] * p + ids[p:]
        rows.append(row)
    return rows


# ------------------------------------------------------------------------------------------------ the child
def _pad_collator(features: list[dict[str, Any]]) -> dict[str, Any]:
    """The plain recipe's batch: right padding to the longest, labels -100 there (DataCollatorForSeq2Seq's)."""
    import torch

    n = max(len(f["input_ids"]) for f in features)
    ids = torch.zeros((len(features), n), dtype=torch.long)
    mask = torch.zeros_like(ids)
    labels = torch.full_like(ids, -100)
    for i, f in enumerate(features):
        k = len(f["input_ids"])
        ids[i, :k] = torch.tensor(f["input_ids"])
        mask[i, :k] = 1
        labels[i, :k] = torch.tensor(f["labels"]) if f.get("labels") is not None else ids[i, :k]
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def _plain_model(path: str, mode: str, device: str) -> Any:
    import torch
    from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    kw: dict[str, Any] = {"dtype": torch.bfloat16, "device_map": device}
    if mode == "qlora":
        kw["quantization_config"] = BitsAndBytesConfig(
            load_in_4bit=True,
            bnb_4bit_quant_type="nf4",
            bnb_4bit_use_double_quant=True,
            bnb_4bit_compute_dtype=torch.bfloat16,
        )
    model = AutoModelForCausalLM.from_pretrained(path, **kw)
    if mode == "qlora":
        model = prepare_model_for_kbit_training(
            model, use_gradient_checkpointing=True, gradient_checkpointing_kwargs={"use_reentrant": False}
        )
    return get_peft_model(model, LoraConfig(task_type="CAUSAL_LM", **LORA))


def child(spec: dict[str, Any]) -> dict[str, Any]:
    t_proc = time.perf_counter()
    import torch
    from transformers import Trainer, TrainerCallback, TrainingArguments

    import cudaload

    cuda = torch.cuda.is_available()
    device = "cuda:0" if cuda else "cpu"
    card = spec.get("card_gib")
    if cuda and card:
        # an emulated smaller card: the allocator capped (the CUDA context lives outside the cap)
        torch.cuda.set_per_process_memory_fraction(
            card * GiB / torch.cuda.get_device_properties(0).total_memory
        )
    steps, warmup = int(spec["steps"]), int(spec["warmup"])
    out: dict[str, Any] = {"spec": spec}
    seq = DISTS[spec["dist"]][3] if not spec.get("smoke") else 64
    from transformers import AutoConfig

    vocab = AutoConfig.from_pretrained(spec["path"]).vocab_size
    data = make_data(
        spec["dist"],
        int(spec["examples"]),
        vocab,
        seed=int(spec.get("seed", 0)),
        cap=seq,
        prompt_frac=float(spec.get("prompt_frac") or 0.0),
    )

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    t0 = time.perf_counter()
    targs: dict[str, Any] = {
        "output_dir": str(Path(spec["work"]) / "trainer"),
        "max_steps": steps + warmup,
        "report_to": [],
        "save_strategy": "no",
        "logging_strategy": "no",
        "disable_tqdm": True,
        "dataloader_num_workers": 0,
        "seed": 0,
        "learning_rate": 2e-4,
    }
    if spec["method"] == "plain":
        model = _plain_model(spec["path"], spec["mode"], device)
        targs.update(
            bf16=cuda,
            per_device_train_batch_size=BATCH,
            gradient_checkpointing=True,
            gradient_checkpointing_kwargs={"use_reentrant": False},
            optim="paged_adamw_8bit"
            if spec["mode"] == "qlora"
            else ("adamw_torch_fused" if cuda else "adamw_torch"),
        )
        collate: Any = _pad_collator
        dataset: Any = data
    else:
        trl_method = spec["method"].removesuffix("-compiled") == "cudaload-trl"
        kw: dict[str, Any] = {}
        if card:
            from cudaload.policies.memory import CUDA_CONTEXT_BYTES

            kw["max_memory"] = {"cuda:0": int(card * GiB) + CUDA_CONTEXT_BYTES}
        # a "-compiled" method is its base method with the decoder layers compiled (cudaload-varlen-compiled)
        compiled = spec["method"].endswith("-compiled")
        kw.update(VARIANTS.get(spec["method"].removesuffix("-compiled"), {}))
        if spec["method"].removesuffix("-compiled") not in UNDECLARED:
            kw["batch_size"] = BATCH
        model = cudaload.load_model(spec["path"], intent=spec["mode"], seq_len=seq, **kw)
        if spec["method"] == "cudaload-peftcast":
            # the A/B of the plan's adapter_cast decision: PEFT's own cast of every adapted input put back
            from peft.tuners.lora import LoraLayer

            for m in model.modules():
                if isinstance(m, LoraLayer):
                    m._forward_pre_hooks.clear()
                    m.cast_input_dtype_enabled = True
        p = model.cudaload_plan
        if trl_method:
            # TRL's path: no data set given to training_setup (it would pack it); only compile_layers=True for
            # cudaload-trl-compiled (None would compile wherever the plan chose it: no data set counts as repaying)
            setup = cudaload.training_setup(model, compile_layers=True) if compiled else None
            sft = cudaload.sft_config_arguments(p)
            # the run's overrides then the plan's keywords, in the order the Trainer path takes them; SFTConfig's
            # gradient_checkpointing default True (trl 1.16 base_config.py:62) is not the plain TrainingArguments'
            # False: the plan's where it says, else off as on the Trainer path
            targs = {"gradient_checkpointing": False, **targs, **sft}
            collate, dataset = None, data
        else:
            # cudaload-compiled: the decoder layers compiled whatever the data set's length (a benchmark's few
            # dozen steps never repay the compile, which the first step pays: step_seconds[0])
            setup = cudaload.training_setup(model, data, compile_layers=True if compiled else None)
            targs.update(setup.arguments)
            collate, dataset = setup.data_collator, setup.train_dataset
        out["plan"] = {
            "attention": p.attention.choice,
            "layout": p.training.layout.choice if p.training else None,
            "tokens_per_step": p.training.step.tokens if p.training else None,
            "boundaries": p.training.boundaries if p.training else None,
            # TRL drops Liger's loss for its own chunked LM head (trl 1.16 sft_trainer.py:1560-1611,
            # fused_lm_head=True on every forward)
            "loss": "trl-fused-head" if trl_method else (p.training.loss.choice if p.training else None),
            "gradient_checkpointing": p.gradient_checkpointing.choice if p.gradient_checkpointing else None,
            "checkpoint_every": p.checkpoint_every,
            "optimizer": p.optimizer.choice if p.optimizer else None,
            "lora_dropout": (p.peft or {}).get("lora_dropout"),
            "kbit": p.training.kbit_upcast.choice if p.training and p.training.kbit_upcast else None,
            "adapter_cast": "peft"
            if spec["method"] == "cudaload-peftcast"
            else (p.training.adapter_cast.choice if p.training and p.training.adapter_cast else None),
            "memory_total": p.memory.total,
            "memory_terms": dict(p.memory.terms),
            "pack": f"TRL: {', '.join(f'{k}={sft.get(k)}' for k in TRL_KEYS)}"
            if trl_method
            else setup.describe(),
            "layer_compile": setup.layer_compile.choice if setup and setup.layer_compile else None,
            "compiled_layers": setup.compiled_layers if setup else None,
        }
    sync()
    out["load_s"] = time.perf_counter() - t0
    tokens: list[int] = []
    slots: list[int] = []  # tokens computed: padding included
    seqs: list[int] = []
    longest: list[int] = []

    def counted(features: Any) -> Any:
        b = collate(features)
        if "attention_mask" in b:
            tokens.append(int(b["attention_mask"].sum()))
            slots.append(int(b["attention_mask"].numel()))
            seqs.append(int(b["attention_mask"].shape[0]))
            longest.append(int(b["attention_mask"].shape[1]))
        else:
            tokens.append(int(b["input_ids"].numel()))
            slots.append(tokens[-1])
            pos = b["position_ids"][0]
            starts = [*(pos == 0).nonzero().flatten().tolist(), pos.numel()]
            seqs.append(len(starts) - 1)
            longest.append(max(b2 - a2 for a2, b2 in itertools.pairwise(starts)))
        return b

    ends: list[float] = []

    class Clock(TrainerCallback):  # type: ignore[misc]
        def on_train_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            sync()
            ends.append(time.perf_counter())

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            sync()
            ends.append(time.perf_counter())

    if collate is None:
        trainer = _sft_trainer(model, targs, dataset, vocab, spec, callbacks=[Clock()])
        # TRL's own collator (DataCollatorForLanguageModeling, padding-free: one row, position_ids restarting at
        # each sequence, no attention_mask; trl 1.16 sft_trainer.py:168-218) counted as cudaload's packed steps are
        collate = trainer.data_collator
        trainer.data_collator = counted
        # what TRL was configured with, as its SFTConfig resolved it (padding_free: on wherever bfd packs,
        # trl 1.16 sft_trainer.py:916), and the packed rows its data set holds
        out["plan"]["trl"] = {k: getattr(trainer.args, k, None) for k in TRL_KEYS} | {
            "padding_free_effective": trainer.padding_free,
            "rows": len(trainer.train_dataset),
        }
    else:
        trainer = Trainer(
            model=model,
            args=TrainingArguments(**targs),
            train_dataset=dataset,
            data_collator=counted,
            callbacks=[Clock()],
        )
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated() if cuda else 0
    try:
        # the mean training loss over every step: methods on the same data and weights should agree (a check
        # that a faster path computes the same loss, not a quality measure: the weights are random)
        out["train_loss"] = float(trainer.train().training_loss)
    except torch.OutOfMemoryError as e:
        out["oom"] = str(e).splitlines()[0]
    if cuda:
        out["peak_allocated"] = torch.cuda.max_memory_allocated()
        out["peak_reserved"] = torch.cuda.max_memory_reserved()
        out["allocated_before"] = before
    durations = [b - a for a, b in itertools.pairwise(ends)]
    n = len(durations)
    timed = list(range(warmup, n))
    out["steps_run"] = n
    out["step_seconds"] = durations
    out["step_tokens"] = tokens[:n]
    out["step_sequences"] = seqs[:n]
    if timed:
        tok = sum(tokens[i] for i in timed)
        sec = sum(durations[i] for i in timed)
        rates = [tokens[i] / durations[i] for i in timed if durations[i] > 0]
        out["tokens_per_s"] = tok / sec if sec else None
        out["rate_median"] = statistics.median(rates)
        out["rate_min"], out["rate_max"] = min(rates), max(rates)
        out["timed_tokens"] = tok
        out["mean_step_tokens"] = tok / len(timed)
        out["mean_step_sequences"] = sum(seqs[i] for i in timed) / len(timed)
    # the steps met: those timed, and the one that ran out of memory (collated, not finished)
    met = n + 1 if out.get("oom") and len(slots) > n else n
    if met:
        # the largest step: real tokens for a packed one, sequences x longest (padding included) for a padded one
        k = max(range(met), key=lambda i: slots[i])
        out["max_step"] = {"tokens": slots[k], "sequences": seqs[k], "longest": longest[k]}
        out["predicted_at_max_step"] = predict(out)
    out["process_s"] = time.perf_counter() - t_proc
    return out


#: SFTConfig keywords recorded for a TRL run (what sft_config_arguments configured TRL with)
TRL_KEYS = ("packing", "packing_strategy", "padding_free", "max_length", "per_device_train_batch_size")


def _sft_trainer(
    model: Any,
    targs: dict[str, Any],
    data: list[dict[str, Any]],
    vocab: int,
    spec: dict[str, Any],
    callbacks: list[Any],
) -> Any:
    """TRL's SFTTrainer on the run's examples with SFTConfig(**targs) (sft_config_arguments + the run's overrides)."""
    import datasets
    import trl

    from cudaload.testing import make_tokenizer

    # a data set with input_ids is taken as tokenized: no tokenization, labels = input_ids, packed when packing
    # (trl 1.16 sft_trainer.py:1247-1248 is_processed, :1405-1427 labels, :1464-1476 pack_dataset); preparation
    # is kept (no skip_prepare_dataset), since it is what packs
    ds = datasets.Dataset.from_list(data)
    # the benchmark's checkpoints have no tokenizer and TRL needs one for its pad token only (trl 1.16
    # sft_trainer.py:713-716, 967-977): a local byte-level one of the model's vocabulary, "<pad>" = id 0
    tok = make_tokenizer(vocab)
    targs = {**targs, "output_dir": str(Path(spec["work"]) / "sft"), "dataset_num_proc": None}
    return trl.SFTTrainer(
        model=model, args=trl.SFTConfig(**targs), train_dataset=ds, processing_class=tok, callbacks=callbacks
    )


def predict(run: dict[str, Any]) -> dict[str, int] | None:
    """cudaload's memory model at the largest step a run met (``run["max_step"]``): the allocator's peak it
    predicts, from what the run recorded (its spec and, for cudaload, its plan), so a results.json can be
    compared again with the current model (``--recompare``)."""
    from cudaload.model_info import model_info
    from cudaload.planner import sdpa_family
    from cudaload.plans.training import StepShape
    from cudaload.policies.memory import allocated_bytes, estimate
    from cudaload.testing import full_config

    spec, step = run["spec"], run.get("max_step")
    if not step:
        return None
    info = model_info(full_config(SHAPES[spec["shape"]]) if not spec.get("smoke") else spec["path"])
    p = run.get("plan")
    if spec["method"].startswith("cudaload") and p:
        longest = DISTS[spec["dist"]][3] if not spec.get("smoke") else 64
        packed = p["layout"] == "packed"
        shape = StepShape(
            tokens=step["tokens"],
            # TRL fills a packed row with as many sequences as fit, not at most BATCH
            sequences=step["sequences"]
            if not packed
            else max(BATCH, step["sequences"] if p.get("trl") else 0),
            longest=min(longest, step["longest"]),
            packed=packed,
            fused_loss=p["loss"] in ("liger", "trl-fused-head", "cudaload_chunked"),
            chunked_loss=p["loss"] == "cudaload_chunked",
            lora_dropout=float(p.get("lora_dropout") or 0.0),
            kbit_upcast=p.get("kbit") == "fp32",
            cast_outside_autocast=p.get("adapter_cast") == "outside-autocast",
            # runs recorded before partial checkpointing: every layer where it was on
            checkpoint_every=max(int(p.get("checkpoint_every") or 1), 1),
            # the run's layers compiled (training_setup): the memory model's compiled figure
            compiled_layers=bool(p.get("compiled_layers")),
        )
        kw = {
            "quantization": "nf4" if spec["mode"] == "qlora" else None,
            "attn": sdpa_family(p["attention"]) or p["attention"],
            "optimizer": p.get("optimizer"),
            "gradient_checkpointing": p.get("gradient_checkpointing") in ("on", "partial"),
        }
    else:
        shape = StepShape.padded(step["sequences"], step["longest"], kbit_upcast=spec["mode"] == "qlora")
        kw = {
            "quantization": "nf4" if spec["mode"] == "qlora" else None,
            "attn": "sdpa",
            "optimizer": "paged_adamw_8bit" if spec["mode"] == "qlora" else "adamw_torch_fused",
            "gradient_checkpointing": True,
        }
    terms = estimate(
        info,
        dtype="bfloat16",
        intent=spec["mode"],
        seq_len=shape.longest,
        batch_size=shape.sequences,
        step=shape,
        **kw,
    )
    return {"allocated": allocated_bytes(terms), "total": terms["total"]}


def recompare(paths: list[str]) -> list[dict[str, Any]]:
    """Every run of these results.json files against the current memory model: measured peak, prediction, ratio.
    A run that ran out of memory is a lower bound: the prediction must be at least what was allocated."""
    rows = []
    for path in paths:
        for r in json.loads(Path(path).read_text())["runs"]:
            if r.get("error") or not r.get("peak_allocated"):
                continue
            pred = predict(r)
            if pred is None:
                continue
            s = r["spec"]
            rows.append(
                {
                    "run": f"{Path(path).parent.parent.name}/{Path(path).parent.name}",
                    "shape": s["shape"],
                    "mode": s["mode"],
                    "dist": s["dist"] + (f" on {s['card_gib']} GiB" if s.get("card_gib") else ""),
                    "method": s["method"],
                    "oom": bool(r.get("oom")),
                    "max_step": r["max_step"],
                    "peak_allocated": r["peak_allocated"],
                    "predicted": pred["allocated"],
                    "ratio": pred["allocated"] / r["peak_allocated"],
                }
            )
    return rows


# ----------------------------------------------------------------------------------------------- the parent
def _run_child(spec: dict[str, Any], timeout: float) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--child", json.dumps(spec)]
    t0 = time.perf_counter()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"spec": spec, "error": f"timed out after {timeout:.0f} s", "wall_s": time.perf_counter() - t0}
    for line in p.stdout.splitlines():
        if line.startswith(TAG):
            res = json.loads(line[len(TAG) :])
            res["wall_s"] = time.perf_counter() - t0
            return dict(res)
    return {"spec": spec, "error": (p.stderr or p.stdout)[-3000:], "wall_s": time.perf_counter() - t0}


def _fmt(x: Any, d: int = 0) -> str:
    return "-" if x is None else f"{x:,.{d}f}"


def _gib(x: Any) -> str:
    return "-" if x is None else f"{x / GiB:.1f}"


def summarize(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (shape, mode, dist): both methods' rates and peaks, the ratio, cudaload's predictions."""
    by: dict[tuple[str, str, str], dict[str, dict[str, Any]]] = {}
    for r in runs:
        s = r["spec"]
        dist = s["dist"] + (f" on {s['card_gib']} GiB" if s.get("card_gib") else "")
        by.setdefault((s["shape"], s["mode"], dist), {})[s["method"]] = r
    rows = []
    for (shape, mode, dist), m in by.items():
        pl, cl, pc = m.get("plain", {}), m.get("cudaload", {}), m.get("cudaload-peftcast", {})
        cc = m.get("cudaload-compiled", {})
        a, b, c = pl.get("tokens_per_s"), cl.get("tokens_per_s"), cc.get("tokens_per_s")
        pred = (cl.get("predicted_at_max_step") or {}).get("allocated")
        peak = cl.get("peak_allocated")
        rows.append(
            {
                "shape": shape,
                "mode": mode,
                "dist": dist,
                "plain_tokens_per_s": a,
                "cudaload_tokens_per_s": b,
                "ratio": b / a if a and b else None,
                "cudaload_peftcast_tokens_per_s": pc.get("tokens_per_s"),
                "cudaload_compiled_tokens_per_s": c,
                "compiled_ratio": c / a if a and c else None,
                # the first step pays the compile
                "compiled_first_step_s": (cc.get("step_seconds") or [None])[0],
                "cudaload_compiled_peak": cc.get("peak_allocated"),
                "plain_peak": pl.get("peak_allocated"),
                "cudaload_peak": peak,
                "cudaload_bound": (cl.get("plan") or {}).get("memory_total"),
                "cudaload_predicted_at_max_step": pred,
                "prediction_ratio": pred / peak if pred and peak else None,
                "plain_predicted_at_max_step": (pl.get("predicted_at_max_step") or {}).get("allocated"),
                "plan": cl.get("plan"),
                "errors": {
                    k: v.get("error") or v.get("oom") for k, v in m.items() if v.get("error") or v.get("oom")
                },
            }
        )
    return rows


def write(out: Path, res: dict[str, Any]) -> None:
    res["summary"] = summarize(res["runs"])
    (out / "results.json").write_text(json.dumps(res, indent=1, default=str))
    lines = [
        "# Fine-tuning: plain recipe vs cudaload (benchmarks/bench_train.py)",
        "",
        f"{res['meta']['date']}, {res['meta'].get('gpu') or 'CPU'}; {res['meta']['versions']}",
        f"command: `{res['meta']['command']}`",
        "",
        "| shape | mode | lengths | plain tok/s | cudaload tok/s | ratio | plain peak GiB | cudaload peak GiB "
        "| plan's bound GiB | predicted at the largest step GiB (ratio) | cudaload's plan |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in res["summary"]:
        p = r["plan"] or {}
        plan = (
            f"{p.get('attention')}, {p.get('layout')} <= {_fmt(p.get('tokens_per_step'))} tokens, "
            f"checkpointing {p.get('gradient_checkpointing')}, loss {p.get('loss')}, {p.get('optimizer')}"
            if p
            else "-"
        )
        pr = r["prediction_ratio"]
        lines.append(
            f"| {r['shape']} | {r['mode']} | {r['dist']} | {_fmt(r['plain_tokens_per_s'])} | "
            f"{_fmt(r['cudaload_tokens_per_s'])} | {_fmt(r['ratio'], 2)} | {_gib(r['plain_peak'])} | "
            f"{_gib(r['cudaload_peak'])} | {_gib(r['cudaload_bound'])} | "
            f"{_gib(r['cudaload_predicted_at_max_step'])} ({_fmt(pr, 2)}) | {plan} |"
        )
    variants = [r for r in res["runs"] if r["spec"]["method"] in ("cudaload", *VARIANTS)]
    if any(r["spec"]["method"] in VARIANTS for r in variants):
        lines += [
            "",
            "## Attention and layout (same data, cudaload's plan with these pinned)",
            "",
            "| shape | mode | lengths | method | attention | layout | tok/s | peak GiB |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for r in variants:
            s, p = r["spec"], r.get("plan") or {}
            lines.append(
                f"| {s['shape']} | {s['mode']} | {s['dist']} | {s['method']} | {p.get('attention')} | "
                f"{p.get('layout')} ({p.get('boundaries') or 'mask'}) | {_fmt(r.get('tokens_per_s'))} | "
                f"{_gib(r.get('peak_allocated'))} |"
            )
    lines += ["", "## Runs", ""]
    for r in res["runs"]:
        s = r["spec"]
        card = f" on {s['card_gib']} GiB" if s.get("card_gib") else ""
        head = f"- {s['shape']} {s['mode']} {s['dist']}{card} {s['method']}: "
        if r.get("error"):
            lines.append(head + "ERROR " + str(r["error"]).strip().splitlines()[-1][:300])
            continue
        lines.append(
            head
            + f"{_fmt(r.get('tokens_per_s'))} tok/s (per step {_fmt(r.get('rate_min'))}-{_fmt(r.get('rate_max'))}, "
            f"median {_fmt(r.get('rate_median'))}), {_fmt(r.get('mean_step_sequences'), 1)} sequences and "
            f"{_fmt(r.get('mean_step_tokens'))} real tokens a step, peak {_gib(r.get('peak_allocated'))} GiB "
            f"allocated / {_gib(r.get('peak_reserved'))} reserved, load {_fmt(r.get('load_s'), 1)} s, process "
            f"{_fmt(r.get('process_s'), 1)} s" + (f", OOM: {r['oom']}" if r.get("oom") else "")
        )
        if r.get("plan"):
            lines.append(f"  - {r['plan'].get('pack')}")
    if res.get("skipped"):
        lines += ["", "Skipped (budget): " + ", ".join(res["skipped"])]
    (out / "results.md").write_text("\n".join(lines) + "\n")


def _versions() -> dict[str, str]:
    import importlib.metadata as md

    out = {}
    for n in ("torch", "transformers", "peft", "flash-attn-4", "bitsandbytes", "liger-kernel", "accelerate"):
        with contextlib.suppress(md.PackageNotFoundError):
            out[n] = md.version(n)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=False)
    ap.add_argument("--shapes", default="8b,0.6b")
    ap.add_argument("--modes", default="lora,qlora")
    ap.add_argument("--dists", default="chat,docs")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--examples", type=int, default=400)
    ap.add_argument("--budget-s", type=float, default=540)
    ap.add_argument("--work", default="/tmp/cudaload-bench")
    ap.add_argument("--card-gib", type=float, help="emulate a card of this many GiB (the allocator capped)")
    ap.add_argument("--methods", default="plain,cudaload")
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument(
        "--prompt-frac",
        type=float,
        default=0.0,
        help="label only the last 1 - FRAC of each example (its first FRAC masked -100, as a chat template's prompt)",
    )
    ap.add_argument("--child")
    ap.add_argument(
        "--recompare", nargs="+", metavar="RESULTS_JSON", help="compare runs with the current model"
    )
    a = ap.parse_args(argv)
    if a.recompare:
        rows = recompare(a.recompare)
        for r in rows:
            print(
                f"{r['run']:<22} {r['shape']:>5} {r['mode']:<6} {r['dist']:<17} {r['method']:<9} "
                f"tokens {r['max_step']['tokens']:>6} peak {r['peak_allocated'] / GiB:6.2f} GiB "
                f"predicted {r['predicted'] / GiB:6.2f} GiB ratio {r['ratio']:.3f}"
                + (" (OOM)" if r["oom"] else "")
            )
        if a.out:
            Path(a.out).write_text(json.dumps(rows, indent=1))
        return 0
    if a.child:
        spec = json.loads(a.child)
        try:
            res = child(spec)
        except Exception as e:
            res = {"spec": spec, "error": f"{type(e).__name__}: {e}\n{traceback.format_exc()[-2000:]}"}
        print(TAG + json.dumps(res, default=str), flush=True)
        return 0
    if not a.out:
        ap.error("--out is required")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()
    res: dict[str, Any] = {
        "meta": {
            "date": _dt.date.today().isoformat(),
            "command": " ".join([Path(sys.argv[0]).name, *(argv if argv is not None else sys.argv[1:])]),
            "python": platform.python_version(),
            "versions": _versions(),
        },
        "runs": [],
        "skipped": [],
    }
    try:
        import pynvml

        pynvml.nvmlInit()
        res["meta"]["gpu"] = pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(0))
    except Exception:
        res["meta"]["gpu"] = None
    paths: dict[str, str] = {}
    for shape in a.shapes.split(","):
        if a.smoke:
            path = work / "tiny-qwen3-train"
            if not (path / "config.json").exists():
                from cudaload.testing import make_tiny

                make_tiny("qwen3", path, dtype="bfloat16")
            paths[shape] = str(path)
            continue
        path = work / SHAPES[shape]
        if not (path / "config.json").exists():
            from benchlib.common import w_write

            print(f"writing {SHAPES[shape]} to {path}", flush=True)
            print(json.dumps(w_write({"path": str(path), "config": SHAPES[shape]})), flush=True)
        paths[shape] = str(path)
    specs = []
    for shape in a.shapes.split(","):
        for mode in a.modes.split(","):
            for dist in a.dists.split(","):
                for method in a.methods.split(","):
                    specs.append(
                        {
                            "shape": shape,
                            "mode": mode,
                            "dist": dist,
                            "method": method,
                            "path": paths[shape],
                            "steps": 2 if a.smoke else (a.steps if dist != "docs" else max(a.steps // 2, 4)),
                            "warmup": 1
                            if a.smoke
                            else (a.warmup if dist != "docs" else max(a.warmup - 1, 1)),
                            "examples": 24 if a.smoke else a.examples,
                            "work": str(work),
                            "smoke": a.smoke,
                            "card_gib": a.card_gib,
                            "prompt_frac": a.prompt_frac,
                        }
                    )
    for spec in specs:
        left = a.budget_s - (time.perf_counter() - t_start)
        label = f"{spec['shape']}/{spec['mode']}/{spec['dist']}/{spec['method']}" + (
            f"/{a.card_gib}GiB" if a.card_gib else ""
        )
        if left < 30:
            res["skipped"].append(label)
            continue
        print(f"run {label} ({left:.0f} s left)", flush=True)
        r = _run_child(spec, timeout=left)
        res["runs"].append(r)
        print(
            f"  {label}: {_fmt(r.get('tokens_per_s'))} tok/s, peak {_gib(r.get('peak_allocated'))} GiB"
            + (f" ERROR {str(r['error']).strip().splitlines()[-1][:200]}" if r.get("error") else ""),
            flush=True,
        )
        write(out, res)
    write(out, res)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
