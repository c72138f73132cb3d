""":func:`model_info` and :func:`summarize`: the steps in order (config, model class, counts, safetensors
headers, attention facts) and the :class:`~cudaload.plans.ModelSummary` and :class:`ModelInfo` made from them."""

from __future__ import annotations

from typing import Any

from ..dtypes import dtype_bytes
from .attention_facts import _alibi, _attention_dims, _attention_dropout, _module_attention_facts
from .config import _load_config
from .counts import _counts_cached
from .model_class import _resolve_class
from .records import ModelInfo, ParamCounts
from .safetensors_headers import _stored, safetensors_files
from .summary import ModelSummary


def _dtype_name(config: Any) -> str | None:
    # transformers 5 keeps the dtype in ``config.dtype``; ``config.torch_dtype`` is a deprecated property that
    # logs "`torch_dtype` is deprecated! Use `dtype` instead!" on every read (configuration_utils.py, 5.17
    # lines 463 and 473), so it is never touched. Older releases stored a plain ``torch_dtype`` attribute: read it
    # from the instance dict, which bypasses any property.
    d = getattr(config, "dtype", None)
    if d is None:
        d = vars(config).get("torch_dtype")
    if d is None:
        return None
    return str(d).removeprefix("torch.")


def model_info(model: Any, *, model_class: str | None = None, revision: str | None = None) -> ModelInfo:
    """Summarise ``model`` (local dir, config.json, config object or dict, or a cached Hub id)."""
    config, name, local = _load_config(model, revision)
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    cls, auto = _resolve_class(config, model_class)
    layers = int(getattr(text, "num_hidden_layers", 0) or 0)
    heads = int(getattr(text, "num_attention_heads", 0) or 0)
    hidden = int(getattr(text, "hidden_size", 0) or 0)
    kv = int(getattr(text, "num_key_value_heads", None) or heads)
    head_dim, qk_dim, v_dim = _attention_dims(text, heads, hidden)
    window = getattr(text, "sliding_window", None)
    layer_types = getattr(text, "layer_types", None)
    if isinstance(layer_types, list) and layer_types:
        sliding = sum(1 for t in layer_types[:layers] if "sliding" in str(t))
    else:
        sliding = layers if window else 0
    if not window:
        sliding = 0
    counts = _counts_cached(cls, config, layers) if cls is not None else ParamCounts()
    remote = bool(getattr(config, "auto_map", None)) and cls is None
    files = safetensors_files(local) if local is not None else []
    ck_dtype = _dtype_name(config)
    if files:
        wbytes, wparams, st_dtype = _stored(files)
        ck_dtype = st_dtype or ck_dtype
        source = "safetensors"
    else:
        wparams = counts.total
        wbytes = wparams * dtype_bytes(ck_dtype or "float32")
        source = "config"
    sinks, attn_classes = _module_attention_facts(cls) if cls is not None else (False, None)
    compatible = getattr(cls, "_compatible_flash_implementations", None) if cls is not None else None
    summary = ModelSummary(
        name=name,
        type=str(config.model_type),
        architecture=cls.__name__
        if cls is not None
        else ((getattr(config, "architectures", None) or [None])[0]),
        params=counts.total or wparams,
        layers=layers,
        hidden_size=hidden,
        num_heads=heads,
        num_kv_heads=kv,
        head_dim=head_dim,
        vocab_size=int(getattr(text, "vocab_size", 0) or 0),
        max_position_embeddings=getattr(text, "max_position_embeddings", None),
        sliding_window=int(window) if window else None,
        tied_embeddings=bool(getattr(text, "tie_word_embeddings", False)) and counts.head == 0,
        checkpoint_dtype=ck_dtype,
        weights_bytes=wbytes,
        weights_source=source,
        is_moe=bool(getattr(text, "num_experts", None) or getattr(text, "num_local_experts", None)),
        is_encoder=cls is not None
        and not _can_generate(cls)
        and not getattr(config, "is_encoder_decoder", False),
        local_path=str(local) if local is not None else None,
        safetensors=bool(files),
    )
    return ModelInfo(
        summary=summary,
        config=config,
        counts=counts,
        class_name=cls.__name__ if cls is not None else None,
        auto_class=auto,
        supports_sdpa=bool(getattr(cls, "_supports_sdpa", False)) if cls is not None else True,
        supports_flash_attn=bool(getattr(cls, "_supports_flash_attn", False)) if cls is not None else False,
        supports_flex_attn=bool(getattr(cls, "_supports_flex_attn", False)) if cls is not None else False,
        can_generate=_can_generate(cls) if cls is not None else True,
        attn_softcapping=getattr(text, "attn_logit_softcapping", None) or None,
        attention_dropout=_attention_dropout(text),
        sliding_layers=sliding,
        intermediate_size=int(getattr(text, "intermediate_size", 0) or 0),
        remote_code=remote,
        qk_head_dim=qk_dim if qk_dim != head_dim else 0,
        v_head_dim=v_dim if v_dim != (qk_dim or head_dim) else 0,
        sinks=sinks,
        alibi=_alibi(config, text),
        compatible_flash=tuple(compatible) if isinstance(compatible, list | tuple) else None,
        attention_classes=attn_classes,
        head_transform=_head_transform(text),
    )


#: config keys whose value transforms the head's logits before the loss, and the value that leaves them as they
#: are (transformers 5.17: gemma2 ``final_logit_softcapping`` (None off), cohere ``logit_scale`` (multiplies),
#: granite ``logits_scaling`` (divides))
_HEAD_TRANSFORMS = {"final_logit_softcapping": None, "logit_scale": 1.0, "logits_scaling": 1.0}


def _head_transform(text: Any) -> str | None:
    for key, neutral in _HEAD_TRANSFORMS.items():
        value = getattr(text, key, None)
        if value is not None and value != neutral:
            return f"{key}={value}"
    return None


def _can_generate(cls: Any) -> bool:
    try:
        return bool(cls.can_generate())
    except Exception:
        return str(cls.__name__).endswith(("ForCausalLM", "LMHeadModel", "ForConditionalGeneration"))


def summarize(model: Any, *, model_class: str | None = None, revision: str | None = None) -> ModelSummary:
    """Just the :class:`ModelSummary` (what ``Plan.model`` holds)."""
    return model_info(model, model_class=model_class, revision=revision).summary
