"""How checkpoint keys land on the model's state_dict, by transformers' own renaming rules
(:func:`plan_keys`), what the fast path cannot copy (:func:`check_keys`: weight converters, dtypes, extra state,
mismatched shapes), and the safetensors dtypes it reads (:func:`torch_dtype`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ...checkpoint_coverage import coverage_error
from ...errors import DependencyError
from ..reader import CheckpointHeader
from .checkpoint import Prepared, step_aside

if TYPE_CHECKING:
    import torch


#: safetensors dtype string -> torch dtype name
_TORCH_DTYPES = {
    "F64": "float64",
    "F32": "float32",
    "F16": "float16",
    "BF16": "bfloat16",
    "I64": "int64",
    "I32": "int32",
    "I16": "int16",
    "I8": "int8",
    "U64": "uint64",
    "U32": "uint32",
    "U16": "uint16",
    "U8": "uint8",
    "BOOL": "bool",
    "F8_E4M3": "float8_e4m3fn",
    "F8_E5M2": "float8_e5m2",
}


def torch_dtype(st_dtype: str) -> torch.dtype:
    import torch

    dt = getattr(torch, _TORCH_DTYPES[st_dtype], None)
    if dt is None:
        raise DependencyError(f"this torch has no dtype for safetensors {st_dtype}", fix="upgrade torch")
    return dt  # type: ignore[no-any-return]


@dataclass
class KeyPlan:
    """How checkpoint keys map onto the model's state_dict (names as transformers reports them)."""

    load: dict[str, str] = field(default_factory=dict)  # model key -> checkpoint key
    missing: set[str] = field(default_factory=set)  # model keys the checkpoint lacks
    unexpected: set[str] = field(default_factory=set)  # checkpoint keys (renamed) the model has no place for
    needs_conversion: list[str] = field(default_factory=list)  # keys only a WeightConverter can load
    mismatched: list[str] = field(default_factory=list)  # "key: checkpoint shape vs model shape"
    mismatched_shapes: set[tuple[str, Any, Any]] = field(default_factory=set)  # as transformers records them
    unsupported_dtype: list[str] = field(default_factory=list)  # "key (dtype)" the fast path cannot copy
    # ``_extra_state`` keys: transformers calls set_extra_state, there are no bytes to copy
    extra_state: list[str] = field(default_factory=list)
    # transformers' renamings/converters for this model (the ones used are kept on the model)
    conversions: list[Any] = field(default_factory=list)
    model_name: str = "the model"  # the class, for messages
    prefix: str | None = None  # its base_model_prefix


def plan_keys(model: Any, header: CheckpointHeader) -> KeyPlan:
    """Map checkpoint keys onto ``model.state_dict()`` with transformers' own renaming rules, in its order.

    transformers (core_model_loading.py ``convert_and_load_state_dict_in_model``, 5.17:1647-1669,
    5.24:1884-1906) visits checkpoint keys sorted by ``dot_natural_key``, renames each, and keeps the *first*
    key that lands on a parameter (``param_name_to_load.setdefault``; ``WeightRenaming.convert`` reads
    ``source_patterns[0]``). A key with no place in the model is reported under its renamed name."""
    meta_sd = model.state_dict()
    prefix = getattr(model, "base_model_prefix", None) or None
    renamings: list[Any] = []
    converters: list[Any] = []
    rename: Any = None
    order: Any = None
    try:
        from transformers.conversion_mapping import get_model_conversion_mapping
        from transformers.core_model_loading import (
            WeightConverter,
            WeightRenaming,
            dot_natural_key,
            rename_source_key,
        )

        conversions = get_model_conversion_mapping(model, None, None)
        renamings = [c for c in conversions if isinstance(c, WeightRenaming)]
        converters = [c for c in conversions if isinstance(c, WeightConverter)]
        rename = rename_source_key
        order = dot_natural_key
    except ImportError:  # a transformers without the 5.x loading machinery: exact keys and the prefix only
        rename = None

    plan = KeyPlan(conversions=[*renamings, *converters], model_name=type(model).__name__, prefix=prefix)
    seen: set[str] = set()
    for key in sorted(header.tensors, key=order):
        if rename is not None:
            new, pattern = rename(key, renamings, converters, prefix, meta_sd)
            if new not in meta_sd and key in meta_sd:
                new, pattern = rename(key, [], [], prefix, meta_sd)
        else:
            new, pattern = _prefix_only(key, prefix, meta_sd), None
        if pattern is not None:
            plan.needs_conversion.append(key)
            continue
        if new not in meta_sd:
            plan.unexpected.add(new)
            continue
        if new in seen:
            continue  # a later duplicate: transformers reads the first
        seen.add(new)
        info, ref = header.tensors[key], meta_sd[new]
        if new.rpartition(".")[2] == "_extra_state":
            plan.extra_state.append(new)
            continue
        if tuple(ref.shape) != info.shape:
            plan.mismatched.append(f"{new}: checkpoint {list(info.shape)} vs model {list(ref.shape)}")
            # torch.Size both, as set_param_for_module records them (its report prints them)
            plan.mismatched_shapes.add((new, type(ref.shape)(info.shape), ref.shape))
            continue
        if info.dtype not in _TORCH_DTYPES:
            plan.unsupported_dtype.append(f"{key} ({info.dtype})")
            continue
        plan.load[new] = key
    # built as transformers builds it (all keys, then discard), so the set iterates in the same order and
    # transformers' load report lists the keys in the same order
    plan.missing = set(meta_sd.keys())
    for k in seen:
        plan.missing.discard(k)
    return plan


def _prefix_only(key: str, prefix: str | None, meta_sd: Mapping[str, Any]) -> str:
    if prefix:
        if key.startswith(prefix + ".") and key[len(prefix) + 1 :] in meta_sd:
            return key[len(prefix) + 1 :]
        if f"{prefix}.{key}" in meta_sd:
            return f"{prefix}.{key}"
    return key


def check_keys(keys: KeyPlan, prep: Prepared) -> None:
    """Step aside for keys only from_pretrained loads; fail as it fails on mismatched shapes."""
    root = prep.options.path
    if keys.needs_conversion:
        raise step_aside(
            root,
            f"{len(keys.needs_conversion)} checkpoint tensors need transformers' weight conversion "
            f"(e.g. {keys.needs_conversion[0]!r})",
        )
    if keys.unsupported_dtype:
        raise step_aside(
            root, f"tensors of a dtype the fast path does not copy: {keys.unsupported_dtype[:4]}"
        )
    if keys.extra_state:
        raise step_aside(root, f"module extra state is set by set_extra_state: {keys.extra_state[:4]}")
    if keys.mismatched_shapes and not prep.options.ignore_mismatched_sizes:
        # from_pretrained raises RuntimeError after its report (5.25 utils/loading_report.py:236-239,
        # log_state_dict_report); refused here before any storage is allocated, as a CheckpointCoverageError
        # (also a LoadError, a RuntimeError) naming the tensors
        raise coverage_error(root, keys.model_name, mismatched=keys.mismatched_shapes, prefix=keys.prefix)
