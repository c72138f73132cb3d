"""The model class a config loads as, and its auto class: ``model_class`` when the caller names one, else the
config's ``architectures`` or the auto mappings (a causal LM first, the bare model for encoders)."""

from __future__ import annotations

from typing import Any

from ..errors import CheckpointError


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
