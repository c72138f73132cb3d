"""Tiny random checkpoints made from configs and saved as safetensors, with a tokenizer built locally
whose vocabulary size equals the model's. Used by the tests, the CPU benchmarks and ``cudaload demo``."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

#: Tiny configs. Shapes are small but keep each family's distinctive feature: GQA everywhere,
#: Mistral's sliding window, Gemma-2's soft-capping and head_dim 256, MoE routing, GPT-2's fused attention,
#: BERT as an encoder.
VOCAB = 320
_COMMON: dict[str, Any] = {
    "vocab_size": VOCAB,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 512,
}
_TINY: dict[str, tuple[str, str, dict[str, Any]]] = {
    # kind: (config class, auto class, overrides)
    "qwen3": ("Qwen3Config", "AutoModelForCausalLM", {"head_dim": 16, "tie_word_embeddings": True}),
    "llama": ("LlamaConfig", "AutoModelForCausalLM", {}),
    "mistral": ("MistralConfig", "AutoModelForCausalLM", {"sliding_window": 64}),
    "gemma2": (
        "Gemma2Config",
        "AutoModelForCausalLM",
        {
            "head_dim": 256,
            "attn_logit_softcapping": 50.0,
            "final_logit_softcapping": 30.0,
            "sliding_window": 64,
        },
    ),
    "qwen3_moe": (
        "Qwen3MoeConfig",
        "AutoModelForCausalLM",
        {
            "head_dim": 16,
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 32,
            "decoder_sparse_step": 1,
        },
    ),
    "gpt2": ("GPT2Config", "AutoModelForCausalLM", {}),
    "bert": ("BertConfig", "AutoModel", {}),
}
TINY_KINDS = tuple(_TINY)

_GPT2_KEYS = {"vocab_size": VOCAB, "n_embd": 64, "n_layer": 2, "n_head": 4, "n_positions": 512}
_BERT_KEYS = {
    "vocab_size": VOCAB,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "max_position_embeddings": 512,
}


def tiny_config(kind: str, **overrides: Any) -> Any:
    """The tiny ``kind`` config; ``overrides`` replace its keys (a longer context, another vocabulary)."""
    import transformers

    if kind not in _TINY:
        raise ValueError(f"unknown tiny model kind {kind!r}; choose from {', '.join(TINY_KINDS)}")
    cls_name, _, family = _TINY[kind]
    if kind == "gpt2":
        kw = dict(_GPT2_KEYS)
    elif kind == "bert":
        kw = dict(_BERT_KEYS)
    else:
        kw = {**_COMMON, **family}
    kw.update({"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0}, **overrides)
    return getattr(transformers, cls_name)(**kw)


def make_tokenizer(vocab_size: int = VOCAB) -> Any:
    """A byte-level BPE tokenizer with no merges: 256 byte symbols, specials, and fillers up to
    ``vocab_size`` so ids always index the embedding. Round-trips any UTF-8 text."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = ["<pad>", "<s>", "</s>", "<unk>"]
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    if vocab_size < len(specials) + len(alphabet):
        raise ValueError(f"vocab_size must be at least {len(specials) + len(alphabet)}")
    vocab: dict[str, int] = {tok: i for i, tok in enumerate(specials)}
    for ch in sorted(alphabet):
        vocab[ch] = len(vocab)
    while len(vocab) < vocab_size:
        vocab[f"<extra_{len(vocab)}>"] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )


def make_tiny(
    kind: str,
    path: str | os.PathLike[str],
    *,
    seed: int = 0,
    dtype: str = "float32",
    max_shard_size: str | None = None,
) -> Path:
    """Write a tiny random ``kind`` model (config, safetensors weights, tokenizer) into ``path``."""
    import torch
    import transformers

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    config = tiny_config(kind)
    auto = getattr(transformers, _TINY[kind][1])
    torch.manual_seed(seed)
    model = auto.from_config(config, dtype=getattr(torch, dtype))
    kw: dict[str, Any] = {"safe_serialization": True}
    if max_shard_size:
        kw["max_shard_size"] = max_shard_size
    model.save_pretrained(path, **kw)
    make_tokenizer(config.vocab_size).save_pretrained(path)
    return path
