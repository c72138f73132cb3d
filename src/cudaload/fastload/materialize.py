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
- keywords: from_pretrained's, sorted as it sorts them (config overrides through ``AutoConfig``, files through
  ``_get_resolved_checkpoint_files``), or the load steps aside (:class:`StepAside`) before allocating;
- checkpoint files: transformers' ``_get_resolved_checkpoint_files``; headers validated as the safetensors
  library validates them; shards merged in from_pretrained's order (a later shard's copy wins);
- finishing: loaded tensors are set as ``set_param_for_module`` sets them, then transformers'
  ``_finalize_model_loading`` does the rest (move missing keys and non-persistent buffers off meta,
  ``initialize_weights``, ``tie_weights``, ``_adjust_missing_and_unexpected_keys``, the load report).

Nothing of transformers is patched: these are the methods ``from_pretrained`` itself calls.
"""

from __future__ import annotations

import contextlib
import copy
import json
import logging
import os
import re
import time
import traceback
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..errors import (
    CheckpointError,
    ConfigurationError,
    DependencyError,
    InvalidChoiceError,
    LoadError,
    ModelNotFoundError,
)
from .reader import CheckpointHeader, TensorInfo, read_files

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


class StepAside(InvalidChoiceError):
    """The fast path cannot give exactly what ``from_pretrained`` gives for this load; from_pretrained can.

    Raised before any tensor storage is allocated. ``load_model`` catches it and loads with from_pretrained,
    recording the reason in the plan's verified notes."""


def _step_aside(root: str | os.PathLike[str], why: str) -> StepAside:
    return StepAside(
        f"fast loading steps aside for {os.fspath(root)}: {why}", fix="load it with from_pretrained"
    )


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


@dataclass(frozen=True)
class LoadOptions:
    """The ``from_pretrained`` keywords of one load, sorted into what decides files, config and model."""

    path: str  # as given: what transformers names in its reports
    subfolder: str
    variant: str | None
    use_safetensors: bool | None
    ignore_mismatched_sizes: bool
    trust_remote_code: bool
    download: dict[str, Any]  # transformers' DownloadKwargs
    config_kwargs: dict[str, Any]  # everything AutoConfig.from_pretrained gets


def load_options(path: str | os.PathLike[str], kwargs: Mapping[str, Any]) -> LoadOptions:
    """Sort ``from_pretrained`` keywords; raise :class:`StepAside` for one the fast path cannot honour."""
    from ..policies.load_path import fast_kwargs_blockers

    blockers = fast_kwargs_blockers(kwargs)
    if blockers:
        raise _step_aside(path, "; ".join(blockers))
    subfolder = kwargs.get("subfolder") or ""
    download = {
        "cache_dir": kwargs.get("cache_dir"),
        "force_download": bool(kwargs.get("force_download", False)),
        "proxies": kwargs.get("proxies"),
        "local_files_only": bool(kwargs.get("local_files_only", False)),
        "token": kwargs.get("token"),
        "revision": kwargs.get("revision"),
        "subfolder": subfolder,
    }
    # The auto classes hand every keyword to AutoConfig.from_pretrained and build the model with what it does
    # not consume (transformers models/auto/auto_factory.py from_pretrained); dtype="auto" is dropped there.
    config_kwargs = {k: v for k, v in kwargs.items() if k != "trust_remote_code"}
    for k in ("dtype", "torch_dtype"):
        if config_kwargs.get(k) == "auto":
            config_kwargs.pop(k)
    return LoadOptions(
        path=os.fspath(path),
        subfolder=subfolder,
        variant=kwargs.get("variant"),
        use_safetensors=kwargs.get("use_safetensors"),
        ignore_mismatched_sizes=bool(kwargs.get("ignore_mismatched_sizes", False)),
        trust_remote_code=bool(kwargs.get("trust_remote_code", False)),
        download=download,
        config_kwargs=config_kwargs,
    )


def read_config(path: str | os.PathLike[str], **kwargs: Any) -> tuple[Any, dict[str, Any]]:
    """``config.json`` as from_pretrained reads it: (config, model kwargs left over).

    ``kwargs`` are from_pretrained's keywords: those naming a config attribute override it (``rms_norm_eps``,
    ``use_cache``...), exactly as ``AutoConfig.from_pretrained(path, return_unused_kwargs=True, **kwargs)``
    does inside from_pretrained; the loader's own keywords (:data:`FAST_LOADER_KWARGS`) are taken out of the
    leftovers, which go to the model's ``__init__``."""
    from transformers import AutoConfig

    from ..policies.load_path import FAST_LOADER_KWARGS

    kwargs = dict(kwargs)
    trust = bool(kwargs.pop("trust_remote_code", False))
    try:
        config, unused = AutoConfig.from_pretrained(
            os.fspath(path), return_unused_kwargs=True, trust_remote_code=trust, **kwargs
        )
    except ValueError as e:
        # unknown model_type, or an auto_map that needs remote code
        raise CheckpointError(f"cannot read the config in {path}: {e}", fix="check config.json") from e
    except OSError as e:
        raise CheckpointError(
            f"no readable config.json in {path}: {e}", fix="check the checkpoint directory"
        ) from e
    return config, {k: v for k, v in unused.items() if k not in FAST_LOADER_KWARGS}


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

    plan = KeyPlan(conversions=[*renamings, *converters])
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
        raise _step_aside(
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


def resolve_files(options: LoadOptions, config: Any) -> list[str]:
    """The checkpoint files from_pretrained would read, found by transformers' own
    ``_get_resolved_checkpoint_files`` (single file before index, ``variant``, ``subfolder``,
    ``transformers_weights``). Raises :class:`StepAside` when they are not safetensors files the fast path
    reads, ModelNotFoundError when there are none."""
    from transformers.modeling_utils import _get_resolved_checkpoint_files

    path = options.path
    if os.path.isfile(os.path.join(path, options.subfolder, "adapter_config.json")):
        raise _step_aside(
            path, "adapter_config.json: from_pretrained loads the base model and a PEFT adapter"
        )
    try:
        files, _ = _get_resolved_checkpoint_files(
            pretrained_model_name_or_path=path,
            variant=options.variant,
            gguf_file=None,
            use_safetensors=options.use_safetensors,
            user_agent=None,
            is_remote_code=False,
            transformers_explicit_filename=getattr(config, "transformers_weights", None),
            download_kwargs=dict(options.download),  # type: ignore[arg-type]
        )
    except (OSError, ValueError) as e:
        raise ModelNotFoundError(
            f"no checkpoint from_pretrained can read in {path}: {e}",
            fix="check the directory, variant= and subfolder=",
        ) from None
    files = list(files or [])
    if not files or not all(str(f).endswith(".safetensors") for f in files):
        raise _step_aside(
            path, f"the checkpoint is {[os.path.basename(str(f)) for f in files]}, not safetensors"
        )
    # transformers 5.24 also reads the config class's ``extra_files`` when present (modeling_utils.py
    # from_pretrained, "EXPERIMENTAL ... config.extra_files"): leave those to it.
    for extra in getattr(type(config), "extra_files", ()) or ():
        if os.path.isfile(os.path.join(path, options.subfolder, extra)):
            raise _step_aside(path, f"the model class reads the extra weights file {extra}")
    return [str(f) for f in files]


@dataclass
class Prepared:
    header: CheckpointHeader
    config: Any
    model_kwargs: dict[str, Any]
    options: LoadOptions


def prepare(path: str | os.PathLike[str], kwargs: Mapping[str, Any]) -> Prepared:
    """Everything a load decides from files alone: keywords, config (with overrides), checkpoint files,
    validated headers. Reads no tensor data; raises :class:`StepAside` for what only from_pretrained does."""
    if not os.path.isdir(path):
        what = "is a file, not a checkpoint directory" if os.path.exists(path) else "does not exist"
        raise ModelNotFoundError(f"{os.fspath(path)} {what}", fix="pass a local checkpoint directory")
    options = load_options(path, kwargs)
    config_json = os.path.join(options.path, options.subfolder, "config.json")
    if os.path.isfile(config_json):
        try:
            with open(config_json) as fh:
                raw = json.load(fh)
        except (OSError, ValueError):
            raw = {}
        if isinstance(raw, dict) and raw.get("auto_map"):
            # checked before AutoConfig runs: with trust_remote_code=True it would import the repository's code
            raise _step_aside(options.path, "config.json has an auto_map (remote code)")
    config, model_kwargs = read_config(
        options.path, trust_remote_code=options.trust_remote_code, **options.config_kwargs
    )
    reason = unsupported_config(config)
    if reason:
        raise _step_aside(options.path, reason)
    files = resolve_files(options, config)
    header = read_files(files, os.path.join(options.path, options.subfolder))  # every header check, here
    return Prepared(header, config, model_kwargs, options)


def check_keys(keys: KeyPlan, prep: Prepared) -> None:
    """Step aside for keys only from_pretrained loads; fail as it fails on mismatched shapes."""
    root = prep.options.path
    if keys.needs_conversion:
        raise _step_aside(
            root,
            f"{len(keys.needs_conversion)} checkpoint tensors need transformers' weight conversion "
            f"(e.g. {keys.needs_conversion[0]!r})",
        )
    if keys.unsupported_dtype:
        raise _step_aside(
            root, f"tensors of a dtype the fast path does not copy: {keys.unsupported_dtype[:4]}"
        )
    if keys.extra_state:
        raise _step_aside(root, f"module extra state is set by set_extra_state: {keys.extra_state[:4]}")
    if keys.mismatched and not prep.options.ignore_mismatched_sizes:
        # from_pretrained raises RuntimeError after its report (utils/loading_report.py log_state_dict_report);
        # load_model reports that as LoadError
        raise LoadError(
            f"{root}: {len(keys.mismatched)} tensors have another shape than the model expects",
            reasons=keys.mismatched[:8],
            fix="check that config.json belongs to these weights, or pass ignore_mismatched_sizes=True to "
            "re-initialise them",
        )


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
    from . import staging

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


def load_report(
    header: CheckpointHeader, info: Any, threads: int, buffer_bytes: int, dev: torch.device
) -> dict[str, Any]:
    """The part of ``model.cudaload_fastload`` every fast path reports: how it read and what was left over."""
    return {
        "threads": threads,
        "buffer_bytes": buffer_bytes,
        "device": str(dev),
        "files": [os.path.basename(f) for f in header.files],
        # transformers' own report, after its adjustments (what from_pretrained(output_loading_info=True) gives)
        "missing_keys": sorted(info.missing_keys),
        "unexpected_keys": sorted(info.unexpected_keys),
        "mismatched_keys": sorted((k, list(a), list(b)) for k, a, b in info.mismatched_keys),
    }


def clear_tracebacks(e: BaseException | None) -> None:
    """Clear the frames of ``e`` and of every exception it was raised from or during, so the tensors a
    failed load allocated are not held by the traceback while the error goes up."""
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


def supports(
    path: str | os.PathLike[str], *, auto_class: str = "AutoModelForCausalLM", **from_pretrained_kwargs: Any
) -> tuple[bool, str]:
    """Whether ``path`` can take the fast path with these ``from_pretrained`` keywords, and why (or why not).
    Reads headers and config only; builds the skeleton on the meta device (no tensor storage) to check that
    every key maps."""
    import torch

    from ..errors import CudaloadError

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
