"""Shared test set-up: offline by default, tiny model checkpoints, and the ``gpu`` marker's skip."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

# The test machines cannot reach the Hub: make every library say so up front instead of timing out.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("CUDALOAD_HUB_TIMEOUT", "0")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if _cuda_available():
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU (runs on the H200 device machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """``tiny_model("qwen3")`` -> a directory with a tiny random checkpoint, made once per session."""
    from cudaload.testing import make_tiny

    made: dict[tuple[str, str, str | None], Path] = {}

    def get(kind: str, dtype: str = "float32", max_shard_size: str | None = None) -> Path:
        key = (kind, dtype, max_shard_size)
        if key not in made:
            path = tmp_path_factory.mktemp(f"tiny-{kind}-{dtype}")
            made[key] = make_tiny(kind, path, dtype=dtype, max_shard_size=max_shard_size)
        return made[key]

    return get


@pytest.fixture(scope="session")
def small_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Qwen3 with head_dim 128 (what flash kernels are built for), 2 layers, bf16 safetensors: the GPU tests'
    model (tests/test_gpu_load.py, tests/test_training_gpu.py)."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen3Config

    from cudaload.testing import make_tokenizer

    path = tmp_path_factory.mktemp("qwen3-small")
    cfg = Qwen3Config(
        vocab_size=512,
        hidden_size=512,
        intermediate_size=1024,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=128,
        max_position_embeddings=4096,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).save_pretrained(path)
    make_tokenizer(512).save_pretrained(path)
    return path
