"""The loaded model checked against its plan: devices, dtype, attention, quantization."""

from __future__ import annotations

from typing import Any

from ..errors import VerificationError
from ..plans.plan import Plan


def _module_devices(model: Any) -> dict[str, set[str]]:
    """device -> names of modules with parameters or buffers there."""
    out: dict[str, set[str]] = {}
    for name, t in [*model.named_parameters(), *model.named_buffers()]:
        module = name.rsplit(".", 1)[0] if "." in name else name
        out.setdefault(str(t.device), set()).add(module)
    return out


def verify(model: Any, plan: Plan, *, allow_offload: bool) -> dict[str, Any]:
    """Check the loaded model against the plan; raise VerificationError naming what differs."""
    import torch

    problems: list[str] = []
    devices = _module_devices(model)
    planned = {d if ":" in d or d == "cpu" else f"{d}:0" for d in plan.placement.devices}
    if "meta" in devices:
        problems.append(f"modules left on the meta device (never loaded): {sorted(devices['meta'])[:8]}")
    device_map = getattr(model, "hf_device_map", None) or {}
    offloaded = sorted(k for k, v in device_map.items() if str(v) in ("cpu", "disk"))
    if offloaded and not (allow_offload or plan.placement.offload):
        problems.append(f"modules offloaded to cpu/disk without permission: {offloaded[:8]}")
    elsewhere = {d: m for d, m in devices.items() if d != "meta" and d not in planned}
    if elsewhere and not (allow_offload or plan.placement.offload):
        for d, mods in elsewhere.items():
            problems.append(f"modules on {d}, which the plan did not place anything on: {sorted(mods)[:8]}")

    want = plan.dtype.choice or "float32"
    by_dtype: dict[str, int] = {}
    for p in model.parameters():
        name = str(p.dtype).removeprefix("torch.")
        by_dtype[name] = by_dtype.get(name, 0) + p.numel()
    floating = {k: v for k, v in by_dtype.items() if getattr(torch, k).is_floating_point}
    mostly = max(floating, key=lambda k: floating[k]) if floating else None
    # a sharded FSDP2 load keeps float32 master parameters and computes in the plan's dtype
    compute = ((getattr(model, "cudaload_fastload", None) or {}).get("sharded") or {}).get("param_dtype")
    if mostly is not None and mostly != want and compute != want:
        problems.append(f"parameters are mostly {mostly}, the plan said {want}")

    attn = getattr(model.config, "_attn_implementation", None)
    if plan.attention.choice and attn != plan.attention.choice:
        problems.append(f"attention implementation is {attn!r}, the plan said {plan.attention.choice!r}")

    quant = None
    if getattr(model, "is_loaded_in_4bit", False):
        quant = "nf4"
    elif getattr(model, "is_loaded_in_8bit", False):
        quant = "int8"
    if quant != plan.quantization.choice:
        problems.append(f"quantization is {quant}, the plan said {plan.quantization.choice}")

    if problems:
        raise VerificationError(
            "the loaded model is not what the plan said",
            reasons=problems,
            fix="pass allow_offload=True to accept offloading, or report this as a bug",
        )
    return {
        "attn_implementation": attn,
        "devices": sorted(d for d in devices if d != "meta"),
        "parameters_by_dtype": by_dtype,
        "quantization": quant,
        "offloaded_modules": offloaded,
    }
