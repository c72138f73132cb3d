#!/usr/bin/env python
"""cudaload's QLoRA fit against HF's recipe on the same card, term by term (issue 44, item 4).

    python benchmarks/investigations/fit_vs_hf_recipe.py [--cards 12,16,24,40,80] [--json]

CPU only, no GPU, no weights: the Llama-3.1-8B shape (``cudaload.testing.full_config``, as
``bench_fit_boundary.py``'s "llama8b"), the H100 profile with bitsandbytes and peft, and each card emulated as
``bench_fit_boundary.py`` does it (``max_memory={"cuda:0": card GiB + CUDA_CONTEXT_BYTES}``). Per card:

- ``plan``: the longest seq_len (a multiple of 256) ``cudaload.plan(intent="qlora", batch_size=1)`` accepts;
- ``hf``: the longest that cudaload's fit ladder (``policies.quantization.fit``, what the plan runs) accepts for
  HF's QLoRA recipe: nf4 double quant, peft's ``prepare_model_for_kbit_training`` (fp32 embeddings, norms and
  head, hence an fp32 residual stream), LoRA r=32 with dropout 0.05 on every linear layer, a padded batch of 1,
  FlashAttention-2, gradient checkpointing, transformers' loss over fp32 logits, 8-bit AdamW on the GPU;
- a ladder from ``hf`` to ``plan``, one recipe setting changed at a time, so each setting's share of the gap
  is its own row;
- Unsloth's HF + FA2 numbers (https://unsloth.ai/blog/llama3-3, as quoted in issue 44).

Then each recipe's memory terms as ``bytes = fixed + per_token x seq_len`` (two estimates, 4096 and 8192 tokens:
every term is linear in seq_len here, FlashAttention keeps no scores), and Unsloth's line for comparison.
Everything is cudaload's memory model computed on the CPU: no measurement.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from compare_memory_train import longest_aligned

GiB = 1 << 30
MiB = 1 << 20
SHAPE = "Llama-3.1-8B"
CARDS = (12, 16, 24, 40, 80)
#: Unsloth's table (Llama 3.1 8B Instruct, 4-bit QLoRA on q,k,v,o,gate,up,down, r=32, batch 1, padded to the max
#: length, HF + FA2 with gradient checkpointing): the longest context that fit, per card in GB (8 GB: OOM)
UNSLOTH_HF = {12: 932, 16: 2551, 24: 5789, 40: 12264, 48: 15502, 80: 28454}
HF_DROPOUT = 0.05
HF_R = 32
HF_OPTIM = "adamw_8bit"
FA2 = "flash_attention_2"
PROBES = (4096, 8192)  # the two lengths each term's line is read from


def setup() -> tuple[Any, Any, Any]:
    import torch

    from cudaload.model_info import model_info
    from cudaload.profiles import hardware
    from cudaload.testing import full_config

    cfg = full_config(SHAPE)
    h100 = hardware("H100").with_packages(["bitsandbytes", "peft"], [])
    caps = dataclasses.replace(h100, torch_version=torch.__version__.split("+")[0], torch_cuda_version="13.0")
    return cfg, model_info(cfg), caps


def max_memory(card: float) -> dict[str, int]:
    from cudaload.policies.memory import CUDA_CONTEXT_BYTES

    return {"cuda:0": int(card * GiB) + CUDA_CONTEXT_BYTES}


def plan_at(cfg: Any, caps: Any, card: float, seq: int) -> Any:
    import cudaload

    # transformers' loss, as HF's recipe has: the comparison is of the recipes, not of the loss (cudaload's
    # chunked loss, which the plan takes on these cards since, is the README's first paragraph)
    return cudaload.plan(
        cfg,
        hardware=caps,
        intent="qlora",
        seq_len=seq,
        batch_size=1,
        max_memory=max_memory(card),
        loss="transformers",
    )


def plan_longest(cfg: Any, caps: Any, card: float) -> int:
    from cudaload.errors import DoesNotFitError

    def fits(seq: int) -> bool:
        try:
            plan_at(cfg, caps, card, seq)
            return True
        except DoesNotFitError:
            return False

    return longest_aligned(fits)


@dataclasses.dataclass(frozen=True)
class Recipe:
    """One QLoRA recipe as cudaload's memory model takes it: attention, optimizer and the step's shape."""

    name: str
    attn: str
    optimizer: str
    step: Callable[[int], Any]  # seq_len -> StepShape (batch 1)

    def estimate(self, info: Any, seq: int) -> dict[str, int]:
        from cudaload.policies.memory import estimate

        return estimate(
            info,
            dtype="bfloat16",
            quantization="nf4",
            intent="qlora",
            seq_len=seq,
            batch_size=1,
            attn=self.attn,
            optimizer=self.optimizer,
            gradient_checkpointing=True,
            step=self.step(seq),
        )

    def longest(self, info: Any, caps: Any, card: float) -> int:
        from cudaload.errors import DoesNotFitError
        from cudaload.policies.quantization import fit

        def fits(seq: int) -> bool:
            try:
                fit(
                    info,
                    caps,
                    dtype="bfloat16",
                    intent="qlora",
                    seq_len=seq,
                    batch_size=1,
                    attn=self.attn,
                    quantization="nf4",
                    max_memory=max_memory(card),
                    optimizer=self.optimizer,
                    gradient_checkpointing=True,
                    step=self.step(seq),
                )
                return True
            except DoesNotFitError:
                return False

        return longest_aligned(fits)


def ladder(plan: Any) -> list[Recipe]:
    """HF's recipe, then one setting at a time turned to what ``plan`` decided; the last rung is the plan's."""
    from cudaload.plans.training import StepShape

    def padded(**kw: Any) -> Callable[[int], Any]:
        return lambda s: StepShape.padded(1, s, **kw)

    hf = {"lora_dropout": HF_DROPOUT, "kbit_upcast": True, "lora_r": HF_R}
    st = plan.training.step
    bf16 = {
        "lora_dropout": st.lora_dropout,
        "lora_r": st.lora_r,
        "kbit_upcast": st.kbit_upcast,
        "autocast": st.autocast,
        "cast_outside_autocast": st.cast_outside_autocast,
    }
    opt = plan.optimizer.choice
    return [
        Recipe(
            "HF recipe (fp32 casts, r=32, dropout 0.05, adamw_8bit, padded, FA2)", FA2, HF_OPTIM, padded(**hf)
        ),
        Recipe("  dropout 0", FA2, HF_OPTIM, padded(**{**hf, "lora_dropout": 0.0})),
        Recipe(f"  r={st.lora_r}", FA2, HF_OPTIM, padded(**{**hf, "lora_dropout": 0.0, "lora_r": st.lora_r})),
        Recipe(f"  {opt}", FA2, opt, padded(**{**hf, "lora_dropout": 0.0, "lora_r": st.lora_r})),
        Recipe("  bf16 base (no fp32 cast, bf16 autocast)", FA2, opt, padded(**bf16)),
        Recipe(
            f"  {plan.training.layout.choice} + {plan.attention.choice} (the plan)",
            plan.attention.choice,
            opt,
            lambda s: dataclasses.replace(st, tokens=s, sequences=1, longest=s),
        ),
    ]


def lines(info: Any, recipe: Recipe) -> dict[str, tuple[float, float]]:
    """Each term as (fixed bytes, bytes per token), the activations split into their phases."""
    from cudaload.policies.memory import training_activations

    a, b = PROBES
    ta, tb = recipe.estimate(info, a), recipe.estimate(info, b)
    out: dict[str, tuple[float, float]] = {}
    for k in [*(k for k in ta if k != "total"), "total"]:
        if k in ("kv_cache", "master_weights", "optimizer_step") and not ta[k] and not tb[k]:
            continue
        slope = (tb[k] - ta[k]) / (b - a)
        out[k] = (ta[k] - slope * a, slope)
    # the activations term: every layer's checkpointed input + the larger of the loss and one layer's recompute,
    # less the gradients (absent at the forward's end): the phases at 8192 tokens, as the estimate reads them
    kbit = recipe.step(b).kbit_upcast
    ph, _ = training_activations(
        info,
        intent="qlora",
        step=recipe.step(b),
        act_bytes=4 if kbit else 2,
        resid_bytes=4 if kbit else 2,
        attn=recipe.attn,
        gradient_checkpointing=True,
    )
    act_fixed, act_slope = out.pop("activations")
    out["activations: checkpointed layer inputs"] = (0.0, ph.kept / b)
    out["activations: loss over fp32 logits"] = (0.0, ph.loss / b)
    out["activations: rest (one layer's recompute above the loss; less the gradients)"] = (
        act_fixed,
        act_slope - (ph.kept + ph.loss) / b,
    )
    out["total"] = out.pop("total")
    out["(one layer's recompute + backward: below the loss, not at the peak)"] = (0.0, ph.layer / b)
    return out


def run(cards: list[float]) -> dict[str, Any]:
    import peft
    import torch
    import transformers

    import cudaload

    cfg, info, caps = setup()
    rows, plans = [], {}
    for card in cards:
        seq = plan_longest(cfg, caps, card)
        p = plans[card] = plan_at(cfg, caps, card, seq)
        rungs = [{"recipe": r.name, "longest": r.longest(info, caps, card)} for r in ladder(p)]
        t = p.memory.terms
        rows.append(
            {
                "card_gib": card,
                "plan_longest": seq,
                "hf_estimate_longest": rungs[0]["longest"],
                "unsloth_hf": UNSLOTH_HF.get(int(card)) if float(card).is_integer() else None,
                "plan": {
                    "attention": p.attention.choice,
                    "layout": p.training.layout.choice,
                    "loss": p.training.loss.choice,
                    "optimizer": p.optimizer.choice,
                    "gradient_checkpointing": p.gradient_checkpointing.choice
                    if p.gradient_checkpointing
                    else None,
                    "step": p.training.step.to_dict(),
                    "terms": dict(t),
                    "total": p.memory.total,
                    "budget": dict(p.memory.budget),
                },
                "ladder": rungs,
            }
        )
    # the terms' lines with the plan's decisions at its boundary on the 24 GiB card (else the first card)
    recipes = ladder(plans.get(24.0) or plans[cards[0]])
    terms = {"hf": lines(info, recipes[0]), "plan": lines(info, recipes[-1])}
    u = sorted(UNSLOTH_HF.items())
    (c0, s0), (c1, s1) = u[0], u[-1]
    per_token = (c1 - c0) * GiB / (s1 - s0)
    unsloth_line = {"per_token": per_token, "fixed": c0 * GiB - s0 * per_token}
    resid = {c: s - (c * GiB - unsloth_line["fixed"]) / per_token for c, s in u}
    return {
        "meta": {
            "shape": SHAPE,
            "hardware": "H100 profile (bitsandbytes, peft), each card emulated by max_memory",
            "versions": {
                "cudaload": getattr(cudaload, "__version__", "?"),
                "torch": torch.__version__,
                "transformers": transformers.__version__,
                "peft": peft.__version__,
            },
            "probes": PROBES,
        },
        "rows": rows,
        "terms": {k: {n: {"fixed": f, "per_token": s} for n, (f, s) in v.items()} for k, v in terms.items()},
        "unsloth_line": {**unsloth_line, "residual_tokens": resid},
    }


def render(res: dict[str, Any]) -> str:
    m = res["meta"]
    v = m["versions"]
    out = [
        f"Llama-3.1-8B shape, QLoRA, batch 1; {m['hardware']}; cudaload {v['cudaload']}, torch {v['torch']}, "
        f"transformers {v['transformers']}, peft {v['peft']}. cudaload's memory model on the CPU, no measurement.",
        "",
        "| card GiB | plan's longest | estimate of HF's recipe | Unsloth HF + FA2 | plan / Unsloth | "
        "HF estimate / Unsloth | plan / HF estimate |",
        "|---|---|---|---|---|---|---|",
    ]

    def r(a: float | None, b: float | None) -> str:
        return f"{a / b:.2f}" if a and b else "-"

    for row in res["rows"]:
        p, h, u = row["plan_longest"], row["hf_estimate_longest"], row["unsloth_hf"]
        out.append(f"| {row['card_gib']:g} | {p} | {h} | {u or '-'} | {r(p, u)} | {r(h, u)} | {r(p, h)} |")
    out += ["", "The plan's terms at its longest seq_len (GiB):", ""]
    names = list(res["rows"][0]["plan"]["terms"])
    out += [
        "| card GiB | choices | " + " | ".join(names) + " | total | budget |",
        "|---|---|" + "---|" * (len(names) + 2),
    ]
    for row in res["rows"]:
        p = row["plan"]
        cells = " | ".join(f"{p['terms'].get(n, 0) / GiB:.2f}" for n in names)
        how = f"{p['layout']}, {p['attention']}, checkpointing {p['gradient_checkpointing']}, {p['optimizer']}, r={p['step']['lora_r']}, loss {p['loss']}"
        out.append(
            f"| {row['card_gib']:g} | {how} | {cells} | {p['total'] / GiB:.2f} | {sum(p['budget'].values()) / GiB:.2f} |"
        )
    out += ["", "From HF's recipe to the plan, one setting at a time (longest seq_len per card GiB):", ""]
    cards = [row["card_gib"] for row in res["rows"]]
    out += ["| recipe | " + " | ".join(f"{c:g}" for c in cards) + " |", "|---|" + "---|" * len(cards)]
    for i, rung in enumerate(res["rows"][0]["ladder"]):
        cells = " | ".join(str(row["ladder"][i]["longest"]) for row in res["rows"])
        out.append(f"| {rung['recipe'].strip()} | {cells} |")
    out += [
        "",
        "Each term as bytes = fixed + per token x seq_len (read at "
        f"{m['probes'][0]} and {m['probes'][1]} tokens):",
        "",
        "| term | plan fixed MiB | plan KiB/token | HF fixed MiB | HF KiB/token |",
        "|---|---|---|---|---|",
    ]
    hf, pl = res["terms"]["hf"], res["terms"]["plan"]
    for name in hf:
        a, b = pl.get(name, {"fixed": 0, "per_token": 0}), hf[name]
        out.append(
            f"| {name} | {a['fixed'] / MiB:.0f} | {a['per_token'] / 1024:.0f} | "
            f"{b['fixed'] / MiB:.0f} | {b['per_token'] / 1024:.0f} |"
        )
    ul = res["unsloth_line"]
    out += [
        "",
        f"Unsloth's HF line (12 and 80 GB): {ul['per_token'] / 1024:.0f} KiB/token, fixed "
        f"{ul['fixed'] / MiB:.0f} MiB (the card's GB read as GiB); its other rows lie off that line by "
        + ", ".join(f"{c}: {d:+.1f}" for c, d in ul["residual_tokens"].items())
        + " tokens.",
    ]
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--cards", default=",".join(map(str, CARDS)), help="card sizes in GiB")
    ap.add_argument("--json", action="store_true", help="print the results as JSON instead of markdown")
    a = ap.parse_args(argv)
    res = run([float(c) for c in a.cards.split(",") if c])
    print(json.dumps(res, indent=1, default=str) if a.json else render(res))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
