"""The decode section (issue 35), after the sizing: the declared generate() work, the measured decode facts for
this GPU, whether the compile cache already holds this plan's artifact, and the static cache lengths that fit
beside the weights; then :func:`cudaload.policies.decode.select_decode`. A compiled plan's memory is the static
cache's length x batch, not seq_len: its estimate replaces the sizing's."""

from __future__ import annotations

from dataclasses import replace

from .. import compile_cache
from ..capabilities import Capabilities
from ..errors import DoesNotFitError, InvalidChoiceError
from ..model_info import ModelInfo
from ..plans.decision import Decision
from ..plans.decode import DecodePlan, PerCallDecode
from ..policies.decode import (
    bound_ms,
    cache_lengths,
    quant_decode_cost,
    scaled_facts,
    select_decode,
    static_cache_length,
)
from ..policies.decode_facts import QuantDecodeCost, Scaled
from ..policies.decode_key import COMPILE_CONFIG, decode_cache_key, decode_key_base
from ..policies.decode_query import DecodeCosts, DecodeModel, DecodeQuery, Placement, StaticCache
from ..policies.dtype import dtype_bytes
from ..policies.quantization import fit
from ..request import Request
from ..tuning import load_decode_facts
from .sections import sdpa_family
from .sizing import Sized, _memory
from .work import WorkSize

#: the auto classes whose models generate() token by token from a KV cache
_DECODERS = ("CausalLM", "ImageTextToText")


def quant_cost_for(
    req: Request, info: ModelInfo, caps: Capabilities, dtype: str, work: WorkSize
) -> QuantDecodeCost | None:
    """What the fit ladder weighs about the quantized rungs' decode speed (inference only)."""
    if req.intent not in ("inference", "serving") or not _generates(req, info):
        return None
    steps = work.decode().new_tokens if req.intent == "inference" else None
    return quant_decode_cost(caps, load_decode_facts(), info.summary, dtype, work.seq_len, steps)


def decode_for(
    req: Request,
    info: ModelInfo,
    caps: Capabilities,
    work: WorkSize,
    dtype: str,
    at: Decision,
    sized: Sized,
) -> tuple[DecodePlan | None, Sized]:
    """The decode section, and the sizing with a compiled plan's static cache in its memory."""
    if req.intent != "inference" or not _generates(req, info):
        if req.decode == "compiled" and req.intent == "inference":
            raise InvalidChoiceError(
                "decode='compiled' cannot be used here: the model is not loaded as a decoder that generate() runs "
                f"token by token ({req.model_class or info.auto_class})",
                fix="drop decode=, or load the model's generating class (model_class='AutoModelForCausalLM' or "
                "'AutoModelForImageTextToText')",
            )
        return None, sized
    assert at.choice is not None
    dw = work.decode()
    s = info.summary
    q = sized.fit.decision.choice
    gpus = len(sized.gpu_devices)
    if sized.parallelism is not None and sized.parallelism.choice == "tp":
        gpus = max(gpus, sized.parallelism.world_size)
    buckets = cache_lengths(s.max_position_embeddings, work.seq_len)
    fits: dict[int, Sized] = {}
    unfit: dict[int, str] = {}
    on_gpu = bool(sized.gpu_devices)
    kv = bool(s.num_kv_heads)
    possible = (
        on_gpu
        and kv
        and work.declared_seq is not None
        and q is None
        and not sized.placement.offload
        and gpus <= 1
    )
    if possible and (dw.declared or req.decode == "compiled"):
        fits, unfit = _static_cache_fits(req, info, caps, dtype, at.choice, sized, work, buckets)
    length, length_why = static_cache_length(work.seq_len, buckets, unfit)
    key = (
        decode_cache_key(
            caps, s, dtype=dtype, attention=at.choice, max_cache_len=length, batch=work.batch_size
        )
        if length is not None and caps.gpus
        else None
    )
    assumed = _assumed(work)
    facts = scaled_facts(caps, load_decode_facts(), s, dtype)
    per_call = (
        _per_call(caps, info, dtype, at.choice, facts, work.seq_len)
        if (not dw.declared or (facts is not None and facts.facts.graphed))
        and req.decode == "auto"
        and facts is not None
        and caps.gpus
        else None
    )
    plan = select_decode(
        DecodeQuery(req.intent, True, dw, req.decode, work.declared_seq is not None, tuple(assumed)),
        DecodeModel(q, kv, at.choice),
        Placement(bool(caps.gpus), on_gpu, sized.placement.offload, gpus),
        StaticCache(length, tuple(buckets), tuple(length_why), compile_cache.present(key, req.env), key),
        DecodeCosts(facts, bound_ms(s, dtype, caps.gpus[0].name) if caps.gpus else None, per_call),
    )
    if plan is not None and plan.compiled and plan.max_cache_len in fits:
        sized = fits[plan.max_cache_len]
    return plan, sized


def _static_cache_fits(
    req: Request,
    info: ModelInfo,
    caps: Capabilities,
    dtype: str,
    attention: str,
    sized: Sized,
    work: WorkSize,
    buckets: tuple[int, ...],
) -> tuple[dict[int, Sized], dict[int, str]]:
    """The static cache lengths a compiled plan may take (the bucket that holds the work, the work's own length)
    with the sizing each one gives, and why each other one does not fit."""
    fits: dict[int, Sized] = {}
    unfit: dict[int, str] = {}
    for n in dict.fromkeys(x for x in (static_cache_length(work.seq_len, buckets, {})[0], work.seq_len) if x):
        got = (
            sized  # the sizing planned this length already
            if n == work.seq_len
            else _with_static_cache(req, info, caps, dtype, attention, sized, n, work.batch_size)
        )
        if isinstance(got, str):
            unfit[n] = got
        else:
            fits[n] = got
    return fits, unfit


def _assumed(work: WorkSize) -> list[str]:
    """What the decode costs assume that the request did not say."""
    assumed: list[str] = []
    if work.decode().declared and work.generate_calls is None:
        assumed.append(f"one generate() call of {work.new_tokens} new tokens (declare generate_calls=)")
    if work.batch_size > 1:
        assumed.append(
            f"a decode step of {work.batch_size} sequences costs what the compiled path's measured batch-8 step "
            "says, for both paths (the dynamic path's batched step is not measured)"
        )
    return assumed


def _per_call(
    caps: Capabilities, info: ModelInfo, dtype: str, attention: str, facts: Scaled, seq_len: int
) -> PerCallDecode:
    """What each generate() call of an undeclared plan decides from (the policy keeps it only where the compiled
    path can run): the facts as scaled here, the buckets up to the model's context, one sequence's static-cache
    bytes per slot (keys and values of every layer: an upper bound for sliding-window layers, which hold less),
    and the compile cache key's call-independent parts."""
    s = info.summary
    head_dim = s.head_dim or (s.hidden_size // s.num_heads if s.num_heads else 0)
    parts, label = decode_key_base(caps, s, dtype=dtype, attention=attention)
    return PerCallDecode(
        facts=facts.facts.to_dict(),
        weight_scale=facts.weights,
        layer_scale=facts.layers,
        facts_text=facts.text,
        buckets=cache_lengths(s.max_position_embeddings, seq_len),
        max_positions=s.max_position_embeddings,
        kv_bytes_per_slot=int(2 * s.layers * s.num_kv_heads * head_dim * dtype_bytes(dtype)),
        compile=dict(COMPILE_CONFIG),
        key_parts=parts,
        key_label=label,
    )


def _generates(req: Request, info: ModelInfo) -> bool:
    cls = req.model_class or info.auto_class
    return info.can_generate and not info.summary.is_encoder and any(d in cls for d in _DECODERS)


def _with_static_cache(
    req: Request,
    info: ModelInfo,
    caps: Capabilities,
    dtype: str,
    attn: str,
    sized: Sized,
    length: int,
    batch: int,
) -> Sized | str:
    """The sizing with a static cache of ``length`` slots x ``batch`` in its memory (the plan's quantization and
    placement kept), or why it does not fit so."""
    try:
        fr = fit(
            info,
            caps,
            dtype=dtype,
            intent="inference",
            seq_len=length,
            batch_size=batch,
            attn=sdpa_family(attn) or attn,
            quantization="none",
            device_map=req.device_map,
            max_memory=req.max_memory,
            allow_offload=False,
        )
    except (DoesNotFitError, InvalidChoiceError) as e:
        return str(e).splitlines()[0] if not e.reasons else "; ".join(e.reasons)
    assert fr.fit.placement is not None
    if fr.fit.placement.devices != sized.placement.devices:
        return f"the weights would move to {', '.join(fr.fit.placement.devices)}"
    memory = _memory(fr)
    note = f"kv_cache: the static cache's {length:,} slots x batch {batch} (decode compiled), not the declared seq_len"
    return replace(sized, memory=replace(memory, notes=(*memory.notes, note)))
