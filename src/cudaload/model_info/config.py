"""Config loading: a local directory, a ``config.json``, a config object or dict, or a Hub id the local cache
answers, made into a transformers config (planning never downloads)."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..errors import CheckpointError, ConfigurationError, ModelNotFoundError

#: names of weight files, which are no config (a ``*.safetensors.index.json`` is JSON, but not a config either)
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".gguf", ".h5", ".msgpack", ".index.json")

#: size fields the planner and the model's constructor read as whole numbers of at least 1 (a string
#: "320", a float, a bool or 0 is a damaged config: transformers 5.25's strict config dataclasses refuse a
#: non-int with huggingface_hub's StrictDataclassFieldValidationError; older releases took it and a tensor
#: shape failed later)
_SIZE_FIELDS = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "max_position_embeddings",
    "n_embd",
    "n_layer",
    "n_head",
    "n_positions",
)
#: the same, where null (and 0: no experts, no window) also means something
_OPTIONAL_SIZE_FIELDS = (
    "num_key_value_heads",
    "head_dim",
    "sliding_window",
    "num_experts",
    "num_local_experts",
    "num_experts_per_tok",
    "moe_intermediate_size",
)
#: the nested configs a composite model's config.json holds, checked like the top level
_SUB_CONFIGS = ("text_config", "vision_config", "audio_config", "encoder", "decoder")
#: torch's dtype names (torch 2.13-2.15: every ``torch.dtype`` attribute of the module); a config's ``dtype``
#: string is read by transformers as ``getattr(torch, name)`` (configuration_utils.py 5.25 line 448), so
#: anything else raises torch's bare AttributeError
TORCH_DTYPE_NAMES = (
    "bfloat16",
    "bool",
    "cdouble",
    "cfloat",
    "chalf",
    "complex128",
    "complex32",
    "complex64",
    "double",
    "float",
    "float16",
    "float32",
    "float64",
    "float8_e4m3fn",
    "float8_e4m3fnuz",
    "float8_e5m2",
    "float8_e5m2fnuz",
    "float8_e8m0fnu",
    "float4_e2m1fn_x2",
    "half",
    "int",
    "int16",
    "int32",
    "int64",
    "int8",
    "long",
    "short",
    "uint16",
    "uint32",
    "uint64",
    "uint8",
)


def _torch_dtype_name(name: str) -> bool:
    import sys

    torch = sys.modules.get("torch")  # imported already: ask it (a newer torch may have more); else the table
    if torch is not None:
        return isinstance(getattr(torch, name, None), torch.dtype)
    return name in TORCH_DTYPE_NAMES


def check_values(config: Mapping[str, Any], where: str) -> None:
    """Refuse a config whose values torch or transformers would fail on with their own bare errors: a size
    field that is not a whole number (``"vocab_size": "320"``), a ``dtype`` / ``torch_dtype`` torch has no
    dtype for (``"bfloat61"``). ``where``: the file (or "the config dict"), named in the error with the field."""
    from ..errors import close_names

    def check(d: Mapping[str, Any], prefix: str) -> None:
        for key in (*_SIZE_FIELDS, *_OPTIONAL_SIZE_FIELDS):
            if key not in d:
                continue
            v = d[key]
            optional = key in _OPTIONAL_SIZE_FIELDS
            if optional and v is None:
                continue
            least = 0 if optional else 1
            if isinstance(v, int) and not isinstance(v, bool) and v >= least:
                continue
            numeric = (isinstance(v, str) and v.strip().isdigit()) or (
                isinstance(v, float) and v.is_integer() and v >= least
            )
            example = int(v) if numeric else None
            raise CheckpointError(
                f"{where}: {prefix}{key}={v!r} is not a whole number"
                + (f" of at least {least}" if least else " (or null)"),
                fix=(f'set "{key}": {example}' if example is not None else f'correct "{key}" (an integer)')
                + f" in {where}",
            )
        for key in ("dtype", "torch_dtype"):
            v = d.get(key)
            if not isinstance(v, str):
                continue  # null, a per-module dict, or an int some vocabularies keep under this name (Emu3)
            name = v.strip().removeprefix("torch.")
            if name == v and _torch_dtype_name(name):
                continue
            close = [name] if _torch_dtype_name(name) else close_names(name, TORCH_DTYPE_NAMES, n=1)
            raise CheckpointError(
                f"{where}: {prefix}{key}={v!r} is not a torch dtype"
                + (f"; did you mean {close[0]!r}?" if close else ""),
                fix=f'set "{key}": "{close[0] if close else "bfloat16"}" in {where} (the dtype the weights are '
                "stored in), or delete the field",
            )
        for sub in _SUB_CONFIGS:
            if isinstance(d.get(sub), Mapping):
                check(d[sub], f"{prefix}{sub}.")

    check(config, "")


def _load_config(model: Any, revision: str | None) -> tuple[Any, str, Path | None]:
    """(config, display name, local directory or None)."""
    import transformers

    if isinstance(model, transformers.PretrainedConfig):
        return model, getattr(model, "_name_or_path", "") or model.model_type, None
    if isinstance(model, Mapping):
        d = dict(model)
        mt = d.pop("model_type", None)
        if mt is None:
            raise CheckpointError("config dict has no model_type", fix="pass a full config.json dict")
        return _config_for(mt, d, "the config dict"), str(d.get("_name_or_path") or mt), None
    path = Path(os.fspath(model)).expanduser()
    try:
        is_file, is_dir = path.is_file(), path.is_dir()
        has_config = is_dir and (path / "config.json").is_file()
    except PermissionError as e:  # a folder on the way that this user may not enter
        raise ModelNotFoundError(
            f"model folder {str(path)!r} cannot be read by this user ({e.strerror or e})",
            fix=f"make it readable (chmod -R a+rX {str(path)!r}), or run as the user who owns it",
        ) from None
    if is_file:
        return (
            _config_from_file(path),
            str(path.parent if path.name == "config.json" else path),
            (path.parent if path.name == "config.json" else None),
        )
    if is_dir:
        if not has_config:
            raise ModelNotFoundError(
                f"{path} has no config.json", fix="point at a model directory saved by save_pretrained"
            )
        return _config_from_file(path / "config.json"), str(path), path
    name = os.fspath(model)
    if name.count("/") > 1 or name.startswith((".", "/", "~")) or not name:
        raise ModelNotFoundError(f"model path {name!r} does not exist", fix="check the path")
    return _config_from_cache(name, revision)


def _config_for(model_type: str, d: dict[str, Any], where: str = "config.json") -> Any:
    import transformers
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES  # type: ignore[attr-defined]

    from ..errors import unknown_model_type

    if model_type not in CONFIG_MAPPING_NAMES:
        # transformers' own message lists every model type it knows (~10 KB): name the close ones instead
        raise unknown_model_type(model_type, CONFIG_MAPPING_NAMES, transformers.__version__)
    check_values(d, where)
    refused: tuple[type[Exception], ...] = (ValueError, KeyError, TypeError, AttributeError)
    try:
        from huggingface_hub.errors import StrictDataclassError

        refused = (*refused, StrictDataclassError)
    except ImportError:  # a huggingface_hub before strict dataclasses (transformers 5.17's floor)
        pass
    try:
        return transformers.AutoConfig.for_model(model_type, **d)
    except refused as e:
        # transformers 5.25's config classes are huggingface_hub strict dataclasses: each field's type and the
        # class's validators are checked, and the error (an Exception, not a ValueError) starts "Validation error
        # for field 'x'"
        import re

        field = re.search(r"field '([^']+)'", str(e))
        what = f"its {field.group(1)!r} " if field else ""
        first = str(e).strip().splitlines()
        detail = first[-1].strip() if first else type(e).__name__
        raise CheckpointError(
            f"{where} does not make a {model_type} config for transformers {transformers.__version__}: "
            f"{what}is refused ({detail})",
            fix=f"correct {('the ' + repr(field.group(1)) + ' value') if field else 'the values'} in {where} "
            "(the model's config class documents each field)",
        ) from None


def refuse_weights_file(path: Path) -> None:
    """A weights file passed as the model is refused, before gigabytes of it are read as text."""
    name = path.name.lower()
    if name.endswith(WEIGHT_SUFFIXES) and name != "config.json":
        folder = path.parent
        where = (
            f"model={str(folder)!r}"
            if (folder / "config.json").is_file()
            else "the folder that holds the weights and their config.json"
        )
        raise ConfigurationError(
            f"model={str(path)!r} is a weights file; cudaload reads a model folder (config.json beside the weights)",
            fix=f"pass {where}",
        )


def _config_from_file(path: Path) -> Any:
    refuse_weights_file(path)
    try:
        d = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:  # UnicodeDecodeError: bytes, not text
        raise CheckpointError(
            f"cannot read {path}: {e}", fix="check that the file is a complete config.json"
        ) from None
    if not isinstance(d, dict) or "model_type" not in d:
        raise CheckpointError(f"{path} has no model_type", fix="point at a transformers config.json")
    d.pop("transformers_version", None)
    mt = d.pop("model_type")
    return _config_for(mt, d, str(path))


def _config_from_cache(repo_id: str, revision: str | None) -> tuple[Any, str, Path | None]:
    """A Hub id: the config from the local cache only (planning never downloads)."""
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:  # pragma: no cover - huggingface_hub is a dependency of transformers
        raise ModelNotFoundError(f"{repo_id!r} is not a local path", fix="pass a local directory") from None
    from .. import _env

    found = try_to_load_from_cache(repo_id, "config.json", cache_dir=_env.hub_cache(), revision=revision)
    if not isinstance(found, str):
        raise ModelNotFoundError(
            f"{repo_id!r} is not a local path and its config.json is not in the Hub cache "
            f"({_env.hub_cache()})",
            fix=f"download it once (`hf download {repo_id}`), or pass a local directory or config.json",
        )
    cfg_path = Path(found)
    return _config_from_file(cfg_path), repo_id, cfg_path.parent
