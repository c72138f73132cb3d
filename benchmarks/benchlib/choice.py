"""Section "choice": every attention backend timed on the same model, and how cudaload's choice ranks."""

from __future__ import annotations

from typing import Any

from .common import (
    GOAL_CHOICE,
    UNTIMED_BY_DEFAULT,
    _device,
    _input_ids,
    _time_call,
    fmt,
    md_table,
    median,
    ratio,
)


def w_choice(spec: dict[str, Any]) -> dict[str, Any]:
    """Time every requested attention backend on one loaded model: prefill ms and greedy decode tokens/s."""
    import torch
    import transformers

    from cudaload.policies.sdpa_dispatch import NAMES as SDPA_VARIANTS

    if any(b in SDPA_VARIANTS for b in spec["backends"]):
        # cudaload's sdpa variants are attention functions it registers with transformers (as load_model and
        # cudaload tune do): unregistered, set_attn_implementation refuses them and the plan's choice goes untimed
        from cudaload.execute.runtime.sdpa_decode import register

        register()
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


class ChoiceSection:
    """The Runner's choice section (a mixin of benchlib.runner.Runner: uses its args, worker(), save()...)."""

    args: Any
    results: Any

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
