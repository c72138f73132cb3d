"""Attention facts read from the config and the model class's module (the attention backend rules need them):
q/k and v head dims, attention dropout, ALiBi, learnable sinks, a legacy ``*_ATTENTION_CLASSES`` table."""

from __future__ import annotations

from typing import Any

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
