"""The quantized fast load, step by step (:func:`load_quantized`), and whether a load can take it
(:func:`supports_quantized`).

Finishing: ``materialize.finish`` with the quantizer, i.e. transformers' ``_finalize_model_loading`` with
``hf_quantizer`` in its ``LoadStateDictConfig`` as from_pretrained passes it (initialise missing, tie, the
load report), eval, ``set_use_kernels(False)``, generation config; ``_weight_conversions`` as
``convert_and_load_state_dict_in_model`` leaves it; then ``model.hf_quantizer = hf_quantizer`` and
``hf_quantizer.postprocess_model(model)`` as ``from_pretrained`` ends (transformers 5.17
``modeling_utils.py:4335-4339``).
"""

from __future__ import annotations

import logging
import os
import time
from typing import TYPE_CHECKING, Any

from ...errors import CudaloadError
from ..materialize import clear_tracebacks, finish, load_report, resolve_device
from .checks import StepAside, _bnb_config_or_none, _check_quant_options, _pick_device
from .fill import _fill_and_quantize, _layer_groups
from .prepare import _prepare

if TYPE_CHECKING:
    import torch

logger = logging.getLogger("cudaload.fastload.quantized")  # the name before the split


def load_quantized(
    path: str | os.PathLike[str],
    *,
    quantization_config: Any,
    auto_class: str = "AutoModelForCausalLM",
    device: str | torch.device | None = None,
    device_map: Any = None,
    dtype: torch.dtype,
    attn_implementation: str | None = None,
    threads: int | None = None,
    buffer_bytes: int | None = None,
    **from_config_kwargs: Any,
) -> Any:
    """Load an unquantized safetensors checkpoint and quantize it with bitsandbytes on ``device``, layer by
    layer; the result equals ``from_pretrained(path, dtype=dtype, device_map=device,
    quantization_config=quantization_config)``. Raises :class:`StepAside` (an InvalidChoiceError) for what
    the fast path does not cover.

    ``device`` (default ``cuda:0``) or a ``device_map`` naming one device (``"cuda:1"``, ``{"": 0}``) says
    where; a device_map over several devices steps aside."""
    import torch

    from .. import staging

    t0 = time.perf_counter()
    dev = resolve_device(_pick_device(device, device_map) or "cuda:0")
    threads, buffer_bytes = staging.io_settings(threads, buffer_bytes)
    prep: Any = _prepare(
        path, quantization_config, auto_class, dev, dtype, attn_implementation, from_config_kwargs
    )
    model, header, keys = prep.model, prep.header, prep.keys
    t_build = time.perf_counter()
    try:
        # what from_pretrained keeps for save_pretrained to undo (5.17 core_model_loading.py:1795-1798, end of
        # convert_and_load_state_dict_in_model): the renamings that matched a checkpoint key. The quantizer's
        # update_weight_conversions (quantizers/base.py:297-308) appends get_weight_conversions(), which for
        # bitsandbytes is non-empty only for a pre-quantized checkpoint (quantizer_bnb_4bit.py:168-171,
        # quantizer_bnb_8bit.py:167-170); those step aside here.
        model._weight_conversions = [c for c in keys.conversions if c.was_used()]
        times = _fill_and_quantize(prep, dev, threads, buffer_bytes)
        t_quant = time.perf_counter()
        info = finish(
            model,
            keys,
            prep.base.options,
            prep.model_kwargs,
            dev,
            prep.dtype,
            hf_quantizer=prep.hf_quantizer,
        )
        # from_pretrained's last steps (transformers 5.17 modeling_utils.py:4335-4339)
        model.hf_quantizer = prep.hf_quantizer
        prep.hf_quantizer.postprocess_model(model)
    except BaseException as e:
        # Leave nothing behind: the traceback's frames hold the half-built model and its tensors; this frame
        # is still running, so its own references are dropped by hand.
        model = prep = None
        clear_tracebacks(e)
        if dev.type == "cuda":
            torch.cuda.empty_cache()
        raise
    t_end = time.perf_counter()
    model.cudaload_fastload = {
        "seconds": round(t_end - t0, 4),
        "build_s": round(t_build - t0, 4),
        **times,
        "finish_s": round(t_end - t_quant, 4),
        "quantization": prep.method,
        "quantized_weights": len(prep.quantized),
        "bytes": sum(header.tensors[src].nbytes for src in keys.load.values()),
        **load_report(header, info, threads, buffer_bytes, dev),
    }
    logger.info("fast-loaded %s with %s quantization in %.2f s", header.root, prep.method, t_end - t0)
    return model


def supports_quantized(
    path: str | os.PathLike[str],
    quantization_config: Any,
    auto_class: str = "AutoModelForCausalLM",
    *,
    device: str | None = None,
    device_map: Any = None,
) -> tuple[bool, str]:
    """Whether ``from_pretrained(path, quantization_config=...)`` can take the quantized fast path, and why
    (or why not). Reads headers and config and converts the skeleton on the meta device; no tensor storage.

    ``device_map``: what the caller would pass to from_pretrained; anything over more than one device steps
    aside. ``device`` (default: the CUDA device when one is visible, else the CPU) is where it would load."""
    import torch

    try:
        if device_map is not None:
            _check_quant_options(_bnb_config_or_none(quantization_config), device_map)
        device = _pick_device(device, device_map)
        dev = torch.device(device) if device else torch.device("cuda" if torch.cuda.is_available() else "cpu")
        if dev.type not in ("cuda", "cpu"):
            raise StepAside(f"device type {dev.type!r} (the fast path loads onto cuda or cpu)")
        dev = resolve_device(dev)
        prep = _prepare(path, quantization_config, auto_class, dev, torch.bfloat16, None, {})
    except StepAside as e:
        return False, e.reason
    except CudaloadError as e:
        return False, e.message
    except Exception as e:  # a model transformers itself cannot build: from_pretrained will say why
        return False, f"transformers cannot build {auto_class} for this config ({type(e).__name__}: {e})"
    q_bytes = sum(prep.header.tensors[src].nbytes for src in prep.quantized.values())
    groups = _layer_groups(prep)
    largest = max(sum(prep.header.tensors[prep.quantized[k]].nbytes for k in g) for g in groups)
    return True, (
        f"{prep.method}: {len(prep.quantized)} weights ({q_bytes / 1e9:.2f} GB) quantized on the device in "
        f"{len(groups)} layers (the largest {largest / 2**20:.0f} MiB in the checkpoint); "
        f"{len(prep.keys.load) - len(prep.quantized)} other tensors loaded as they are"
    )
