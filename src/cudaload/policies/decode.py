"""How generate() decodes (issue 35): transformers' dynamic cache, or a static cache whose decode step
generate() compiles (CUDA graphs through torch.compile's ``reduce-overhead``), decided from the declared work and
what was measured (:mod:`cudaload.policies.decode_facts`). Pure: the planner passes the facts, whether the
compile cache is warm (:func:`cudaload.compile_cache.present` of :func:`decode_cache_key`) and which static
cache lengths fit in memory.

The compile is the price: ~58 s cold, 11-13 s from cudaload's saved artifacts on the H200 for the 8B shape,
against decode steps ~5.5x faster after it (6.0-6.3 ms at 2,048 slots, 6.2 at 6,144, a process's first calls
8-10, against the dynamic path's 30-44 ms; measured: benchmarks/results/2026-12-03-h200/README.md; the compiled step runs
cudaload_sdpa's grouped decode attention, :mod:`cudaload.execute.runtime.sdpa_decode`, and generate() reads its stop one step
late, :mod:`cudaload.execute.runtime.decode_loop`). So:

* no work declared: ``dynamic`` at load, nothing compiled; with ``decode='auto'`` where the compiled path can run
  here and a measurement speaks for the GPU, each ``generate()`` call then decides its own decode from the call
  (``per_call``: :mod:`cudaload.policies.decode_call`), so only a call whose decode steps pay a compile back
  compiles;
* work declared (new tokens per call x calls, batch, the longest sequence): each mode's job seconds, and
  ``compiled`` only when it saves at least :data:`MARGIN` of the dynamic job (estimates, not a stopwatch);
* ``compiled`` is refused where generate() would not compile (a bitsandbytes model, offload, weights on the CPU,
  no CUDA GPU, a model without an attention KV cache), where cudaload has not measured it (a model split over
  several GPUs), and without a declared ``seq_len`` (the static cache's length).

A static cache's length is fixed per compile: the cache is one of :func:`cache_lengths`' buckets, the smallest
that holds the declared longest sequence, so calls of any length up to it reuse one graph.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ..capabilities import Capabilities
from ..errors import InvalidChoiceError
from ..model_info import ModelSummary
from ..plans.decision import Candidate, Decision
from ..plans.decode import DecodePlan, DecodeWork, PerCallDecode
from .decode_facts import DecodeFacts, QuantDecodeCost, Scaled, decode_facts_for, scaled, with_graphed
from .decode_key import COMPILE_CONFIG, cache_key_from, decode_cache_key, decode_key_base
from .decode_query import DecodeCosts, DecodeModel, DecodeQuery, Placement, RequestedDecode, StaticCache
from .dtype import dtype_bytes
from .sdpa_dispatch import NAMES as SDPA_VARIANTS
from .serving.batching import HBM_BYTES_S, hbm_bandwidth

__all__ = [
    "BUCKET_MIN",
    "COMPILE_CONFIG",
    "MARGIN",
    "DecodeCosts",
    "DecodeFacts",
    "DecodeModel",
    "DecodeQuery",
    "Placement",
    "RequestedDecode",
    "StaticCache",
    "bound_ms",
    "bucket_for",
    "cache_key_from",
    "cache_lengths",
    "choose_decode",
    "decode_cache_key",
    "decode_facts_for",
    "decode_key_base",
    "quant_decode_cost",
    "scaled_facts",
    "select_decode",
    "static_cache_length",
]

#: ``compiled`` must make the declared job at least this much shorter (the per-token and compile figures are
#: estimates from one GPU's measurements; a tie goes to the path that compiles nothing)
MARGIN = 0.10
#: the smallest static-cache bucket: below it the static cache's attention over empty slots costs little, and a
#: handful of short buckets would each compile once
BUCKET_MIN = 1024
#: above this bucket the buckets grow by :data:`BUCKET_STEP` instead of doubling: the compiled step's time grows
#: with the static cache's slots, used or not (H200, 8B, grouped decode attention: ~0.1 ms per 1,000 slots in
#: the kernel timings, below the calls' noise: 6.0-6.3 ms/token at 2,048 slots, 6.2 at 6,144; 1.6 ms per 1,000
#: with sdpa's memory-efficient kernel; benchmarks/results/2026-12-03-h200/README.md), and a doubled bucket holds
#: twice the static cache's memory
BUCKET_DOUBLING_UNTIL = 4096
#: a decode measurement speaks for models whose weights are within this factor of the measured model's
SCALE_LIMIT = 4.0
BUCKET_STEP = 2048
#: bitsandbytes' quantizers do not override ``is_compileable`` (transformers 5.17 quantizers/base.py:260-263
#: returns False), and generate() drops the compile for such a model (generation/utils.py:2274-2276): a
#: static cache without the compile is slower than the dynamic one
_BNB = ("int8", "nf4")
_HOW_TO_DECLARE = (
    "declare the work to weigh a compile: new_tokens= (each call's) and generate_calls= (how many calls), with "
    "seq_len= (the longest prompt + new tokens) and batch_size=, on cudaload.plan() / load_model(); "
    "--new-tokens, --generate-calls, --seq-len, --batch-size on `cudaload plan`"
)


def cache_lengths(max_positions: int | None, seq_len: int) -> tuple[int, ...]:
    """The static cache's buckets: powers of two from :data:`BUCKET_MIN` to :data:`BUCKET_DOUBLING_UNTIL`, then
    steps of :data:`BUCKET_STEP`, up to the model's context (and the context itself where it is not on that
    grid), or up to the first bucket that holds ``seq_len`` where the context is unknown or shorter."""
    top = max(max_positions or 0, seq_len)
    out: list[int] = []
    b = BUCKET_MIN
    while b < top:
        out.append(b)
        b = b * 2 if b < BUCKET_DOUBLING_UNTIL else b + BUCKET_STEP
    out.append(top if max_positions and top == max_positions else b)
    return tuple(sorted(set(out)))


def bucket_for(seq_len: int, buckets: Sequence[int]) -> int | None:
    """The smallest bucket that holds ``seq_len`` tokens."""
    return next((b for b in sorted(buckets) if b >= seq_len), None)


def static_cache_length(
    seq_len: int, buckets: Sequence[int], unfit: Mapping[int, str]
) -> tuple[int | None, tuple[str, ...]]:
    """The static cache's length: the bucket that holds ``seq_len``, else (its cache does not fit in memory:
    ``unfit`` says why) ``seq_len`` itself, a bucket of one length; None when neither fits. With the reasons."""
    why: list[str] = []
    for n in dict.fromkeys(x for x in (bucket_for(seq_len, buckets), seq_len) if x is not None):
        if n not in unfit:
            return n, tuple(why)
        why.append(f"a static cache of {n:,} slots does not fit: {unfit[n]}")
    return None, tuple(why)


def scaled_facts(
    caps: Capabilities, facts: Sequence[DecodeFacts], model: ModelSummary, dtype: str
) -> Scaled | None:
    """The record that speaks for this GPU, scaled to ``model`` in ``dtype`` (None: none does)."""
    f = decode_facts_for(caps, facts)
    if f is None:
        return None
    f = with_graphed(f, facts)
    weights = int(model.params * dtype_bytes(dtype))
    if model.is_moe:
        return None  # a token reads only its routed experts: the dense record's time per weight byte does not apply
    if not 1 / SCALE_LIMIT <= weights / f.weight_bytes <= SCALE_LIMIT:
        # batch-1 decode of the measured 8B runs ~10x above its memory bound (launches and host work, not weight
        # reads): scaling its times by weight bytes says nothing about a model far from its size
        return None
    return scaled(f, weights, model.layers, caps.gpus[0].name)


def quant_decode_cost(
    caps: Capabilities,
    facts: Sequence[DecodeFacts],
    model: ModelSummary,
    dtype: str,
    seq_len: int,
    steps: int | None,
) -> QuantDecodeCost | None:
    """What the fit ladder weighs about each quantized rung's decode speed: the newest record's relative times
    (they are ratios, so they speak for any GPU, and say where they were measured), this model's unquantized
    dynamic ms per token where a record speaks for this GPU, and the declared decode steps."""
    pool = [f for f in facts if f.relative_decode()]
    if not pool:
        return None
    here = decode_facts_for(caps, pool)
    f = here or max(pool, key=lambda r: r.date)
    s = scaled(f, int(model.params * dtype_bytes(dtype)), model.layers)
    return QuantDecodeCost(
        relative=f.relative_decode(),
        source=f"measured on the {f.gpu_name}, {f.model} shape, {f.quantized_work}",
        ms_per_token=s.dynamic_ms(seq_len) if here is not None else None,
        steps=steps,
    )


def choose_decode(
    *,
    intent: str,
    can_generate: bool,
    work: DecodeWork,
    quantization: str | None,
    offload: bool,
    gpu_devices: int,
    has_gpu: bool,
    facts: Scaled | None,
    max_cache_len: int | None,
    cache_buckets: Sequence[int] = (),
    cache_len_reasons: Sequence[str] = (),
    warm: bool = False,
    cache_key: str | None = None,
    requested: RequestedDecode = "auto",
    assumed: Sequence[str] = (),
    bound: float | None = None,
    weights_on_gpu: bool = True,
    kv_cache: bool = True,
    length_declared: bool = True,
    attention: str | None = None,
    per_call: PerCallDecode | None = None,
) -> DecodePlan | None:
    """:func:`select_decode` with its five values as keywords (the tests' form)."""
    return select_decode(
        DecodeQuery(intent, can_generate, work, requested, length_declared, tuple(assumed)),
        DecodeModel(quantization, kv_cache, attention),
        Placement(has_gpu, weights_on_gpu, offload, gpu_devices),
        StaticCache(max_cache_len, tuple(cache_buckets), tuple(cache_len_reasons), warm, cache_key),
        DecodeCosts(facts, bound, per_call),
    )


def select_decode(
    query: DecodeQuery, model: DecodeModel, where: Placement, cache: StaticCache, costs: DecodeCosts
) -> DecodePlan | None:
    """The decode section: ``dynamic`` or ``compiled`` with every candidate's costs (module docstring; what each
    value holds: :mod:`cudaload.policies.decode_query`).

    None for intents that do not call generate() one batch at a time (training; serving runs continuous
    batching) and for models that do not generate. The facts were measured on cudaload's sdpa variants, whose
    compiled step runs the grouped decode attention: with another ``model.attention`` they speak for nothing.
    ``costs.per_call`` is kept on the plan only where each call may decide (no work declared, ``decode='auto'``,
    no blocker, the facts speak for the GPU and attention). Raises :class:`InvalidChoiceError` for
    ``requested="compiled"`` where it cannot run, with the fix."""
    work = query.work
    if query.intent != "inference" or not query.can_generate:
        return None
    req = query.requested
    explicit = req != "auto"
    found = _blockers(
        where,
        model.quantization,
        model.kv_cache,
        query.length_declared or not (work.declared or explicit),  # no work, nothing asked: no length to miss
        cache.max_cache_len,
        cache.length_reasons,
    )
    blockers = [why for why, _ in found]
    facts = costs.facts
    unmeasured_attention = (
        facts is not None and model.attention is not None and model.attention not in SDPA_VARIANTS
    )
    if unmeasured_attention:
        facts = None
    each_call = (
        not explicit
        and not blockers
        and not work.declared
        and costs.per_call is not None
        and facts is not None
    )
    expected = _expected(work, model.quantization, facts, cache.max_cache_len, cache.warm, costs.bound)
    dyn_why, comp_why = _costs(expected, cache.warm, facts)
    if req == "compiled" and blockers:
        raise InvalidChoiceError("decode='compiled' cannot run here", reasons=blockers, fix=found[0][1])
    choice, why = _mode_and_why(
        query,
        blockers,
        each_call=each_call,
        unmeasured_attention=model.attention if unmeasured_attention else None,
        facts=facts,
        expected=expected,
    )
    compiled = choice == "compiled"
    graphed_why = _graphed_calls_why(
        facts,
        may=not compiled and not each_call and not explicit and not blockers and work.declared,
        per_call=costs.per_call,
    )
    if graphed_why is not None:
        why = [*why, graphed_why]
    comp_why = _compiled_candidate_why(
        comp_why,
        compiled=compiled,
        blockers=blockers,
        work_declared=work.declared,
        measured=facts is not None,
        explicit=explicit,
        each_call=each_call,
        unmeasured_attention=model.attention if unmeasured_attention else None,
        cache=cache,
    )
    notes = _compiled_notes(cache.max_cache_len, work.batch) if compiled else []
    if facts is not None and (compiled or work.declared):
        notes.append("costs " + facts.text)
    cands, reasons = _candidates_and_reasons(why, dyn_why, comp_why, compiled=compiled, explicit=explicit)
    return DecodePlan(
        mode=Decision(choice, reasons, cands, explicit=explicit),
        work=work,
        max_cache_len=cache.max_cache_len if compiled else None,
        cache_buckets=cache.buckets if compiled else (),
        batch_sizes=(work.batch,) if compiled else (),
        compile=dict(COMPILE_CONFIG) if compiled else {},
        expected=expected,
        cache_key=cache.key if compiled else None,
        assumed=tuple(query.assumed),
        notes=tuple(notes),
        per_call=costs.per_call if each_call or graphed_why is not None else None,
    )


def _graphed_calls_why(facts: Scaled | None, *, may: bool, per_call: PerCallDecode | None) -> str | None:
    """Where declared work's compile does not pay at load, whether each call may still replay its step as a CUDA
    graph (no compile; :mod:`cudaload.policies.decode_call` weighs it per call): the reason, where the GPU's
    architecture has the graphed path measured; None where not."""
    if not (may and per_call is not None and facts is not None and facts.facts.graphed):
        return None
    return (
        "each generate() call may still replay its decode step as a CUDA graph (no compile: a "
        f"~{facts.capture_s():.2f} s capture, {facts.graphed_ms(4096):.1f} against "
        f"{facts.dynamic_ms(1024):.1f} ms a step at 4,096 slots), decided per call "
        "(cudaload.policies.decode_call; plan.verified['decode']['calls'])"
    )


def _mode_and_why(
    query: DecodeQuery,
    blockers: Sequence[str],
    *,
    each_call: bool,
    unmeasured_attention: str | None,
    facts: Scaled | None,
    expected: Mapping[str, float],
) -> tuple[str, list[str]]:
    """The mode at load, ``dynamic`` or ``compiled``, and why: the request, a blocker, each call deciding, no
    work declared, an unmeasured attention or GPU, else the declared job's seconds each way."""
    req, work = query.requested, query.work
    if req != "auto":
        return req, [f"requested explicitly (decode={req!r})"]
    if blockers:
        return "dynamic", ["the compiled path cannot run here: " + "; ".join(blockers)]
    if each_call:
        assert facts is not None
        return "dynamic", [
            "no generate() work declared: load_model() compiles nothing, and each generate() call decides its own "
            "decode from its batch, prompt length and max_new_tokens (cudaload.policies.decode_call): "
            + (
                f"a static cache with the step replayed as a CUDA graph where its ~{facts.capture_s():.2f} s "
                f"capture pays ({facts.graphed_ms(4096):.1f} against {facts.dynamic_ms(1024):.1f} ms a step "
                "dynamic, 4,096 slots"
                + (
                    f"; the graphed figures are the {facts.facts.graphed_from}'s"
                    if facts.facts.graphed_from
                    else ""
                )
                + "), and with the compiled step "
                if facts.facts.graphed
                else "a static cache with the compiled step "
            )
            + "only where the call's decode steps save more than the compile costs "
            f"(~{facts.compile_s(False):.0f} s cold, ~{facts.compile_s(True):.0f} s from cudaload's saved "
            "artifacts, nothing for a bucket the process compiled already); each call's choice and why in "
            "plan.verified['decode']['calls']; to pay the compile at load instead, declare the work (new_tokens=, "
            "generate_calls=, seq_len=, batch_size=), or decode='dynamic' to keep every call dynamic"
        ]
    if not work.declared:
        return "dynamic", [
            "no generate() work declared: the default never pays a compile (~58 s cold, 11-13 s from cudaload's "
            "saved artifacts, for an 8B model on the H200: benchmarks/results/2026-12-03-h200 runs 43-44) that the "
            "process is not known to recover; " + _HOW_TO_DECLARE
        ]
    if unmeasured_attention is not None:
        return "dynamic", [
            f"the compiled step was measured with cudaload's sdpa variants, whose decode attention reads each "
            f"key/value head once; with {unmeasured_attention} it is not measured (transformers' sdpa, for one, "
            "repeats the heads under a mask and runs the memory-efficient kernel: 18 ms more a token at 8,192 slots "
            "on the H200, benchmarks/results/2026-12-03-h200 run42): cudaload does not claim a compiled speed-up "
            "there; pass decode='compiled' to choose it"
        ]
    if facts is None:
        return "dynamic", [
            "no decode measurement speaks for this GPU and model (the priors' decode records: the same compute "
            f"capability, a dense model with weights within {SCALE_LIMIT:g}x of the measured one's): cudaload does "
            "not claim a "
            "compiled speed-up it has not measured; pass decode='compiled' to choose it"
        ]
    if expected["job_s_compiled"] <= (1 - MARGIN) * expected["job_s_dynamic"]:
        return "compiled", [
            f"the declared {work.new_tokens:,} decode steps take ~{expected['job_s_compiled']:.0f} s compiled "
            f"(compile included) against ~{expected['job_s_dynamic']:.0f} s dynamic"
        ]
    return "dynamic", [
        f"the declared {work.new_tokens:,} decode steps take ~{expected['job_s_dynamic']:.0f} s dynamic; "
        f"compiled would take ~{expected['job_s_compiled']:.0f} s with its compile, not {MARGIN:.0%} less"
    ]


def _compiled_candidate_why(
    comp_why: list[str],
    *,
    compiled: bool,
    blockers: Sequence[str],
    work_declared: bool,
    measured: bool,
    explicit: bool,
    each_call: bool,
    unmeasured_attention: str | None,
    cache: StaticCache,
) -> list[str]:
    """The ``compiled`` candidate's reasons: why it lost (or its static cache's length where it won) before its
    costs."""
    if blockers:
        comp_why = [*blockers, *comp_why]
    elif not compiled and work_declared and measured and not explicit:
        comp_why = [f"not {MARGIN:.0%} faster for the declared work", *comp_why]
    elif each_call:
        comp_why = ["at load: no work declared; at a generate() call that pays the compile back", *comp_why]
    elif not compiled and not work_declared and not explicit:
        comp_why = ["no work declared", *comp_why]
    elif not compiled and unmeasured_attention is not None and not explicit:
        comp_why = [f"not measured with {unmeasured_attention}", *comp_why]
    elif not compiled:
        comp_why = ["not requested", *comp_why]
    if compiled and cache.length_reasons:
        comp_why = [
            *comp_why,
            *cache.length_reasons,
            f"so the static cache is the declared length, {cache.max_cache_len:,}",
        ]
    return comp_why


def _candidates_and_reasons(
    why: Sequence[str], dyn_why: list[str], comp_why: Sequence[str], *, compiled: bool, explicit: bool
) -> tuple[tuple[Candidate, Candidate], tuple[str, ...]]:
    """Both candidates with their reasons, and the decision's reasons: the why, then the chosen candidate's costs
    less the job seconds the why has said."""
    if compiled:
        dyn_why = [
            "not requested" if explicit else f"{MARGIN:.0%} or more slower for the declared work",
            *dyn_why,
        ]
    cands = (
        Candidate("dynamic", not compiled, tuple(dyn_why)),
        Candidate("compiled", compiled, tuple(comp_why)),
    )
    reasons = tuple(why) + tuple(
        r
        for r in (comp_why if compiled else dyn_why)
        if not r.startswith(("the declared job", "not requested", "10%"))
    )
    return cands, reasons


def _compiled_notes(max_cache_len: int | None, batch: int) -> list[str]:
    """What a compiled plan says about the graphs it compiles: the bucket, the batch size, the compile config."""
    return [
        f"prompts of any length up to {max_cache_len:,} tokens with their new tokens reuse the compiled graph; "
        "a longer call moves to the next bucket and compiles once more",
        f"batch size {batch} is compiled; another batch size compiles once more (measured on the H200: 94 s "
        "cold, 47 s with inductor's cache warm)",
        "the compile config is transformers' CompileConfig default (fullgraph False: generate() forces it with "
        "flash attention, and a graph break would otherwise be an error), dynamic False (the static cache "
        "fixes every shape), reduce-overhead (CUDA graphs)",
    ]


def _blockers(
    where: Placement,
    quantization: str | None,
    kv_cache: bool,
    length_declared: bool,
    max_cache_len: int | None,
    cache_len_reasons: Sequence[str],
) -> list[tuple[str, str]]:
    """Why the compiled path cannot run here, each with its fix (empty: it can)."""
    dyn = "use decode='dynamic'"
    out: list[tuple[str, str]] = []
    if not where.has_gpu:
        out.append(
            (
                "no CUDA GPU: reduce-overhead's CUDA graphs need one (and generate() compiles only on an accelerator)",
                f"{dyn}, or run where a CUDA GPU is visible",
            )
        )
    elif not where.on_gpu:
        # transformers compiles the decode step only when the model's device is an accelerator (5.17
        # generation/utils.py:2262-2265): a static cache on the CPU would run uncompiled, slower than dynamic
        out.append(
            (
                "the weights are placed on the CPU (device_map): generate() compiles only on an accelerator",
                f"{dyn}, or place the model on a GPU (device_map='cuda:0')",
            )
        )
    if not kv_cache:
        # a state-space model keeps its own cache; transformers ignores cache_implementation for it
        # (generation/utils.py, _supports_default_dynamic_cache)
        out.append(
            (
                "no attention KV cache: the model keeps its own state, which a static cache does not replace",
                f"{dyn} (the model keeps its own cache)",
            )
        )
    if quantization in _BNB:
        out.append(
            (
                f"bitsandbytes {quantization}: its quantizer does not override is_compileable (transformers 5.17 "
                "quantizers/base.py:260-263), so generate() skips the compile (generation/utils.py:2274-2276) and "
                "a static cache without it is slower than the dynamic one",
                f"{dyn}, or quantization='none' where the model fits unquantized",
            )
        )
    if where.offload:
        out.append(
            (
                "CPU/disk offload: generate() does not compile an offloaded model (transformers 5.17 "
                "generation/utils.py:2278-2286, _valid_auto_compile_criteria)",
                f"{dyn}, or a GPU that holds the whole model (no allow_offload)",
            )
        )
    elif where.gpu_devices > 1:
        out.append(
            (
                f"the model is split over {where.gpu_devices} GPUs: every decode step crosses devices and cudaload "
                "has not measured the compiled path there",
                f"{dyn}, or one GPU that holds the model (device_map='cuda:0')",
            )
        )
    if not length_declared:
        out.append(
            (
                "seq_len= is not declared: a static cache must hold the longest prompt + new tokens, which an "
                "assumed length may not",
                "declare seq_len= (the longest prompt + new tokens of one sequence), or use decode='dynamic'",
            )
        )
    elif where.on_gpu and max_cache_len is None:
        fix = f"{dyn}, or a shorter seq_len / batch_size so the static cache fits"
        out.extend((why, fix) for why in (cache_len_reasons or ["no static cache length fits"]))
    return out


def _expected(
    work: DecodeWork,
    quantization: str | None,
    facts: Scaled | None,
    max_cache_len: int | None,
    warm: bool,
    bound: float | None,
) -> dict[str, float]:
    """The costs the decision weighs (DecodePlan.expected's keys); empty where no record speaks for the GPU."""
    if facts is None:
        return {}
    seq_len, batch = work.longest or 1, work.batch
    slow = facts.facts.relative_decode().get(quantization or "none", 1.0) if quantization else 1.0
    dyn = facts.dynamic_ms(seq_len, batch) * slow
    comp = facts.compiled_ms(
        max_cache_len or bucket_for(seq_len, cache_lengths(None, seq_len)) or seq_len, batch
    )
    out = {
        "ms_per_token_dynamic": dyn,
        "ms_per_token_compiled": comp,
        "compile_s_cold": facts.compile_s(False),
        "compile_s_warm": facts.compile_s(True),
    }
    if bound is not None:
        out["ms_per_token_bound"] = bound
    compile_s = out["compile_s_warm" if warm else "compile_s_cold"]
    if dyn > comp:
        out["breakeven_tokens"] = float(int(compile_s * 1000 / (dyn - comp)) + 1)
    if work.new_tokens is not None:
        out["job_s_dynamic"] = work.new_tokens * dyn / 1000
        out["job_s_compiled"] = work.new_tokens * comp / 1000 + compile_s
    return out


def _costs(expected: Mapping[str, float], warm: bool, facts: Scaled | None) -> tuple[list[str], list[str]]:
    """Each candidate's costs, as its reasons say them."""
    if not expected:
        return (
            ["transformers' DynamicCache: nothing compiled"],
            ["a static cache and the decode step compiled by generate(): its speed here is not measured"],
        )
    dyn = [f"~{expected['ms_per_token_dynamic']:.1f} ms per decode step, nothing compiled"]
    cs = expected["compile_s_warm" if warm else "compile_s_cold"]
    comp = [
        f"~{expected['ms_per_token_compiled']:.1f} ms per decode step after a ~{cs:.0f} s compile ("
        + (
            "its artifact is in cudaload's compile cache"
            if warm
            else "cold: no artifact in cudaload's compile cache"
        )
        + (
            f"; pays back after ~{expected['breakeven_tokens']:,.0f} steps"
            if "breakeven_tokens" in expected
            else ""
        )
        + ")"
    ]
    if "job_s_dynamic" in expected:
        dyn.append(f"the declared job ~{expected['job_s_dynamic']:.0f} s")
        comp.append(f"the declared job ~{expected['job_s_compiled']:.0f} s")
    if "ms_per_token_bound" in expected:
        comp.append(f"the memory bound is ~{expected['ms_per_token_bound']:.1f} ms per step")
    return dyn, comp


def bound_ms(model: ModelSummary, dtype: str, gpu_name: str | None, batch_bytes: int = 0) -> float | None:
    """The decode step's memory bound: the weights (and ``batch_bytes`` of KV read) over the GPU's HBM
    bandwidth (:data:`cudaload.policies.serving.batching.HBM_BYTES_S`); None for a GPU not in that table."""
    name = (gpu_name or "").upper()
    if not any(k in name for k in HBM_BYTES_S):
        return None
    return (model.params * dtype_bytes(dtype) + batch_bytes) / hbm_bandwidth(gpu_name) * 1000
