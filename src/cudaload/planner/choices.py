"""The dtype and the attention decisions of a plan, with what they read: the request's wishes, the measured
timings of a declared generate() work (this GPU's tune cache, then the shipped priors), the sdpa and training
facts, and for serving the implementation whose paged form serves."""

from __future__ import annotations

from .. import _env
from ..capabilities import Capabilities
from ..model_info import ModelInfo
from ..plans.decision import Decision
from ..policies.attention import AttentionFacts, AttentionQuery, AttentionTimings, select_attention
from ..policies.dtype import choose_dtype
from ..request import Request
from ..tuning import Timings, load_layer_compile_facts, load_sdpa_facts, load_training_facts
from ..tuning import lookup as lookup_timings
from .machine import _first_use_here
from .sections import _serving_attention
from .work import WorkSize


def base_intent(intent: str) -> str:
    """Serving plans the model as inference, then adds transformers' continuous-batching settings."""
    return "inference" if intent == "serving" else intent


def dtype_for(req: Request, info: ModelInfo, caps: Capabilities) -> Decision:
    s = info.summary
    dt = choose_dtype(
        caps,
        checkpoint_dtype=s.checkpoint_dtype,
        model_type=s.type,
        intent=base_intent(req.intent),
        requested=str(req.dtype),
        fp16_overflow=info.fp16_overflow,
    )
    assert dt.choice is not None
    return dt


def attention_for(
    req: Request,
    info: ModelInfo,
    caps: Capabilities,
    dtype: str,
    work: WorkSize,
    *,
    attn: str | None = None,
    timings: Timings | None = None,
) -> tuple[Decision, list[str] | None]:
    """The attention decision, and for serving the usable implementations the serving section pages from.
    ``attn`` / ``timings`` replace the request's (a load planning again after a fallback, or with measured
    timings)."""
    intent = base_intent(req.intent)
    requested = attn or req.attn
    timings = timings if timings is not None else req.timings
    # one generate() call's work picks its kernel; a server's many requests are not one short sequence
    call = None if req.intent == "serving" else work.call
    timed = work.timed() if call is not None else None
    if timings is None and timed is not None and intent == "inference" and requested == "auto":
        # measured seconds for this work: this GPU's tune cache first, then the priors cudaload ships
        timings = lookup_timings(caps, info, dtype, timed)
    at = select_attention(
        info,
        caps,
        AttentionQuery(
            dtype, intent, requested, trust=trusted(req), work=call, batch_layout=req.batch_layout
        ),
        AttentionFacts(
            AttentionTimings(timings.seconds, timings.source, timings.repeated)
            if timings is not None
            else AttentionTimings(),
            first_use=_first_use_here(caps),
            sdpa=load_sdpa_facts(),
            training=load_training_facts(),
            layer_compile=load_layer_compile_facts(),
        ),
    )
    assert at.choice is not None
    usable: list[str] | None = None
    if req.intent == "serving" and requested == "auto":
        # the attention decision weighs one generate() batch; continuous batching pages many requests, where a
        # flash form attends per request and sdpa/eager mask every key the batch reads: the model is loaded with
        # the implementation whose paged form serves (transformers pages the model's own attention at the
        # manager's start, 5.17 continuous_api.py:651-683)
        usable = [at.choice, *(c.name for c in at.candidates if c.ok)]
        at = _serving_attention(at, info, caps, usable)
    return at, usable


def fallbacks_for(at: Decision) -> tuple[str, ...]:
    """Where load_model goes when the choice fails its one-step forward: the valid candidates after it, in the
    order the attention policy ranked them (policies/attention/choice.py ``_ordered``: torch's own sdpa and
    eager first, which need nothing else); none for an explicit choice, which is refused instead."""
    if at.explicit:
        return ()
    return tuple(c.name for c in at.candidates if c.ok and c.name != at.choice)


def trusted(req: Request) -> tuple[str, ...]:
    """Hub kernel repos / publishers whose code may run: the request's and ``CUDALOAD_TRUST_KERNELS``."""
    return (*req.trust_kernels, *_env.trusted_kernel_repos())
