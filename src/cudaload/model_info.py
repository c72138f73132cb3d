"""What the planner knows about a model, without loading its weights.

:func:`model_info` accepts a local model directory, a ``config.json`` path, a transformers config object
(or a plain dict), or a Hub id that the local cache can answer. It returns a :class:`ModelInfo`: the
public :class:`~cudaload.plans.ModelSummary` that travels in the Plan, plus the facts the policies need
(parameter counts split by what bitsandbytes would quantize, the model class's ``_supports_*`` flags,
soft-capping, sliding-window layers).

Parameter counts come from the config on the meta device (no memory, no weights), instantiated with one
and two decoder layers and extrapolated linearly: building an 80-layer 70B model on meta takes ~1.5 s on
a small CPU, the two small builds take a few ms. Tied weights count once (``parameters()`` de-duplicates
them). When the checkpoint is local safetensors, the stored bytes come from the file headers instead.
"""

from __future__ import annotations

import copy
import json
import logging
import os
import struct
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from .errors import CheckpointError, ModelNotFoundError
from .plans import ModelSummary

log = logging.getLogger(__name__)

#: Bytes per element of the safetensors dtype codes.
_ST_BYTES = {
    "F64": 8,
    "I64": 8,
    "U64": 8,
    "F32": 4,
    "I32": 4,
    "U32": 4,
    "F16": 2,
    "BF16": 2,
    "I16": 2,
    "U16": 2,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
    "I8": 1,
    "U8": 1,
    "BOOL": 1,
}
_ST_NAMES = {
    "F64": "float64",
    "F32": "float32",
    "F16": "float16",
    "BF16": "bfloat16",
    "F8_E4M3": "float8_e4m3fn",
    "F8_E5M2": "float8_e5m2",
    "I8": "int8",
    "U8": "uint8",
}

#: model types whose activations overflow fp16 (trained in bf16; their own docs say so)
FP16_OVERFLOW_TYPES = frozenset({"gemma2", "gemma3", "gemma3_text", "t5", "mt5"})

#: auto class -> PEFT task_type
_TASK_TYPES = {
    "AutoModelForCausalLM": "CAUSAL_LM",
    "AutoModelForSequenceClassification": "SEQ_CLS",
    "AutoModelForTokenClassification": "TOKEN_CLS",
    "AutoModelForQuestionAnswering": "QUESTION_ANS",
    "AutoModelForSeq2SeqLM": "SEQ_2_SEQ_LM",
    "AutoModel": "FEATURE_EXTRACTION",
}


@dataclass(frozen=True)
class ParamCounts:
    """Parameter counts by what quantization and LoRA touch. ``linear`` are the ``nn.Linear`` weights and
    biases outside the output head (what bitsandbytes replaces); ``head`` the untied output projection;
    ``embedding`` the input embeddings; ``other`` norms, 3-D expert tensors, position tables."""

    linear: int = 0
    head: int = 0
    embedding: int = 0
    other: int = 0
    per_layer: int = 0  # one decoder layer (the unit a device_map split moves)
    linear_modules: int = 0  # nn.Linear modules LoRA ("all-linear") would wrap
    linear_in_out: int = 0  # sum of in_features + out_features over those modules (LoRA params = r * this)

    @property
    def total(self) -> int:
        return self.linear + self.head + self.embedding + self.other


@dataclass(frozen=True, eq=False)
class ModelInfo:
    """The summary plus planner-only facts. ``config`` is the transformers config (not serialised)."""

    summary: ModelSummary
    config: Any = field(repr=False)
    counts: ParamCounts
    class_name: str | None
    auto_class: str
    supports_sdpa: bool = True
    supports_flash_attn: bool = False
    supports_flex_attn: bool = False
    can_generate: bool = True
    attn_softcapping: float | None = None
    attention_dropout: float = 0.0
    sliding_layers: int = 0  # layers whose KV cache is capped at the sliding window
    intermediate_size: int = 0
    remote_code: bool = False  # the config asks for code from the repo (auto_map)
    # -- attention facts the backend rules need (cudaload.policies.attention) --
    #: query/key head dim where it differs from ``summary.head_dim``: ``qk_nope_head_dim + qk_rope_head_dim``
    #: for MLA models (DeepSeek-V3: 192, where ``config.head_dim`` is the 64-wide rope part). 0: the same.
    qk_head_dim: int = 0
    #: value head dim where it differs from the q/k one (DeepSeek-V3: ``v_head_dim`` 128). 0: the same.
    v_head_dim: int = 0
    #: learnable per-head attention sinks (gpt-oss): the modeling code passes ``s_aux=self.sinks`` to the
    #: attention function (transformers 5.17 integrations/flash_attention.py:37 ``s_aux`` argument).
    sinks: bool = False
    #: ALiBi position bias instead of rotary (falcon with ``alibi=True``, bloom, mpt)
    alibi: bool = False
    #: the model class's ``_compatible_flash_implementations`` (gpt-oss): transformers replaces any other
    #: flash request by the first entry (modeling_utils.PreTrainedModel._check_and_adjust_attn_implementation)
    compatible_flash: tuple[str, ...] | None = None
    #: keys of a legacy ``*_ATTENTION_CLASSES`` dict in the model's module (falcon: eager, sdpa,
    #: flash_attention_2): any other attn_implementation fails with KeyError when the model is built
    attention_classes: tuple[str, ...] | None = None

    @property
    def flash_head_dim(self) -> int:
        """The head dim a flash kernel sees: transformers pads v up to the q/k head dim before calling it
        (integrations/flash_attention.py, ``v_head_dim != head_dim`` -> ``F.pad(value, ...)``; 5.17 line 63)."""
        return self.qk_head_dim or self.summary.head_dim

    @property
    def value_head_dim(self) -> int:
        return self.v_head_dim or self.flash_head_dim

    @property
    def task_type(self) -> str:
        return _TASK_TYPES.get(self.auto_class, "CAUSAL_LM" if self.can_generate else "FEATURE_EXTRACTION")

    @property
    def fp16_overflow(self) -> bool:
        return self.summary.type in FP16_OVERFLOW_TYPES


# -- config loading ----------------------------------------------------------------------------------------


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
    if path.is_file():
        return (
            _config_from_file(path),
            str(path.parent if path.name == "config.json" else path),
            (path.parent if path.name == "config.json" else None),
        )
    if path.is_dir():
        cfg_file = path / "config.json"
        if not cfg_file.is_file():
            raise ModelNotFoundError(
                f"{path} has no config.json", fix="point at a model directory saved by save_pretrained"
            )
        return _config_from_file(cfg_file), str(path), path
    name = os.fspath(model)
    if name.count("/") > 1 or name.startswith((".", "/", "~")) or not name:
        raise ModelNotFoundError(f"model path {name!r} does not exist", fix="check the path")
    return _config_from_cache(name, revision)


def _config_for(model_type: str, d: dict[str, Any]) -> Any:
    import transformers
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES  # type: ignore[attr-defined]

    from .errors import unknown_model_type

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


def _config_from_file(path: Path) -> Any:
    try:
        d = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
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
    from . import _env

    found = try_to_load_from_cache(repo_id, "config.json", cache_dir=_env.hub_cache(), revision=revision)
    if not isinstance(found, str):
        raise ModelNotFoundError(
            f"{repo_id!r} is not a local path and its config.json is not in the Hub cache "
            f"({_env.hub_cache()})",
            fix=f"download it once (`hf download {repo_id}`), or pass a local directory or config.json",
        )
    cfg_path = Path(found)
    return _config_from_file(cfg_path), repo_id, cfg_path.parent


# -- model class and parameter counts ----------------------------------------------------------------------


def _resolve_class(config: Any, model_class: str | None) -> tuple[Any, str]:
    """(model class or None, auto class name). Never instantiates anything."""
    import transformers

    if model_class and model_class.startswith("AutoModel"):
        auto = getattr(transformers, model_class, None)
        if auto is None:
            raise CheckpointError(f"transformers has no {model_class}", fix="use e.g. AutoModelForCausalLM")
        try:
            return auto._model_mapping[type(config)], model_class
        except KeyError:
            raise CheckpointError(
                f"{model_class} has no class for model type {config.model_type!r}",
                fix="pick the auto class for this model's task (AutoModel for encoders)",
            ) from None
    if model_class:
        cls = getattr(transformers, model_class, None)
        if cls is None:
            raise CheckpointError(
                f"transformers has no model class {model_class}", fix="check the class name"
            )
        return cls, _auto_for(cls.__name__)
    for auto_name in ("AutoModelForCausalLM", "AutoModel"):
        mapping = getattr(transformers, auto_name)._model_mapping
        archs = [a for a in (getattr(config, "architectures", None) or []) if isinstance(a, str)]
        cls = None
        for a in archs:
            c = getattr(transformers, a, None)
            if c is not None and auto_name == _auto_for(a):
                cls = c
                break
        if cls is None and type(config) in mapping:
            cls = mapping[type(config)]
            # an encoder (BERT) has a causal-LM head class too, but its checkpoint is the bare model
            if auto_name == "AutoModelForCausalLM" and archs and _auto_for(archs[0]) != auto_name:
                continue
        if cls is not None:
            return cls, auto_name
    return None, "AutoModelForCausalLM"


def _auto_for(class_name: str) -> str:
    for suffix, auto in (
        ("ForCausalLM", "AutoModelForCausalLM"),
        ("LMHeadModel", "AutoModelForCausalLM"),
        ("ForSequenceClassification", "AutoModelForSequenceClassification"),
        ("ForTokenClassification", "AutoModelForTokenClassification"),
        ("ForQuestionAnswering", "AutoModelForQuestionAnswering"),
        ("ForConditionalGeneration", "AutoModelForSeq2SeqLM"),
    ):
        if class_name.endswith(suffix):
            return auto
    return "AutoModel"


def _with_layers(config: Any, n: int) -> Any:
    c = copy.deepcopy(config)
    text = c.get_text_config() if hasattr(c, "get_text_config") else c
    text.num_hidden_layers = n
    for attr in ("layer_types", "mlp_only_layers"):
        v = getattr(text, attr, None)
        if isinstance(v, list):
            setattr(
                text,
                attr,
                [x for x in v if not isinstance(x, int) or x < n][:n] if attr == "mlp_only_layers" else v[:n],
            )
    return c


def _count(cls: Any, config: Any) -> tuple[int, int, int, int, int, int]:
    """(linear, head, embedding, other, linear modules, sum in+out) of ``cls`` built on the meta device."""
    import torch

    with torch.device("meta"):
        model = cls._from_config(config) if hasattr(cls, "_from_config") else cls(config)
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    head_ids = {id(p) for p in head.parameters()} if head is not None else set()
    emb_ids: set[int] = set()
    lin_ids: set[int] = set()
    mods = ins = 0
    for m in model.modules():
        if isinstance(m, torch.nn.Embedding):
            emb_ids.update(id(p) for p in m.parameters(recurse=False))
        elif isinstance(m, torch.nn.Linear) and m is not head:
            lin_ids.update(id(p) for p in m.parameters(recurse=False))
            mods += 1
            ins += m.in_features + m.out_features
    lin = hd = emb = other = 0
    for p in model.parameters():  # de-duplicated: a tied head counts once, as the embedding
        n = p.numel()
        if id(p) in emb_ids:
            emb += n
        elif id(p) in head_ids:
            hd += n
        elif id(p) in lin_ids:
            lin += n
        else:
            other += n
    return lin, hd, emb, other, mods, ins


#: (class, config JSON) -> counts. Plans are re-made often for the same model (CLI, tests, load_model).
_COUNTS: dict[tuple[Any, str], ParamCounts] = {}
_COUNTS_LOCK = threading.Lock()


def _counts_cached(cls: Any, config: Any, layers: int) -> ParamCounts:
    key = (cls, json.dumps(config.to_dict(), sort_keys=True, default=str))
    with _COUNTS_LOCK:
        hit = _COUNTS.get(key)
    if hit is None:
        hit = _counts(cls, config, layers)
        with _COUNTS_LOCK:
            if len(_COUNTS) > 64:
                _COUNTS.clear()
            _COUNTS[key] = hit
    return hit


def _counts(cls: Any, config: Any, layers: int) -> ParamCounts:
    try:
        one = _count(cls, _with_layers(config, 1))
        two = _count(cls, _with_layers(config, 2))
    except Exception as e:  # some configs refuse 1-layer copies; count the real thing instead
        log.debug("layer extrapolation failed (%s); counting the full model on meta", e)
        full = _count(cls, config)
        return ParamCounts(
            *full[:4],
            per_layer=sum(full[:4]) // max(layers, 1),
            linear_modules=full[4],
            linear_in_out=full[5],
        )
    per = [b - a for a, b in zip(one, two, strict=True)]
    base = [a - p for a, p in zip(one, per, strict=True)]
    tot = [b + layers * p for b, p in zip(base, per, strict=True)]
    return ParamCounts(
        linear=tot[0],
        head=tot[1],
        embedding=tot[2],
        other=tot[3],
        per_layer=sum(per[:4]),
        linear_modules=tot[4],
        linear_in_out=tot[5],
    )


# -- safetensors headers -----------------------------------------------------------------------------------


def safetensors_files(path: Path) -> list[Path]:
    index = path / "model.safetensors.index.json"
    if index.is_file():
        try:
            names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (OSError, ValueError, KeyError) as e:
            raise CheckpointError(
                f"{index} is unreadable: {e}", fix="re-save or re-download the checkpoint"
            ) from None
        return [path / n for n in names]
    single = path / "model.safetensors"
    return [single] if single.is_file() else []


def read_header(file: Path) -> dict[str, Any]:
    """The JSON header of one safetensors file (8-byte little-endian length, then JSON), validated."""
    try:
        size = file.stat().st_size
        with file.open("rb") as f:
            raw = f.read(8)
            if len(raw) < 8:
                raise CheckpointError(
                    f"{file} is truncated (no header)", fix="re-save or re-download the checkpoint"
                )
            (n,) = struct.unpack("<Q", raw)
            if n > size - 8 or n > 100_000_000:
                raise CheckpointError(
                    f"{file} has a corrupt header length ({n})", fix="re-download the checkpoint"
                )
            raw_header = f.read(n)
    except OSError as e:
        raise CheckpointError(f"cannot read {file}: {e}", fix="check permissions and the path") from None
    # parsed outside the try above: CheckpointError is a ValueError, and wrapping it again said its fix twice
    try:
        header: dict[str, Any] = json.loads(raw_header)
        if not isinstance(header, dict):
            raise ValueError("the header is not a JSON object")
        end = max((int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"), default=0)
    except (ValueError, TypeError, KeyError, IndexError) as e:
        raise CheckpointError(f"{file} has a corrupt header: {e}", fix="re-download the checkpoint") from None
    if 8 + n + end > size:
        raise CheckpointError(
            f"{file} is truncated ({size} bytes, header promises {8 + n + end})",
            fix="re-save or re-download the checkpoint",
        )
    return header


def _stored(files: list[Path]) -> tuple[int, int, str | None]:
    """(bytes, params, dominant dtype name) over the files' headers."""
    total = params = 0
    by_dtype: dict[str, int] = {}
    for f in files:
        for k, v in read_header(f).items():
            if k == "__metadata__":
                continue
            n = 1
            for d in v["shape"]:
                n *= int(d)
            b = n * _ST_BYTES.get(v["dtype"], 2)
            total += b
            params += n
            by_dtype[v["dtype"]] = by_dtype.get(v["dtype"], 0) + b
    dom = max(by_dtype, key=lambda k: by_dtype[k]) if by_dtype else None
    return total, params, _ST_NAMES.get(dom, dom.lower()) if dom else None


# -- public ------------------------------------------------------------------------------------------------


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


#: model types whose attention always uses ALiBi (their modeling code builds the bias unconditionally; bloom
#: modeling_bloom.build_alibi_tensor, mpt ``attn_config.alibi`` defaults to True). Falcon has a config flag.
_ALIBI_TYPES = frozenset({"bloom", "mpt"})


def _attention_dims(text: Any, heads: int, hidden: int) -> tuple[int, int, int]:
    """(summary head_dim, q/k head dim, v head dim) read from the config.

    MLA configs (DeepSeek-V2/V3, MiniCPM3, Kimi) split the q/k head into a no-position part and a rotary part:
    DeepseekV3Attention uses ``qk_head_dim = qk_nope_head_dim + qk_rope_head_dim`` and a separate
    ``v_head_dim`` (transformers models/deepseek_v3/modeling_deepseek_v3.py, 5.17 lines 373-377), while
    DeepseekV3Config sets ``head_dim = qk_rope_head_dim`` (configuration_deepseek_v3.py line 124).
    """
    head_dim = int(getattr(text, "head_dim", None) or (hidden // heads if heads else 0))
    nope = getattr(text, "qk_nope_head_dim", None)
    rope = getattr(text, "qk_rope_head_dim", None)
    if isinstance(nope, int) and isinstance(rope, int) and nope + rope > 0:
        qk = int(getattr(text, "qk_head_dim", None) or nope + rope)
    else:
        qk = head_dim
    v = getattr(text, "v_head_dim", None)
    return head_dim, qk, int(v) if isinstance(v, int) and v > 0 else qk


def _attention_dropout(text: Any) -> float:
    # the name differs by family: llama/qwen/gemma/falcon ``attention_dropout``, gpt2/gptj ``attn_pdrop``,
    # bert ``attention_probs_dropout_prob``, mpt ``attn_config["attn_pdrop"]``
    for name in ("attention_dropout", "attn_pdrop", "attention_probs_dropout_prob"):
        v = getattr(text, name, None)
        if isinstance(v, int | float) and not isinstance(v, bool):
            return float(v)
    attn_cfg = getattr(text, "attn_config", None)
    v = attn_cfg.get("attn_pdrop") if isinstance(attn_cfg, dict) else getattr(attn_cfg, "attn_pdrop", None)
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else 0.0


def _alibi(config: Any, text: Any) -> bool:
    if config.model_type in _ALIBI_TYPES:
        attn_cfg = getattr(text, "attn_config", None)
        flag = attn_cfg.get("alibi") if isinstance(attn_cfg, dict) else getattr(attn_cfg, "alibi", None)
        return flag is not False
    return bool(getattr(text, "alibi", False))


def _module_attention_facts(cls: Any) -> tuple[bool, tuple[str, ...] | None]:
    """(sinks, keys of a ``*_ATTENTION_CLASSES`` dict) from the model class's module, without building it.

    Sinks: every transformers model with learnable sinks hands them to the attention function as
    ``s_aux=self.sinks`` (gpt_oss, deepseek_v4, hy_v4, mimo_v2_flash, granite_swa... in 5.17), the keyword
    integrations/flash_attention.flash_attention_forward takes; reading the source finds the models added
    later too.
    """
    import inspect
    import sys

    module = sys.modules.get(getattr(cls, "__module__", ""), None)
    if module is None:
        return False, None
    try:
        source = inspect.getsource(module)
    except (OSError, TypeError):
        source = ""
    classes: tuple[str, ...] | None = None
    for name, value in vars(module).items():
        if name.endswith("_ATTENTION_CLASSES") and isinstance(value, dict):
            classes = tuple(str(k) for k in value)
            break
    return "s_aux=" in source, classes


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
        from .policies.dtype import dtype_bytes

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
    )


def _can_generate(cls: Any) -> bool:
    try:
        return bool(cls.can_generate())
    except Exception:
        return str(cls.__name__).endswith(("ForCausalLM", "LMHeadModel", "ForConditionalGeneration"))


def summarize(model: Any, *, model_class: str | None = None, revision: str | None = None) -> ModelSummary:
    """Just the :class:`ModelSummary` (what ``Plan.model`` holds)."""
    return model_info(model, model_class=model_class, revision=revision).summary


def with_summary(info: ModelInfo, **changes: Any) -> ModelInfo:
    return replace(info, summary=replace(info.summary, **changes))
