"""The decode plan readied at load (:func:`ready_decode`) and, with no work declared (issue 43), the decode decided
at each ``generate()`` call: a dynamic plan's ``per_call`` gives the model a ``generate`` that decides each call
(:func:`install_per_call`): the call read, :mod:`cudaload.policies.decode_call` asked, the choice recorded in
``verified["decode"]["calls"]``. A dynamic call reaches transformers' ``generate()`` with the caller's arguments
untouched; a graphed one runs transformers' static cache with each decode step replayed from a CUDA graph
(:mod:`cudaload.execute.runtime.graphed_step`); a compiled one passes the compiled plan's three fields as keywords
of that call (the model's generation config stays as the dynamic plan left it), after a warm-up of its bucket and
batch the first time (:func:`cudaload.execute.decode.warm_decode`).
"""

from __future__ import annotations

import functools
import logging
import time
import warnings
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from .. import compile_cache
from ..errors import CudaloadWarning
from ..plans.decision import Decision
from ..plans.decode import DecodePlan, PerCallDecode
from ..policies.decode_call import CallChoice, CallQuery, call_bucket, choose_call_decode
from ..policies.decode_facts import DecodeFacts, Scaled
from ..policies.decode_key import cache_key_from
from .decode import (
    PER_CALL_MARK,
    apply_decode,
    load_artifacts,
    per_call_installed,
    undo_decode,
    uninstall_per_call,
    warm_decode,
)
from .runtime import decode_loop

__all__ = [
    "CALLS_KEPT",
    "CallState",
    "graph_refusal",
    "install_per_call",
    "per_call_installed",
    "ready_decode",
    "replanned_decode",
    "uninstall_per_call",
]

logger = logging.getLogger("cudaload.execute")


def ready_decode(model: Any, decode: DecodePlan, *, warm: bool) -> dict[str, Any]:
    """``load_model``'s decode step (its ``verified["decode"]``): the plan applied (:func:`apply_decode`); for a
    compiled plan, with ``warm`` (``load_model(warmup=True)``, ``cudaload precompile --decode``) every planned batch
    size compiled now (:func:`warm_decode`, which also saves the artifacts), so the first ``generate()`` runs
    compiled; without it the saved artifacts are handed to torch now and the first ``generate()`` that decodes
    compiles, finding them (nothing is saved then: torch's artifacts exist only after that compile)."""
    out = apply_decode(model, decode)
    if decode.per_call is not None and not decode.compiled:
        out.update(install_per_call(model, decode.per_call))
        return out
    if not decode.compiled or not out.get("applied"):
        return out
    if warm:
        out["warmup"] = warm_decode(model, decode)
        if not out["warmup"]["compiled"]:
            # generate() ran the static cache without compiling (a check of transformers' own failed where the
            # plan's passed): slower than the dynamic cache the plan weighed it against, so that one is put back
            undo_decode(model)
            out["undone"] = "the warm-up's generate() did not compile: the dynamic cache is kept"
            warnings.warn(
                "cudaload: the compiled decode plan did not compile in the warm-up; generate() keeps transformers' "
                "dynamic cache (plan.verified['decode'])",
                CudaloadWarning,
                stacklevel=2,
            )
    else:
        out["artifacts_loaded"] = load_artifacts(decode.cache_key)
    return out


def replanned_decode(decode: DecodePlan, why: str) -> DecodePlan:
    """The decode section as the model decodes after :func:`ready_decode` undid a compiled plan (``why``: its
    ``undone``): dynamic, with no static cache, its decision saying why and keeping every candidate, as the
    attention path's new plan says why the load left the first plan's backend."""
    planned = "; ".join(decode.mode.reasons) or "-"
    mode = replace(
        decode.mode,
        choice="dynamic",
        reasons=(f"replanned after loading: {why}", f"the plan chose compiled: {planned}"),
    )
    return replace(decode, mode=mode, max_cache_len=None, cache_buckets=(), batch_sizes=(), cache_key=None)


# -- the decode decided at each generate() call (issue 43) -------------------------------------------------------

#: the newest calls kept in ``plan.verified["decode"]["calls"]`` (a long-running process makes many)
CALLS_KEPT = 32
#: the newest EOS calls whose share of ``max_new_tokens`` the policy averages
SHARES_KEPT = 16
#: a call's keywords that choose its own cache or compile: such a call keeps transformers' generate() untouched
#: (``cache`` is transformers 5.24's name for ``past_key_values``, which it still accepts)
_OWN_CACHE_OR_COMPILE = (
    "past_key_values",
    "cache",
    "cache_implementation",
    "compile_config",
    "max_cache_len",
    "disable_compile",
    "inputs_embeds",
)


class CallState:
    """One model's per-call decode: its settings (the plan's ``per_call``), the (bucket, batch) shapes this process
    compiled or failed to, the newest calls' records (``calls``: the list ``plan.verified["decode"]["calls"]``
    holds) and the shares of ``max_new_tokens`` its EOS calls ran."""

    def __init__(self, per_call: PerCallDecode):
        self.per_call = per_call
        self.compiled: set[tuple[int, int]] = set()
        self.failed: set[tuple[int, int]] = set()
        self.calls: list[dict[str, Any]] = []
        self.shares: list[float] = []
        self.count = 0
        self._facts: Scaled | None = None
        # the graphed decode: this model's graphs (made at its first graphed call), the shapes whose capture failed
        self.graphs: Any = None
        self.graph_failed: set[tuple[int, int]] = set()

    def facts(self) -> Scaled:
        if self._facts is None:
            pc = self.per_call
            self._facts = Scaled(
                DecodeFacts.from_dict(pc.facts), pc.weight_scale, pc.layer_scale, pc.facts_text
            )
        return self._facts

    def key(self, bucket: int, batch: int) -> str:
        pc = self.per_call
        return cache_key_from(pc.key_parts, pc.key_label, max_cache_len=bucket, batch=batch)

    def record(self, entry: dict[str, Any]) -> None:
        self.count += 1
        entry["call"] = self.count
        self.calls.append(entry)
        del self.calls[:-CALLS_KEPT]


def install_per_call(model: Any, per_call: PerCallDecode) -> dict[str, Any]:
    """Give ``model`` a ``generate`` that decides each call's decode (:func:`_per_call_generate`), bound with
    ``functools.partial`` as :func:`cudaload.execute.runtime.decode_loop.install` binds its own (the instance-attribute route
    transformers takes for a checkpoint's ``custom_generate``, 5.17 generation/utils.py:568-573). Refused where
    the late stop is (:func:`cudaload.execute.runtime.decode_loop.install_refusal`: not CUDA, an encoder-decoder, a class's own
    ``generate`` or ``_sample``, a ``generate`` already on the instance). Returns what ``verified["decode"]``
    records: ``per_call`` (how) and ``calls`` (the list each call's record goes to)."""
    why = decode_loop.install_refusal(model)
    if why is not None:
        return {"per_call": f"off: {why}; every call keeps transformers' generate()"}
    state = CallState(per_call)
    model.generate = functools.partial(_per_call_generate, model, state)
    return {
        "per_call": "decided at each generate() call (cudaload.policies.decode_call)",
        "calls": state.calls,
    }


def _compile_config(compile: Mapping[str, Any]) -> Any:
    """transformers' ``CompileConfig`` of the plan's keywords (a test on the CPU adds ``_compile_all_devices``)."""
    from transformers import CompileConfig

    return CompileConfig(**compile)


def _per_call_generate(self: Any, state: CallState, *args: Any, **kwargs: Any) -> Any:
    """``generate()`` of a model whose plan decides each call (:func:`install_per_call`): the call read
    (:func:`_read_call`), :func:`cudaload.policies.decode_call.choose_call_decode` asked, the choice recorded; a
    dynamic call (and any call the compiled path refuses) runs the class's ``generate()`` with the caller's
    arguments untouched, a compiled one :func:`_run_compiled`."""
    t0 = time.perf_counter()
    try:
        query, why = _read_call(self, state, args, kwargs)
    except Exception as e:  # reading the call is cudaload's: it never fails the user's call
        query, why = None, f"the call was not read ({type(e).__name__}: {e})"
    if query is None:
        state.record({"choice": "transformers", "reason": f"kept transformers' generate(): {why}"})
        return type(self).generate(self, *args, **kwargs)
    choice = choose_call_decode(query)
    entry: dict[str, Any] = {
        "batch": query.batch,
        "prompt": query.prompt_len,
        "max_new_tokens": query.max_new_tokens,
        "eos": query.eos,
        **choice.to_dict(),
    }
    state.record(entry)
    logger.info(
        "cudaload: generate() call %d decodes %s: %s", entry["call"], choice.decision.choice, choice.reason
    )
    if choice.compiled:
        out = _run_compiled(self, state, query, choice, entry, args, kwargs)
    elif choice.graphed:
        out = _run_graphed(self, state, query, choice, entry, args, kwargs)
    else:
        out = type(self).generate(self, *args, **kwargs)
    _observe(state, query, out, entry, t0)
    return out


def _read_call(
    model: Any, state: CallState, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[CallQuery | None, str | None]:
    """The call as the policy reads it, or why it keeps transformers' generate() untouched: what the late stop
    refuses (:func:`cudaload.execute.runtime.decode_loop.call_refusal` and :func:`~cudaload.execute.runtime.decode_loop.late_stop_refusal`: beams,
    assisted, a streamer, the caller's processors or criteria, a tokenizer, more than ids returned, multi-rank, a
    prompt not on CUDA), a call that chooses its own cache or compile (:data:`_OWN_CACHE_OR_COMPILE`, or
    ``cache_implementation`` / ``compile_config`` in its config), several sequences returned per prompt, no cache,
    and a prompt that is not a 2-d tensor of ids."""
    import torch

    own = [k for k in _OWN_CACHE_OR_COMPILE if kwargs.get(k) is not None]
    if own:
        return None, f"the call passes {own[0]}="
    why, gc = decode_loop.call_refusal(model, args, kwargs)
    if why is not None:
        return None, why
    ids = kwargs.get("input_ids")
    if ids is None:
        ids = args[0] if args else kwargs.get("inputs")
    if not isinstance(ids, torch.Tensor) or ids.dim() != 2 or ids.is_floating_point():
        return None, "the prompt is not a 2-d tensor of token ids"
    for name in ("cache_implementation", "compile_config", "prefill_chunk_size"):
        if getattr(gc, name, None) is not None:
            return None, f"the generation config sets {name}"
    if getattr(gc, "return_dict_in_generate", False):
        return None, "return_dict_in_generate: the call returns more than ids"
    if getattr(gc, "disable_compile", False):
        return None, "the generation config sets disable_compile"
    if getattr(gc, "use_cache", True) is False:
        return None, "use_cache=False"
    if (getattr(gc, "num_return_sequences", 1) or 1) > 1:
        return None, "num_return_sequences > 1"
    refused = decode_loop.late_stop_refusal(model, ids, gc, False, {})
    if refused is not None:
        return None, refused
    batch, prompt = int(ids.shape[0]), int(ids.shape[1])
    new = gc.max_new_tokens if gc.max_new_tokens is not None else (gc.max_length or 0) - prompt
    pc = state.per_call
    floor = max(int(getattr(model, "_previous_max_cache_length", 0) or 0), 0)
    bucket = call_bucket(prompt + int(new), pc.buckets, floor)
    free = None
    if ids.device.type == "cuda":
        # the driver's free memory and what torch's allocator holds unused (a static cache reuses its blocks)
        held = torch.cuda.memory_reserved(ids.device) - torch.cuda.memory_allocated(ids.device)
        free = int(torch.cuda.mem_get_info(ids.device)[0]) + max(int(held), 0)
    shape = (bucket, batch) if bucket is not None else None
    return (
        CallQuery(
            batch=batch,
            prompt_len=prompt,
            max_new_tokens=int(new),
            min_new_tokens=int(gc.min_new_tokens or 0),
            eos=gc.eos_token_id is not None,
            facts=state.facts(),
            bucket=bucket,
            warm=bucket is not None and compile_cache.present(state.key(bucket, batch)),
            compiled_here=shape in state.compiled,
            failed_here=shape in state.failed,
            compiled_count=len(state.compiled),
            observed_shares=tuple(state.shares),
            max_positions=pc.max_positions,
            cache_bytes=(bucket or 0) * batch * pc.kv_bytes_per_slot,
            free_bytes=free,
            graphable=graph_refusal(model, ids),
            graph_failed_here=shape in state.graph_failed,
        ),
        None,
    )


#: attention functions whose decode step runs cudaload's grouped decode attention inside a captured graph
#: (cudaload.execute.runtime.sdpa_decode.grouped_decode); sdpa would scan every slot of the static cache
_GRAPHED_ATTENTION = ("cudaload_sdpa", "cudaload_sdpa_nocudnn")


def graph_refusal(model: Any, ids: Any) -> str | None:
    """Why this model's decode step is not captured as a CUDA graph here (None: it can be): not on CUDA, an
    attention other than cudaload's sdpa variants, sliding-window layers (their static cache branches on the host
    each step), or a quantized model (its kernels were never captured in a measurement)."""
    if getattr(ids.device, "type", None) != "cuda":
        return f"the prompt is on {ids.device.type}: CUDA graphs need CUDA"
    config: Any = getattr(model, "config", None)
    attn = getattr(config, "_attn_implementation", None)
    if attn not in _GRAPHED_ATTENTION:
        return f"attention {attn!r}: only {' and '.join(_GRAPHED_ATTENTION)} run the grouped decode step in a graph"
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    # transformers' StaticSlidingWindowLayer.update branches on a host int, cumulative_length_int (5.17
    # cache_utils.py:544-550): a captured step would replay one branch forever
    if any("sliding" in str(t) for t in (getattr(text, "layer_types", None) or ())):
        return "sliding-window layers: their static cache decides on the host at each step"
    if getattr(model, "hf_quantizer", None) is not None:
        return "a quantized model: its kernels were not measured in a captured step"
    return None


def _static_settings(state: CallState, bucket: int) -> dict[str, Any]:
    """The generate() keywords of a compiled call: transformers' own static cache of ``bucket`` slots and its
    compiled decode step (the fields :func:`apply_decode` sets on a compiled plan's generation config, given per
    call here so the model's generation config stays as the dynamic plan left it)."""
    return {
        "cache_implementation": "static",
        "max_cache_len": bucket,
        "compile_config": _compile_config(state.per_call.compile),
    }


def _static_generate(model: Any, settings: Mapping[str, Any], *args: Any, **kwargs: Any) -> Any:
    """The class's ``generate()`` with a compiled call's settings and the late stop (:mod:`cudaload.execute.runtime.decode_loop`),
    as a compiled plan's generate() runs it."""
    return type(model).generate(
        model, *args, **kwargs, **settings, custom_generate=decode_loop.late_stop_sample
    )


def _run_compiled(
    model: Any,
    state: CallState,
    query: CallQuery,
    choice: CallChoice,
    entry: dict[str, Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> Any:
    """A call the policy compiled: a bucket and batch this process has not compiled are first compiled by
    :func:`warm_decode` (short dummy calls, cudaload's artifacts loaded before and saved after, as a declared
    plan's warm-up), then the call runs with the static cache and the late stop. A compile or a compiled call
    that fails warns, marks the shape failed for this process and runs the call on transformers' dynamic path; an
    error that the dynamic path raises too is the call's own, and is raised."""
    assert choice.bucket is not None
    shape = (choice.bucket, query.batch)
    settings = _static_settings(state, choice.bucket)
    run = functools.partial(_static_generate, model, settings)
    if shape not in state.compiled:
        key = state.key(*shape)
        plan = DecodePlan(
            mode=Decision("compiled", (choice.reason,)),
            max_cache_len=choice.bucket,
            cache_buckets=(choice.bucket,),
            batch_sizes=(query.batch,),
            compile=dict(state.per_call.compile),
            cache_key=key,
        )
        try:
            warm = warm_decode(model, plan, generate=run)
            if not warm.get("compiled"):
                raise RuntimeError("generate() ran the static cache without compiling it")
        except Exception as e:
            return _fall_back(model, state, shape, entry, "compile", e, args, kwargs)
        state.compiled.add(shape)
        entry["warmup"] = {
            k: warm.get(k)
            for k in ("compile_s", "second_s", "graphs_compiled", "graphs_from_cache", "artifacts_loaded")
        }
        entry["warmup"]["artifacts_saved"] = (warm.get("artifacts_saved") or {}).get("bytes", 0)
    try:
        return run(*args, **kwargs)
    except Exception as e:
        return _fall_back(model, state, shape, entry, "compiled call", e, args, kwargs)


def _run_graphed(
    model: Any,
    state: CallState,
    query: CallQuery,
    choice: CallChoice,
    entry: dict[str, Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> Any:
    """A call the policy graphed: transformers' static cache of the bucket, no compile, and the late-stop loop
    with each decode step replayed from this model's :class:`~cudaload.execute.runtime.graphed_step.DecodeGraphs`
    (the first step of a new bucket and batch is captured). A step that could not be captured ran eagerly (the
    same tokens): the shape is then left out of the graphed path for this process. A call that fails runs on
    transformers' dynamic path, as a failed compiled call does."""
    from .runtime.graphed_step import DecodeGraphs

    assert choice.bucket is not None
    shape = (choice.bucket, query.batch)
    if state.graphs is None:
        state.graphs = DecodeGraphs(model)
    seen = len(state.graphs.captures)
    settings = {"cache_implementation": "static", "max_cache_len": choice.bucket, "disable_compile": True}
    try:
        out = type(model).generate(
            model, *args, **kwargs, **settings, custom_generate=decode_loop.graphed_sample(state.graphs.step)
        )
    except Exception as e:
        return _fall_back(model, state, shape, entry, "graphed call", e, args, kwargs, state.graph_failed)
    captured = state.graphs.captures[seen:]
    if captured:
        entry["capture"] = captured[-1]
    if any("error" in c for c in captured):
        state.graph_failed.add(shape)
        warnings.warn(
            f"cudaload: generate()'s decode step for a static cache of {shape[0]:,} slots at batch {shape[1]} "
            f"could not be captured as a CUDA graph ({captured[-1].get('error')}); the call ran it eagerly, and "
            "this shape leaves the graphed path in this process (plan.verified['decode']['calls'])",
            CudaloadWarning,
            stacklevel=4,
        )
    return out


def _fall_back(
    model: Any,
    state: CallState,
    shape: tuple[int, int],
    entry: dict[str, Any],
    what: str,
    err: Exception,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    failed: set[tuple[int, int]] | None = None,
) -> Any:
    failed = state.failed if failed is None else failed
    new = shape not in failed
    failed.add(shape)
    entry["fallback"] = f"the {what} failed ({type(err).__name__}: {err}); ran dynamic"
    try:
        out = type(model).generate(model, *args, **kwargs)
    except Exception:
        if new:  # the dynamic path fails too: the call's own error, not the compiled path's
            failed.discard(shape)
        entry["fallback"] = f"the {what} failed, and so did the dynamic path: the call's own error"
        raise
    warnings.warn(
        f"cudaload: generate()'s {what} for a static cache of {shape[0]:,} slots at batch {shape[1]} failed "
        f"({type(err).__name__}: {err}); this call ran transformers' dynamic path, and this shape stays dynamic in "
        "this process (plan.verified['decode']['calls'])",
        CudaloadWarning,
        stacklevel=4,
    )
    return out


def _observe(state: CallState, query: CallQuery, out: Any, entry: dict[str, Any], t0: float) -> None:
    """What the call ran: its seconds, its new tokens, and for an EOS call the share of ``max_new_tokens`` past
    ``min_new_tokens`` it ran (the policy's history)."""
    entry["seconds"] = round(time.perf_counter() - t0, 3)
    seq = getattr(out, "sequences", out)
    shape = getattr(seq, "shape", None)
    if shape is None or len(shape) != 2:
        return
    ran = int(shape[1]) - query.prompt_len
    entry["new_tokens"] = ran
    span = query.max_new_tokens - query.min_new_tokens
    if query.eos and span > 0:
        state.shares.append(min(max((ran - query.min_new_tokens) / span, 0.0), 1.0))
        del state.shares[:-SHARES_KEPT]


setattr(_per_call_generate, PER_CALL_MARK, True)
