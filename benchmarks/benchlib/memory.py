"""Section "memory": the plan's memory estimate against measured GPU peaks."""

from __future__ import annotations

from typing import Any

from .common import CUDALOAD_QUANT, GOAL_MEMORY, _input_ids, human, md_table, ratio, within


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


class MemorySection:
    """The Runner's memory section (a mixin of benchlib.runner.Runner: uses its args, worker(), save()...)."""

    args: Any
    results: Any

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
