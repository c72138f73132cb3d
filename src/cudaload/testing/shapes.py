"""Full-size model shapes as configs (public config.json values), for planning without weights."""

from __future__ import annotations

from typing import Any

FULL_SHAPES: dict[str, tuple[str, dict[str, Any]]] = {
    "Qwen3-0.6B": (
        "Qwen3Config",
        {
            "vocab_size": 151936,
            "hidden_size": 1024,
            "intermediate_size": 3072,
            "num_hidden_layers": 28,
            "num_attention_heads": 16,
            "num_key_value_heads": 8,
            "head_dim": 128,
            "max_position_embeddings": 40960,
            "tie_word_embeddings": True,
            "dtype": "bfloat16",
            "architectures": ["Qwen3ForCausalLM"],
        },
    ),
    "Qwen3-8B": (
        "Qwen3Config",
        {
            "vocab_size": 151936,
            "hidden_size": 4096,
            "intermediate_size": 12288,
            "num_hidden_layers": 36,
            "num_attention_heads": 32,
            "num_key_value_heads": 8,
            "head_dim": 128,
            "max_position_embeddings": 40960,
            "tie_word_embeddings": False,
            "dtype": "bfloat16",
            "architectures": ["Qwen3ForCausalLM"],
        },
    ),
    "Llama-3.1-8B": (
        "LlamaConfig",
        {
            "vocab_size": 128256,
            "hidden_size": 4096,
            "intermediate_size": 14336,
            "num_hidden_layers": 32,
            "num_attention_heads": 32,
            "num_key_value_heads": 8,
            "max_position_embeddings": 131072,
            "rope_theta": 500000.0,
            "tie_word_embeddings": False,
            "dtype": "bfloat16",
            "architectures": ["LlamaForCausalLM"],
        },
    ),
    "Llama-3.1-70B": (
        "LlamaConfig",
        {
            "vocab_size": 128256,
            "hidden_size": 8192,
            "intermediate_size": 28672,
            "num_hidden_layers": 80,
            "num_attention_heads": 64,
            "num_key_value_heads": 8,
            "max_position_embeddings": 131072,
            "rope_theta": 500000.0,
            "tie_word_embeddings": False,
            "dtype": "bfloat16",
            "architectures": ["LlamaForCausalLM"],
        },
    ),
    "Qwen3-30B-A3B": (
        "Qwen3MoeConfig",
        {
            "vocab_size": 151936,
            "hidden_size": 2048,
            "intermediate_size": 6144,
            "moe_intermediate_size": 768,
            "num_hidden_layers": 48,
            "num_attention_heads": 32,
            "num_key_value_heads": 4,
            "head_dim": 128,
            "num_experts": 128,
            "num_experts_per_tok": 8,
            "decoder_sparse_step": 1,
            "max_position_embeddings": 40960,
            "tie_word_embeddings": False,
            "dtype": "bfloat16",
            "architectures": ["Qwen3MoeForCausalLM"],
        },
    ),
    "Gemma-2-9B": (
        "Gemma2Config",
        {
            "vocab_size": 256000,
            "hidden_size": 3584,
            "intermediate_size": 14336,
            "num_hidden_layers": 42,
            "num_attention_heads": 16,
            "num_key_value_heads": 8,
            "head_dim": 256,
            "max_position_embeddings": 8192,
            "sliding_window": 4096,
            "attn_logit_softcapping": 50.0,
            "final_logit_softcapping": 30.0,
            "dtype": "bfloat16",
            "architectures": ["Gemma2ForCausalLM"],
        },
    ),
    "Mixtral-8x7B": (
        "MixtralConfig",
        {
            "vocab_size": 32000,
            "hidden_size": 4096,
            "intermediate_size": 14336,
            "num_hidden_layers": 32,
            "num_attention_heads": 32,
            "num_key_value_heads": 8,
            "num_local_experts": 8,
            "num_experts_per_tok": 2,
            "max_position_embeddings": 32768,
            "tie_word_embeddings": False,
            "dtype": "bfloat16",
            "architectures": ["MixtralForCausalLM"],
        },
    ),
}


def full_config(name: str) -> Any:
    """A transformers config for a full-size shape (no weights)."""
    import transformers

    try:
        cls_name, kw = FULL_SHAPES[name]
    except KeyError:
        raise ValueError(f"unknown shape {name!r}; choose from {', '.join(FULL_SHAPES)}") from None
    return getattr(transformers, cls_name)(**kw)
