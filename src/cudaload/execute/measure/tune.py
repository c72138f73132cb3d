"""``cudaload tune``: time every usable attention backend for one model and one work on this GPU, and cache it.

The model is loaded once per backend with plain ``from_pretrained(attn_implementation=...)`` in the dtype
cudaload's plan chooses; when the copies fit together (GPU memory after the first one, with a quarter
spare for the work's activations and cache) they are held at once and called round-robin, else one at a
time. Timing is :mod:`cudaload.execute.measure.backends`, the code benchmarks/bench_generate.py runs, within
``budget_s`` seconds from the call (loading included). The medians land in the timing cache
(:mod:`cudaload.tuning.store`), where :func:`cudaload.tuning.lookup` finds them for the next plan.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ...capabilities import Capabilities
from ...errors import ConfigurationError, LoadError
from ...model_info import ModelInfo
from ...plans.decision import Decision
from ...tuning.signature import AttentionSignature, Work, bucket, signature
from ...tuning.store import Entry, TimingCache, gpu_id, package_versions
from ...tuning.timings import Timings, measured_timings
from .backends import COMPILED_BACKENDS, Measurement, WorkShape, error_line, measure_backends

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)

DEFAULT_BUDGET_S = 120.0
#: spare GPU memory kept per extra copy, as a fraction of one copy: KV cache and activations of the work
_SPARE = 0.25
_CPU_NOTE = (
    "measured on the CPU (float32): these timings serve plans made on this machine without a GPU; "
    "no GPU plan reads them (run cudaload tune on that GPU)"
)


@dataclass
class TuneResult:
    """What :func:`tune` measured and stored."""

    timings: Timings
    entry: Entry
    rows: list[dict[str, Any]]
    not_usable: dict[str, str]
    interleaved: bool  # all copies held at once (else loaded one at a time)
    stored: bool  # written to the timing cache
    cache_path: str
    elapsed_s: float
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "timings": self.timings.to_dict(),
            "fastest": self.timings.fastest,
            "key": self.entry.key,
            "rows": self.rows,
            "not_usable": self.not_usable,
            "interleaved": self.interleaved,
            "stored": self.stored,
            "cache_path": self.cache_path,
            "elapsed_s": round(self.elapsed_s, 2),
            "notes": self.notes,
        }

    def render(self) -> str:
        lines = [self.timings.source, "", f"fastest: {self.timings.fastest}", ""]
        lines.append(f"{'backend':<34} {'first-seen s':>12} {'repeated s':>10} {'n':>3}  first call +s")
        for r in self.rows:
            g, f = r.get("generate_s"), r.get("generate_first_s")
            if not g or not f:
                lines.append(f"{r['backend']:<34} {r.get('error') or r.get('stopped') or 'not timed'}")
                continue
            extra = r.get("first_call_extra_s")
            lines.append(
                f"{r['backend']:<34} {f['median']:>12.3f} {g['median']:>10.3f} {f['n']:>3}  "
                f"{'-' if extra is None else f'{extra:.2f}'}"
            )
        lines += [f"{b}: not usable: {why}" for b, why in self.not_usable.items()]
        lines.append("")
        lines.append(
            ("stored in " if self.stored else "NOT stored (cache not writable): ")
            + f"{self.cache_path}; {'models held at once, interleaved' if self.interleaved else 'one model at a time'}"
            + f"; {self.elapsed_s:.1f} s"
        )
        lines += self.notes
        return "\n".join(lines)


def _candidates(attention: Decision, on_gpu: bool) -> tuple[list[str], dict[str, str]]:
    """Backends to time from the attention decision's candidates: every valid one; flex_attention on the CPU
    is left out (inductor compiles C++ for each new shape: minutes, and nobody decodes there)."""
    names = ["sdpa", "eager"]
    skipped: dict[str, str] = {}
    for c in attention.candidates:
        if c.name in names:
            continue
        if not c.ok:
            skipped[c.name] = "; ".join(c.reasons) or "rejected by the plan"
        elif c.name in COMPILED_BACKENDS and not on_gpu:
            skipped[c.name] = "compiles C++ per shape on the CPU; pass backends= to time it anyway"
        else:
            names.append(c.name)
    return names, skipped


def _check_work(batch_size: int, seq_len: int, new_tokens: int, budget_s: float) -> None:
    """tune()'s arguments, refused before torch is imported."""
    for name, v in (("batch_size", batch_size), ("seq_len", seq_len), ("new_tokens", new_tokens)):
        if not isinstance(v, int) or v < 1:
            raise ConfigurationError(f"{name}={v!r} must be a positive integer", fix=f"pass {name}=1 or more")
    if isinstance(budget_s, bool) or not isinstance(budget_s, int | float) or not budget_s > 0:
        raise ConfigurationError(
            f"budget_s={budget_s!r} leaves no time to measure anything",
            fix=f"pass budget_s= in seconds above 0 (default {DEFAULT_BUDGET_S:g})",
        )


def tune(
    model_path: str,
    *,
    batch_size: int = 1,
    seq_len: int = 512,
    new_tokens: int = 32,
    padded: bool = False,
    budget_s: float = DEFAULT_BUDGET_S,
    backends: Sequence[str] | None = None,
    reps: int = 5,
    interleave: bool | None = None,
    hardware: Capabilities | None = None,
    cache: TimingCache | None = None,
    log: Callable[[str], None] | None = None,
) -> TuneResult:
    """Time generate() of ``batch_size`` prompts of ``seq_len`` tokens (the longest, when ``padded``: the
    others left-padded down to half of it) + ``new_tokens`` greedy tokens, for every usable backend
    (``backends``: these instead), store the medians in the timing cache and return them.

    Stays within ``budget_s`` seconds from the call: calls are started only when their expected duration
    fits (loading a backend's copy is not interrupted). ``interleave``: hold every backend's copy at once and
    call them round-robin (True), one copy at a time (False), or decide by free GPU memory (None; the CPU
    holds them all). Works on the CPU too (float32)."""
    _check_work(batch_size, seq_len, new_tokens, budget_s)
    import torch
    import transformers

    from ...detection import detect
    from ...model_info import model_info
    from ...policies.sdpa_dispatch import RECUR, SDPA_DECODE

    say = log or (lambda m: logger.info("%s", m))
    t0 = time.perf_counter()
    deadline = t0 + budget_s
    caps = hardware if hardware is not None else detect()
    on_gpu = caps.has_gpu and torch.cuda.is_available()
    info = model_info(model_path)
    dtype_name, attention = _dtype_and_attention(info, caps, on_gpu)
    dtype = getattr(torch, dtype_name)
    device = "cuda:0" if on_gpu else "cpu"
    sig = signature(info, dtype_name)
    wanted, not_usable = _backends_to_time(attention, on_gpu, backends, say)
    work = WorkShape(batch_size, seq_len, new_tokens, "left" if padded else "ones")
    load = _loader(transformers.AutoModelForCausalLM, model_path, dtype, device)
    pad = 0
    # cudaload_sdpa changes kernels once a shape recurs: its repeated sample comes after RECUR more calls
    settle = {SDPA_DECODE: RECUR}
    rows: list[Measurement] = []
    models, interleaved = _load_together(
        wanted, load, interleave=interleave, on_gpu=on_gpu, deadline=deadline, not_usable=not_usable, say=say
    )
    if models:
        first = next(iter(models.values()))
        gc = first.generation_config
        pad = int(gc.pad_token_id if gc.pad_token_id is not None else 0)

    def measure(held: dict[str, Any], until: float) -> list[Measurement]:
        return measure_backends(
            held, [work], reps=reps, deadline=until, log=say, t0=t0, pad_token_id=pad, settle=settle
        )

    if interleaved:
        rows = measure(models, deadline)
    else:
        # copies do not fit together: the loaded ones first, the rest one at a time, each its share
        say(
            "timing one backend at a time"
            + (" (the copies do not fit together)" if interleave is None else "")
        )
        rows += _time_one_at_a_time(
            models, wanted, load, measure, deadline=deadline, on_gpu=on_gpu, not_usable=not_usable
        )
    models.clear()
    summaries = [m.summary() for m in rows]
    seconds, repeated = _medians(summaries, not_usable, budget_s)
    declared = Work(batch_size, seq_len, new_tokens, padded)
    entry = _entry(
        caps, sig, declared, summaries, seconds, repeated, interleaved=interleaved, model_path=model_path
    )
    store = cache if cache is not None else TimingCache()
    stored = store.put(entry)
    return TuneResult(
        timings=measured_timings(entry, declared, 0.0),
        entry=entry,
        rows=summaries,
        not_usable=not_usable,
        interleaved=interleaved,
        stored=stored,
        cache_path=store.path,
        elapsed_s=time.perf_counter() - t0,
        notes=[] if on_gpu else [_CPU_NOTE],
    )


def _dtype_and_attention(info: ModelInfo, caps: Capabilities, on_gpu: bool) -> tuple[str, Decision]:
    """The dtype and the attention decision the planner would reach: the policies it asks, asked directly
    (tuning sits below the planner, which asks it for timings)."""
    from ...policies.attention import AttentionFacts, AttentionQuery, select_attention
    from ...policies.dtype import choose_dtype
    from ...tuning.timings import load_sdpa_facts

    s = info.summary
    dt = choose_dtype(
        caps,
        checkpoint_dtype=s.checkpoint_dtype,
        model_type=s.type,
        intent="inference",
        fp16_overflow=info.fp16_overflow,
    )
    dtype_name = dt.choice or ("bfloat16" if on_gpu else "float32")
    attention = select_attention(
        info, caps, AttentionQuery(dtype_name), AttentionFacts(sdpa=load_sdpa_facts())
    )
    if s.is_encoder or not info.can_generate:
        raise ConfigurationError(
            f"{s.name} cannot generate(): cudaload tune times generation",
            fix="tune a causal language model; encoders run one forward, any backend the plan picks will do",
        )
    return dtype_name, attention


def _loader(auto: Any, model_path: str, dtype: torch.dtype, device: str) -> Callable[[str], Any]:
    """Loads the model with one attention backend (``auto``: transformers' auto class), in eval mode."""

    def load(b: str) -> Any:
        # use_kernels=False: transformers 5.25 would otherwise kernelize with its default Hub kernels (see
        # execute.from_pretrained), timing them and not the attention backend alone
        m = auto.from_pretrained(
            model_path, dtype=dtype, device_map=device, attn_implementation=b, use_kernels=False
        )
        m.eval()
        return m

    return load


def _backends_to_time(
    attention: Decision, on_gpu: bool, backends: Sequence[str] | None, say: Callable[[str], None]
) -> tuple[list[str], dict[str, str]]:
    """The backends to time (``backends``: these, less the unusable ones) and why the others are not usable;
    cudaload's sdpa variants registered and FA4's compile cache switched on where they will be timed."""
    from ...policies.sdpa_dispatch import NAMES as SDPA_VARIANTS

    wanted, not_usable = _candidates(attention, on_gpu)
    if any(b in SDPA_VARIANTS for b in (backends or wanted)):
        from ..runtime.sdpa_decode import register

        register()  # cudaload's sdpa variants are transformers attention functions
    if backends is not None:
        not_usable = {b: why for b, why in not_usable.items() if b in backends}
        wanted = [b for b in backends if b not in not_usable]
    if "flash_attention_4" in wanted:
        from ..runtime.fa4_cache import enable_fa4_compile_cache

        say(enable_fa4_compile_cache().note)
    return wanted, not_usable


def _time_one_at_a_time(
    models: dict[str, Any],
    wanted: Sequence[str],
    load: Callable[[str], Any],
    measure: Callable[[dict[str, Any], float], list[Measurement]],
    *,
    deadline: float,
    on_gpu: bool,
    not_usable: dict[str, str],
) -> list[Measurement]:
    """The loaded copies first, then the rest loaded one at a time, each backend timed alone within its share
    of the time left and let go before the next."""
    import torch

    rows: list[Measurement] = []
    rest = [b for b in wanted if b not in models and b not in not_usable]
    n_left = len(models) + len(rest)
    for b in [*list(models), *rest]:
        share = max(0.0, deadline - time.perf_counter()) / max(1, n_left)
        n_left -= 1
        try:
            m = models.pop(b) if b in models else load(b)
        except Exception as e:
            not_usable[b] = error_line(e)
            continue
        rows += measure({b: m}, time.perf_counter() + share)
        del m
        if on_gpu:
            torch.cuda.empty_cache()
    return rows


def _medians(
    summaries: Sequence[dict[str, Any]], not_usable: Mapping[str, str], budget_s: float
) -> tuple[dict[str, float], dict[str, float]]:
    """Each backend's median seconds on lengths a new process has not run (what the choice weighs), and on
    the repeated ones beside; :class:`LoadError` where no backend finished a timed call."""
    seconds = {
        s["backend"]: float(s["generate_first_s"]["median"]) for s in summaries if s.get("generate_first_s")
    }
    repeated = {s["backend"]: float(s["generate_s"]["median"]) for s in summaries if s["generate_s"]}
    if not seconds:
        raise LoadError(
            f"no attention backend finished a timed generate() within {budget_s:g} s",
            reasons=[f"{b}: {why}" for b, why in not_usable.items()]
            + [f"{s['backend']}: {s.get('error') or s.get('stopped')}" for s in summaries],
            fix="raise the budget (--budget-s), or tune a smaller work",
        )
    return seconds, repeated


def _load_together(
    wanted: Sequence[str],
    load: Callable[[str], Any],
    *,
    interleave: bool | None,
    on_gpu: bool,
    deadline: float,
    not_usable: dict[str, str],
    say: Callable[[str], None],
) -> tuple[dict[str, Any], bool]:
    """Each backend's copy loaded while they fit together (``interleave`` None: by free GPU memory), with
    whether all of them were (else the loaded ones are timed first, then the rest one at a time). A backend
    that cannot load, or that the budget leaves no time to load, goes to ``not_usable``."""
    import torch

    interleaved = True
    models: dict[str, Any] = {}
    for b in wanted:
        if interleave is False:
            interleaved = False
            break
        if time.perf_counter() >= deadline:
            not_usable[b] = "time budget used before it could be loaded"
            continue
        if interleave is None and on_gpu and models:
            free, _total = torch.cuda.mem_get_info(0)
            one = next(iter(models.values())).get_memory_footprint()
            if free < one * (1 + _SPARE) * 1.05:
                interleaved = False
                break
        try:
            before = time.perf_counter()
            models[b] = load(b)
            say(f"loaded {b} in {time.perf_counter() - before:.1f} s")
        except Exception as e:  # a backend that cannot load here is a result, not a failure of tune
            not_usable[b] = error_line(e)
            say(f"{b}: not usable: {not_usable[b]}")
    return models, interleaved


def _entry(
    caps: Capabilities,
    sig: AttentionSignature,
    declared: Work,
    summaries: Sequence[dict[str, Any]],
    seconds: dict[str, float],
    repeated: dict[str, float],
    *,
    interleaved: bool,
    model_path: str,
) -> Entry:
    """The timing cache's entry for this GPU, model and work: the first-seen and repeated medians, each
    backend's first-call cost, and how they were measured."""
    batch_size, seq_len, new_tokens, padded = (
        declared.batch_size,
        declared.prompt_len,
        declared.new_tokens,
        declared.padded,
    )
    return Entry(
        gpu=gpu_id(caps, 0),
        versions=package_versions(caps),
        signature=sig,
        work=bucket(declared),
        seconds=seconds,
        date=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        first_call_s={
            s["backend"]: round(float(s["first_call_extra_s"]), 3)
            for s in summaries
            if s.get("first_call_extra_s") is not None and s["first_call_extra_s"] > 0
        },
        detail={
            "work": {
                "batch_size": batch_size,
                "prompt_len": seq_len,
                "new_tokens": new_tokens,
                "padded": padded,
            },
            "model": str(model_path),
            "samples": {s["backend"]: s["generate_s"]["n"] for s in summaries if s["generate_s"]},
            "how": "cudaload tune: generate() "
            + ("interleaved, models held at once" if interleaved else "one backend at a time")
            + "; seconds on first-seen lengths (a new thread), repeated_s on lengths already run",
        },
        repeated_s=repeated,
    )


# -- command line (wired into cudaload.commands.cli as `cudaload tune`) -------------------------------------------------


def _csv(value: str) -> list[str]:
    return [v.strip() for v in value.split(",") if v.strip()]


def add_tune_parser(
    subparsers: Any, parents: Sequence[argparse.ArgumentParser] = ()
) -> argparse.ArgumentParser:
    """Add ``tune`` to ``cudaload``'s subcommands (``parents``: the options every subcommand shares);
    ``args.func`` is :func:`run_tune`."""
    t: argparse.ArgumentParser = subparsers.add_parser(
        "tune",
        parents=list(parents),
        help="time every usable attention backend for a model on this GPU and cache the result",
        description="Time generate() of the declared work with every usable attention backend on this GPU "
        "and store the medians in cudaload's cache, where plan() and load_model() find them.",
    )
    t.add_argument("model", help="a local model directory (or a Hub id available offline)")
    t.add_argument("--batch-size", type=int, default=1, help="prompts per generate() call (default 1)")
    t.add_argument(
        "--seq-len",
        type=int,
        default=544,
        help="tokens per sequence, prompt + new tokens, as `cudaload plan --seq-len` counts them; with "
        "--padded the longest (default 544 = a 512-token prompt + 32)",
    )
    t.add_argument("--new-tokens", type=int, default=32, help="tokens generated per call (default 32)")
    t.add_argument(
        "--padded",
        action="store_true",
        help="left-padded prompts of varying length (down to half of --seq-len)",
    )
    t.add_argument(
        "--budget-s",
        type=float,
        default=DEFAULT_BUDGET_S,
        help=f"seconds for the whole run, loading included (default {DEFAULT_BUDGET_S:g})",
    )
    t.add_argument("--backends", type=_csv, help="comma-separated attn_implementation names to time instead")
    t.add_argument("--reps", type=int, default=5, help="timed calls per backend, budget allowing (default 5)")
    t.add_argument("--json", action="store_true", help="print the result as JSON")
    t.set_defaults(func=run_tune)
    return t


def run_tune(args: argparse.Namespace) -> int:
    import sys

    def progress(m: str) -> None:
        print(m, file=sys.stderr, flush=True)

    # the CLI counts like plan(): prompt + new tokens; tune() takes the prompt
    prompt = args.seq_len - args.new_tokens
    if prompt < 1:
        raise ConfigurationError(
            f"--seq-len {args.seq_len} leaves no prompt: it counts the prompt and the {args.new_tokens} new tokens",
            fix=f"pass --seq-len {args.new_tokens + 1} or more (a prompt of 1 token or more), or fewer --new-tokens",
        )
    result = tune(
        args.model,
        batch_size=args.batch_size,
        seq_len=prompt,
        new_tokens=args.new_tokens,
        padded=args.padded,
        budget_s=args.budget_s,
        backends=args.backends,
        reps=args.reps,
        log=progress,
    )
    print(json.dumps(result.to_dict(), indent=1) if args.json else result.render())
    return 0


def measured_or_tune(
    model_path: str,
    caps: Capabilities,
    info: ModelInfo,
    dtype: str,
    work: Work,
    *,
    budget_s: float = DEFAULT_BUDGET_S,
    cache: TimingCache | None = None,
    log: Callable[[str], None] | None = None,
) -> Timings:
    """For ``load_model(..., tune=True)``: this machine's measurement of ``work`` when the cache has one (the
    nearest bucket, as :func:`cudaload.tuning.lookup` finds it; shipped priors do not count), else
    :func:`tune` it now (``work.new_tokens`` None: 32) and return the fresh measurement."""
    from ...tuning.timings import lookup

    have = lookup(caps, info, dtype, work, cache=cache, priors=[])
    if have is not None:
        return have
    return tune(
        model_path,
        batch_size=work.batch_size,
        seq_len=work.prompt_len,
        new_tokens=work.new_tokens or 32,
        padded=work.padded,
        budget_s=budget_s,
        hardware=caps,
        cache=cache,
        log=log,
    ).timings
