"""What a fast load decides from files alone, before any model exists: the ``from_pretrained`` keywords
sorted into what decides files, config and model (:func:`load_options`), the config with its overrides
(:func:`read_config`), the checkpoint files transformers would read (:func:`resolve_files`), their validated
headers (:func:`prepare`) and the device (:func:`resolve_device`). What only ``from_pretrained`` can load
raises :class:`StepAside` here, before anything is allocated.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ...errors import CheckpointError, ConfigurationError, InvalidChoiceError, ModelNotFoundError
from ..reader import CheckpointHeader, read_files

if TYPE_CHECKING:
    import torch


class StepAside(InvalidChoiceError):
    """The fast path cannot give exactly what ``from_pretrained`` gives for this load; from_pretrained can.

    Raised before any tensor storage is allocated. ``load_model`` catches it and loads with from_pretrained,
    recording the reason in the plan's verified notes."""


def step_aside(root: str | os.PathLike[str], why: str) -> StepAside:
    return StepAside(
        f"fast loading steps aside for {os.fspath(root)}: {why}", fix="load it with from_pretrained"
    )


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
    from ...policies.load_path import fast_kwargs_blockers

    blockers = fast_kwargs_blockers(kwargs)
    if blockers:
        raise step_aside(path, "; ".join(blockers))
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

    from ...policies.load_path import FAST_LOADER_KWARGS

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


def unsupported_config(config: Any) -> str | None:
    """Why a config keeps a checkpoint off the fast path, or None."""
    if getattr(config, "quantization_config", None):
        return "config.json has a quantization_config (pre-quantized weights)"
    auto_map = getattr(config, "auto_map", None)
    if auto_map:
        return "config.json has an auto_map (remote code)"
    return None


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
        raise step_aside(path, "adapter_config.json: from_pretrained loads the base model and a PEFT adapter")
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
        raise step_aside(
            path, f"the checkpoint is {[os.path.basename(str(f)) for f in files]}, not safetensors"
        )
    # transformers 5.24 also reads the config class's ``extra_files`` when present (modeling_utils.py
    # from_pretrained, "EXPERIMENTAL ... config.extra_files"): leave those to it.
    for extra in getattr(type(config), "extra_files", ()) or ():
        if os.path.isfile(os.path.join(path, options.subfolder, extra)):
            raise step_aside(path, f"the model class reads the extra weights file {extra}")
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
            raise step_aside(options.path, "config.json has an auto_map (remote code)")
    config, model_kwargs = read_config(
        options.path, trust_remote_code=options.trust_remote_code, **options.config_kwargs
    )
    reason = unsupported_config(config)
    if reason:
        raise step_aside(options.path, reason)
    files = resolve_files(options, config)
    header = read_files(files, os.path.join(options.path, options.subfolder))  # every header check, here
    return Prepared(header, config, model_kwargs, options)
