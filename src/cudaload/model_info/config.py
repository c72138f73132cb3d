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
        return _config_for(mt, d), str(d.get("_name_or_path") or mt), None
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


def _config_for(model_type: str, d: dict[str, Any]) -> Any:
    import transformers
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES  # type: ignore[attr-defined]

    from ..errors import unknown_model_type

    if model_type not in CONFIG_MAPPING_NAMES:
        # transformers' own message lists every model type it knows (~10 KB): name the close ones instead
        raise unknown_model_type(model_type, CONFIG_MAPPING_NAMES, transformers.__version__)
    try:
        return transformers.AutoConfig.for_model(model_type, **d)
    except (ValueError, KeyError) as e:
        raise CheckpointError(
            f"config.json does not make a {model_type} config for transformers {transformers.__version__}: {e}",
            fix="check config.json's values against the model's config class",
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
    return _config_for(mt, d)


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
