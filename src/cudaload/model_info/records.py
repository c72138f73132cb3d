"""What :func:`~cudaload.model_info.model_info` returns: :class:`ParamCounts` and :class:`ModelInfo` (the public
:class:`~cudaload.plans.ModelSummary` plus the facts only the policies read), and :func:`with_summary`."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from .summary import ModelSummary

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
    qk_norms: int = 0  # attention q_norm modules (RMSNorm on the queries and keys: Qwen3, Gemma3, OLMo2...)

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
    #: the config's transform of the output head's logits before the loss (``final_logit_softcapping`` of
    #: Gemma 2/3, ``logit_scale`` of Cohere, ``logits_scaling`` of Granite), as "name=value"; None where the
    #: logits go to the loss as the head computes them (a fused or chunked loss computes the head itself)
    head_transform: str | None = None

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


def with_summary(info: ModelInfo, **changes: Any) -> ModelInfo:
    return replace(info, summary=replace(info.summary, **changes))
