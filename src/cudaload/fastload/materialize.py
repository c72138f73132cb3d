"""Build the model skeleton on the meta device, give each tensor real storage on the target device, fill
it from the checkpoint, and finish the way ``from_pretrained`` finishes.

Every step that decides *what* the model holds is transformers' own, called rather than re-implemented, so the
result matches ``from_pretrained(path, dtype=..., device_map=device)`` bit for bit:

- construction: ``cls.get_init_context(dtype, ...)`` (meta device, default dtype, no tying in ``__init__``)
  and ``cls(config)``, as ``from_pretrained`` does;
- checkpoint key renames: ``get_model_conversion_mapping`` + ``rename_source_key`` (prefixes for base vs head
  classes, legacy ``gamma``/``beta``, per-model renames). A key that needs a *converter* (tensors fused or
  split, e.g. MoE experts stacked into one parameter) is out of scope: :func:`plan_keys` reports it;
- dtypes: the skeleton's dtype, or float32 where ``_get_dtype_plan`` keeps a module in float32;
- finishing: loaded tensors are flagged ``_is_hf_initialized``, tied targets too, then
  ``initialize_weights()`` initialises exactly what is missing and recomputes non-persistent buffers
  (rotary ``inv_freq``, BERT's ``position_ids``), ``tie_weights(missing_keys=...)`` ties (symmetrically,
  as in ``from_pretrained``).

Nothing of transformers is patched: these are the methods ``from_pretrained`` itself calls.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import os
import re
import time
import traceback
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..errors import CheckpointError, ConfigurationError, DependencyError, InvalidChoiceError
from .reader import CheckpointHeader, TensorInfo, read_header

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)

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
    """How checkpoint keys map onto the model's state_dict."""

    load: dict[str, str] = field(default_factory=dict)  # model key -> checkpoint key
    missing: set[str] = field(default_factory=set)  # model keys the checkpoint lacks
    unexpected: set[str] = field(default_factory=set)  # checkpoint keys the model has no place for
    needs_conversion: list[str] = field(default_factory=list)  # keys only a WeightConverter can load
    mismatched: list[str] = field(default_factory=list)  # "key: checkpoint shape vs model shape"


def read_config(path: str | os.PathLike[str], **kwargs: Any) -> tuple[Any, dict[str, Any]]:
    """``config.json`` as from_pretrained reads it: (config, model kwargs left over)."""
    from transformers import AutoConfig

    try:
        config, unused = AutoConfig.from_pretrained(
            os.fspath(path), return_unused_kwargs=True, trust_remote_code=False, **kwargs
        )
    except ValueError as e:
        # unknown model_type, or an auto_map that needs remote code
        raise CheckpointError(f"cannot read the config in {path}: {e}", fix="check config.json") from e
    except OSError as e:
        raise CheckpointError(
            f"no readable config.json in {path}: {e}", fix="check the checkpoint directory"
        ) from e
    return config, dict(unused)


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
    contexts = cls.get_init_context(dtype, False, False, None)
    with ContextManagers(contexts):
        return cls(config, **model_kwargs)


def plan_keys(model: Any, header: CheckpointHeader) -> KeyPlan:
    """Map checkpoint keys onto ``model.state_dict()`` with transformers' own renaming rules."""
    meta_sd = model.state_dict()
    prefix = getattr(model, "base_model_prefix", None) or None
    renamings: list[Any] = []
    converters: list[Any] = []
    rename: Any = None
    try:
        from transformers.conversion_mapping import get_model_conversion_mapping
        from transformers.core_model_loading import WeightConverter, WeightRenaming, rename_source_key

        conversions = get_model_conversion_mapping(model, None, None)
        renamings = [c for c in conversions if isinstance(c, WeightRenaming)]
        converters = [c for c in conversions if isinstance(c, WeightConverter)]
        rename = rename_source_key
    except ImportError:  # a transformers without the 5.x loading machinery: exact keys and the prefix only
        rename = None

    plan = KeyPlan()
    # transformers visits keys in natural order and a later duplicate wins; sorted() keeps that deterministic
    for key in sorted(header.tensors):
        if rename is not None:
            new, pattern = rename(key, renamings, converters, prefix, meta_sd)
            if new not in meta_sd and key in meta_sd:
                new, pattern = rename(key, [], [], prefix, meta_sd)
        else:
            new, pattern = _prefix_only(key, prefix, meta_sd), None
        if new not in meta_sd:
            plan.unexpected.add(key)
            continue
        if pattern is not None:
            plan.needs_conversion.append(key)
            continue
        info, ref = header.tensors[key], meta_sd[new]
        if tuple(ref.shape) != info.shape:
            plan.mismatched.append(f"{new}: checkpoint {list(info.shape)} vs model {list(ref.shape)}")
            continue
        plan.load[new] = key
    plan.missing = set(meta_sd) - set(plan.load)
    return plan


def _prefix_only(key: str, prefix: str | None, meta_sd: Mapping[str, Any]) -> str:
    if prefix:
        if key.startswith(prefix + ".") and key[len(prefix) + 1 :] in meta_sd:
            return key[len(prefix) + 1 :]
        if f"{prefix}.{key}" in meta_sd:
            return f"{prefix}.{key}"
    return key


def _dtype_plan_match(model: Any, dtype: torch.dtype) -> tuple[re.Pattern[str] | None, Any]:
    plan = model._get_dtype_plan(dtype) if hasattr(model, "_get_dtype_plan") else {}
    if not plan:
        return None, None
    # one pattern per entry, "*" as in transformers' glob alternation; all entries map to the same float32
    pattern = re.compile("|".join(f"({k.replace('*', '.*')})" for k in plan))
    return pattern, next(iter(plan.values()))


def _set_tensor(model: Any, name: str, value: Any) -> None:
    parent_name, _, leaf = name.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    setattr(parent, leaf, value)


def allocate(
    model: Any, keys: KeyPlan, header: CheckpointHeader, device: torch.device, dtype: torch.dtype
) -> list[tuple[str, Any, TensorInfo]]:
    """Give every parameter and buffer of the skeleton uninitialised storage on ``device`` (tied targets the
    checkpoint lacks stay on meta: ``tie_weights`` replaces them).

    Returns (model key, tensor, source) for every tensor to fill."""
    import torch

    fp32_re, fp32 = _dtype_plan_match(model, dtype)
    tied = set(getattr(model, "all_tied_weights_keys", {}) or {})
    fills: list[tuple[str, Any, TensorInfo]] = []
    done: dict[int, Any] = {}  # id(meta tensor) -> its replacement, so shared tensors stay shared
    named = [(n, t, True) for n, t in model.named_parameters(remove_duplicate=False)]
    named += [(n, t, False) for n, t in model.named_buffers(remove_duplicate=False)]
    for name, meta, is_param in named:
        if meta is None:
            continue
        if id(meta) in done:
            _set_tensor(model, name, done[id(meta)])
            continue
        if name in tied and name not in keys.load:
            continue
        target_dtype = meta.dtype
        src = keys.load.get(name)
        if src is not None and fp32_re is not None and fp32_re.search(name):
            target_dtype = fp32
        real = torch.empty(meta.shape, dtype=target_dtype, device=device)
        value: Any = torch.nn.Parameter(real, requires_grad=real.is_floating_point()) if is_param else real
        if src is not None:
            value._is_hf_initialized = True  # what set_param_for_module marks: init must not touch it
            fills.append((name, value, header.tensors[src]))
        _set_tensor(model, name, value)
        done[id(meta)] = value
    return fills


def finish(model: Any, keys: KeyPlan, path: str | os.PathLike[str]) -> None:
    """Initialise what is missing, recompute non-persistent buffers, tie, eval, generation config."""
    import torch

    for target in getattr(model, "all_tied_weights_keys", {}) or {}:
        with contextlib.suppress(AttributeError):
            model.get_parameter(target)._is_hf_initialized = True
    with torch.no_grad():
        model.initialize_weights()
    missing = set(keys.missing)
    model.tie_weights(missing_keys=missing, recompute_mapping=False)
    leftover = [n for n, t in [*model.named_parameters(), *model.named_buffers()] if t.device.type == "meta"]
    if leftover:
        raise CheckpointError(
            f"after loading, {len(leftover)} tensors have no storage, e.g. {leftover[0]!r}",
            fix="load this checkpoint with from_pretrained (the fast path cannot place these tensors)",
        )
    model.eval()
    if model.can_generate():
        from transformers import GenerationConfig

        # no generation_config.json: keep the one derived from config.json, as from_pretrained does
        with contextlib.suppress(OSError):
            model.generation_config = GenerationConfig.from_pretrained(os.fspath(path))
    if missing:
        logger.warning(
            "%s: %d weights not in the checkpoint were newly initialised: %s",
            path,
            len(missing),
            sorted(missing)[:8],
        )


def resolve_device(device: str | torch.device) -> torch.device:
    import torch

    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise ConfigurationError(
            f"invalid device {device!r}: {e}", fix="use 'cuda:0', 'cuda:1' or 'cpu'"
        ) from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigurationError(
                f"device {device!r} asked for but CUDA is not available", fix="use device='cpu'"
            )
        if dev.index is None:
            dev = torch.device("cuda", torch.cuda.current_device())
        if dev.index >= torch.cuda.device_count():
            raise ConfigurationError(
                f"device {device!r}: only {torch.cuda.device_count()} GPUs are visible",
                fix="pick a visible device index",
            )
    elif dev.type != "cpu":
        raise ConfigurationError(
            f"fast loading supports cuda and cpu devices, not {dev.type!r}",
            fix="use from_pretrained for this device",
        )
    return dev


def load(
    path: str | os.PathLike[str],
    *,
    auto_class: str = "AutoModelForCausalLM",
    device: str | torch.device = "cuda:0",
    dtype: torch.dtype,
    attn_implementation: str | None = None,
    threads: int | None = None,
    buffer_bytes: int | None = None,
    **from_config_kwargs: Any,
) -> Any:
    """Load a safetensors checkpoint straight into the model's parameter storage on ``device``."""
    import torch

    from . import staging

    t0 = time.perf_counter()
    dev = resolve_device(device)
    threads = threads or staging.default_threads()
    buffer_bytes = buffer_bytes or staging.DEFAULT_BUFFER_BYTES
    if threads < 1 or buffer_bytes < 1 << 16:
        raise ConfigurationError(
            f"threads={threads}, buffer_bytes={buffer_bytes} out of range",
            fix="use threads >= 1 and buffer_bytes >= 64 KiB",
        )
    header = read_header(path)  # every header check fails here, before any allocation
    root = header.root
    config, model_kwargs = read_config(root, **from_config_kwargs)
    reason = unsupported_config(config)
    if reason:
        raise InvalidChoiceError(
            f"fast loading cannot take {root}: {reason}", fix="load it with from_pretrained"
        )
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
        cls = model_class(config, auto_class)
        model = build_skeleton(config, cls, dtype, model_kwargs)
        keys = plan_keys(model, header)
        if keys.needs_conversion:
            raise InvalidChoiceError(
                f"fast loading cannot take {root}: {len(keys.needs_conversion)} checkpoint tensors need "
                "transformers' "
                f"weight conversion (e.g. {keys.needs_conversion[0]!r})",
                fix="load it with from_pretrained",
            )
        if keys.mismatched:
            raise CheckpointError(
                f"{root}: {len(keys.mismatched)} tensors have another shape than the model expects",
                reasons=keys.mismatched[:8],
                fix="check that config.json belongs to these weights",
            )
        t_build = time.perf_counter()
        fills = allocate(model, keys, header, dev, dtype)
        t_alloc = time.perf_counter()
        fill_times = _fill(fills, dev, threads, buffer_bytes, pool)
        pool = None  # _fill closed it
        t_fill = time.perf_counter()
        finish(model, keys, root)
    except BaseException as e:
        # Leave nothing behind: the traceback's frames (worker threads included) hold views of the tensors
        # this load allocated; clearing them and the model lets the memory go before the error goes up.
        if pool is not None:
            pool.close()
        # this frame is still running, so clearing tracebacks cannot drop its locals: drop them here
        model = fills = None
        _clear_tracebacks(e)
        if dev.type == "cuda":
            torch.cuda.empty_cache()
        raise
    t_end = time.perf_counter()
    read_bytes = sum(info.nbytes for _, _, info in fills)
    model.cudaload_fastload = {
        "seconds": round(t_end - t0, 4),
        "build_s": round(t_build - t0, 4),
        "alloc_s": round(t_alloc - t_build, 4),
        "fill_s": round(t_fill - t_alloc, 4),
        "finish_s": round(t_end - t_fill, 4),
        **fill_times,
        "bytes": read_bytes,
        "threads": threads,
        "buffer_bytes": buffer_bytes,
        "device": str(dev),
        "missing_keys": sorted(keys.missing - set(getattr(model, "all_tied_weights_keys", {}) or {})),
        "unexpected_keys": sorted(keys.unexpected),
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
    from . import staging

    targets = [staging.Target(name, t.detach(), torch_dtype(info.dtype)) for name, t, info in fills]
    infos = [info for _, _, info in fills]
    if dev.type == "cuda":
        return staging.fill_cuda(
            targets, infos, device=dev, threads=threads, buffer_bytes=buffer_bytes, pool=pool
        )
    staging.fill_cpu(targets, infos, threads=threads, buffer_bytes=buffer_bytes)
    return {}


def _clear_tracebacks(e: BaseException | None) -> None:
    seen: set[int] = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        traceback.clear_frames(e.__traceback__)
        e = e.__cause__ or e.__context__


def unsupported_config(config: Any) -> str | None:
    """Why a config keeps a checkpoint off the fast path, or None."""
    if getattr(config, "quantization_config", None):
        return "config.json has a quantization_config (pre-quantized weights)"
    auto_map = getattr(config, "auto_map", None)
    if auto_map:
        return "config.json has an auto_map (remote code)"
    return None


def supports(path: str | os.PathLike[str], *, auto_class: str = "AutoModelForCausalLM") -> tuple[bool, str]:
    """Whether ``path`` can take the fast path, and why (or why not). Reads headers and config only;
    builds the skeleton on the meta device (no tensor storage) to check that every key maps."""
    import torch

    from ..errors import CudaloadError

    try:
        header = read_header(path)
        config, model_kwargs = read_config(header.root)
    except CudaloadError as e:
        return False, e.message
    reason = unsupported_config(config)
    if reason:
        return False, reason
    try:
        model = build_skeleton(config, model_class(config, auto_class), torch.float32, model_kwargs)
    except CudaloadError as e:
        return False, e.message
    except Exception as e:  # a model transformers itself cannot build: from_pretrained will say why
        return False, f"transformers cannot build {auto_class} for this config ({type(e).__name__}: {e})"
    keys = plan_keys(model, header)
    if keys.needs_conversion:
        return False, (
            f"{len(keys.needs_conversion)} tensors need transformers' weight conversion "
            f"(e.g. {keys.needs_conversion[0]!r}); from_pretrained does that"
        )
    if keys.mismatched:
        return (
            False,
            f"{len(keys.mismatched)} tensors have another shape than the model: {keys.mismatched[0]}",
        )
    n = len(header.files)
    detail = (
        f"{len(keys.load)} tensors, {header.total_bytes / 1e9:.2f} GB in {n} safetensors file{'s' * (n > 1)}"
    )
    missing = keys.missing - set(getattr(model, "all_tied_weights_keys", {}) or {})
    if missing:
        detail += f"; {len(missing)} missing keys are initialised as from_pretrained does"
    return True, detail
