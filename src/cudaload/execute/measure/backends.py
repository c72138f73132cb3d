"""Timing attention backends through transformers' own ``generate()``, as a user runs it.

One code path for ``cudaload tune`` and ``benchmarks/bench_generate.py`` (and the superseded
``benchmarks/investigations/bench_attention.py``), so a cached measurement and a benchmark row mean the same
thing. What is timed:

- **generate**: the whole ``model.generate(input_ids, attention_mask=..., max_new_tokens=n,
  min_new_tokens=n, do_sample=False, pad_token_id=...)`` call, greedy, every backend producing exactly n
  tokens (``min_new_tokens`` suppresses EOS, and the output length is checked);
- **prefill**: one forward of the prompt with a fresh cache (``use_cache=True, logits_to_keep=1``), what
  generate's first step does;
- **decode per token**: ``(generate - prefill) / (n - 1)``: generate's first token comes out of the
  prefill, each further token costs one decode step.

**Two states, timed apart.** A backend's cost can depend on what the process has already run: torch's cuDNN
SDPA builds an execution graph for every new problem (key length, batch) and keeps it in a per-thread cache
(torch ``aten/src/ATen/native/cudnn/MHA.cpp``, ``getMHAGraphCache_``: ``thread_local``), so generate() on
lengths the process has not met pays a build per decode step, and on lengths it has met pays none.
- **first-seen**: the call runs on a new thread, whose cuDNN graph cache is empty: the state a fresh
  ``load_model()`` process is in for every length;
- **repeated**: the same call again on that thread, which has just run those lengths: the state of a
  process that keeps meeting the same lengths. Both states time the very same work.
Prefill (one forward of the prompt) is timed in both states the same way, on a thread of its own.
Choices are made on first-seen seconds (what a new process meets); repeated ones are reported beside them.

Several models (one per backend, same weights) are held at once and called round-robin, the starting
backend rotating each round, so drift in the machine's state (clocks, other processes, page-cache writeback)
lands on every backend alike. Every (backend, work) gets one warm-up call first (its time is kept: it
holds the JIT / compile cost of FA4 and flex_attention), then up to ``reps`` rounds of a first-seen and a
repeated call while the budget lasts. Decode through generate() is bound by the host (one kernel launch stream per token; H200 8B at
batch 8: ~30 ms a step of which little is GPU math), so each sample also records the process's CPU
seconds: a call whose CPU time is close to its wall time was host-bound.

torch and transformers are imported inside the functions: ``import cudaload`` stays cheap.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

#: How a batch's prompts are presented to generate():
#: "none": no attention_mask at all; "ones": an all-ones attention_mask (what a tokenizer returns for
#: equal-length prompts); "left": left-padded prompts of varying length with the matching mask.
PADDINGS = ("none", "ones", "left")
#: first token id of the random prompts: ids below it are the tiny tokenizers' specials (pad/bos/eos)
FIRST_ID = 4
#: the prompts' seed: the same batch benchmarks/run.py's choice worker builds
PROMPT_SEED = 1234


@dataclass(frozen=True)
class WorkShape:
    """One generate() call: ``batch`` prompts of at most ``prompt`` tokens, ``new_tokens`` generated."""

    batch: int
    prompt: int
    new_tokens: int
    padding: str = "none"
    #: left padding: the shortest prompt (default half the longest); lengths are evenly spaced up to ``prompt``
    min_prompt: int | None = None

    def __post_init__(self) -> None:
        if self.padding not in PADDINGS:
            raise ValueError(f"padding {self.padding!r} is not one of {', '.join(PADDINGS)}")
        if self.batch < 1 or self.prompt < 1 or self.new_tokens < 1:
            raise ValueError(f"batch, prompt and new_tokens must be >= 1, got {self}")

    @property
    def name(self) -> str:
        base = f"{self.batch}x{self.prompt}+{self.new_tokens}"
        if self.padding == "none":
            return base
        if self.padding == "ones":
            return f"{base} ones-mask"
        lo, hi = min(self.lengths()), max(self.lengths())
        return f"{base} left-pad {lo}-{hi}"

    def lengths(self) -> list[int]:
        """Real (unpadded) prompt length of each row."""
        if self.padding != "left" or self.batch == 1:
            return [self.prompt] * self.batch
        lo = self.min_prompt if self.min_prompt is not None else max(1, self.prompt // 2)
        lo = max(1, min(lo, self.prompt))
        step = (self.prompt - lo) / (self.batch - 1)
        # longest first, like a length-sorted batch; the longest row always has the full prompt
        return [self.prompt - round(i * step) for i in range(self.batch)]

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "name": self.name}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> WorkShape:
        return cls(
            batch=int(d["batch"]),
            prompt=int(d["prompt"]),
            new_tokens=int(d["new_tokens"]),
            padding=str(d.get("padding", "none")),
            min_prompt=None if d.get("min_prompt") is None else int(d["min_prompt"]),
        )


def make_inputs(
    work: WorkShape, vocab_size: int, device: torch.device, *, pad_token_id: int = 0, seed: int = PROMPT_SEED
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(input_ids, attention_mask or None) for ``work``: random ids in [FIRST_ID, vocab), built the way
    benchmarks/run.py's choice worker builds its batch (CPU generator, seed 1234), then left-padded."""
    import torch

    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(FIRST_ID, int(vocab_size), (work.batch, work.prompt), generator=g)
    mask = None
    if work.padding in ("ones", "left"):
        mask = torch.ones_like(ids)
    if work.padding == "left":
        assert mask is not None
        for row, n in enumerate(work.lengths()):
            ids[row, : work.prompt - n] = pad_token_id
            mask[row, : work.prompt - n] = 0
    return ids.to(device), None if mask is None else mask.to(device)


def sync(device: torch.device) -> None:
    import torch

    if str(device).startswith("cuda"):
        torch.cuda.synchronize(device)


def timed(fn: Callable[[], Any], device: torch.device) -> tuple[float, float, Any]:
    """(wall seconds, process CPU seconds, fn's result), the device synchronised before and after."""
    sync(device)
    c0, t0 = time.process_time(), time.perf_counter()
    out = fn()
    sync(device)
    return time.perf_counter() - t0, time.process_time() - c0, out


def on_new_thread(fn: Callable[[], Any], device: torch.device) -> Any:
    """``fn()`` on a new thread: per-thread caches (cuDNN's execution graphs) start empty, as in a new process.
    Its exception is raised here."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            import torch

            if str(device).startswith("cuda"):
                torch.cuda.set_device(device)  # a new thread starts on device 0
            box["r"] = fn()
        except BaseException as e:  # re-raised on the caller's thread
            box["e"] = e

    t = threading.Thread(target=run, name="cudaload-first-seen")
    t.start()
    t.join()
    if "e" in box:
        raise box["e"]
    return box["r"]


def model_device(model: Any) -> torch.device:
    for p in model.parameters():
        if p.device.type != "meta":
            device: torch.device = p.device
            return device
    import torch

    return torch.device("cpu")


def generate_call(
    model: Any, ids: torch.Tensor, mask: torch.Tensor | None, new_tokens: int, *, pad_token_id: int = 0
) -> Callable[[], Any]:
    """The generate() a user writes: greedy, exactly ``new_tokens`` new tokens. Returns the output ids."""
    kw: dict[str, Any] = {
        "max_new_tokens": new_tokens,
        "min_new_tokens": new_tokens,
        "do_sample": False,
        "num_beams": 1,
        "pad_token_id": pad_token_id,
    }
    if mask is not None:
        kw["attention_mask"] = mask

    def call() -> Any:
        return model.generate(ids, **kw)

    return call


def prefill_call(model: Any, ids: torch.Tensor, mask: torch.Tensor | None) -> Callable[[], Any]:
    """One forward of the prompt with a fresh cache: generate()'s first step."""
    import torch

    def call() -> None:
        with torch.no_grad():
            model(input_ids=ids, attention_mask=mask, use_cache=True, logits_to_keep=1)

    return call


def _stats(xs: Sequence[float]) -> dict[str, float] | None:
    if not xs:
        return None
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "n": len(xs)}


@dataclass
class Measurement:
    """Everything timed for one (backend, work)."""

    backend: str
    work: WorkShape
    warmup_s: float | None = None
    warmup_tokens: int = 0
    #: repeated-length samples (the measuring thread, after the full-length warm-up)
    generate_s: list[float] = field(default_factory=list)
    generate_cpu_s: list[float] = field(default_factory=list)
    #: first-seen samples: the same call on a new thread (empty per-thread plan caches)
    first_s: list[float] = field(default_factory=list)
    first_cpu_s: list[float] = field(default_factory=list)
    prefill_first_s: list[float] = field(default_factory=list)
    #: per round, the calls between the first-seen and the repeated sample (``settle``)
    settle_s: list[list[float]] = field(default_factory=list)
    #: seconds since the run started at which each generate sample began (drift shows here)
    generate_at: list[float] = field(default_factory=list)
    prefill_s: list[float] = field(default_factory=list)
    error: str | None = None
    stopped: str | None = None  # why no further reps were taken (budget, too slow, error)
    warmup_prefill_s: float | None = None

    def expected_s(self) -> float:
        """A full call's expected seconds before any was timed: the warm-up's per-token rate (its first
        call's extra cost included, so this errs long) scaled to ``new_tokens``."""
        w = self.warmup_s or 0.0
        p = min(self.warmup_prefill_s or 0.0, w)
        if self.warmup_tokens <= 1:
            return w
        per_token = (w - p) / (self.warmup_tokens - 1)
        return p + per_token * (self.work.new_tokens - 1)

    def median(self) -> float | None:
        """Median repeated-length seconds."""
        return statistics.median(self.generate_s) if self.generate_s else None

    def median_first(self) -> float | None:
        """Median first-seen seconds."""
        return statistics.median(self.first_s) if self.first_s else None

    def summary(self) -> dict[str, Any]:
        g = _stats(self.generate_s)
        p = _stats(self.prefill_s)
        out: dict[str, Any] = {
            "backend": self.backend,
            "work": self.work.name,
            "work_shape": self.work.to_dict(),
            "generate_s": g,
            "generate_first_s": _stats(self.first_s),
            "prefill_s": p,
            "prefill_first_s": _stats(self.prefill_first_s),
            "cpu_fraction": (
                statistics.median([c / w for c, w in zip(self.generate_cpu_s, self.generate_s, strict=True)])
                if self.generate_s and min(self.generate_s) > 0
                else None
            ),
            "warmup_s": self.warmup_s,
            "warmup_tokens": self.warmup_tokens,
            "error": self.error,
            "stopped": self.stopped,
            "samples": {
                "generate_s": self.generate_s,
                "generate_cpu_s": self.generate_cpu_s,
                "generate_at": self.generate_at,
                "prefill_s": self.prefill_s,
                "first_s": self.first_s,
                "first_cpu_s": self.first_cpu_s,
                "prefill_first_s": self.prefill_first_s,
                "settle_s": self.settle_s,
            },
        }
        decode = None
        if g and p and self.work.new_tokens > 1:
            decode = max(g["median"] - p["median"], 0.0) / (self.work.new_tokens - 1)
        out["decode_s_per_token"] = decode
        # the warm-up's cost beyond a steady call of the same length: JIT / compile / allocator growth
        extra = None
        if self.warmup_s is not None and p and decode is not None and self.warmup_tokens:
            extra = self.warmup_s - (p["median"] + decode * (self.warmup_tokens - 1))
        out["first_call_extra_s"] = extra
        # the first full-length call beyond the later ones: costs paid once per new shape (a KV length the
        # warm-up did not reach: per-shape kernel plans, allocator growth) show here, not in the warm-up
        out["first_rep_extra_s"] = (
            self.generate_s[0] - statistics.median(self.generate_s[1:]) if len(self.generate_s) > 1 else None
        )
        return out


def _sample(
    call: Callable[[], Any],
    pre: Callable[[], Any],
    device: torch.device,
    w: WorkShape,
    *,
    first_seen: bool,
    prefill: bool,
    t0: float,
    settle: int = 0,
) -> dict[str, Any]:
    """One round's calls of one backend: first-seen then repeated on a new thread (``first_seen``), else
    repeated on this one; prefill the same way. ``settle``: calls between the two (timed, kept apart) for a
    backend whose kernels change with how often a shape was met (cudaload_sdpa: cuDNN from the third)."""

    def calls() -> dict[str, Any]:
        got: dict[str, Any] = {}
        if first_seen:
            got["first"] = timed(call, device)
            _check_length(got["first"][2], w)
        got["settle"] = [timed(call, device)[0] for _ in range(settle)]
        got["at"] = time.perf_counter() - t0
        got["repeated"] = timed(call, device)
        _check_length(got["repeated"][2], w)
        if prefill:
            got["prefill"] = timed(pre, device)[0]
        return got

    if not first_seen:
        return calls()
    got: dict[str, Any] = on_new_thread(calls, device)
    if prefill:
        got["prefill_first"] = on_new_thread(lambda: timed(pre, device)[0], device)
    return got


def _check_length(out: torch.Tensor, w: WorkShape) -> None:
    got = int(out.shape[-1]) - w.prompt
    if got != w.new_tokens:
        raise RuntimeError(f"generated {got} tokens, not {w.new_tokens}")


def error_line(e: BaseException) -> str:
    """``Type: first line of the message``, at most 300 characters: how a backend that failed is reported."""
    return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]


def run_rounds(
    models: Mapping[str, Any],
    works: Sequence[WorkShape],
    *,
    reps: int,
    deadline: float,
    pad_token_id: int = 0,
    warmup_tokens: int | None = 4,
    prefill: bool = True,
    first_seen: bool = True,
    settle: Mapping[str, int] | None = None,
    slow_factor: float = 2.0,
    log: Callable[[str], None] = lambda _m: None,
    t0: float | None = None,
) -> list[Measurement]:
    """Warm up every (backend, work), then take up to ``reps`` rounds of timed generate() calls of each,
    round by round over all works (so every row gets its first sample before any gets a third), the backends
    round-robin inside a work with the starting backend rotating each round. In a round each backend makes a
    first-seen and then a repeated call on a new thread (see the module's docstring); ``first_seen=False``:
    repeated calls only, on this thread (after the warm-up; pass ``warmup_tokens=None`` so that it covers
    every length).

    ``deadline`` is a ``time.perf_counter()`` value: a call is started only when its expected duration (its
    last sample, else its warm-up) fits before it. ``warmup_tokens`` caps the warm-up call's new tokens (the
    full prompt still runs, so prefill kernels for this shape are compiled; None: the full call). A backend
    more than ``slow_factor`` times slower than the fastest on a work after a round gets no further reps
    there once it has two samples. On any error the backend is dropped for that work.
    """
    t0 = time.perf_counter() if t0 is None else t0
    names = list(models)
    res: dict[tuple[str, str], Measurement] = {}
    inputs: dict[str, tuple[torch.Tensor, torch.Tensor | None]] = {}

    def get_inputs(w: WorkShape, model: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
        if w.name not in inputs:
            vocab = int(model.config.get_text_config().vocab_size)
            inputs[w.name] = make_inputs(w, vocab, model_device(model), pad_token_id=pad_token_id)
        return inputs[w.name]

    def fail(m: Measurement, e: BaseException) -> None:
        _fail(m, e, models, log)

    _warm_up(
        models,
        works,
        res,
        get_inputs,
        fail,
        deadline=deadline,
        warmup_tokens=warmup_tokens,
        prefill=prefill,
        pad_token_id=pad_token_id,
        log=log,
    )
    # timed rounds
    for r in range(reps):
        for w in works:
            order = names[r % len(names) :] + names[: r % len(names)]
            for b in order:
                m = res[(b, w.name)]
                if m.stopped or len(m.generate_s) > r:
                    continue
                model = models[b]
                ids, mask = get_inputs(w, model)
                calls = int((settle or {}).get(b, 0))
                est = _expected_sample_s(m, res, prefill=prefill, first_seen=first_seen, settle=calls)
                if time.perf_counter() + est > deadline:
                    m.stopped = "budget"
                    continue
                call = generate_call(model, ids, mask, w.new_tokens, pad_token_id=pad_token_id)
                pre = prefill_call(model, ids, mask)

                try:
                    got = _sample(
                        call,
                        pre,
                        ids.device,
                        w,
                        first_seen=first_seen,
                        prefill=prefill,
                        t0=t0,
                        settle=calls,
                    )
                except Exception as e:
                    fail(m, e)
                    continue
                s, cpu = _record(m, got, first_seen=first_seen, prefill=prefill)
                first = f", first-seen {m.first_s[-1]:.3f} s" if first_seen else ""
                log(f"  rep {r + 1} {b} {w.name}: repeated {s:.3f} s (cpu {cpu:.2f} s){first}")
            _stop_the_slow(
                [res[(b, w.name)] for b in names], slow_factor=slow_factor, last_round=r + 1 >= reps
            )
    for m in res.values():
        if m.stopped is None and len(m.generate_s) >= reps:
            m.stopped = "done"
    return [res[(b, w.name)] for w in works for b in names]


def _fail(m: Measurement, e: BaseException, models: Mapping[str, Any], log: Callable[[str], None]) -> None:
    """``m``'s backend dropped for its work with the error, the GPU's cached memory given back."""
    import torch

    m.error = error_line(e)
    m.stopped = "error"
    log(f"  {m.backend} {m.work.name}: {m.error}")
    if any(str(model_device(x)).startswith("cuda") for x in models.values()):
        torch.cuda.empty_cache()


def _warm_up(
    models: Mapping[str, Any],
    works: Sequence[WorkShape],
    res: dict[tuple[str, str], Measurement],
    get_inputs: Callable[[WorkShape, Any], tuple[torch.Tensor, torch.Tensor | None]],
    fail: Callable[[Measurement, BaseException], None],
    *,
    deadline: float,
    warmup_tokens: int | None,
    prefill: bool,
    pad_token_id: int,
    log: Callable[[str], None],
) -> None:
    """One call per (backend, work), its time kept as the first-use cost: each work's
    :class:`Measurement` of each backend lands in ``res``."""
    for w in works:
        for b in models:
            m = res[(b, w.name)] = Measurement(b, w)
            model = models[b]
            # a warm-up is expected to take as long as this backend's longest one so far (compiles recur)
            seen = [x.warmup_s for (bb, _w), x in res.items() if bb == b and x.warmup_s is not None]
            if time.perf_counter() + max(seen, default=0.0) >= deadline:
                m.stopped = "budget"
                continue
            ids, mask = get_inputs(w, model)
            n = w.new_tokens if warmup_tokens is None else min(w.new_tokens, max(2, warmup_tokens))
            try:
                s, _cpu, _ = timed(generate_call(model, ids, mask, n, pad_token_id=pad_token_id), ids.device)
            except Exception as e:
                fail(m, e)
                continue
            m.warmup_s, m.warmup_tokens = s, n
            if prefill:
                try:  # also warms the bare forward; its time turns the warm-up into a cost estimate
                    m.warmup_prefill_s = timed(prefill_call(model, ids, mask), ids.device)[0]
                except Exception as e:
                    fail(m, e)
                    continue
            log(f"  warm-up {b} {w.name}: {s:.3f} s ({n} tokens)")


def _expected_sample_s(
    m: Measurement,
    res: Mapping[tuple[str, str], Measurement],
    *,
    prefill: bool,
    first_seen: bool,
    settle: int,
) -> float:
    """How long a round's sample of ``m`` is expected to take: its last call, else its warm-up (bounded by the
    other backends' calls on the work), with its prefill, times the calls a first-seen sample makes."""
    w = m.work
    est = m.generate_s[-1] if m.generate_s else m.expected_s()
    others = [x.generate_s[-1] for (bb, ww), x in res.items() if ww == w.name and x.generate_s]
    if not m.generate_s and others:
        # a warm-up that paid a JIT overstates the per-token cost: the others' calls bound it
        est = min(est, 2 * max(others))
    if prefill:
        est += m.prefill_s[-1] if m.prefill_s else (m.warmup_prefill_s or 0.0)
    if first_seen:
        est *= 2 + settle
    return est


def _record(
    m: Measurement, got: Mapping[str, Any], *, first_seen: bool, prefill: bool
) -> tuple[float, float]:
    """A round's sample appended to ``m``; the repeated call's wall and CPU seconds."""
    if first_seen:
        m.first_s.append(got["first"][0])
        m.first_cpu_s.append(got["first"][1])
    m.settle_s.append(got["settle"])
    s, cpu, _out = got["repeated"]
    m.generate_s.append(s)
    m.generate_cpu_s.append(cpu)
    m.generate_at.append(got["at"])
    if prefill:
        m.prefill_s.append(got["prefill"])
        if first_seen:
            m.prefill_first_s.append(got["prefill_first"])
    return s, cpu


def _stop_the_slow(ms: Sequence[Measurement], *, slow_factor: float, last_round: bool) -> None:
    """After a round, stop the backends of one work (``ms``) far behind the fastest there: a backend has shown
    enough when its best of two or more calls is more than ``slow_factor`` times the fastest one's best (one
    sample never decides: a first full-length call can carry one-time costs), in both states (a backend far
    behind on repeated lengths can still win on first-seen ones)."""
    best = min((min(m.generate_s) for m in ms if m.generate_s), default=None)
    best_first = min((min(m.first_s) for m in ms if m.first_s), default=None)
    for m in ms:
        slow = best and len(m.generate_s) >= 2 and min(m.generate_s) > slow_factor * best
        if slow and best_first and m.first_s:
            slow = min(m.first_s) > slow_factor * best_first
        if slow and not m.stopped and not last_round:
            m.stopped = f"more than {slow_factor:g}x the fastest after {len(m.generate_s)} reps"


#: backends that compile on first use (transformers runs flex_attention through torch.compile,
#: integrations/flex_attention.py WrappedFlexAttention): timed in a pass of their own, after the others
COMPILED_BACKENDS = ("flex_attention",)


def measure_backends(
    models: Mapping[str, Any],
    works: Sequence[WorkShape],
    *,
    reps: int,
    deadline: float,
    compiled_share: float = 0.2,
    log: Callable[[str], None] = lambda _m: None,
    t0: float | None = None,
    pad_token_id: int = 0,
    settle: Mapping[str, int] | None = None,
) -> list[Measurement]:
    """:func:`run_rounds` over ``models``, the compiled backends in a second pass with ``compiled_share`` of
    the time left, so their compiles cannot starve the others' samples."""
    main = {b: m for b, m in models.items() if b not in COMPILED_BACKENDS}
    compiled = {b: m for b, m in models.items() if b in COMPILED_BACKENDS}
    reserve = compiled_share * max(0.0, deadline - time.perf_counter()) if compiled and main else 0.0
    out: list[Measurement] = []
    if main:
        out += run_rounds(
            main,
            works,
            reps=reps,
            deadline=deadline - reserve,
            log=log,
            t0=t0,
            pad_token_id=pad_token_id,
            settle=settle,
        )
    if compiled:
        log(f"compiled backends {list(compiled)}: {max(0, int(deadline - time.perf_counter()))} s")
        out += run_rounds(
            compiled, works, reps=reps, deadline=deadline, log=log, t0=t0, pad_token_id=pad_token_id
        )
    return out
