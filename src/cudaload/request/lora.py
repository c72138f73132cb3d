"""``lora=``: LoraConfig's keywords, each checked as peft would read it, before peft is imported."""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from typing import Any

from ..errors import ConfigurationError
from .options import closest

#: LoraConfig's keywords (peft 0.22.0 peft/tuners/lora/config.py, dataclass fields; ``astra_config`` is new in
#: 0.22.0) a caller may set
LORA_KEYS = (
    "r",
    "lora_alpha",
    "lora_dropout",
    "target_modules",
    "exclude_modules",
    "fan_in_fan_out",
    "bias",
    "use_rslora",
    "use_dora",
    "modules_to_save",
    "init_lora_weights",
    "layers_to_transform",
    "layers_pattern",
    "rank_pattern",
    "alpha_pattern",
    "megatron_config",
    "megatron_core",
    "trainable_token_indices",
    "loftq_config",
    "eva_config",
    "corda_config",
    "astra_config",
    "lora_ga_config",
    "velora_config",
    "alora_invocation_tokens",
    "use_qalora",
    "qalora_group_size",
    "monteclora_config",
    "layer_replication",
    "runtime_config",
    "lora_bias",
    "target_parameters",
    "use_bdlora",
    "arrow_config",
    "kasa_config",
    "ensure_weight_tying",
    "task_type",
)
#: LoraConfig fields peft fills in itself
_LORA_BOOKKEEPING = (
    "peft_type",
    "auto_mapping",
    "peft_version",
    "base_model_name_or_path",
    "revision",
    "inference_mode",
)
_LORA_BOOLS = ("fan_in_fan_out", "use_rslora", "use_dora", "use_qalora", "lora_bias", "ensure_weight_tying")
_LORA_BIAS = ("none", "all", "lora_only")
#: init_lora_weights' names: peft 0.22.0 tuners/lora/config.py:551 (its Literal) and lora/layer.py:301-318, where
#: "lora_ga" is read too (config.py:1210); "astra" and "nora" are new in 0.22.0
_LORA_INITS = (
    "gaussian",
    "eva",
    "olora",
    "pissa",
    "corda",
    "astra",
    "loftq",
    "orthogonal",
    "mica",
    "nora",
    "lora_ga",
)


def check_lora(value: Any) -> Mapping[str, Any] | None:
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise ConfigurationError(
            f"lora={type(value).__name__} is not a dict of LoraConfig keywords",
            fix="pass a dict: lora={'r': 16, 'lora_alpha': 32}",
        )
    out = dict(value)
    for key, v in out.items():
        if key in _LORA_BOOKKEEPING:
            raise ConfigurationError(f"lora[{key!r}] is filled in by peft", fix=f"drop {key!r} from lora=")
        if key not in LORA_KEYS:
            close = closest(str(key), LORA_KEYS)
            shown = repr(v) if close and isinstance(v, (int, float, str, list, tuple)) else "..."
            raise ConfigurationError(
                f"lora[{key!r}] is not a LoraConfig keyword"
                + (f"; did you mean {close[0]!r}?" if close else ""),
                fix=f"use lora={{{(close[0] if close else 'r')!r}: {shown}}} (LoraConfig's keywords)",
            )
        _lora_value(key, v)
    return out


def _lora_value(key: str, v: Any) -> None:
    is_num = isinstance(v, numbers.Real) and not isinstance(v, bool)
    bad: str | None = None
    if key == "r" and not (isinstance(v, numbers.Integral) and not isinstance(v, bool) and int(v) >= 1):
        bad, fix = "a whole number, 1 or more", "lora={'r': 16}"
    elif key == "lora_alpha" and not (is_num and math.isfinite(v) and v > 0):
        bad, fix = "a number above 0", "lora={'lora_alpha': 32}"
    elif key == "lora_dropout" and not (is_num and 0 <= v < 1):
        bad, fix = "a fraction from 0 up to (not including) 1", "lora={'lora_dropout': 0.05}"
    elif key in _LORA_BOOLS and not isinstance(v, bool):
        bad, fix = "True or False", f"lora={{{key!r}: True}}"
    elif key == "bias" and v not in _LORA_BIAS:
        bad, fix = f"one of {', '.join(_LORA_BIAS)}", "lora={'bias': 'none'}"
    elif key in ("target_modules", "exclude_modules", "layers_pattern") and not _str_or_names(v):
        bad, fix = "a module name, a regex or a list of names", f"lora={{{key!r}: ['q_proj', 'v_proj']}}"
    elif key in ("modules_to_save", "target_parameters") and not (v is None or _str_or_names(v, one=False)):
        bad, fix = "a list of names", f"lora={{{key!r}: ['lm_head']}}"
    elif key == "layers_to_transform" and not _ints(v):
        bad, fix = "a layer index or a list of them", "lora={'layers_to_transform': [0, 1]}"
    elif key in ("rank_pattern", "alpha_pattern") and not isinstance(v, Mapping):
        bad, fix = "a dict of module pattern -> value", f"lora={{{key!r}: {{'q_proj': 8}}}}"
    elif key == "init_lora_weights" and not (
        isinstance(v, bool) or (isinstance(v, str) and (v in _LORA_INITS or v.startswith("pissa_niter_")))
    ):
        bad, fix = f"True, False or one of {', '.join(_LORA_INITS)}", "lora={'init_lora_weights': True}"
    if bad is not None:
        raise ConfigurationError(f"lora[{key!r}]={v!r} must be {bad}", fix=f"pass {fix}")


def _str_or_names(v: Any, one: bool = True) -> bool:
    if isinstance(v, str):
        return one and bool(v.strip())
    if isinstance(v, Mapping) or not hasattr(v, "__iter__"):
        return False
    items = list(v)
    return bool(items) and all(isinstance(i, str) and i.strip() for i in items)


def _ints(v: Any) -> bool:
    def ok(i: Any) -> bool:
        return isinstance(i, numbers.Integral) and not isinstance(i, bool) and int(i) >= 0

    if ok(v):
        return True
    return isinstance(v, (list, tuple)) and bool(v) and all(ok(i) for i in v)
