"""``model=``: a config dict or object, a local folder or ``config.json``, or a Hub id; the config read where that is
cheap (no torch, no transformers, no network)."""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..errors import CheckpointError, ConfigurationError, ModelNotFoundError

#: a Hub repo id: "name" or "org/name" (huggingface_hub's validate_repo_id allows these characters)
_REPO_ID = re.compile(r"^[\w.-]+(/[\w.-]+)?$")


def check_model(model: Any, entry: str, subfolder: str) -> Mapping[str, Any] | None:
    """Check ``model``; its config as a dict where that is cheap (a dict, a config object, a local
    ``config.json``), else None (a Hub id: model_info reads the cache)."""
    if isinstance(model, Mapping):
        if entry != "plan":
            raise ConfigurationError(
                f"{entry}() needs a model folder or a Hub id; a config dict can only be planned",
                fix="save the model (model.save_pretrained('folder')) and pass its folder, or use cudaload.plan(config)",
            )
        if "model_type" not in model:
            raise CheckpointError("config dict has no model_type", fix="pass a full config.json dict")
        from ..model_info.config import check_values

        check_values(model, "the config dict")
        return model
    tf = sys.modules.get("transformers")
    config_class = getattr(tf, "PretrainedConfig", None) if tf is not None else None
    if config_class is not None and isinstance(model, config_class):
        if entry != "plan":
            raise ConfigurationError(
                f"{entry}() needs a model folder or a Hub id; a config object can only be planned",
                fix="pass the folder the model was saved to, or use cudaload.plan(config)",
            )
        return dict(model.to_dict())
    if not isinstance(model, (str, os.PathLike)):
        raise ConfigurationError(
            f"model={model!r} ({type(model).__name__}) is not a model",
            fix="pass a model folder, a config.json path or a Hub id as a string: model='./Qwen3-8B'",
        )
    text = os.fspath(model)
    if not isinstance(text, str) or not text.strip():
        raise ModelNotFoundError("model is empty", fix="pass a model folder or a Hub id: model='./Qwen3-8B'")
    path = Path(text).expanduser()
    try:
        is_dir, is_file = path.is_dir(), path.is_file()
    except OSError as e:  # a folder on the way that may not be entered
        raise _unreadable(path, e) from None
    if is_file:
        return _model_file(path, entry)
    if is_dir:
        return _model_dir(path / subfolder if subfolder else path, path)
    if text.count("/") > 1 or text.startswith((".", "/", "~")) or not _REPO_ID.match(text):
        raise ModelNotFoundError(
            f"model path {text!r} does not exist",
            fix="check the path (a folder saved by save_pretrained), or pass a Hub id such as 'Qwen/Qwen3-8B'",
        )
    return None  # a Hub id: model_info finds it in the cache, or says how to download it


def is_local(model: Any) -> bool:
    """Whether ``model`` is read from this disk (a folder, a file, a config dict or object): no Hub revision."""
    if not isinstance(model, (str, os.PathLike)):
        return True
    try:
        return Path(os.fspath(model)).expanduser().exists()
    except (OSError, TypeError):
        return False


def _unreadable(path: Path, e: OSError) -> ModelNotFoundError:
    return ModelNotFoundError(
        f"model folder {str(path)!r} cannot be read by this user ({e.strerror or e})",
        fix=f"make it readable (chmod -R a+rX {str(path)!r}), or run as the user who owns it",
    )


def _model_file(path: Path, entry: str) -> Mapping[str, Any]:
    from ..model_info.config import refuse_weights_file

    refuse_weights_file(path)
    if entry != "plan":
        raise ConfigurationError(
            f"{entry}() needs the model folder, not a file ({path.name})",
            fix=f"pass model={str(path.parent)!r}"
            if path.name == "config.json"
            else "pass the model's folder",
        )
    return _read_config(path)


def _model_dir(folder: Path, given: Path) -> Mapping[str, Any]:
    if not os.access(given, os.R_OK | os.X_OK) or not os.access(folder, os.R_OK | os.X_OK):
        raise _unreadable(given, PermissionError(13, "permission denied"))
    config = folder / "config.json"
    if not config.is_file():
        raise ModelNotFoundError(
            f"{folder} has no config.json", fix="point at a model directory saved by save_pretrained"
        )
    return _read_config(config)


def _read_config(path: Path) -> Mapping[str, Any]:
    try:
        data = json.loads(path.read_text())
    except PermissionError as e:
        raise _unreadable(path, e) from None
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise CheckpointError(
            f"cannot read {path}: {e}", fix="check that the file is a complete config.json"
        ) from None
    if not isinstance(data, dict) or "model_type" not in data:
        raise CheckpointError(f"{path} has no model_type", fix="point at a transformers config.json")
    from ..model_info.config import check_values

    check_values(data, str(path))  # before torch or transformers sees a value they would fail on
    return data


def context_length(config: Mapping[str, Any] | None) -> int | None:
    """The model's max_position_embeddings, from its text config when it has one (as model_info reads it)."""
    if config is None:
        return None
    text = config.get("text_config")
    value = (text if isinstance(text, Mapping) else config).get("max_position_embeddings")
    return int(value) if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None
