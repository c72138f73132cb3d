"""The plan's decode section applied to a loaded model (issue 35): transformers' own compiled decode path switched on
through the model's generation config, its compile artifacts kept across processes, and a warm-up that pays the
compile before the user's first ``generate()``.

Nothing is patched: a compiled plan sets three fields of ``model.generation_config`` that ``generate()`` reads
(transformers 5.17-5.24 all have them; see :func:`apply_decode`), and gives the model a ``generate`` that passes
transformers' ``custom_generate`` hook the sampling loop with the stop read one step late
(:mod:`cudaload.execute.runtime.decode_loop`). transformers then builds a ``StaticCache`` and
runs each decode step through ``model.get_compiled_call(compile_config)`` (5.17 generation/utils.py:2995-2998;
modeling_utils.py:4676-4692); the prefill stays eager, so only calls that decode at least one token compile.

The compile artifacts (inductor's FX graphs, AOTAutograd entries, autotuning results, dynamo's automatic-dynamic
profiles) go through torch's portable "mega-cache", ``torch.compiler.save_cache_artifacts`` /
``load_cache_artifacts`` (torch >= 2.7; torch 2.13 torch/compiler/__init__.py), into one file per plan
``cache_key`` under ``<CUDALOAD_CACHE>/compile`` (:mod:`cudaload.compile_cache`). Loading writes them into torch's
own on-disk caches, where the next compile finds them; nothing there can make a load fail.

:mod:`cudaload.execute.decode_calls` readies the plan at load (``ready_decode``) and, where no work was declared
(issue 43), gives the model a ``generate`` that decides each call.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from .. import compile_cache
from ..errors import ConfigurationError
from ..plans.decode import DecodePlan
from .runtime import decode_loop

logger = logging.getLogger("cudaload.execute")

#: new tokens per warm-up call: the first comes from the (eager) prefill, the other three from the compiled decode
#: step, which is what reduce-overhead needs to pass its three stages (cudagraph trees run a new graph once eagerly
#: to warm up, record it on the next call, replay it from the third: torch's docs, torch.compiler_cudagraph_trees)
WARM_NEW_TOKENS = 4
#: the warm-up prompt's length where the plan's bucket allows it: short, since the prefill is not compiled
WARM_PROMPT = 16
#: devices transformers compiles the decode step on unless told otherwise (5.17 generation/utils.py:2262-2265)
_COMPILING_DEVICES = ("cuda", "xpu", "neuron", "tpu")


def apply_decode(model: Any, decode: DecodePlan) -> dict[str, Any]:
    """Set the plan's decode mode on ``model.generation_config``; return what was set (for ``plan.verified``).

    A compiled plan sets ``cache_implementation="static"``, ``max_cache_len`` (the bucket: transformers sizes the
    static cache to the larger of a call's prompt + new tokens and this, 5.17 generation/utils.py:2118-2123, and
    keeps the largest it has built, ``_previous_max_cache_length``, :1987-2032, so every call inside the bucket
    meets the same shapes and reuses the compiled graph) and ``compile_config`` (a ``CompileConfig`` of the plan's
    keywords). A call may still override any of them with its own ``generate()`` keywords.

    A dynamic plan returns ``{"mode": "dynamic"}`` and leaves the generation config as it is, but for a
    checkpoint's static-type ``cache_implementation``, which it clears (:func:`_dynamic`)."""
    if not decode.compiled:
        return _dynamic(model)
    if decode.max_cache_len is None or decode.max_cache_len < 2:
        raise ConfigurationError(
            f"a compiled decode plan needs a static cache of 2 slots or more (max_cache_len={decode.max_cache_len})",
            fix="plan it with new_tokens and seq_len, or decode='dynamic'",
        )
    gc = getattr(model, "generation_config", None)
    if gc is None:
        # an encoder, or a model class without generate(): nothing decodes, so nothing compiles
        return {
            "mode": "compiled",
            "applied": False,
            "why": f"{type(model).__name__} has no generation_config",
        }
    from transformers import CompileConfig

    try:
        compile_config = CompileConfig(**decode.compile)
    except TypeError as e:
        raise ConfigurationError(
            f"the decode plan's compile settings {decode.compile} are not CompileConfig's: {e}",
            fix="keep the plan's compile keywords to fullgraph, dynamic, backend, mode and options",
        ) from None
    settings = decode.generation_settings()
    gc.cache_implementation = "static"
    gc.compile_config = compile_config
    out: dict[str, Any] = {
        "mode": "compiled",
        "applied": True,
        "cache_implementation": "static",
        "compile_config": dict(decode.compile),
    }
    # GenerationConfig.max_cache_len: in every transformers cudaload supports (5.17 configuration_utils.py:409,
    # read by generation/utils.py:2122-2123; 5.22 and 5.24 the same)
    gc.max_cache_len = out["max_cache_len"] = settings["max_cache_len"]
    # the compiled step leaves the host's per-token wait as the largest cost above the GPU's work: greedy and
    # sampling calls read the stop one step late (cudaload.execute.runtime.decode_loop), so the host queues the next step meanwhile
    why = decode_loop.install(model)
    out["stop_check"] = "late" if why is None else f"transformers' ({why})"
    device = getattr(model, "device", None)
    if getattr(device, "type", None) not in _COMPILING_DEVICES:
        # transformers does not compile there unless CompileConfig._compile_all_devices is set (its test switch)
        out["compiles_on_device"] = False
    return out


def load_artifacts(key: str | None) -> dict[str, Any]:
    """Hand the artifacts saved for ``key`` to torch before a compile. Returns ``{"bytes": n, "entries": n}`` or,
    where they could not be used (another torch's format, a damaged file), ``{"bytes": n, "error": why}``: the
    compile then runs cold, as without a cache."""
    data = compile_cache.load(key)
    if not data:
        return {"bytes": 0}
    import torch

    try:
        info = torch.compiler.load_cache_artifacts(data)
    except (
        Exception
    ) as e:  # an artifact is an optimisation: any failure to use it costs a compile, not the load
        logger.warning("cudaload: the compile artifacts for %s were not loaded: %s", key, e)
        return {"bytes": len(data), "error": f"{type(e).__name__}: {e}"}
    if info is None:
        # torch returns None where it could not unpickle them (and logs why): another torch's artifacts
        return {"bytes": len(data), "error": "torch could not read them (saved by another torch?)"}
    return {"bytes": len(data), "entries": sum(len(v) for v in info.artifacts.values())}


def save_artifacts(key: str | None) -> dict[str, Any]:
    """Save what this process has compiled so far (torch's mega-cache is per process: every compile since it
    started, this model's decode step and anything else compiled) as ``key``'s artifact."""
    if not key:
        return {"bytes": 0, "why": "the plan has no cache key"}
    import torch

    try:
        got = torch.compiler.save_cache_artifacts()
    except Exception as e:
        logger.warning("cudaload: the compile artifacts were not saved: %s", e)
        return {"bytes": 0, "error": f"{type(e).__name__}: {e}"}
    if got is None:
        return {"bytes": 0, "why": "torch recorded nothing to save"}
    data, _info = got
    path = compile_cache.save(key, data)
    return {"bytes": len(data) if path else 0, "path": str(path) if path else None}


def _sync(device: Any) -> None:
    import torch

    if getattr(device, "type", None) == "cuda":
        torch.cuda.synchronize(device)


def _dynamic(model: Any) -> dict[str, Any]:
    """A dynamic plan: a checkpoint whose generation_config.json asks for a static-type cache (Gemma-2 ships
    ``"hybrid"``, which transformers 5.17 counts as static: generation/configuration_utils.py:50-57) would make
    generate() compile on its first call, which the plan says it never does: the field is cleared (DynamicCache
    builds the same sliding layers from the config) and what the checkpoint asked for is recorded."""
    out: dict[str, Any] = {"mode": "dynamic"}
    gc = getattr(model, "generation_config", None)
    asked = getattr(gc, "cache_implementation", None)
    if gc is None or asked is None:
        return out
    # the names generate() builds a StaticCache for (5.17-5.24 generation/configuration_utils.py:47-57)
    from transformers.generation.configuration_utils import ALL_STATIC_CACHE_IMPLEMENTATIONS

    if asked in ALL_STATIC_CACHE_IMPLEMENTATIONS:  # "offloaded" or "quantized" are dynamic caches: kept
        gc.cache_implementation = None
        out["checkpoint_cache_implementation"] = asked
    return out


def undo_decode(model: Any) -> None:
    """The generation config as a dynamic plan leaves it: no static cache, no compile settings."""
    decode_loop.uninstall(model)
    uninstall_per_call(model)
    gc = getattr(model, "generation_config", None)
    if gc is None:
        return
    gc.cache_implementation = None
    gc.compile_config = None
    gc.max_cache_len = None


def _fresh_artifacts() -> Any:
    """torch's record of compile artifacts, emptied for the warm-up and given back after (torch 2.7+
    torch/compiler/_cache.py ``CacheArtifactManager.with_fresh_cache``): ``save_cache_artifacts`` otherwise
    serialises everything compiled in the process so far, another model's graphs or the user's own included."""
    import contextlib

    try:
        from torch.compiler._cache import CacheArtifactManager

        return CacheArtifactManager.with_fresh_cache()
    except (ImportError, AttributeError):
        return contextlib.nullcontext()


def warm_decode(
    model: Any,
    decode: DecodePlan,
    *,
    prompt_len: int | None = None,
    new_tokens: int = WARM_NEW_TOKENS,
    generate: Callable[..., Any] | None = None,
) -> dict[str, Any]:
    """Compile the decode step ahead: the plan's artifacts loaded, then two short greedy ``generate()`` calls per
    batch size in ``decode.batch_sizes`` on dummy token ids (the first compiles, the second shows the compiled
    speed), then the artifacts saved. :func:`apply_decode` must have run (the generation config carries the plan).

    ``prompt_len``: the dummy prompt's tokens (default :data:`WARM_PROMPT`, less where the bucket is smaller);
    ``generate``: what runs the calls (default ``model.generate``; a per-call compile passes its static settings).
    Returns ``{"compile_s", "second_s",
    "per_batch", "artifacts_loaded", "artifacts_saved", "batch_sizes", "prompt_len", "graphs_from_cache",
    "graphs_compiled", "compiled"}`` (the graphs are inductor's: an ``aot_eager`` backend counts none); ``compiled``
    says whether transformers built its compiled forward (``model._compiled_call``, 5.17
    modeling_utils.py:4686-4692)."""
    if not decode.compiled:
        return {"compiled": False, "why": "the plan decodes with the dynamic cache: nothing to compile"}
    if decode.max_cache_len is None:
        raise ConfigurationError("a compiled decode plan without max_cache_len", fix="plan it again")
    if new_tokens < 2:
        raise ConfigurationError(
            f"new_tokens={new_tokens}: the warm-up must decode at least one token after the prefill",
            fix=f"pass new_tokens={WARM_NEW_TOKENS}",
        )
    if prompt_len is None:
        room = decode.max_cache_len - new_tokens
        prompt_len = min(WARM_PROMPT, room)
    if prompt_len < 1 or prompt_len + new_tokens > decode.max_cache_len:
        raise ConfigurationError(
            f"a warm-up of {prompt_len} prompt + {new_tokens} new tokens does not fit the static cache of "
            f"{decode.max_cache_len} slots",
            fix=f"pass a prompt_len from 1 to {decode.max_cache_len - new_tokens}",
        )
    with _fresh_artifacts():
        return _warm(model, decode, prompt_len, new_tokens, generate or model.generate)


def _warm(
    model: Any, decode: DecodePlan, prompt_len: int, new_tokens: int, generate: Callable[..., Any]
) -> dict[str, Any]:
    import torch
    from torch._dynamo.utils import counters

    loaded = load_artifacts(decode.cache_key)
    # inductor's FX-graph cache counts its hits and misses here (torch/_inductor/codecache.py): a miss during the
    # warm-up is a graph compiled from scratch, a hit one the saved artifacts (or torch's own disk cache) held
    before = {k: counters["inductor"][k] for k in ("fxgraph_cache_hit", "fxgraph_cache_miss")}
    device = model.device
    vocab = int(model.config.get_text_config(decoder=True).vocab_size)
    pad = model.generation_config.pad_token_id
    if isinstance(pad, (list, tuple)):
        pad = pad[0] if pad else None
    eos = model.generation_config.eos_token_id
    if pad is None:  # generate() would warn and take eos as pad; saying it here keeps the warm-up quiet
        pad = eos[0] if isinstance(eos, (list, tuple)) and eos else eos
    per_batch: list[dict[str, Any]] = []
    for batch in decode.batch_sizes or (decode.work.batch,):
        # the same dummy ids for each call: tokens 3.. of the vocabulary, away from the usual special ids 0-2
        ids = (torch.arange(batch * prompt_len, device=device) % max(vocab - 3, 1) + 3).view(
            batch, prompt_len
        )
        mask = torch.ones_like(ids)
        seconds = []
        for _ in range(2):
            _sync(device)
            t0 = time.perf_counter()
            # no inference_mode here: generate() runs under no_grad, and a graph compiled inside inference_mode
            # guards on the parameters' dispatch keys without autograd, so the user's first call recompiled
            out = generate(
                input_ids=ids,
                attention_mask=mask,
                max_new_tokens=new_tokens,
                min_new_tokens=new_tokens,  # no early stop at an EOS: every step runs
                do_sample=False,
                pad_token_id=pad,
            )
            _sync(device)
            seconds.append(time.perf_counter() - t0)
        if out.shape[-1] != prompt_len + new_tokens:
            raise RuntimeError(f"the warm-up generated {out.shape[-1] - prompt_len} tokens, not {new_tokens}")
        per_batch.append({"batch": batch, "first_s": round(seconds[0], 3), "second_s": round(seconds[1], 4)})
    saved = save_artifacts(decode.cache_key)
    return {
        "compiled": hasattr(model, "_compiled_call"),
        "compile_s": round(sum(b["first_s"] for b in per_batch), 3),
        "second_s": round(sum(b["second_s"] for b in per_batch), 4),
        "per_batch": per_batch,
        "artifacts_loaded": loaded,
        "artifacts_saved": saved,
        "batch_sizes": [b["batch"] for b in per_batch],
        "prompt_len": prompt_len,
        "graphs_from_cache": counters["inductor"]["fxgraph_cache_hit"] - before["fxgraph_cache_hit"],
        "graphs_compiled": counters["inductor"]["fxgraph_cache_miss"] - before["fxgraph_cache_miss"],
    }


#: the attribute that marks the per-call ``generate`` (:mod:`cudaload.execute.decode_calls`): this module undoes
#: it without importing that one, which imports this
PER_CALL_MARK = "cudaload_per_call"


def per_call_installed(model: Any) -> bool:
    own = vars(model).get("generate") if hasattr(model, "__dict__") else None
    return bool(getattr(getattr(own, "func", None), PER_CALL_MARK, False))


def uninstall_per_call(model: Any) -> None:
    if per_call_installed(model):
        del model.generate
