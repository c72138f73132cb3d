#!/usr/bin/env python
"""Check cudaload's attention verdicts against what really happens, and measure first-use costs.

    python benchmarks/attention_rules_check.py --out DIR [--budget-s 480] [--smoke]

For each model family (real attention shapes, 2 tiny layers, random bf16 weights) and each backend cudaload
plans (sdpa, eager, flex_attention, flash_attention_2 and flash_attention_4 when installed), in inference and
in training (forward + backward), this runs the backend and records: cudaload's verdict (``choose_attention``
candidate ok or not, with the first reason), what happened (ok / the exception), and, when it ran, the
largest relative difference of the logits (and of a q_proj gradient in training) against eager on the same
weights, so a backend that runs but computes something else (SDPA dropping soft-capping, a kernel dropping
sinks) shows.
A row where the verdict and the outcome disagree is marked MISMATCH.

flash-attn-4 also runs with FLASH_ATTENTION_ARCH=sm_80 and sm_120 (its interface.py _get_device_arch
override selects those kernel paths on any GPU; both use SM80 MMA, which the H200 runs): that checks the
rules for those architectures (no sinks, no sm80 backward) without such a GPU. Shared-memory limits are not
checked that way (the kernels are compiled for the real GPU).

First use, each in a fresh process: ``import flash_attn.cute``, and the first vs second forward of each
backend (FA4 JIT, flex_attention compile).

Every model family runs in its own subprocess (a kernel fault would poison the CUDA context); results are
rewritten after each one, so a run stopped by the time limit keeps what it measured. ``--smoke`` runs on the
CPU with sdpa / eager / flex_attention (inference) in seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
TAG = "RULES-RESULT "
SMALL = {"num_hidden_layers": 2, "vocab_size": 256, "intermediate_size": 128}
#: family -> config dict. Head dims, sinks, soft-capping, windows and ALiBi are the real ones; the families the
#: rules most depend on come first, so a run cut by its time budget has them.
FAMILIES: dict[str, dict[str, Any]] = {
    "gpt_oss-sinks": {
        "model_type": "gpt_oss",
        "hidden_size": 256,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "num_local_experts": 4,
        "sliding_window": 64,
    },
    "deepseek_v3-mla": {
        "model_type": "deepseek_v3",
        "hidden_size": 256,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "q_lora_rank": 64,
        "kv_lora_rank": 64,
        "n_routed_experts": 4,
        "num_experts_per_tok": 2,
        "first_k_dense_replace": 1,
        "moe_intermediate_size": 32,
        "n_group": 1,
        "topk_group": 1,
    },
    "gemma3-hd256-window": {
        "model_type": "gemma3_text",
        "hidden_size": 256,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 256,
        "sliding_window": 64,
    },
    "gemma2-hd256-softcap": {
        "model_type": "gemma2",
        "hidden_size": 256,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 256,
        "sliding_window": 64,
        # a cap the random logits reach, so a backend that drops soft-capping shows in the logits
        "attn_logit_softcapping": 0.5,
        "query_pre_attn_scalar": 1,
    },
    "falcon-alibi": {"model_type": "falcon", "hidden_size": 256, "num_attention_heads": 4, "alibi": True},
    "qwen3-hd96": {
        "model_type": "qwen3",
        "hidden_size": 384,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 96,
    },
    # head dim not a multiple of 8: flash-attn 2 pads it to 104 (valid, at the cost of copies), FA3 / FA4 pad
    # nothing and refuse it (FA4 on sm80 / sm120 has no Python check: the kernel's aligned loads are the test)
    "qwen3-hd100": {
        "model_type": "qwen3",
        "hidden_size": 384,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 100,
    },
    "llama-hd128": {
        "model_type": "llama",
        "hidden_size": 512,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
    },
}
SMOKE_FAMILIES = ("llama-hd128", "gemma2-hd256-softcap", "falcon-alibi")
SEQ = 160  # longer than the 64-token windows, so windows are exercised
BATCH = 2


def log(msg: str) -> None:
    print(msg, flush=True)


# -- worker: one family in this process ------------------------------------------------------------------------


def _caps_for(arch: str | None, real: Any) -> Any:
    """cudaload's Capabilities as the verdict should see them: the real machine, or a GPU of the emulated arch."""
    from dataclasses import replace

    if arch is None or not real.gpus:
        return real
    major, minor = int(arch[3:-1]), int(arch[-1])
    return replace(real, gpus=(replace(real.gpus[0], compute_capability=(major, minor)),))


def worker(family: str, smoke: bool) -> None:
    import torch
    import transformers

    from cudaload.detection import detect
    from cudaload.model_info import model_info
    from cudaload.policies.attention import choose_attention

    device = "cpu" if smoke else "cuda"
    dtype = torch.float32 if smoke else torch.bfloat16
    real = detect()
    cfg_dict = {**SMALL, **FAMILIES[family]}
    if cfg_dict["model_type"] == "phi3":
        cfg_dict["pad_token_id"] = 0
    info = model_info(dict(cfg_dict))
    mt = cfg_dict.pop("model_type")
    config = transformers.AutoConfig.for_model(mt, **cfg_dict)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(
        config, attn_implementation="eager", dtype=dtype
    ).to(device)
    ids = torch.randint(3, config.vocab_size, (BATCH, SEQ), device=device)

    def q_proj_grad(m: Any) -> Any:
        for name, p in m.named_parameters():
            if "layers.0" in name and ("q_proj" in name or "q_a_proj" in name or "query_key_value" in name):
                return p.grad
        return None

    def run(train: bool, model: Any) -> tuple[Any, Any, float]:
        model.zero_grad(set_to_none=True)
        t0 = time.perf_counter()
        if train:
            model.train()
            out = model(ids, labels=ids)
            out.loss.backward()
            grad = q_proj_grad(model)
            logits = out.logits.detach().float()
        else:
            model.eval()
            with torch.no_grad():
                logits = model(ids).logits.float()
            grad = None
        if device == "cuda":
            torch.cuda.synchronize()
        return logits, (grad.detach().float().clone() if grad is not None else None), time.perf_counter() - t0

    ref = {train: run(train, model)[:2] for train in ((False,) if smoke else (False, True))}
    state = model.state_dict()
    backends = ["sdpa", "eager", "flex_attention"]
    archs: list[str | None] = [None]
    if not smoke and real.usable("flash-attn"):
        backends.append("flash_attention_2")
    if not smoke and real.usable("flash-attn-4"):
        backends.append("flash_attention_4")
        archs += ["sm_80", "sm_120"]
    for arch in archs:
        for backend in backends:
            if arch is not None and backend != "flash_attention_4":
                continue
            for train in (False,) if smoke else (False, True):
                intent = "lora" if train else "inference"
                caps = _caps_for(arch, real)
                d = choose_attention(
                    info, caps, dtype="bfloat16" if not smoke else "float32", intent=intent, work=(BATCH, SEQ)
                )
                cand = d.candidate(backend)
                row: dict[str, Any] = {
                    "family": family,
                    "backend": backend,
                    "arch": arch or (f"sm{real.gpus[0].sm}" if real.gpus else "cpu"),
                    "intent": intent,
                    "verdict": bool(cand and cand.ok),
                    "verdict_reason": (cand.reasons[0] if cand and cand.reasons else ""),
                }
                if arch is not None:
                    os.environ["FLASH_ATTENTION_ARCH"] = arch
                try:
                    import flash_attn.cute.interface as fi

                    fi._get_device_arch.cache_clear()
                except Exception:
                    pass
                try:
                    # built the way from_pretrained builds it: models with a fixed attention table
                    # (falcon) pick their attention classes at construction
                    m = transformers.AutoModelForCausalLM.from_config(
                        config, attn_implementation=backend, dtype=dtype
                    ).to(device)
                    m.load_state_dict(state)
                    row["in_effect"] = str(m.config._attn_implementation)
                    logits, grad, first = run(train, m)
                    _, _, second = run(train, m)
                    del m
                    rl, rg = ref[train]
                    row["ran"] = True
                    row["first_s"], row["second_s"] = round(first, 4), round(second, 4)
                    row["logits_rel_diff"] = float(
                        ((logits - rl).abs().max() / rl.abs().max().clamp_min(1e-6)).item()
                    )
                    if grad is not None and rg is not None:
                        row["grad_rel_diff"] = float(
                            ((grad - rg).abs().max() / rg.abs().max().clamp_min(1e-9)).item()
                        )
                except Exception as e:  # the outcome we record
                    row["ran"] = False
                    row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
                    if "CUDA error" in str(e) or "illegal" in str(e).lower():
                        row["context_lost"] = True
                        print(TAG + json.dumps(row), flush=True)
                        return
                finally:
                    os.environ.pop("FLASH_ATTENTION_ARCH", None)
                # ran but computed something else: bf16 kernels differ from eager by ~1e-2 on these tiny
                # models; a dropped soft-cap or sink moves the logits by tens of percent
                row["wrong"] = bool(row.get("ran")) and (
                    row.get("logits_rel_diff", 0.0) > 0.05 or row.get("grad_rel_diff", 0.0) > 0.1
                )
                works = bool(row.get("ran")) and not row["wrong"]
                row["agrees"] = row["verdict"] == works
                if arch is not None and "shared memory" in row["verdict_reason"]:
                    # the emulated path is compiled for the real GPU's shared memory: not checkable here
                    row["agrees"] = None
                print(TAG + json.dumps(row), flush=True)


def first_use_worker(what: str) -> None:
    t0 = time.perf_counter()
    if what == "import_fa4":
        import flash_attn.cute  # noqa: F401
    print(TAG + json.dumps({"first_use": what, "seconds": round(time.perf_counter() - t0, 3)}), flush=True)


# -- parent ----------------------------------------------------------------------------------------------------


def _child(args: list[str], timeout: float) -> tuple[list[dict[str, Any]], str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(HERE.parent / "src"), env.get("PYTHONPATH", "")) if p)
    try:
        r = subprocess.run(
            [sys.executable, str(Path(__file__).resolve()), *args],
            capture_output=True,
            text=True,
            timeout=max(timeout, 1.0),
            env=env,
        )
        out, err = r.stdout, r.stderr
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        err = "timed out"
    rows = [json.loads(line[len(TAG) :]) for line in out.splitlines() if line.startswith(TAG)]
    return rows, err[-2000:]


def write(out: Path, result: dict[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "attention_rules.json").write_text(json.dumps(result, indent=1))
    lines = [
        "# Attention rules against the GPU",
        "",
        f"{result['meta']['date']}, {result['meta']['machine']}; torch {result['meta'].get('torch')}, "
        f"transformers {result['meta'].get('transformers')}",
        "",
        "| family | backend | arch | intent | cudaload | ran | logits rel. diff | grad rel. diff | 1st / 2nd call s | |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        verdict = "ok" if r["verdict"] else "no: " + r["verdict_reason"][:70]
        ran = (
            ("yes, wrong result" if r.get("wrong") else "yes")
            if r.get("ran")
            else "no: " + r.get("error", "")[:70]
        )
        lines.append(
            f"| {r['family']} | {r['backend']} | {r['arch']} | {r['intent']} | {verdict} | {ran} | "
            f"{_g(r.get('logits_rel_diff'))} | {_g(r.get('grad_rel_diff'))} | "
            f"{_g(r.get('first_s'))} / {_g(r.get('second_s'))} | {_mark(r.get('agrees'))} |"
        )
    mism = [r for r in result["rows"] if r.get("agrees") is False]
    lines += ["", f"{len(result['rows'])} rows, {len(mism)} mismatches."]
    if result.get("first_use"):
        lines += ["", "## First use (fresh process)", ""]
        lines += [f"- {k}: {v} s" for k, v in result["first_use"].items()]
    if result.get("skipped"):
        lines += ["", "Skipped: " + "; ".join(result["skipped"])]
    (out / "attention_rules.md").write_text("\n".join(lines) + "\n")


def _mark(agrees: bool | None) -> str:
    return "n/a (emulated)" if agrees is None else ("" if agrees else "MISMATCH")


def _g(v: Any) -> str:
    return "" if v is None else f"{v:.3g}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--out", help="directory for attention_rules.json / .md")
    p.add_argument(
        "--budget-s", type=float, default=480.0, help="stop starting new work after this many seconds"
    )
    p.add_argument("--smoke", action="store_true", help="CPU, tiny, sdpa/eager/flex inference only")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--first-use", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.worker:
        worker(a.worker, a.smoke)
        return 0
    if a.first_use:
        first_use_worker(a.first_use)
        return 0
    if not a.out:
        p.error("--out is required")
    start = time.perf_counter()
    import datetime

    sys.path.insert(0, str(HERE.parent / "src"))
    from cudaload.detection import detect

    caps = detect()
    if not a.smoke and not caps.gpus:
        p.error("no GPU here: use --smoke on a CPU")
    result: dict[str, Any] = {
        "meta": {
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "machine": ", ".join(f"{g.name} sm{g.sm}" for g in caps.gpus) or "CPU",
            "torch": caps.torch_version,
            "transformers": caps.transformers_version,
            "smoke": a.smoke,
        },
        "rows": [],
        "first_use": {},
        "skipped": [],
    }
    out = Path(a.out)
    families = SMOKE_FAMILIES if a.smoke else tuple(FAMILIES)
    for fam in families:
        left = a.budget_s - (time.perf_counter() - start)
        if left < 20:
            result["skipped"].append(f"{fam}: time budget spent")
            continue
        log(f"[{time.perf_counter() - start:6.1f}s] {fam} ...")
        rows, err = _child(["--worker", fam, *(["--smoke"] if a.smoke else [])], left - 5)
        result["rows"] += rows
        if not rows:
            result["skipped"].append(
                f"{fam}: no result ({err.strip().splitlines()[-1] if err.strip() else '?'})"
            )
        for r in rows:
            flag = "  MISMATCH" if r.get("agrees") is False else ""
            log(
                f"    {r['backend']:<18} {r['arch']:<6} {r['intent']:<9} verdict={r['verdict']} ran={r.get('ran')}{flag}"
            )
        write(out, result)
    if not a.smoke and caps.usable("flash-attn-4"):
        for _ in range(2):  # the first may read cold files; the second is the warm figure
            if a.budget_s - (time.perf_counter() - start) < 15:
                break
            rows, _err = _child(["--first-use", "import_fa4"], 60)
            for r in rows:
                result["first_use"].setdefault("import flash_attn.cute", []).append(r["seconds"])
        write(out, result)
    log(f"done in {time.perf_counter() - start:.1f} s: {out / 'attention_rules.md'}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except SystemExit:
        raise
    except Exception:
        traceback.print_exc()
        sys.exit(1)
