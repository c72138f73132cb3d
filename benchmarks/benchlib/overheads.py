"""Section "overheads": import, detect() and plan() costs."""

from __future__ import annotations

import sys
import time
from typing import Any

from .common import GOAL_DETECT_MS, GOAL_IMPORT_MS, GOAL_PLAN_S, PLAN_CONFIGS, _ms, fmt, md_table, median


def w_overheads(spec: dict[str, Any]) -> dict[str, Any]:
    """import cudaload after torch, detect() cold and warm, plan() of full-size configs."""
    t0 = time.perf_counter()
    import torch

    before = set(sys.modules)  # torch itself imports pynvml: count only what cudaload adds
    t1 = time.perf_counter()
    import cudaload

    t2 = time.perf_counter()
    heavy = sorted(
        m
        for m in ("transformers", "accelerate", "safetensors", "pynvml")
        if m in sys.modules and m not in before
    )
    out: dict[str, Any] = {
        "import_torch_s": t1 - t0,
        "import_cudaload_s": t2 - t1,
        "heavy_modules_after_import": heavy,
        "cuda_initialized_after_import": bool(torch.cuda.is_initialized()),
    }
    if spec.get("import_only"):
        return out
    t = time.perf_counter()
    caps = cudaload.detect()
    out["detect_cold_s"] = time.perf_counter() - t
    warm = []
    for _ in range(5):
        t = time.perf_counter()
        cudaload.detect()
        warm.append(time.perf_counter() - t)
    out["detect_warm_s"] = median(warm)
    out["cuda_initialized_after_detect"] = bool(torch.cuda.is_initialized())
    # plan() imports transformers on first use; timed apart so each plan's first call is the planning itself
    t = time.perf_counter()
    import transformers  # noqa: F401

    out["import_transformers_s"] = time.perf_counter() - t
    plans = []
    for cfg_name, cfg_dir in spec["configs"].items():
        for hw_name in spec["hardware"]:
            hw: Any = caps if hw_name == "detected" else hw_name
            row: dict[str, Any] = {"config": cfg_name, "hardware": hw_name}
            times = []
            for _ in range(int(spec["reps"])):
                t = time.perf_counter()
                try:
                    p = cudaload.plan(cfg_dir, hardware=hw)
                    row["outcome"] = (
                        f"{p.dtype.choice}, {p.attention.choice}, quant={p.quantization.choice}, "
                        f"{p.placement.device_map if isinstance(p.placement.device_map, str) else 'split'}"
                    )
                except cudaload.CudaloadError as e:  # planning an impossible fit still costs planning time
                    row["outcome"] = f"{type(e).__name__}: {e.message}"[:200]
                except Exception as e:
                    row["error"] = f"{type(e).__name__}: {e}"[:300]
                    break
                times.append(time.perf_counter() - t)
            if times:
                row.update({"first_s": times[0], "warm_s": median(times[1:]) if len(times) > 1 else None})
            plans.append(row)
    out["plans"] = plans
    return out


class OverheadsSection:
    """The Runner's overheads section (a mixin of benchlib.runner.Runner: uses its args, worker(), save()...)."""

    args: Any
    results: Any

    def s_overheads(self, sec: dict[str, Any]) -> None:
        reps = 1 if self.args.small else 5
        cfg_dirs: dict[str, str] = {}
        from cudaload.testing import full_config

        for name in PLAN_CONFIGS:
            d = self.work / "configs" / name
            if not (d / "config.json").exists():
                full_config(name).save_pretrained(d)
            cfg_dirs[name] = str(d)
        spec = {"configs": cfg_dirs, "hardware": ["detected", "8xH100-80GB"], "reps": 1 + reps}
        full = self.worker("overheads", spec)
        imports = [full] + [self.worker("overheads", {"import_only": True}) for _ in range(reps - 1)]
        sec["import"] = {
            "samples_ms": [r.get("import_cudaload_s", 0) * 1000 for r in imports if "error" not in r],
            "torch_ms": median(r.get("import_torch_s") for r in imports if "error" not in r),
            "heavy_modules_after_import": full.get("heavy_modules_after_import"),
            "cuda_initialized_after_import": full.get("cuda_initialized_after_import"),
        }
        sec["import"]["median_ms"] = median(sec["import"]["samples_ms"])
        if sec["import"]["torch_ms"] is not None:
            sec["import"]["torch_ms"] *= 1000
        sec["detect"] = {
            k: full.get(k) for k in ("detect_cold_s", "detect_warm_s", "cuda_initialized_after_detect")
        }
        sec["import_transformers_s"] = full.get("import_transformers_s")
        sec["plans"] = full.get("plans", [])
        if "error" in full:
            sec["status"] = f"error: {full['error']}"[:500]
            sec["stderr_tail"] = full.get("stderr_tail")
        sec["goals"] = {
            "import_ms<50": (sec["import"]["median_ms"] or 1e9) < GOAL_IMPORT_MS,
            "detect_warm_ms<100": (full.get("detect_warm_s") or 1e9) * 1000 < GOAL_DETECT_MS,
            "plan_70b_s<1": all(
                (r.get("first_s") or 1e9) < GOAL_PLAN_S
                for r in sec["plans"]
                if r["config"] == "Llama-3.1-70B"
            )
            and bool(sec["plans"]),
        }


def _md_overheads(sec: dict[str, Any]) -> list[str]:
    imp, det = sec.get("import", {}), sec.get("detect", {})
    out = [
        f"- `import cudaload` after `import torch`: median {fmt(imp.get('median_ms'))} ms "
        f"(samples {', '.join(fmt(x) for x in imp.get('samples_ms', []))}; goal < {GOAL_IMPORT_MS:.0f} ms); "
        f"`import torch` {fmt(imp.get('torch_ms'))} ms; heavy modules pulled in: "
        f"{imp.get('heavy_modules_after_import') or 'none'}; "
        f"CUDA initialised: {fmt(imp.get('cuda_initialized_after_import'))}",
        f"- `detect()`: cold (first call in a process) {fmt(_ms(det.get('detect_cold_s')))} ms, warm "
        f"{fmt(_ms(det.get('detect_warm_s')))} ms (goal < {GOAL_DETECT_MS:.0f} ms); CUDA initialised: "
        f"{fmt(det.get('cuda_initialized_after_detect'))}",
        "- plan() imports transformers on its first use in a process: "
        f"{fmt(_ms(sec.get('import_transformers_s')))} "
        "ms, timed apart from the plans below (first = first plan of that config in the process)",
        "",
    ]
    rows = [
        [
            r["config"],
            r["hardware"],
            _ms(r.get("first_s")),
            _ms(r.get("warm_s")),
            r.get("outcome") or r.get("error"),
        ]
        for r in sec.get("plans", [])
    ]
    out += md_table(["config", "hardware", "plan() first ms", "plan() warm ms", "outcome"], rows)
    goals = sec.get("goals")
    if goals:
        out.append("")
        out.append("Goals: " + ", ".join(f"{k}: {'met' if v else 'NOT met'}" for k, v in goals.items()))
    return out
