"""The "verified after loading" block of ``Plan.explain()``: what ``load_model()`` found once the model was
loaded (``plan.verified``), as text. It reads the plain dict, so it sits below :mod:`cudaload.plans.plan`."""

from __future__ import annotations

from typing import Any

from ..units import file_size


def verified_lines(ver: dict[str, Any]) -> list[str]:
    """The load path and its seconds, devices, attention and quantization, parameters by dtype, the attention
    fallbacks taken, notes, the tensors the checkpoint did not give, the ranks, trainable parameters, each phase's seconds, the prefetch, the GPU start."""
    out = [
        "verified after loading:",
        f"    load path {ver.get('load_path')} in {ver.get('load_seconds', 0):.3f} s ({ver.get('auto_class')})",
        f"    devices {', '.join(ver.get('devices', []))}; attention {ver.get('attn_implementation')}; "
        f"quantization {ver.get('quantization') or 'none'}",
    ]
    by_dtype = ver.get("parameters_by_dtype", {})
    out.append("    parameters " + ", ".join(f"{n:,} {d}" for d, n in by_dtype.items()))
    for f in ver.get("attention_fallbacks", []):
        out.append(f"    attention fell back {f['from']} -> {f['to']}: {f['reason']}")
    for note in ver.get("notes", []):
        out.append(f"    note: {note}")
    out += _checkpoint_lines(ver.get("checkpoint"))
    if ver.get("ranks"):
        out.append(f"    ranks: {ver['ranks']}")
    if "trainable_parameters" in ver:
        out.append(f"    trainable parameters {ver['trainable_parameters']:,} (adapters)")
    phases = ver.get("phases") or {}
    if phases:
        out.append(
            "    seconds: "
            + ", ".join(f"{k} {v:.3f}" for k, v in phases.items() if k != "total")
            + f"; total {phases.get('total', 0):.3f}"
        )
    out += _prefetch_lines(ver.get("prefetch"))
    gs = ver.get("gpu_start")
    if gs:
        out.append(
            f"    CUDA context and cuBLAS on {gs.get('device')} made while transformers imported"
            + (f" ({gs['seconds']:.3f} s on a thread)" if gs.get("seconds") is not None else "")
            + (f"; failed there: {gs['error']}" if gs.get("error") else "")
        )
    if ver.get("fa4_compile_cache"):
        out.append(f"    {ver['fa4_compile_cache']}")
    return out


def _checkpoint_lines(cov: dict[str, Any] | None) -> list[str]:
    """What the checkpoint did not give the model, accepted (new_weights=, ignore_mismatched_sizes=, a head
    the class does not build): cudaload.checkpoint_coverage."""
    if not cov:
        return []
    out = []
    new, unused = cov.get("new_weights") or [], cov.get("unused") or []
    reshaped = {m[0] for m in cov.get("mismatched") or []}
    if new:
        out.append(
            f"    {len(new)} tensors initialised anew, not read from the checkpoint: {_names(new)}"
            + (f" ({len(reshaped)} of them of another shape there)" if reshaped else "")
        )
    if unused:
        out.append(f"    {len(unused)} checkpoint tensors unused: {_names(unused)}")
    return out


def _names(names: list[str], shown: int = 5) -> str:
    more = len(names) - shown
    return ", ".join(names[:shown]) + (f" and {more} more" if more > 0 else "")


def _prefetch_lines(pre: dict[str, Any] | None) -> list[str]:
    """How much of the checkpoint was asked into the page cache, and how much was there already."""
    if not pre:
        return []
    done = f"in {pre['seconds']:.3f} s" if pre.get("seconds") is not None else "still running"
    return [
        f"    prefetch ({pre.get('mode')}): {file_size(pre.get('bytes', 0))} of {pre.get('files')} "
        f"files asked into the page cache {done}"
        + (
            f" ({file_size(pre['resident_bytes'])} of it already there, not read again)"
            if pre.get("resident_bytes")
            else ""
        )
        + (f"; {pre['error']}" if pre.get("error") else "")
    ]
