"""The model itself: built on the meta device as ``from_pretrained`` builds it (:func:`model_class`,
:func:`build_skeleton`), given storage for what the checkpoint fills (:func:`allocate`), and finished by
transformers' own ``_finalize_model_loading`` (:func:`finish`), whose report :func:`load_report` passes on.
"""

from __future__ import annotations

import contextlib
import copy
import os
import re
from collections.abc import Collection, Mapping
from typing import TYPE_CHECKING, Any

from ...errors import ConfigurationError, InvalidChoiceError
from ..reader import CheckpointHeader, TensorInfo
from .checkpoint import LoadOptions, step_aside
from .keys import KeyPlan

if TYPE_CHECKING:
    import torch


def model_class(config: Any, auto_class: str) -> Any:
    import transformers

    auto = getattr(transformers, auto_class, None)
    mapping = getattr(auto, "_model_mapping", None)
    if mapping is None:
        raise ConfigurationError(
            f"{auto_class!r} is not a transformers auto class", fix="use e.g. AutoModelForCausalLM"
        )
    try:
        from transformers.models.auto.auto_factory import _get_model_class

        return _get_model_class(config, mapping)  # type: ignore[no-untyped-call]
    except KeyError:
        raise InvalidChoiceError(
            f"{auto_class} has no model for config type {type(config).__name__}",
            fix="pick the auto class that matches this checkpoint (e.g. AutoModel for encoders)",
        ) from None


def build_skeleton(config: Any, cls: Any, dtype: torch.dtype, model_kwargs: Mapping[str, Any]) -> Any:
    """The model on the meta device, constructed exactly as ``from_pretrained`` constructs it."""
    from transformers.utils.generic import ContextManagers

    config = copy.deepcopy(config)
    # from_pretrained records the load dtype on the config and its sub-configs
    config.dtype = dtype
    for key in getattr(config, "sub_configs", {}) or {}:
        sub = getattr(config, key, None)
        if sub is not None:
            sub.dtype = dtype
    patch_output_recorders: Any = None
    with contextlib.suppress(ImportError):  # a transformers without output recorders has nothing to patch
        from transformers.monkey_patching import patch_output_recorders
    contexts = cls.get_init_context(dtype, False, False, None)
    with ContextManagers(contexts):
        model = cls(config, **model_kwargs)
        if patch_output_recorders is not None:
            patch_output_recorders(model)  # from_pretrained does this inside the same contexts
    return model


def _dtype_plan_match(model: Any, dtype: torch.dtype) -> tuple[Any, Any]:
    """(regex, {group: dtype}) of the model's keep-in-float32 plan, matched as transformers matches it."""
    plan = model._get_dtype_plan(dtype) if hasattr(model, "_get_dtype_plan") else {}
    if not plan:
        return None, None
    try:
        from transformers.core_model_loading import build_glob_alternation

        alt, by_group, _ = build_glob_alternation(list(plan.keys()))
        return alt, {g: plan[glob] for g, glob in by_group.items()}
    except ImportError:
        pattern = re.compile("|".join(f"(?P<g{i}>{k.replace('*', '.*')})" for i, k in enumerate(plan)))
        return pattern, {f"g{i}": v for i, v in enumerate(plan.values())}


def _set_tensor(model: Any, name: str, value: Any) -> None:
    parent_name, _, leaf = name.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    setattr(parent, leaf, value)


def allocate(
    model: Any,
    keys: KeyPlan,
    header: CheckpointHeader,
    device: torch.device,
    dtype: torch.dtype,
    *,
    skip: Collection[str] = (),
) -> list[tuple[str, Any, TensorInfo]]:
    """Give every tensor the checkpoint fills uninitialised storage on ``device``, set on its module as
    transformers' ``set_param_for_module`` sets it (a new ``Parameter``, ``requires_grad`` for floating
    point, flagged ``_is_hf_initialized``). Everything else stays on meta: ``finish`` hands it to
    transformers' own finishing steps, which move, initialise and tie it as from_pretrained does.

    ``skip``: model keys of ``keys.load`` the caller gives storage itself (the quantized path quantizes those
    weights layer by layer; full-size storage for them here would double its peak).

    Returns (model key, tensor, source) for every tensor to fill."""
    import torch

    fp32_re, fp32_by_group = _dtype_plan_match(model, dtype)
    meta_sd = model.state_dict(keep_vars=True)
    buffers = {n for n, _ in model.named_buffers(remove_duplicate=False)}
    fills: list[tuple[str, Any, TensorInfo]] = []
    skipped = frozenset(skip)
    for name, src in keys.load.items():
        if name in skipped:
            continue
        meta = meta_sd[name]
        target_dtype = meta.dtype
        if fp32_re is not None:
            m = fp32_re.search(name)
            if m is not None and m.lastgroup in fp32_by_group:
                target_dtype = fp32_by_group[m.lastgroup]
        src_info = header.tensors[src]
        real = torch.empty(meta.shape, dtype=target_dtype, device=device)
        value: Any = (
            real if name in buffers else torch.nn.Parameter(real, requires_grad=real.is_floating_point())
        )
        value._is_hf_initialized = True  # what set_param_for_module marks: init must not touch it
        fills.append((name, value, src_info))
        _set_tensor(model, name, value)
    return fills


def finish(
    model: Any,
    keys: KeyPlan,
    options: LoadOptions,
    model_kwargs: Mapping[str, Any],
    device: torch.device,
    dtype: torch.dtype,
    *,
    hf_quantizer: Any = None,
    pending: Collection[str] = (),
) -> Any:
    """Finish as from_pretrained finishes, by calling its own ``_finalize_model_loading``: flag tied weights,
    move what is missing (and mismatched) off meta, initialise it, recompute non-persistent buffers, tie,
    drop the keys the model ignores, log transformers' load report; then eval and the generation config.

    ``hf_quantizer``: the quantizer of a quantized load, handed to ``_finalize_model_loading`` as
    from_pretrained hands it (it decides how missing keys leave meta and that initialisation knows the model
    is quantized).

    ``pending``: model keys that may still be on meta afterwards because the caller fills them later (the
    sharded loader, :mod:`cudaload.fastload.sharded`, finishes on the meta skeleton before sharding it).

    Returns transformers' ``LoadStateDictInfo`` (missing, unexpected, mismatched keys after adjustment)."""
    import dataclasses

    from transformers.modeling_utils import LoadStateDictConfig
    from transformers.utils.loading_report import LoadStateDictInfo

    defaults: dict[str, Any] = {
        f.name: (set() if "keys" in f.name else [] if "msgs" in f.name else {})
        for f in dataclasses.fields(LoadStateDictInfo)
    }
    # the sets themselves, not copies: a copy can iterate in another order, and the report follows it
    defaults.update(
        missing_keys=keys.missing, unexpected_keys=keys.unexpected, mismatched_keys=keys.mismatched_shapes
    )
    info = LoadStateDictInfo(**defaults)
    load_config = LoadStateDictConfig(
        pretrained_model_name_or_path=options.path,
        ignore_mismatched_sizes=options.ignore_mismatched_sizes,
        device_map={"": device},
        dtype=dtype,
        dtype_plan=model._get_dtype_plan(dtype) if hasattr(model, "_get_dtype_plan") else {},
        hf_quantizer=hf_quantizer,
    )
    info = type(model)._finalize_model_loading(model, load_config, info)
    waiting = frozenset(pending)
    leftover = [
        n
        for n, t in [*model.named_parameters(), *model.named_buffers()]
        if t.device.type == "meta" and n not in waiting
    ]
    if leftover:
        raise step_aside(
            options.path, f"after loading, {len(leftover)} tensors are still on meta, e.g. {leftover[0]!r}"
        )
    model.eval()
    if hasattr(model, "set_use_kernels"):
        model.set_use_kernels(False, None)
    if model.can_generate() and hasattr(model, "adjust_generation_fn"):
        # from_pretrained's own step (generation_config.json, else the one derived from config.json)
        model.adjust_generation_fn(
            None,
            True,
            None,
            options.path,
            **options.download,
            trust_remote_code=options.trust_remote_code,
            **model_kwargs,
        )
    return info


def load_report(
    header: CheckpointHeader, loading: Any, threads: int, buffer_bytes: int, dev: torch.device
) -> dict[str, Any]:
    """The part of ``model.cudaload_fastload`` every fast path reports: how it read and what was left over."""
    return {
        "threads": threads,
        "buffer_bytes": buffer_bytes,
        "device": str(dev),
        "files": [os.path.basename(f) for f in header.files],
        # transformers' own report, after its adjustments (what from_pretrained(output_loading_info=True) gives)
        "missing_keys": sorted(loading.missing_keys),
        "unexpected_keys": sorted(loading.unexpected_keys),
        "mismatched_keys": sorted((k, list(a), list(b)) for k, a, b in loading.mismatched_keys),
    }
