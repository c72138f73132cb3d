#!/usr/bin/env python
"""FSDP2 ranks that read only their own shards (issue 17, cudaload.fastload.sharded) against today's staged load
(every rank loads the whole model on its CPU), on the GPUs of one host under torchrun.

    python benchmarks/bench_sharded_load.py --out DIR [--budget-s 480] [--shape Qwen3-8B] [--nproc 2]
                                            [--reps 3] [--work DIR] [--smoke]

parts:
  write    a random bf16 checkpoint of ``--shape`` (4 GB safetensors shards), once, in the page cache.
  compare  ``--reps`` interleaved rounds of two fresh ``torchrun`` runs: ``sharded`` (``load_fsdp2``: float32
           master shards on cuda:LOCAL_RANK, bf16 compute) and ``staged`` (``from_pretrained(dtype=bf16,
           device_map="cpu")`` on every rank, what load_model does today). Per rank: load seconds, bytes read,
           host RSS growth (ru_maxrss), GPU peak; sharded ranks also check their shards against the
           checkpoint's rows bit for bit and run one AdamW step (loss must be finite).
  wiring   ``cudaload.load_model(intent="training")`` on every rank, with this machine's GPUs shrunk so a 1.2 B
           Qwen3 (small vocabulary) fits none whole (the plan picks FSDP2 and the sharded load), then a transformers
           ``Trainer`` built from ``TrainingArguments(**cudaload.training_arguments(plan))`` for 3 steps: the
           real accelerate FSDP2 path taking the FSDPModule (losses finite, plan notes, per-rank bytes).

Runs each part in fresh processes (the parent never touches CUDA) and rewrites DIR/results.json and
DIR/results.md after every run; a failing run records its error and the rest goes on. Medians and spread over
reps. ``--smoke`` does it all on this CPU (gloo, 2 processes, tiny Qwen3; the wiring part's Trainer is replaced
by one manual step there, since accelerate runs DDP, not FSDP, on the CPU) in about a minute.
Expected on 2 x H200 with the defaults: write ~60 s, compare ~6 x 35 s, wiring ~60 s: within 480 s.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
GiB = 1 << 30


def log(msg: str) -> None:
    print(f"[bench_sharded_load {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def _rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB


# ----------------------------------------------------------------------------------------------------
# workers (under torchrun, or alone for "write")
# ----------------------------------------------------------------------------------------------------
def _init(spec: dict[str, Any]) -> tuple[Any, Any, int]:
    import torch

    local = int(os.environ.get("LOCAL_RANK", "0"))
    if spec["smoke"]:
        dev = torch.device("cpu")
        torch.set_num_threads(1)
    else:
        torch.cuda.set_device(local)
        dev = torch.device("cuda", local)
    return torch, dev, local


def w_write(spec: dict[str, Any]) -> dict[str, Any]:
    import torch
    import transformers

    t0 = time.perf_counter()
    path = Path(spec["path"])
    if spec["shape"] == "tiny":
        from cudaload.testing import make_tiny

        make_tiny("qwen3", path, dtype="bfloat16", max_shard_size="100KB")
    else:
        from cudaload.testing import full_config
        from cudaload.testing.models import make_tokenizer

        cfg = WIRING_SHAPES[spec["shape"]]() if spec["shape"] in WIRING_SHAPES else full_config(spec["shape"])
        with torch.device("cpu" if spec["smoke"] else "cuda"):
            model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
        model.save_pretrained(path, max_shard_size="4GB")
        make_tokenizer(cfg.vocab_size).save_pretrained(path)
    (path / "WRITTEN").write_text("ok")
    return {"seconds": round(time.perf_counter() - t0, 2)}


def _qwen3(layers: int, hidden: int, inter: int, heads: int, kv: int, tied: bool) -> Any:
    import transformers

    return transformers.Qwen3Config(
        vocab_size=1024, hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=kv, head_dim=hidden // heads, max_position_embeddings=1024,
        tie_word_embeddings=tied, bos_token_id=1, eos_token_id=2, pad_token_id=0,
    )  # fmt: skip


#: Checkpoints for the wiring part: load_model takes the sharded path when the bf16 weights fit no GPU whole
#: but FSDP2 (with CPU offload) fits. A small vocabulary keeps the root unit (embeddings, head) small, so a
#: shrunk GPU can hold the working set and not the weights (Qwen3-0.6B's 151936-word vocabulary cannot: its
#: root alone outweighs the gap). smoke-165M: tests/test_sharded_load.py's, 1050 MB GPUs; wide-1.2B: 1.21 B
#: parameters (tied), sharded at 1.45-2.9 GiB GPUs by the plan.
WIRING_SHAPES = {
    "smoke-165M": lambda: _qwen3(52, 512, 1536, 8, 4, tied=False),
    "wide-1.2B": lambda: _qwen3(24, 2048, 6144, 16, 8, tied=True),
}


def _check_rows(model: Any, path: str, names: int = 6) -> list[str]:
    """This rank's shard of a few parameters against the checkpoint's rows (bf16 -> float32 is exact)."""
    import torch
    from safetensors import safe_open

    from cudaload.fastload.sharded import shard_rows

    found: dict[str, str] = {}
    for f in sorted(Path(path).glob("*.safetensors")):
        with safe_open(str(f), "pt") as st:
            for k in st.keys():  # noqa: SIM118
                found[k] = str(f)
    bad = []
    params = dict(model.named_parameters())
    picked = [n for n in params if n in found][:: max(1, len(params) // names)][:names]
    for n in picked:
        p = params[n]
        local = p.to_local()
        rows = p.shape[0]
        start, stop = shard_rows(rows, p.device_mesh.size(), p.device_mesh.get_local_rank())
        with safe_open(found[n], "pt") as st:
            want = st.get_slice(n)[start:stop].to(torch.float32)
        if not torch.equal(local.detach().cpu().float(), want):
            bad.append(n)
    return bad


def w_sharded(spec: dict[str, Any]) -> dict[str, Any]:
    torch, dev, _ = _init(spec)
    import torch.distributed as dist
    from torch.distributed.fsdp import MixedPrecisionPolicy

    from cudaload.fastload.sharded import load_fsdp2

    dist.init_process_group("gloo" if spec["smoke"] else "nccl")
    dist.barrier()
    rss0 = _rss()
    bf = torch.bfloat16
    t0 = time.perf_counter()
    model = load_fsdp2(
        spec["path"],
        dtype=torch.float32,
        device=dev,
        mp_policy=MixedPrecisionPolicy(param_dtype=bf, reduce_dtype=bf, output_dtype=bf),
    )
    if dev.type == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    out: dict[str, Any] = {
        "seconds": round(seconds, 3),
        "bytes": model.cudaload_fastload["bytes"],
        "checkpoint_bytes": model.cudaload_fastload["checkpoint_bytes"],
        "rss_growth": _rss() - rss0,
        "gpu_peak": torch.cuda.max_memory_allocated(dev) if dev.type == "cuda" else None,
        "local_params": sum(p.to_local().numel() for p in model.parameters()),
        "bad_rows": _check_rows(model, spec["path"]),
    }
    model.train()
    ids = torch.arange(3, 3 + 256, device=dev).reshape(1, 256) % model.config.vocab_size
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    opt.step()
    out["loss"] = float(loss.detach())
    dist.barrier()
    dist.destroy_process_group()
    return out


def w_staged(spec: dict[str, Any]) -> dict[str, Any]:
    torch, _, _ = _init(spec)
    import torch.distributed as dist
    import transformers

    dist.init_process_group("gloo" if spec["smoke"] else "nccl")
    dist.barrier()
    rss0 = _rss()
    t0 = time.perf_counter()
    model = transformers.AutoModelForCausalLM.from_pretrained(
        spec["path"], dtype=torch.bfloat16, device_map="cpu"
    )
    seconds = time.perf_counter() - t0
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    out = {"seconds": round(seconds, 3), "bytes": total, "rss_growth": _rss() - rss0}
    dist.barrier()
    dist.destroy_process_group()
    return out


def _shrunk_caps(spec: dict[str, Any], local: int, world: int) -> Any:
    """This machine (or, smoke, a 2 x H200 snapshot) with GPUs shrunk until the plan loads sharded."""
    import dataclasses

    import cudaload
    from cudaload.capabilities import Distributed

    if spec["smoke"]:
        from cudaload.profiles import hardware

        caps = dataclasses.replace(hardware("2xH200"), source="snapshot:smoke")
        sizes = [1050 * 10**6]
    else:
        caps = cudaload.detect()
        # wide-1.2B: 2.4 GB of bf16 weights; the 2 x H200 snapshot plans the sharded load from 1.45 to 2.9 GiB
        # (planning only reads headers, so trying sizes is cheap)
        sizes = [int((1.2 + 0.05 * i) * GiB) for i in range(40)]
    d = Distributed(local_rank=local, rank=local, world_size=world, local_world_size=world)
    caps = dataclasses.replace(caps, distributed=d)
    for size in sizes:
        gpus = tuple(dataclasses.replace(g, total_memory=size, free_memory=size) for g in caps.gpus)
        shrunk = dataclasses.replace(caps, gpus=gpus)
        try:
            p = cudaload.plan(
                spec["wiring_path"], hardware=shrunk, intent="training", seq_len=256, allow_offload=True
            )
        except Exception:  # does not fit at this size: try the next
            continue
        if p.parallelism is not None and p.parallelism.config.get("sharded_load"):
            return shrunk
    raise RuntimeError(f"no GPU size in {sizes} gives a sharded-load plan")


def w_wiring(spec: dict[str, Any]) -> dict[str, Any]:
    torch, dev, local = _init(spec)
    import torch.distributed as dist
    import transformers

    import cudaload

    world = int(os.environ["WORLD_SIZE"])
    caps = _shrunk_caps(spec, local, world)
    rss0 = _rss()
    t0 = time.perf_counter()
    model = cudaload.load_model(
        spec["wiring_path"], hardware=caps, intent="training", seq_len=256, allow_offload=True, prefetch=False
    )
    seconds = time.perf_counter() - t0
    p = model.cudaload_plan
    par = p.parallelism
    out: dict[str, Any] = {
        "seconds": round(seconds, 3),
        "gpu_gib": round(caps.gpus[0].total_memory / GiB, 2),
        "choice": par.choice if par else None,
        "load_path": p.verified["load_path"],
        "notes": p.verified["notes"],
        "placement": list(p.placement.devices),
        "bytes": getattr(model, "cudaload_fastload", {}).get("bytes"),
        "host_bytes_per_node": par.config.get("host_bytes_per_node") if par else None,
        "rss_growth": _rss() - rss0,
    }
    ids = torch.arange(3, 3 + 256).reshape(256) % model.config.vocab_size
    targs = cudaload.training_arguments(p)
    out["fsdp_config"] = targs.get("fsdp_config")
    if spec["smoke"]:
        # accelerate runs DDP, not FSDP, on the CPU: one manual step instead of the Trainer
        model.train()
        loss = model(input_ids=ids[None], labels=ids[None]).loss
        loss.backward()
        torch.optim.AdamW(model.parameters(), lr=1e-4).step()
        out["losses"] = [float(loss.detach())]
    else:
        targs.update(
            output_dir=f"{spec['work']}/trainer{local}",
            max_steps=3,
            per_device_train_batch_size=1,
            report_to=[],
            save_strategy="no",
            logging_steps=1,
        )
        ds = [{"input_ids": ids, "labels": ids} for _ in range(16)]
        trainer = transformers.Trainer(
            model=model, args=transformers.TrainingArguments(**targs), train_dataset=ds
        )
        trainer.train()
        out["losses"] = [h["loss"] for h in trainer.state.log_history if "loss" in h]
        out["gpu_peak"] = torch.cuda.max_memory_allocated(dev)
        out["model_is_fsdp"] = type(trainer.model_wrapped).__name__
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
    return out


WORKERS = {"write": w_write, "sharded": w_sharded, "staged": w_staged, "wiring": w_wiring}


def worker_main(kind: str, spec_file: str) -> int:
    spec = json.loads(Path(spec_file).read_text())
    rank = int(os.environ.get("RANK", "0"))
    try:
        result = WORKERS[kind](spec)
    except Exception as e:
        traceback.print_exc()
        result = {"error": f"rank {rank}: {type(e).__name__}: {e}"[:1500]}
    Path(f"{spec['result']}.rank{rank}").write_text(json.dumps(result, default=str))
    return 0


# ----------------------------------------------------------------------------------------------------
# parent
# ----------------------------------------------------------------------------------------------------
def _run(kind: str, spec: dict[str, Any], nproc: int, timeout: float) -> list[dict[str, Any]]:
    spec_file = Path(spec["result"] + ".spec.json")
    spec_file.write_text(json.dumps(spec))
    for old in Path(spec["result"]).parent.glob(Path(spec["result"]).name + ".rank*"):
        old.unlink()
    me = [str(Path(__file__).resolve()), "--worker", kind, str(spec_file)]
    if kind == "write":
        cmd = [sys.executable, *me]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc), "--master_port",
               str(spec["port"]), *me]  # fmt: skip
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    src = str(HERE.parent / "src")
    env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "") if env.get("PYTHONPATH") else src
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)  # fmt: skip
    try:
        text, _ = proc.communicate(timeout=max(timeout, 5))
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 15)
        text, _ = proc.communicate()
        return [{"error": f"{kind}: timed out after {timeout:.0f} s", "tail": text[-2000:]}]
    res = []
    for r in range(1 if kind == "write" else nproc):
        f = Path(f"{spec['result']}.rank{r}")
        res.append(
            json.loads(f.read_text())
            if f.exists()
            else {"error": f"rank {r} wrote nothing", "tail": text[-2000:]}
        )
    return res


def _stats(xs: list[Any]) -> dict[str, Any]:
    xs = [x for x in xs if isinstance(x, (int, float))]
    return {"median": statistics.median(xs), "spread": [min(xs), max(xs)]} if xs else {}


def render(res: dict[str, Any]) -> str:
    lines = ["# FSDP2 sharded loading vs every rank loading the whole model (issue 17)", ""]
    m = res["meta"]
    lines.append(
        f"shape {m['shape']}, {m['nproc']} ranks, {m['reps']} interleaved rounds, smoke={m['smoke']}"
    )
    lines += ["", "| mode | load s (median, spread) | bytes read per rank | host RSS growth per rank (GiB) | GPU peak (GiB) |",
              "|---|---|---|---|---|"]  # fmt: skip
    for mode in ("sharded", "staged"):
        runs = [r for rnd in res["compare"] for r in rnd.get(mode, []) if "error" not in r]
        if not runs:
            continue
        s, b = _stats([r["seconds"] for r in runs]), _stats([r["bytes"] for r in runs])
        rss = _stats([r["rss_growth"] / GiB for r in runs])
        gpu = _stats([r["gpu_peak"] / GiB for r in runs if r.get("gpu_peak")])
        gpu_text = f"{gpu['median']:.2f}" if gpu else "-"
        lines.append(
            f"| {mode} | {s['median']:.2f} ({s['spread'][0]:.2f}-{s['spread'][1]:.2f}) "
            f"| {b['median'] / 1e9:.3f} GB | {rss['median']:.2f} ({rss['spread'][0]:.2f}-{rss['spread'][1]:.2f}) "
            f"| {gpu_text} |"
        )
    errs = [r["error"] for rnd in res["compare"] for v in rnd.values() for r in v if "error" in r]
    sharded = [r for rnd in res["compare"] for r in rnd.get("sharded", []) if "error" not in r]
    if sharded:
        lines.append("")
        lines.append(
            f"sharded: rows checked against the checkpoint: {'all equal' if not any(r['bad_rows'] for r in sharded) else 'MISMATCH'}; "
            f"losses after one step: {sorted({round(r['loss'], 3) for r in sharded})}"
        )
    w = res.get("wiring")
    if w:
        lines += ["", "## load_model + Trainer", ""]
        for r, x in enumerate(w):
            if "error" in x:
                lines.append(f"- rank {r}: ERROR {x['error']}")
                continue
            lines.append(
                f"- rank {r}: GPUs shrunk to {x['gpu_gib']} GiB -> {x['choice']}, load path {x['load_path']}, "
                f"{(x.get('bytes') or 0) / 1e9:.3f} GB read, {x['seconds']:.2f} s, losses {x['losses']}"
            )
        if w and "notes" in w[0]:
            lines += ["", "notes (rank 0): " + " | ".join(w[0]["notes"])]
    if errs:
        lines += ["", "errors:", *[f"- {e}" for e in errs]]
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=False)
    ap.add_argument("--budget-s", type=float, default=480)
    ap.add_argument("--shape", default="Qwen3-8B")
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--work", default=None)
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--worker", nargs=2, metavar=("KIND", "SPEC"))
    a = ap.parse_args()
    if a.worker:
        return worker_main(*a.worker)
    if not a.out:
        ap.error("--out is required")
    t_end = time.time() + a.budget_s
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(a.work or out / "work")
    work.mkdir(parents=True, exist_ok=True)
    shape = "tiny-qwen3" if a.smoke else a.shape
    ck = work / f"ck-{shape}"
    wiring_shape = "smoke-165M" if a.smoke else "wide-1.2B"
    wiring_ck = work / f"ck-{wiring_shape}"
    base = {"smoke": a.smoke, "shape": a.shape, "work": str(work), "wiring_path": str(wiring_ck)}
    res: dict[str, Any] = {"meta": {"shape": shape, "nproc": a.nproc, "reps": a.reps, "smoke": a.smoke,
                                    "date": time.strftime("%Y-%m-%d %H:%M")}, "compare": []}  # fmt: skip
    port = 29531

    def save() -> None:
        (out / "results.json").write_text(json.dumps(res, indent=1, default=str))
        (out / "results.md").write_text(render(res))

    def left() -> float:
        return t_end - time.time()

    for path, sh in ((ck, "tiny" if a.smoke else a.shape), (wiring_ck, wiring_shape)):
        if not (path / "WRITTEN").exists():
            log(f"writing the {sh} checkpoint to {path}")
            r = _run("write", {**base, "shape": sh, "path": str(path), "result": str(work / "write")}, 1,
                     min(left(), 240))  # fmt: skip
            res.setdefault("write", []).append(r[0])
            log(f"  -> {r[0]}")
            save()
    for rep in range(a.reps):
        rnd: dict[str, Any] = {}
        order = ("sharded", "staged") if rep % 2 == 0 else ("staged", "sharded")
        for mode in order:
            if left() < 100:
                log(f"budget: skipping {mode} round {rep}")
                continue
            port += 1
            log(f"round {rep}: {mode}")
            spec = {**base, "path": str(ck), "result": str(work / mode), "port": port}
            rnd[mode] = _run(mode, spec, a.nproc, min(left() - 60, 150))
            log(
                "  -> "
                + "; ".join(json.dumps({k: v for k, v in r.items() if k != "tail"})[:300] for r in rnd[mode])
            )
        res["compare"].append(rnd)
        save()
    if left() > 45:
        port += 1
        log("wiring: load_model + Trainer")
        spec = {**base, "result": str(work / "wiring"), "port": port}
        res["wiring"] = _run("wiring", spec, a.nproc, min(left() - 5, 180))
        log("  -> " + "; ".join(json.dumps(r)[:400] for r in res["wiring"]))
    save()
    log(f"wrote {out / 'results.json'} and results.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
