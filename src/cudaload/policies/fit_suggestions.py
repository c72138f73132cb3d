"""What a :class:`~cudaload.errors.DoesNotFitError` suggests: alternatives that fit, each checked by planning
it against the same estimate (tests/test_memory_suggestions.py follows every one), and the fix text the error
gives (:func:`render_suggestions`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from ..capabilities import Capabilities
from ..model_info import ModelInfo
from ..plans.training import StepShape
from .attention.names import SHORT_DECODE_MAX_TOKENS
from .memory import BNB_OPTIMIZERS, Breakdown, GiB, MemoryShape, breakdown_of
from .placement import budgets, parse_size, place
from .quant_methods import bnb_problems

#: what a suggestion may ask for at most (profiles compose up to 64 GPUs)
MAX_SUGGESTED_GPUS = 64


@dataclass(frozen=True)
class Suggestion:
    """One way to make the plan fit, already checked against the same estimate: ``kind`` is what to change
    (``seq_len``, ``batch_size``, ``gpus``, ``intent``, ``optimizer``, ``offload``), ``value`` its new value
    (``gpus``: how many GPUs like the first one), ``text`` what the error says."""

    kind: str
    value: str | int | bool
    text: str
    seq_len: int | None = None  # a GPU count that holds only with a shorter sequence says so


def replicate_gpus(caps: Capabilities, count: int) -> Capabilities:
    """``caps`` with ``count`` GPUs like its first one (what "N GPUs like X" means), numbered 0..count-1."""
    g0 = caps.gpus[0]
    gpus = tuple(replace(g0, index=i, nvml_index=i) for i in range(count))
    src = caps.source
    if src.startswith("profile:"):
        label = src.removeprefix("profile:")
        label = label.split("x", 1)[1] if label[:1].isdigit() and "x" in label else label
        src = f"profile:{count}x{label}" if count > 1 else f"profile:{label}"
    return replace(caps, gpus=gpus, source=src)


@dataclass(frozen=True)
class _Probe:
    """The configuration a suggestion changes one thing of (``shape``: the ladder's last, smallest rung), and
    whether a change places on this machine (or on another number of its GPUs)."""

    info: ModelInfo
    caps: Capabilities
    shape: MemoryShape
    max_memory: Mapping[Any, Any] | None

    def estimate(self, **kw: Any) -> Breakdown:
        step = self.shape.step
        shape = replace(self.shape, **kw)
        if step is not None and "seq_len" in kw:
            # a shorter sequence: a packed step holds fewer tokens, a padded one is batch x that
            n = int(kw["seq_len"])
            shape = replace(
                shape,
                step=replace(step, tokens=n, longest=min(step.longest, n))
                if step.packed
                else replace(step, tokens=step.sequences * n, longest=n),
            )
        if step is not None and shape.step is not None and "batch_size" in kw and not step.packed:
            b = int(kw["batch_size"])
            shape = replace(shape, step=replace(shape.step, tokens=b * shape.step.longest, sequences=b))
        if (
            shape.intent == "inference"
            and shape.batch_size == 1
            and shape.seq_len <= SHORT_DECODE_MAX_TOKENS
            and self.caps.gpus
            and self.caps.gpus[0].compute_capability >= (8, 0)
        ):
            # a plan declaring one short sequence may pick eager (policies/attention/choice.py _short_decode,
            # unless cudaload_sdpa is the default there): its seq_len^2 scores are assumed, the larger of the
            # two, so a shorter-sequence suggestion fits whichever is chosen
            shape = replace(shape, attn="eager")
        return breakdown_of(self.info, shape)

    def fits(self, caps: Capabilities | None = None, **kw: Any) -> bool:
        return place(self.caps if caps is None else caps, self.estimate(**kw), max_memory=self.max_memory).ok


def suggestions(
    info: ModelInfo,
    caps: Capabilities,
    *,
    dtype: str,
    intent: str,
    seq_len: int,
    batch_size: int,
    attn: str,
    methods: list[str],
    max_memory: Mapping[Any, Any] | None,
    allow_offload: bool,
    optimizer: str | None = None,
    gradient_checkpointing: bool | None = None,
    optimizer_requested: str = "auto",
    step: StepShape | None = None,
) -> list[Suggestion]:
    """Alternatives that fit, each probed with the ladder's last (smallest) rung: the last quantization
    method, ``optimizer`` and ``gradient_checkpointing`` as the ladder would end. A GPU count is found by
    placing the model on that many copies of the first GPU, so the per-GPU context and activations and the
    whole-layer granularity of a split are in the arithmetic (a count that only adds up in bytes is not
    enough). A packed training ``step`` is shortened by its tokens per step, where a padded one is by
    ``seq_len``."""
    if not methods:
        # nothing this intent allows can run here (qlora without a usable bitsandbytes): only another intent
        lora = MemoryShape(
            dtype, None, "lora", seq_len, batch_size, attn, gradient_checkpointing=True, step=step
        )
        if (
            intent == "qlora"
            and caps.gpus
            and place(caps, breakdown_of(info, lora), max_memory=max_memory).ok
        ):
            return [Suggestion("intent", "lora", "intent='lora' (bf16 base + LoRA, no bitsandbytes) fits")]
        return []
    q = None if methods[-1] == "none" else methods[-1]
    shape = MemoryShape(
        dtype, q, intent, seq_len, batch_size, attn, optimizer, gradient_checkpointing, step=step
    )
    p = _Probe(info, caps, shape, max_memory)
    out: list[Suggestion] = []
    if caps.gpus:
        out.extend(_shorter(p))
        if batch_size > 1 and not (step is not None and step.packed) and p.fits(batch_size=1):
            out.append(Suggestion("batch_size", 1, "batch_size=1 fits"))
        out.extend(_more_gpus(p))
        out.extend(_lighter_training(p, methods, optimizer_requested))
    if not allow_offload and place(caps, p.estimate(), max_memory=max_memory, allow_offload=True).ok:
        # only when the host's memory is known (a profile without it cannot offload)
        out.append(Suggestion("offload", True, "allow_offload=True (CPU/disk offload, slow)"))
    return out


def _shorter(p: _Probe) -> list[Suggestion]:
    """The longest sequence (a packed step: the most tokens a step) that fits, by bisection (each probe is
    arithmetic); nothing under 128 tokens."""
    step, q = p.shape.step, p.shape.quantization
    packed = step is not None and step.packed
    top = step.tokens if step is not None and packed else p.shape.seq_len
    lo, hi = 0, top
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if p.fits(seq_len=mid):
            lo = mid
        else:
            hi = mid
    with_q = "" if q is None else f" with {q}"
    if lo >= 128 and packed and step is not None and lo >= step.longest:
        return [Suggestion("tokens_per_step", lo, f"tokens_per_step={lo}{with_q} fits")]
    if lo >= 128 and packed:
        # a step must hold the longest sequence: shorter sequences, and steps of that many tokens
        return [Suggestion("seq_len", lo, f"seq_len <= {lo} with tokens_per_step={lo}{with_q} fits")]
    if lo >= 128:
        return [Suggestion("seq_len", lo, f"seq_len <= {lo} fits{with_q}")]
    return []


def _more_gpus(p: _Probe) -> list[Suggestion]:
    """How many GPUs like the first one place the model (with a shorter sequence where none does), unless
    ``max_memory`` names the GPUs."""
    caps, seq_len = p.caps, p.shape.seq_len
    if p.max_memory is not None and any(str(k).strip() not in ("cpu", "disk") for k in p.max_memory):
        return []
    per_gpu = budgets(caps, None).get(f"cuda:{caps.gpus[0].index}", 0)

    def gpus_for(s: int) -> int | None:
        # smallest count that places: the model's bytes bound it below; then place() decides
        bd = p.estimate(seq_len=s)
        room = max(per_gpu - bd.every_device, 1)
        n = max(len(caps.gpus) + 1, int(bd.model_bytes // room))
        while n <= MAX_SUGGESTED_GPUS and not p.fits(replicate_gpus(caps, n), seq_len=s):
            n += 1
        return n if n <= MAX_SUGGESTED_GPUS else None

    name = f"{caps.gpus[0].name} ({per_gpu / GiB:.0f} GiB each)"
    s = seq_len
    n = gpus_for(s)
    while n is None and s > 512:
        # every GPU of a split runs its share of the sequence's activations: shorter, then more GPUs
        s = max(s // 2, 512)
        n = gpus_for(s)
    if n is None:
        return []
    text = f"{n} GPUs like {name}" + ("" if s == seq_len else f" with seq_len <= {s}")
    return [Suggestion("gpus", n, text, seq_len=None if s == seq_len else s)]


def _lighter_training(p: _Probe, methods: list[str], optimizer_requested: str) -> list[Suggestion]:
    """Training's own ways down: QLoRA's nf4 base, or (an optimizer was requested) a lighter optimizer."""
    out: list[Suggestion] = []
    intent, gc = p.shape.intent, p.shape.gradient_checkpointing
    if (
        intent in ("training", "lora")
        and "nf4" not in methods
        and not bnb_problems(p.caps)
        and p.fits(
            quantization="nf4", intent="qlora", optimizer="paged_adamw_8bit", gradient_checkpointing=True
        )
    ):
        out.append(Suggestion("intent", "qlora", "intent='qlora' (nf4 base + LoRA) fits"))
    if intent == "training" and optimizer_requested not in ("auto", "", None):
        for o in ("adamw_8bit", "paged_adamw_8bit", "adafactor"):
            if o == optimizer_requested or (o in BNB_OPTIMIZERS and bnb_problems(p.caps)):
                continue
            if p.fits(optimizer=o, gradient_checkpointing=True if gc is None else gc):
                out.append(Suggestion("optimizer", o, f"optimizer='{o}' fits"))
                break
    return out


def render_suggestions(
    sugg: list[Suggestion],
    caps: Capabilities | None = None,
    max_memory: Mapping[Any, Any] | None = None,
    *,
    methods: list[str] | None = None,
    shortfall: int = 0,
) -> str:
    """The fix a DoesNotFitError gives: the suggestions that were checked to fit, else what the situation
    needs (no usable method here, a max_memory cap that is the limit, no GPU) before "more GPU memory".
    ``shortfall``: the bytes the closest rung lacked, which a single GPU cap is raised by."""
    tips = [t.text for t in sugg]
    if tips:
        return "try: " + "; or ".join(tips)
    if methods is not None and not methods:
        # nothing the intent allows can run here (QLoRA without a usable bitsandbytes): memory is not the issue
        return (
            "intent='qlora' needs bitsandbytes' 4-bit kernels on a CUDA GPU: use intent='lora' (a bf16 base) here, "
            "or a machine with a GPU and bitsandbytes (pip install 'cudaload[quant]')"
        )
    capped = {str(k): v for k, v in (max_memory or {}).items() if str(k).strip() not in ("cpu", "disk")}
    if capped:
        return _raise_cap(capped, caps, max_memory, shortfall)
    if caps is not None and not caps.gpus:
        return "no GPU is visible here: plan for one with hardware='H100' (cudaload profiles), or load on a machine with a GPU"
    return "use a machine with more GPU memory"


def _raise_cap(
    capped: dict[str, Any], caps: Capabilities | None, max_memory: Mapping[Any, Any] | None, shortfall: int
) -> str:
    """Where a ``max_memory`` cap is the limit: raise it, by how much where one GPU is capped."""
    text = f"raise max_memory ({', '.join(f'{k}: {v}' for k, v in capped.items())} is what caps the GPU here)"
    if shortfall > 0 and len(capped) == 1:
        key, value = next(
            (k, v) for k, v in (max_memory or {}).items() if str(k).strip() not in ("cpu", "disk")
        )
        # rounded up to a tenth of a GiB: the cap that covers what the closest rung lacked
        need = -(-(parse_size(value) + shortfall) * 10 // GiB) / 10
        dev = next(iter(capped)).strip()
        whole = budgets(caps, None).get(dev if dev.startswith("cuda") else f"cuda:{dev}") if caps else None
        if whole is None or need * GiB <= whole:
            text += f" to at least {need:.1f}GiB: max_memory={{{key!r}: '{need:.1f}GiB'}}"
        else:  # no cap this GPU allows is enough
            text += (
                f"; it needs {need:.1f} GiB and the whole GPU has {whole / GiB:.1f}: use a machine with more"
            )
    return text
