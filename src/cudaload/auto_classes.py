"""The names ``load_model`` reads that ``from_pretrained`` also knows: the task shorthands for the transformers auto
class, and the ``from_pretrained`` keywords cudaload decides itself. Data only, below the request
(:mod:`cudaload.request` checks them) and the load (:mod:`cudaload.execute`)."""

from __future__ import annotations

#: ``task=`` shorthand -> the transformers auto class ``load_model`` loads with
AUTO_CLASSES = {
    "causal-lm": "AutoModelForCausalLM",
    "text-generation": "AutoModelForCausalLM",
    "feature-extraction": "AutoModel",
    "embedding": "AutoModel",
    "base": "AutoModel",
    "masked-lm": "AutoModelForMaskedLM",
    "fill-mask": "AutoModelForMaskedLM",
    "sequence-classification": "AutoModelForSequenceClassification",
    "text-classification": "AutoModelForSequenceClassification",
    "token-classification": "AutoModelForTokenClassification",
    "question-answering": "AutoModelForQuestionAnswering",
    "seq2seq": "AutoModelForSeq2SeqLM",
    "text2text-generation": "AutoModelForSeq2SeqLM",
    "image-text-to-text": "AutoModelForImageTextToText",
    "vision-language": "AutoModelForImageTextToText",
}

#: from_pretrained keywords that cudaload decides; passing them twice would make the plan a lie
DECIDED_KWARGS = frozenset(
    {
        "dtype",
        "torch_dtype",
        "attn_implementation",
        "device_map",
        "max_memory",
        "use_kernels",
        "kernel_config",
    }
)
