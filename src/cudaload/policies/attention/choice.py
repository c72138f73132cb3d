"""The choice among the valid candidates (``choose_attention``): the one that costs least, measured seconds
when the caller has them, else the cheapest safe default.

1. ``timings`` given (backend -> steady-state seconds of the declared work, measured by ``cudaload tune`` or a
   shipped prior): the valid measured backend with the least ``timings[b] + first-use seconds not yet paid``.
2. No timings (no declared work, or nothing measured for it): never pay seconds for nothing, and never do
   worse than plain transformers, whose default is sdpa. Which backend wins generate() depends on the work:
   on the H200 (transformers 5.17) sdpa wins 4 of 7 shapes at the best of 2-3 calls but few where first calls
   meet new decode lengths and torch 2.11's cuDNN SDPA builds a plan for each (40-60 ms;
   benchmarks/results/2026-12-01-h200/README.md); FA4 costs 2.7-9.7 s of import plus
   ~3 s of JIT in every fresh process. So sdpa where valid; where it is not (soft-capping, models without SDPA), an
   ahead-of-time compiled flash build (no JIT) or eager.
2b. Training (no timings: those are generate() seconds) is a different question: the backends measured for
   training on this architecture, fastest first, then the flash kernels with a varlen forward and backward
   (they keep packed sequences apart), then sdpa (``_training_order``); one-time seconds are amortised.
3. A declared single short sequence for inference picks eager (measured: 1 x 512 + 32, eager 1.03 s vs sdpa
   1.07 s vs FA4 1.84 s), unless timings say otherwise or ``cudaload_sdpa`` is the default here (2.): against
   it, on first-seen lengths, eager was slower on the H200's 8B shape (see ``_SHORT_DECODE_YIELDS``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property

from ...capabilities import Capabilities
from ...errors import InvalidChoiceError
from ...model_info import ModelInfo
from ...plans.decision import Candidate, Decision
from .. import sdpa_dispatch
from ..sdpa_dispatch import SDPA_DECODE, SDPA_NO_CUDNN, SdpaFacts
from ..training.compile import layer_compile_problems
from ..training_facts import LayerCompileFacts, TrainingFacts, layer_compile_facts_for, training_facts_for
from .candidates import _candidates
from .first_use import FIRST_USE
from .names import _TRAINING, _VLLM_FA3, ALL_NAMES, HUB_KERNEL, SHORT_DECODE_MAX_TOKENS, TORCH_VARLEN, VARLEN
from .query import AttentionFacts, AttentionQuery, AttentionTimings


def _fmt(s: float) -> str:
    return f"{s:.2f} s" if s < 100 else f"{s:.0f} s"


def _static_order(caps: Capabilities) -> tuple[str, ...]:
    """Preference without measurements: sdpa, then ahead-of-time compiled flash builds for this architecture
    (no JIT), then FA4 and flex_attention (compiled at first use), then eager. For inference the caller moves
    every backend with a first-use cost behind eager."""
    gpu = caps.gpus[0] if caps.gpus else None
    if gpu is None or gpu.compute_capability < (8, 0):
        aot: tuple[str, ...] = ()
    elif gpu.compute_capability[0] == 9:
        aot = ("flash_attention_3", _VLLM_FA3, "flash_attention_2", HUB_KERNEL["flash_attention_2"])
    else:
        aot = ("flash_attention_2", HUB_KERNEL["flash_attention_2"], "flash_attention_3", _VLLM_FA3)
    jit = ("flash_attention_4", HUB_KERNEL["flash_attention_4"], "flex_attention")
    return ("sdpa", *aot, *jit, "eager")


def _ordered(cands: list[Candidate], chosen: str, caps: Capabilities) -> tuple[Candidate, ...]:
    """Candidates in the order a runtime fallback should walk them (cudaload.execute._next_attention takes the
    next valid one after the failed choice): the choice, then torch's own sdpa and eager, which need nothing
    else to work, then the rest by preference; rejected ones last, in the architecture's order."""
    by = {c.name: c for c in cands}
    names = [chosen, "sdpa", "eager", *_static_order(caps), *(c.name for c in cands)]
    seen: list[str] = []
    for n in names:
        if n in by and n not in seen:
            seen.append(n)
    ok = [by[n] for n in seen if by[n].ok]
    return (*ok, *(by[n] for n in seen if not by[n].ok))


def choose_attention(
    info: ModelInfo,
    caps: Capabilities,
    *,
    dtype: str,
    intent: str = "inference",
    requested: str = "auto",
    trust: Sequence[str] = (),
    revision: str | None = None,
    work: tuple[int, int] | None = None,
    timings: Mapping[str, float] | None = None,
    timings_source: str | None = None,
    first_use: Mapping[str, float] | None = None,
    timings_repeated: Mapping[str, float] | None = None,
    sdpa_facts: Sequence[SdpaFacts] = (),
    training_facts: Sequence[TrainingFacts] = (),
    layer_compile_facts: Sequence[LayerCompileFacts] = (),
) -> Decision:
    """``attn_implementation`` for ``info`` (a :class:`cudaload.model_info.ModelInfo`) on ``caps``: the keyword
    form of :func:`select_attention`, each keyword a field of its :class:`AttentionQuery` (``dtype``,
    ``intent``, ``requested``, ``trust``, ``revision``, ``work``) or :class:`AttentionFacts` (``timings``,
    ``timings_source`` and ``timings_repeated`` as :class:`AttentionTimings`; ``first_use``; ``sdpa_facts``;
    ``training_facts``; ``layer_compile_facts`` as its ``layer_compile``).

    "auto" never raises: eager always qualifies. An explicit name is honoured when valid, else
    InvalidChoiceError with every reason.

    ``work``: the (batch_size, seq_len) the caller declared, None when it did not.
    ``timings``: backend name (as in :data:`ALL_NAMES`) -> steady-state seconds of the declared work on this
    GPU, lower is better; names that are not valid here are ignored (and said so).
    ``timings_source``: where the timings come from, shown in the reasons, e.g. "measured on this GPU on
    2026-12-01" or "shipped prior: H200, 2026-12-01, torch 2.11, transformers 5.17".
    ``first_use``: backend -> one-time seconds this process would still pay (import, JIT); overrides the
    shipped :data:`FIRST_USE` per name (pass 0.0 for a backend already imported and compiled here).
    ``timings`` are for the state a new process is in (lengths it has not met); ``timings_repeated``, the
    same work on lengths already met, is shown beside them and not weighed.
    ``sdpa_facts``: what was measured about SDPA's cuDNN dispatch (:mod:`cudaload.policies.sdpa_dispatch`);
    where they say leaving cuDNN out of decode helps on this GPU, the default is ``cudaload_sdpa``.
    ``training_facts``: training throughput measured per backend (:mod:`cudaload.policies.training_facts`); for a
    training intent the measured backends valid here rank first (:func:`_training_order`).
    """
    return select_attention(
        info,
        caps,
        AttentionQuery(dtype, intent, requested, trust, revision, work),
        AttentionFacts(
            AttentionTimings(timings, timings_source, timings_repeated),
            first_use,
            sdpa_facts,
            training_facts,
            layer_compile_facts,
        ),
    )


def select_attention(
    info: ModelInfo, caps: Capabilities, query: AttentionQuery, facts: AttentionFacts | None = None
) -> Decision:
    """``attn_implementation`` for ``info`` on ``caps``, asked as :class:`AttentionQuery` with the measured
    :class:`AttentionFacts` (none: the rules alone). An explicit ``query.requested`` is honoured when valid,
    else InvalidChoiceError with every reason; "auto" weighs measured seconds when there are any for a valid
    backend (:func:`_by_timings`), else follows the rules (:func:`_by_rules`)."""
    facts = facts if facts is not None else AttentionFacts()
    work = query.work
    pool = _Pool.of(
        _candidates(
            info,
            caps,
            query.dtype,
            query.intent,
            query.trust,
            query.revision,
            work[1] if work else None,
            facts.sdpa,
        ),
        _Costs.of(facts.first_use),
        caps,
    )
    t = facts.timings
    measured = {
        n: float(s) for n, s in (t.seconds or {}).items() if n in pool.by and s is not None and s >= 0
    }
    source = t.source or "timings given by the caller"
    if query.requested != "auto":
        return _explicit(pool, query.requested.strip(), measured, source)
    ignored = sorted(n for n in measured if not pool.by[n].ok)
    usable, dominated = _pool_sdpa_twins({n: s for n, s in measured.items() if pool.by[n].ok})
    if usable:
        return _by_timings(pool, usable, dominated, ignored=ignored, source=source, repeated=t.repeated)
    if not t.seconds:
        note = ["no timings for this GPU and work: the choice follows the rules above"]
    else:
        note = [
            f"{source} covers no valid backend"
            + (f" ({', '.join(ignored)} not valid here)" if ignored else "")
        ]
    return _by_rules(info, pool, query, facts, note)


@dataclass(frozen=True)
class _Costs:
    """Backend -> (one-time seconds a process still pays, where the figure is from): the shipped
    :data:`FIRST_USE`, with the caller's figures over it."""

    table: Mapping[str, tuple[float, str]]

    @classmethod
    def of(cls, first_use: Mapping[str, float] | None) -> _Costs:
        costs: dict[str, tuple[float, str]] = {n: (f.seconds, f.source) for n, f in FIRST_USE.items()}
        for n, sec in (first_use or {}).items():
            costs[n] = (float(sec), "given by the caller")
        return cls(costs)

    def __call__(self, name: str) -> float:
        return self.table.get(name, (0.0, ""))[0]


@dataclass(frozen=True)
class _Pool:
    """Every candidate (each valid one with what it would still cost once, so explain() shows it beside it), the
    costs, and the machine the runtime fallback order is built for."""

    cands: tuple[Candidate, ...]
    cost: _Costs
    caps: Capabilities

    @classmethod
    def of(cls, cands: list[Candidate], cost: _Costs, caps: Capabilities) -> _Pool:
        noted = tuple(
            Candidate(
                c.name, True, (*c.reasons, f"first use: +{_fmt(cost(c.name))} ({cost.table[c.name][1]})")
            )
            if c.ok and cost(c.name) > 0
            else c
            for c in cands
        )
        return cls(noted, cost, caps)

    @cached_property
    def by(self) -> dict[str, Candidate]:
        return {c.name: c for c in self.cands}

    @property
    def valid(self) -> list[str]:
        return [c.name for c in self.cands if c.ok]

    def decision(self, chosen: str, reasons: Sequence[str], *, explicit: bool = False) -> Decision:
        """The Decision for ``chosen``, its candidates in the runtime fallback order (:func:`_ordered`)."""
        return Decision(
            chosen, tuple(reasons), _ordered(list(self.cands), chosen, self.caps), explicit=explicit
        )


def _explicit(pool: _Pool, name: str, measured: Mapping[str, float], source: str) -> Decision:
    """A backend asked for by name: honoured when valid, with any timings shown; else InvalidChoiceError."""
    if name not in pool.by:
        raise InvalidChoiceError(
            f"attn={name!r} is not an attention implementation cudaload plans",
            fix=f"use 'auto' or one of: {', '.join(ALL_NAMES)}",
        )
    c = pool.by[name]
    if not c.ok:
        raise InvalidChoiceError(
            f"attn={name} cannot be used here",
            reasons=c.reasons,
            fix="use attn='auto' to take the best valid backend, or fix the first reason",
        )
    extra: list[str] = []
    ok_measured = {n: t for n, t in measured.items() if pool.by[n].ok}
    if ok_measured:
        extra.append(
            f"{source}: "
            + ", ".join(f"{n} {_fmt(t)}" for n, t in sorted(ok_measured.items(), key=lambda kv: kv[1]))
        )
    return pool.decision(name, ("requested explicitly", *c.reasons, *extra), explicit=True)


def _by_timings(
    pool: _Pool,
    usable: Mapping[str, float],
    dominated: set[str],
    *,
    ignored: list[str],
    source: str,
    repeated: Mapping[str, float] | None,
) -> Decision:
    """The valid measured backend with the least steady-state seconds plus first-use seconds not yet paid."""
    cost = pool.cost
    valid = pool.valid
    total = {n: t + cost(n) for n, t in usable.items()}
    best = min(total, key=lambda n: (total[n], valid.index(n)))
    ranked = sorted(total, key=lambda n: total[n])
    reasons = [
        f"{source}: " + ", ".join(f"{n} {_fmt(usable[n])}" for n in sorted(usable, key=lambda n: usable[n])),
    ]
    paid = [n for n in ranked if cost(n) > 0]
    if paid:
        reasons.append(
            "first use not yet paid in this process: " + ", ".join(f"{n} +{_fmt(cost(n))}" for n in paid)
        )
        reasons.append("steady state + first use: " + ", ".join(f"{n} {_fmt(total[n])}" for n in ranked))
    rep_ok = {n: float(t) for n, t in (repeated or {}).items() if n in usable}
    if rep_ok:
        reasons.append(
            "the same work on lengths already met (not weighed: a new process has met none): "
            + ", ".join(f"{n} {_fmt(rep_ok[n])}" for n in sorted(rep_ok, key=lambda n: rep_ok[n]))
        )
    reasons.append(f"{best} costs least on the declared work")
    if ignored:
        reasons.append("measured but not valid here: " + ", ".join(ignored))
    unmeasured = [n for n in valid if n not in usable and n not in dominated]
    if unmeasured:
        reasons.append("valid but not measured (not weighed): " + ", ".join(unmeasured))
    if dominated:
        reasons.append(
            f"{SDPA_DECODE} weighed at the lower of its and {SDPA_NO_CUDNN}'s seconds: on lengths met for the "
            "first times both run the same kernels (their difference is the host's noise), and where lengths "
            f"recur {SDPA_NO_CUDNN} keeps cuDNN out, which is equal or slower there"
        )
    return pool.decision(best, reasons + list(pool.by[best].reasons))


def _by_rules(
    info: ModelInfo, pool: _Pool, query: AttentionQuery, facts: AttentionFacts, note: list[str]
) -> Decision:
    """No timings for a valid backend: eager for one short declared sequence (unless cudaload_sdpa is the
    default here), training's order for a training intent, else the inference default (:func:`_default`)."""
    by = pool.by
    short = _short_decode(query.work, query.intent, pool.caps)
    variant = _sdpa_variant(pool.caps, by, facts.sdpa)
    if short and variant is None:
        return pool.decision("eager", (short, *by["eager"].reasons, *note))
    if short:
        note = [f"{short}; {_SHORT_DECODE_YIELDS}", *note]
    if query.intent in _TRAINING:
        order, train_why = _training_order(
            pool.caps, by, facts.training, _compiled_gain(info, pool.caps, query, facts.layer_compile)
        )
        chosen = next(n for n in order if by[n].ok)
        return pool.decision(chosen, (*train_why(chosen), *by[chosen].reasons))
    return _default(pool, variant, note)


def _default(pool: _Pool, variant: tuple[str, list[str]] | None, note: list[str]) -> Decision:
    """Inference without measurements pays no one-time seconds: eager (none) beats FA4 / flex (seconds). sdpa
    where valid (``variant``: cudaload_sdpa in its place where measured to help here)."""
    by, cost, valid = pool.by, pool.cost, pool.valid
    order = _static_order(pool.caps)
    order = tuple(n for n in order if cost(n) == 0) + tuple(n for n in order if cost(n) > 0)
    chosen = next(n for n in order if by[n].ok)
    reasons = []
    if chosen == "sdpa" and variant is not None:
        chosen, why = variant
        reasons += why
    elif chosen == "sdpa":
        reasons.append(
            "sdpa: no import or compile cost, and what plain transformers uses (declare the work -- batch_size, "
            "seq_len, new_tokens -- to choose from measured generate() timings instead)"
        )
    else:
        skipped = [n for n in order[: order.index(chosen)] if n in by]
        reasons.append(f"preferred but rejected: {', '.join(skipped)}" if skipped else "first choice")
        dearer = [n for n in valid if cost(n) > 0 and n != chosen]
        if dearer:
            reasons.append(
                "no timings, so no one-time seconds are paid for an unknown gain: "
                + ", ".join(f"{n} would cost +{_fmt(cost(n))} first" for n in dearer)
            )
    faster_unknown = [n for n in valid if n not in ("sdpa", "eager", chosen)]
    if faster_unknown and chosen == "sdpa":
        reasons.append(
            "also valid, not measured here: "
            + ", ".join(faster_unknown)
            + " (`cudaload tune` measures them on this GPU)"
        )
    return pool.decision(chosen, reasons + note + list(by[chosen].reasons))


#: attention implementations with a varlen forward and backward, in the order the rules prefer them per
#: architecture where nothing was measured: the kernel written for the architecture first (FA3 for Hopper:
#: hopper/ in flash-attention; FA4 for Blackwell and Hopper: flash_attn/cute; FA2 for Ampere), then the others
#: the flash rules admit there
def _varlen_rule_order(caps: Capabilities) -> tuple[str, ...]:
    major = caps.gpus[0].compute_capability[0] if caps.gpus else 0
    fa4 = ("flash_attention_4", HUB_KERNEL["flash_attention_4"])
    fa3 = ("flash_attention_3", _VLLM_FA3)
    fa2 = ("flash_attention_2", HUB_KERNEL["flash_attention_2"])
    if major >= 10:
        return (*fa4, *fa2)
    if major == 9:
        return (*fa3, *fa4, *fa2)
    return (*fa2, *fa3, *fa4)


def _compiled_gain(
    info: ModelInfo, caps: Capabilities, query: AttentionQuery, facts: Sequence[LayerCompileFacts]
) -> Callable[[str], LayerCompileFacts | None]:
    """For a backend, the record of its packed training steps measured faster with compiled decoder layers on this
    GPU's architecture, where the plan would compile them (cudaload.policies.training.compile: the same problems,
    the planner's own test of a causal LM; several GPUs taken as several ranks, padded steps as not packed);
    else None."""
    causal = info.auto_class == "AutoModelForCausalLM" and info.can_generate and not info.summary.is_encoder
    ranks = caps.distributed.world_size or len(caps.gpus)
    bad = layer_compile_problems(
        caps,
        intent=query.intent,
        parallel=ranks > 1,
        remote_code=info.remote_code,
        causal_lm=causal,
        moe=info.summary.is_moe,
    )
    if bad or query.batch_layout == "padded":
        return lambda name: None

    def gain(name: str) -> LayerCompileFacts | None:
        f = layer_compile_facts_for(caps, facts, intent=query.intent, layout="packed", attention=name)
        return f if f is not None and f.saved_per_step_s > 0 else None

    return gain


def _borrowed_rates(
    f: TrainingFacts, facts: Sequence[TrainingFacts]
) -> dict[str, tuple[float, TrainingFacts, str]]:
    """Backends ``f`` did not measure, from the newest other record of the same architecture, intent and layout
    that measured them beside a backend ``f`` did: that record's ratio applied to ``f``'s figure (the decode
    facts borrow the same way: cudaload.policies.decode_facts ``with_graphed``). Backend -> (tokens/s, the record,
    the backend both measured)."""
    sm = f.gpu.rsplit("/", 1)[-1]
    out: dict[str, tuple[float, TrainingFacts, str]] = {}
    for other in sorted(facts, key=lambda r: r.date, reverse=True):
        if (
            other is f
            or other.gpu.rsplit("/", 1)[-1] != sm
            or (other.intent, other.layout) != (f.intent, f.layout)
        ):
            continue
        common = next(
            (c for c in other.tokens_per_s if c in f.tokens_per_s and other.tokens_per_s[c] > 0), None
        )
        if common is None:
            continue
        for n, v in other.tokens_per_s.items():
            if n not in f.tokens_per_s and n not in out:
                out[n] = (f.tokens_per_s[common] * v / other.tokens_per_s[common], other, common)
    return out


def _training_order(
    caps: Capabilities,
    by: Mapping[str, Candidate],
    facts: Sequence[TrainingFacts],
    compiled: Callable[[str], LayerCompileFacts | None] = lambda name: None,
) -> tuple[tuple[str, ...], Callable[[str], list[str]]]:
    """Training's preference: the varlen flash kernels (those measured on this GPU's architecture fastest first,
    then the flash packages in :func:`_varlen_rule_order`, then ``cudaload_varlen``, torch's own flash kernels
    that need no package), then sdpa, flex_attention and eager. A measured backend whose layers were also measured
    compiled (``compiled``) ranks at its compiled rate: a run long enough to repay the compile gets it
    (cudaload.training_setup), as a run long enough amortises any backend's first-use seconds. Returns the order
    and a function giving the chosen backend's reasons."""
    f = training_facts_for(caps, facts)
    eager = dict(f.tokens_per_s) if f is not None else {}
    borrowed = _borrowed_rates(f, facts) if f is not None else {}
    # a scaled-in figure ranks only beside a varlen kernel this record measured and that is valid here (what it was
    # scaled against): with none, an installed flash package the records never measured keeps its place ahead of
    # cudaload_varlen, as an unmeasured one does (the order below)
    if not any(n in VARLEN and n in by and by[n].ok for n in eager):
        borrowed = {}
    eager.update({n: b[0] for n, b in borrowed.items()})

    def rate(n: str) -> float:
        c = compiled(n)
        return eager[n] * (c.step_s / c.compiled_step_s if c is not None else 1.0)

    measured = sorted((n for n in eager if n in by and by[n].ok), key=lambda n: -rate(n))
    # a measurement reorders what it measured against each other, not the classes: a valid varlen kernel, even
    # unmeasured here, goes before sdpa (which packs with a tokens x tokens mask), as every measured one did
    # (cudaload_varlen after the flash packages: an installed package is the user's choice, and one measured
    # faster stays ahead; measured faster itself, it goes first like any measured varlen kernel)
    varlen = [*(n for n in measured if n in VARLEN), *_varlen_rule_order(caps), TORCH_VARLEN]
    rest = [*(n for n in measured if n not in VARLEN), "sdpa", "flex_attention", "eager"]
    order = tuple(dict.fromkeys((*varlen, *rest, *by)))

    def why(chosen: str) -> list[str]:
        out: list[str] = []
        if f is not None and chosen in measured:
            out.append(
                f"training: measured on {f.gpu.split('/')[0]} ({f.model}, {f.intent}, {f.layout} steps, "
                f"{f.date}): "
                + ", ".join(
                    f"{n} {f.tokens_per_s[n]:,.0f}"
                    for n in sorted(f.tokens_per_s, key=lambda n: -f.tokens_per_s[n])
                )
                + f" tokens/s ({f.source})"
            )
            for n in (n for n in measured if n in borrowed and n == chosen):
                v, other, common = borrowed[n]
                out.append(
                    f"{n} ~{v:,.0f} tokens/s here: measured on {other.gpu.split('/')[0]} (the same architecture, "
                    f"{other.date}) at {other.tokens_per_s[n]:,.0f} against its {common} "
                    f"{other.tokens_per_s[common]:,.0f}, scaled to this record's {common}"
                )
            for n in (n for n in measured if compiled(n) is not None and n == chosen):
                c = compiled(n)
                assert c is not None
                out.append(
                    f"{n} with compiled decoder layers: ~{rate(n):,.0f} tokens/s ({c.step_s / c.compiled_step_s:.2f}x "
                    f"the eager step, {c.gpu.split('/')[0]}, {c.date}), where the run repays the compile"
                )
            unmeasured = [
                n
                for n in (*_varlen_rule_order(caps), TORCH_VARLEN)
                if n in by and by[n].ok and n not in eager
            ]
            if unmeasured:
                out.append("also valid, not measured for training here: " + ", ".join(unmeasured))
        elif chosen == TORCH_VARLEN:
            skipped = [n for n in _varlen_rule_order(caps) if n in by]
            out.append(
                "training: torch's own flash kernels with a varlen forward and backward (cudaload_varlen): packed "
                "sequences kept apart by their boundaries, no mask and no padding computed, no flash-attn package"
                + (f" ({', '.join(skipped)} rejected below)" if skipped else "")
            )
        elif chosen in VARLEN:
            out.append(
                "training: a flash kernel with varlen forward and backward: packed sequences kept apart by their "
                "boundaries, no mask and no padding computed; its first-use seconds are amortised over the run"
            )
        else:
            skipped = [n for n in _varlen_rule_order(caps) if n in by]
            out.append(
                "training: no flash kernel with a varlen forward and backward is valid here"
                + (f" ({', '.join(skipped)} rejected below)" if skipped else "")
                + f"; {chosen} is the next preference"
            )
        return out

    return order, why


def _pool_sdpa_twins(measured: Mapping[str, float]) -> tuple[dict[str, float], set[str]]:
    """cudaload_sdpa and cudaload_sdpa_nocudnn measured side by side are two samples of one quantity on
    first-seen lengths (neither lets cuDNN take a shape met fewer than twice): cudaload_sdpa is weighed at the
    lower of the two, as either name would have been chosen at it, and cudaload_sdpa_nocudnn, equal or slower
    where lengths recur, is not chosen automatically (it stays valid for an explicit attn=). Returns (the timings to weigh, the names folded in)."""
    out = dict(measured)
    if SDPA_NO_CUDNN in out and SDPA_DECODE in out:
        out[SDPA_DECODE] = min(out[SDPA_DECODE], out.pop(SDPA_NO_CUDNN))
        return out, {SDPA_NO_CUDNN}
    return out, set()


def _sdpa_variant(
    caps: Capabilities, by: Mapping[str, Candidate], facts: Sequence[SdpaFacts]
) -> tuple[str, list[str]] | None:
    """``cudaload_sdpa`` in place of sdpa, with why, where it is valid here and measured to help on this GPU
    (inference: training chooses by :func:`_training_order`)."""
    c = by.get(SDPA_DECODE)
    if c is None or not c.ok:
        return None
    f = sdpa_dispatch.facts_for(caps, facts, SDPA_DECODE)
    if f is None or not f.helps:
        return None
    # why cuDNN's per-length build matters and what was measured are the candidate's own reasons, which the
    # Decision lists after these: said once
    return SDPA_DECODE, [
        f"sdpa, without cuDNN on lengths met for the first times: measured to help on this GPU (below); a shape "
        f"met {sdpa_dispatch.RECUR}+ times before (a padded decode step {sdpa_dispatch.RECUR_MASKED_DECODE}+ "
        "times, an unpadded one never) goes to cuDNN, whose graph is then built once; load_model "
        "checks on the GPU that cuDNN takes decode calls, else keeps sdpa",
    ]


#: Why the short-decode rule gives way to cudaload_sdpa: its measurement was against plain sdpa on repeated
#: lengths; against cudaload_sdpa on first-seen ones eager lost (benchmarks/results/2026-12-02-h200/README.md)
_SHORT_DECODE_YIELDS = (
    f"not applied: against {SDPA_DECODE} on lengths met for the first time eager was slower on the H200's "
    "8B shape (1 x 512 + 32: 1.51 s vs 1.07 s; 1 x 256 + 256: 9.15 s vs 8.44 s) and within noise on 0.6B "
    "(1 x 512 + 32: 1.09 s vs 1.16 s)"
)


def _short_decode(work: tuple[int, int] | None, intent: str, caps: Capabilities) -> str | None:
    """Why the declared work is single-sequence short decode, where eager beat plain sdpa; None when it is not.
    The caller does not apply it where cudaload_sdpa is the default (:data:`_SHORT_DECODE_YIELDS`)."""
    if work is None or intent != "inference" or not caps.gpus:
        return None
    batch, seq = work
    if batch != 1 or seq > SHORT_DECODE_MAX_TOKENS or caps.gpus[0].compute_capability < (8, 0):
        return None
    return (
        f"declared work: 1 sequence of at most {seq} tokens, so decoding dominates and each step's host-side "
        "overhead decides; eager's plain kernels had the least (H200, 2026-11-30: 1 x 512 + 32 tokens, eager "
        "1.03 s, sdpa 1.07 s, flash_attention_4 1.84 s)"
    )
