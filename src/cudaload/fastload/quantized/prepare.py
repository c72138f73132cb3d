"""Everything up to storage (:func:`_prepare`): the quantizer, the meta skeleton converted to bnb modules, the
key plan, and which weights are quantized. A load the fast path cannot do exactly steps aside here, before
anything is allocated.

Each of these is transformers' own call, made as ``from_pretrained`` makes it:

- the quantizer: ``transformers.quantizers.auto.get_hf_quantizer`` (what ``from_pretrained`` calls: it sets
  ``config.quantization_config``, builds the quantizer with ``AutoHfQuantizer.from_config``, validates the
  environment and the device map);
- which modules are replaced: ``hf_quantizer.preprocess_model`` on the meta skeleton, inside the model's init
  context as ``from_pretrained`` does (so the skip list is transformers' ``get_modules_to_not_convert``:
  ``llm_int8_skip_modules``, tied and output embeddings, ``_keep_in_fp32_modules``), and
  ``replace_with_bnb_linear`` makes the bnb modules;
- which weights are quantized: ``hf_quantizer.param_needs_quantization``;
- keywords, config, checkpoint files and headers: ``materialize.prepare``, shared with the unquantized fast
  path (files from transformers' ``_get_resolved_checkpoint_files``: ``variant``, ``subfolder``, single file
  before index; the same step-asides for keywords only from_pretrained honours, ``.bin`` files, adapters);
  key renames and their checks: ``materialize.plan_keys`` / ``check_keys``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..materialize import build_skeleton, check_keys, model_class, plan_keys, prepare
from ..reader import CheckpointHeader
from .checks import StepAside, _bnb_config, _check_quant_options, _method

if TYPE_CHECKING:
    import torch

    from ..materialize import KeyPlan, Prepared


@dataclass
class _Prepared:
    """A quantized skeleton on the meta device and the plan to fill it."""

    model: Any
    header: CheckpointHeader
    keys: KeyPlan
    base: Prepared  # what materialize.prepare decided: keywords, config, files, headers
    hf_quantizer: Any
    dtype: torch.dtype
    #: the weights to quantize: model key -> checkpoint key
    quantized: dict[str, str] = field(default_factory=dict)
    method: str = ""  # "int8" | "nf4" | "fp4"
    model_kwargs: dict[str, Any] = field(default_factory=dict)  # what the config left for the model


def _device_map_for(dev: torch.device) -> Any:
    """The device map ``from_pretrained(device_map=str(dev))`` works with."""
    import transformers.modeling_utils as mu

    check = getattr(mu, "check_and_set_device_map", None)
    # without it (older layout) the quantizer only looks at the values of a dict
    return check(str(dev)) if check is not None else {"": str(dev)}


def _prepare(
    path: str | os.PathLike[str],
    quantization_config: Any,
    auto_class: str,
    dev: torch.device,
    dtype: torch.dtype,
    attn_implementation: str | None,
    from_config_kwargs: Mapping[str, Any],
) -> _Prepared:
    """Everything up to (not including) storage: checks, quantizer, skeleton, key plan. Raises StepAside."""
    try:
        import bitsandbytes  # noqa: F401
    except ImportError as e:
        raise StepAside(f"bitsandbytes is not importable ({e})") from None
    try:
        from transformers.quantizers.auto import get_hf_quantizer
        from transformers.utils.generic import ContextManagers
    except ImportError as e:
        raise StepAside(
            f"this transformers lacks the quantizer entry point from_pretrained uses ({e})"
        ) from None

    _bnb_config(quantization_config)
    # keywords, config (with overrides), checkpoint files found by transformers' _get_resolved_checkpoint_files,
    # validated headers: exactly what the unquantized fast path reads (it steps aside for a quantization_config
    # or an auto_map in config.json, .bin checkpoints, adapters, keywords only from_pretrained honours)
    base = prepare(path, from_config_kwargs)
    header, config, model_kwargs = base.header, base.config, base.model_kwargs
    if getattr(config.get_text_config(decoder=True), "quantization_config", None):
        raise StepAside("the text config has a quantization_config (a pre-quantized checkpoint)")
    config.name_or_path = base.options.path  # as from_pretrained sets it
    if attn_implementation is not None:
        config._attn_implementation = attn_implementation  # before the quantizer sees the config, as in 5.24
    hf_quantizer, config, device_map = _bnb_quantizer(get_hf_quantizer, config, quantization_config, dev)
    qcfg = hf_quantizer.quantization_config
    method = _method(qcfg)
    _check_quant_options(qcfg, device_map)
    dtype = hf_quantizer.update_dtype(dtype)  # what _get_dtype does with a quantizer (modeling_utils.py:889)

    cls = model_class(config, auto_class)
    model = build_skeleton(config, cls, dtype, model_kwargs)
    # The key plan is made on the unconverted skeleton: bnb modules keep the names (weight, bias) but store
    # Conv1D weights transposed, so only the original modules give the checkpoint's shapes.
    keys = plan_keys(model, header)
    if keys.needs_conversion:
        raise StepAside(
            f"{len(keys.needs_conversion)} tensors need transformers' weight conversion "
            f"(e.g. {keys.needs_conversion[0]!r}: fused MoE experts or similar)"
        )
    # the bf16 path's checks: step aside for extra state and dtypes it does not copy, fail (LoadError) on
    # mismatched shapes as from_pretrained fails unless ignore_mismatched_sizes
    check_keys(keys, base)
    if keys.mismatched:
        raise StepAside(
            f"ignore_mismatched_sizes with {len(keys.mismatched)} mismatched tensors "
            f"(e.g. {keys.mismatched[0]})"
        )
    # from_pretrained converts the skeleton inside its init context (modeling_utils.py:4266-4278): the bnb
    # modules are then made in the load dtype, which is the dtype their weights are cast to before quantizing
    with ContextManagers(cls.get_init_context(dtype, True, False, None)):
        hf_quantizer.preprocess_model(
            model=model,
            dtype=dtype,
            device_map=device_map,
            checkpoint_files=list(header.files),
            use_kernels=False,
        )
    quantized = _weights_to_quantize(model, hf_quantizer, keys, header, dtype)
    return _Prepared(model, header, keys, base, hf_quantizer, dtype, quantized, method, dict(model_kwargs))


def _bnb_quantizer(
    get_hf_quantizer: Callable[..., Any], config: Any, quantization_config: Any, dev: torch.device
) -> tuple[Any, Any, Any]:
    """transformers' quantizer for ``quantization_config``, the config it set, and the device map it checked, as
    from_pretrained gets them; StepAside unless it is bitsandbytes quantizing an unquantized checkpoint."""
    device_map = _device_map_for(dev)
    try:
        # what from_pretrained calls (transformers 5.17 modeling_utils.py:4208): sets config.quantization_config,
        # AutoHfQuantizer.from_config, validate_environment, update_device_map
        hf_quantizer, config, device_map = get_hf_quantizer(config, quantization_config, device_map, True, {})
    except (ImportError, ValueError, RuntimeError, TypeError) as e:
        raise StepAside(f"transformers refuses this quantization config ({type(e).__name__}: {e})") from None
    if hf_quantizer is None or hf_quantizer.pre_quantized:
        raise StepAside("transformers treats this checkpoint as pre-quantized")
    qcfg = hf_quantizer.quantization_config
    if (
        getattr(qcfg, "quant_method", None) != "bitsandbytes"
        and str(getattr(qcfg.quant_method, "value", "")) != "bitsandbytes"
    ):
        raise StepAside(f"quant_method {qcfg.quant_method!r} is not bitsandbytes")
    return hf_quantizer, config, device_map


def _weights_to_quantize(
    model: Any, hf_quantizer: Any, keys: KeyPlan, header: CheckpointHeader, dtype: torch.dtype
) -> dict[str, str]:
    """The weights bitsandbytes quantizes, each with its checkpoint key; StepAside where from_pretrained would
    do what this path does not (a quantized weight tied to another tensor, missing from the checkpoint, stored
    as other than floats, or kept in float32 by the model), or where nothing is quantized."""
    want = [
        n
        for n, _ in model.named_parameters(remove_duplicate=False)
        if hf_quantizer.param_needs_quantization(model, n)
    ]
    tied = getattr(model, "all_tied_weights_keys", {}) or {}
    tied_names = set(tied) | {str(v) for v in tied.values()}
    shared = [n for n in want if n in tied_names]
    if shared:
        # from_pretrained leaves such a module a bnb Linear around an unquantized tied tensor
        raise StepAside(f"weight to quantize {shared[0]!r} is tied to another tensor")
    quantized = {n: keys.load[n] for n in want if n in keys.load}
    unloaded = [n for n in want if n not in quantized]
    if unloaded:
        raise StepAside(
            f"{len(unloaded)} weights to quantize are not in the checkpoint (e.g. {unloaded[0]!r})"
        )
    packed = sorted(
        k for k, src in quantized.items() if not header.tensors[src].dtype.startswith(("F", "BF"))
    )
    if packed:
        raise StepAside(
            f"{packed[0]!r} is stored as {header.tensors[quantized[packed[0]]].dtype}, not as floats "
            "(a pre-quantized checkpoint without its quantization_config?)"
        )
    plan = model._get_dtype_plan(dtype) if hasattr(model, "_get_dtype_plan") else {}
    if plan:
        pattern = re.compile("|".join(f"({k.replace('*', '.*')})" for k in plan))
        forced = sorted(k for k in quantized if pattern.search(k))
        if forced:
            raise StepAside(f"{forced[0]!r} is both quantized and kept in float32 by the model")
    if not quantized:
        raise StepAside("no weight of this model is quantized by bitsandbytes")
    return quantized
