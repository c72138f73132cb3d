"""The unquantized fast load, step by step (:func:`load`), and whether a checkpoint can take it
(:func:`supports`).
"""

from __future__ import annotations

import logging
import os
import time
import traceback
from typing import TYPE_CHECKING, Any

from ..reader import TensorInfo
from .checkpoint import prepare, resolve_device
from .keys import check_keys, plan_keys, torch_dtype
from .skeleton import allocate, build_skeleton, finish, load_report, model_class

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)


def load(
    path: str | os.PathLike[str],
    *,
    auto_class: str = "AutoModelForCausalLM",
    device: str | torch.device = "cuda:0",
    dtype: torch.dtype,
    attn_implementation: str | None = None,
    threads: int | None = None,
    buffer_bytes: int | None = None,
    **from_pretrained_kwargs: Any,
) -> Any:
    """Load a safetensors checkpoint straight into the model's parameter storage on ``device``.

    ``from_pretrained_kwargs`` mean what they mean to ``from_pretrained``: config overrides
    (``rms_norm_eps=...``), ``variant``, ``subfolder``, ``ignore_mismatched_sizes``, model ``__init__``
    keywords. One the fast path cannot honour exactly raises :class:`StepAside` (an InvalidChoiceError)
    before anything is allocated; so does a checkpoint only from_pretrained can read."""
    import torch

    from .. import staging

    t0 = time.perf_counter()
    dev = resolve_device(device)
    threads, buffer_bytes = staging.io_settings(threads, buffer_bytes)
    prep = prepare(path, from_pretrained_kwargs)
    header, config = prep.header, prep.config
    root = header.root
    # Pinning the staging buffers is a fixed cost; started now, it runs while the skeleton is built and its
    # GPU storage allocated instead of in front of the first read.
    pool = (
        staging.PinnedPool(
            staging.pool_size(header.total_bytes, threads, buffer_bytes), buffer_bytes, device=dev
        )
        if dev.type == "cuda"
        else None
    )
    model: Any = None
    fills: Any = None
    try:
        if attn_implementation is not None:
            config._attn_implementation = attn_implementation
        config.name_or_path = prep.options.path  # as from_pretrained sets it
        cls = model_class(config, auto_class)
        model = build_skeleton(config, cls, dtype, prep.model_kwargs)
        keys = plan_keys(model, header)
        check_keys(keys, prep)
        # what from_pretrained keeps for save_pretrained to undo (5.17 core_model_loading.py:1795-1798, end of
        # convert_and_load_state_dict_in_model): the transforms that matched a checkpoint key
        model._weight_conversions = [c for c in keys.conversions if c.was_used()]
        t_build = time.perf_counter()
        fills = allocate(model, keys, header, dev, dtype)
        t_alloc = time.perf_counter()
        fill_times = _fill(fills, dev, threads, buffer_bytes, pool)
        pool = None  # _fill closed it
        t_fill = time.perf_counter()
        info = finish(model, keys, prep.options, prep.model_kwargs, dev, dtype)
    except BaseException as e:
        # Leave nothing behind: the traceback's frames (worker threads included) hold views of the tensors
        # this load allocated; clearing them and the model lets the memory go before the error goes up.
        if pool is not None:
            pool.close()
        # this frame is still running, so clearing tracebacks cannot drop its locals: drop them here
        model = fills = None
        clear_tracebacks(e)
        if dev.type == "cuda":
            torch.cuda.empty_cache()
        raise
    t_end = time.perf_counter()
    read_bytes = sum(info_.nbytes for _, _, info_ in fills)
    model.cudaload_fastload = {
        "seconds": round(t_end - t0, 4),
        "build_s": round(t_build - t0, 4),
        "alloc_s": round(t_alloc - t_build, 4),
        "fill_s": round(t_fill - t_alloc, 4),
        "finish_s": round(t_end - t_fill, 4),
        **fill_times,
        "bytes": read_bytes,
        **load_report(header, info, threads, buffer_bytes, dev),
    }
    logger.info(
        "fast-loaded %s: %.2f GB in %.2f s (%.2f GB/s fill)",
        root,
        read_bytes / 1e9,
        t_end - t0,
        read_bytes / 1e9 / max(t_fill - t_alloc, 1e-9),
    )
    return model


def _fill(
    fills: list[tuple[str, Any, TensorInfo]],
    dev: torch.device,
    threads: int,
    buffer_bytes: int,
    pool: Any,
) -> dict[str, float]:
    from .. import staging

    if not fills:  # no checkpoint tensor has a place in the model: nothing to read
        if pool is not None:
            pool.close()
        return {}
    targets = [staging.Target(name, t.detach(), torch_dtype(info.dtype)) for name, t, info in fills]
    infos = [info for _, _, info in fills]
    if dev.type == "cuda":
        return staging.fill_cuda(
            targets, infos, device=dev, threads=threads, buffer_bytes=buffer_bytes, pool=pool
        )
    staging.fill_cpu(targets, infos, threads=threads, buffer_bytes=buffer_bytes)
    return {}


def clear_tracebacks(e: BaseException | None) -> None:
    """Clear the frames of ``e`` and of every exception it was raised from or during, so the tensors a
    failed load allocated are not held by the traceback while the error goes up."""
    seen: set[int] = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        traceback.clear_frames(e.__traceback__)
        e = e.__cause__ or e.__context__


def supports(
    path: str | os.PathLike[str], *, auto_class: str = "AutoModelForCausalLM", **from_pretrained_kwargs: Any
) -> tuple[bool, str]:
    """Whether ``path`` can take the fast path with these ``from_pretrained`` keywords, and why (or why not).
    Reads headers and config only; builds the skeleton on the meta device (no tensor storage) to check that
    every key maps."""
    import torch

    from ...errors import CudaloadError

    try:
        prep = prepare(path, from_pretrained_kwargs)
        model = build_skeleton(
            prep.config, model_class(prep.config, auto_class), torch.float32, prep.model_kwargs
        )
        keys = plan_keys(model, prep.header)
        check_keys(keys, prep)
    except CudaloadError as e:
        return False, e.message
    except Exception as e:  # a model transformers itself cannot build: from_pretrained will say why
        return False, f"transformers cannot build {auto_class} for this config ({type(e).__name__}: {e})"
    header = prep.header
    n = len(header.files)
    detail = (
        f"{len(keys.load)} tensors, {header.total_bytes / 1e9:.2f} GB in {n} safetensors file{'s' * (n > 1)}"
    )
    missing = keys.missing - set(getattr(model, "all_tied_weights_keys", {}) or {})
    if missing:
        detail += f"; {len(missing)} missing keys are initialised as from_pretrained does"
    return True, detail
