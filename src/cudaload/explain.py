"""``explain(plan)``: the plan as text a person reads: each choice and why, each rejected option and why,
the memory terms, the warnings."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .decision import Decision
from .units import param_count

if TYPE_CHECKING:  # plans.py imports this module (Plan.explain); the type alone flows back, so no cycle
    from .plans import Plan
    from .training_plan import TrainingPlan


def _size(n: int) -> str:
    if abs(n) >= 1 << 30:
        return f"{n / (1 << 30):.2f} GiB"
    if abs(n) >= 1 << 20:
        return f"{n / (1 << 20):.1f} MiB"
    return f"{n / 1024:.1f} KiB" if abs(n) >= 1024 else f"{n} B"


def _decision(title: str, d: Decision, none_label: str = "none") -> list[str]:
    lines = [
        f"{title}: {d.choice if d.choice is not None else none_label}"
        + ("  (explicit)" if d.explicit else "")
    ]
    lines.extend(f"    because {r}" for r in d.reasons)
    for c in d.candidates:
        if c.name == d.choice or (d.choice is None and c.name == none_label and c.ok):
            continue
        mark = "ok " if c.ok else "no "
        why = "; ".join(c.reasons) if c.reasons else "-"
        if c.reasons and any(why in r for r in d.reasons):  # the choice's reason already says it
            why = "see above"
        lines.append(f"  - {mark}{c.name}: {why}")
    return lines


def _training(t: TrainingPlan) -> list[str]:
    """The training section: the batch layout and step size, the loss, the adapters' settings, what was assumed."""
    s = t.step
    head = f"at most {s.sequences} sequences and {s.tokens:,} tokens a step, each sequence up to {s.longest:,} tokens"
    if t.packed and t.boundaries:
        head += f"; sequence boundaries by {t.boundaries}"
    lines = _decision("batch layout", t.layout)
    lines.insert(1, f"    {head}")
    lines += _decision("tokens per step", t.tokens_per_step)
    lines += _decision("loss", t.loss)
    if t.lora_dropout is not None:
        lines += _decision("LoRA dropout", t.lora_dropout)
    if t.kbit_upcast is not None:
        lines += _decision("k-bit preparation", t.kbit_upcast)
    lines.extend(f"    assumed: {a}" for a in t.assumed)
    lines.extend(f"    note: {n}" for n in t.notes)
    return lines


def explain(plan: Plan) -> str:
    m = plan.model
    hw = plan.hardware
    gpus = hw.get("gpus") or []
    machine = (
        ", ".join(
            f"cuda:{g['index']} {g['name']} (sm{g['compute_capability'][0]}{g['compute_capability'][1]})"
            for g in gpus
        )
        or "CPU only"
    )
    out = [
        f"Plan for {m.name} ({m.type}, {m.architecture or '?'}, {param_count(m.params)} params, "
        f"{m.layers} layers, "
        f"head_dim {m.head_dim}, weights from {m.weights_source})",
        f"Machine: {machine} [{hw.get('source')}]"
        + "".join(f"; {k} {hw[k]}" for k in ("torch", "transformers") if hw.get(k)),
        f"Intent: {plan.intent}, seq_len {plan.seq_len} x batch {plan.batch_size}",
    ]
    ranks = (hw.get("distributed") or {}).get("ranks") or []
    if ranks:
        hosts = sorted({r["host"] for r in ranks})
        frees = [r for r in ranks if r.get("free_memory") is not None]
        gpu = ranks[0].get("name") or "no GPU"  # CPU ranks (gloo) agree too
        line = f"Ranks: {len(ranks)} on {len(hosts)} host{'s' if len(hosts) > 1 else ''}, {gpu} each"
        if frees:
            low = min(frees, key=lambda r: (r["free_memory"], r["rank"]))
            high = max(r["free_memory"] for r in frees)
            line += (
                f"; planned alike on every rank from the most free memory any rank's GPU had ({_size(high)}), "
                f"the least: rank {low['rank']} ({_size(low['free_memory'])})"
            )
        out.append(line)
    out.append("")
    out += _decision("dtype", plan.dtype)
    out += _decision("attention", plan.attention)
    out += _decision("quantization", plan.quantization)
    if plan.quantization_config:
        out.append(
            f"    BitsAndBytesConfig({', '.join(f'{k}={v!r}' for k, v in plan.quantization_config.items())})"
        )
    pl = plan.placement
    out.append(
        f"placement: device_map={pl.device_map!r} on {', '.join(pl.devices)}"
        + ("  (offload)" if pl.offload else "")
    )
    out.extend(f"    {r}" for r in pl.reasons)
    if pl.max_memory:
        out.append("    max_memory: " + ", ".join(f"{k}={_size(v)}" for k, v in pl.max_memory.items()))
    out += _decision("load path", plan.load_path)
    if plan.optimizer is not None:
        out += _decision("optimizer", plan.optimizer)
    if plan.gradient_checkpointing is not None:
        out += _decision("gradient checkpointing", plan.gradient_checkpointing)
    if plan.training is not None:
        out += _training(plan.training)
    out.append("memory (estimated before loading):")
    for k, v in plan.memory.terms.items():
        if v:
            out.append(f"    {k:<24}{_size(v):>12}")
    out.append(f"    {'total':<24}{_size(plan.memory.total):>12}")
    for d, v in plan.memory.per_device.items():
        b = plan.memory.budget.get(d)
        out.append(f"    on {d:<21}{_size(v):>12}" + (f" of {_size(b)}" if b is not None else ""))
    out.extend(f"    note: {n}" for n in plan.memory.notes)
    if plan.peft:
        out.append(f"LoRA: {', '.join(f'{k}={v!r}' for k, v in plan.peft.items())}")
    if plan.kernels:
        kp = plan.kernels
        out.append(f"Hub kernels: {'on' if kp.get('enabled') or kp.get('use_kernels') else 'off'}")
        out.extend(f"    {r}" for r in kp.get("reasons", []) or [])
        for e in kp.get("entries", []) or []:  # each layer's kernel, with why it passed or not
            mark = "ok " if e.get("ok") else "no "
            why = "; ".join(e.get("reasons") or []) or "-"
            out.append(f"  - {mark}{e.get('layer')} <- {e.get('repo')}:{e.get('layer_name')}: {why}")
    if plan.warnings:
        out.append("warnings:")
        out.extend(f"  ! {w}" for w in plan.warnings)
    if plan.verified:
        ver = plan.verified
        out.append("verified after loading:")
        out.append(
            f"    load path {ver.get('load_path')} in {ver.get('load_seconds', 0):.3f} s ({ver.get('auto_class')})"
        )
        out.append(
            f"    devices {', '.join(ver.get('devices', []))}; attention {ver.get('attn_implementation')}; "
            f"quantization {ver.get('quantization') or 'none'}"
        )
        by_dtype = ver.get("parameters_by_dtype", {})
        out.append("    parameters " + ", ".join(f"{n:,} {d}" for d, n in by_dtype.items()))
        for f in ver.get("attention_fallbacks", []):
            out.append(f"    attention fell back {f['from']} -> {f['to']}: {f['reason']}")
        for note in ver.get("notes", []):
            out.append(f"    note: {note}")
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
        pre = ver.get("prefetch")

        def size(n: int) -> str:
            return f"{n / 1e9:.2f} GB" if n >= 10**7 else f"{n / 1e6:.2f} MB"

        if pre:
            done = f"in {pre['seconds']:.3f} s" if pre.get("seconds") is not None else "still running"
            out.append(
                f"    prefetch ({pre.get('mode')}): {size(pre.get('bytes', 0))} of {pre.get('files')} "
                f"files asked into the page cache {done}"
                + (
                    f" ({size(pre['resident_bytes'])} of it already there, not read again)"
                    if pre.get("resident_bytes")
                    else ""
                )
                + (f"; {pre['error']}" if pre.get("error") else "")
            )
        gs = ver.get("gpu_start")
        if gs:
            out.append(
                f"    CUDA context and cuBLAS on {gs.get('device')} made while transformers imported"
                + (f" ({gs['seconds']:.3f} s on a thread)" if gs.get("seconds") is not None else "")
                + (f"; failed there: {gs['error']}" if gs.get("error") else "")
            )
        if ver.get("fa4_compile_cache"):
            out.append(f"    {ver['fa4_compile_cache']}")
    return "\n".join(out)
