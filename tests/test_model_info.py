"""model_info: configs, local checkpoints, safetensors headers, parameter counts against real models."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from cudaload.errors import CheckpointError, ConfigurationError, ModelNotFoundError
from cudaload.model_info import _count, _with_layers, model_info
from cudaload.testing import full_config


@pytest.mark.parametrize("kind", ["qwen3", "llama", "mistral", "gemma2", "qwen3_moe", "gpt2", "bert"])
def test_counts_match_the_real_model(tiny_model: Any, kind: str) -> None:
    import transformers

    path = tiny_model(kind)
    info = model_info(path)
    auto = transformers.AutoModel if kind == "bert" else transformers.AutoModelForCausalLM
    model = auto.from_pretrained(path)
    assert info.summary.params == sum(p.numel() for p in model.parameters())
    assert info.summary.weights_source == "safetensors" and info.summary.safetensors
    assert info.summary.checkpoint_dtype == "float32"
    assert info.summary.is_encoder == (kind == "bert")
    assert info.auto_class == ("AutoModel" if kind == "bert" else "AutoModelForCausalLM")


def test_config_json_dict_and_object_agree(tiny_model: Any) -> None:
    path = Path(tiny_model("qwen3"))
    a = model_info(path).summary
    b = model_info(path / "config.json").summary
    c = model_info(json.loads((path / "config.json").read_text())).summary
    assert a.params == b.params == c.params
    assert (a.layers, a.head_dim, a.num_kv_heads, a.tied_embeddings) == (2, 16, 2, True)
    assert c.weights_source == "config"


def test_sliding_window_and_softcap(tiny_model: Any) -> None:
    m = model_info(tiny_model("mistral"))
    assert m.summary.sliding_window == 64 and m.sliding_layers == 2
    g = model_info(tiny_model("gemma2"))
    assert g.attn_softcapping == 50.0 and g.sliding_layers == 1 and g.fp16_overflow
    q = model_info(full_config("Qwen3-8B"))
    assert q.summary.sliding_window is None and q.sliding_layers == 0  # use_sliding_window=False


@pytest.mark.parametrize("shape", ["Qwen3-0.6B", "Gemma-2-9B", "Qwen3-30B-A3B"])
def test_layer_extrapolation_equals_full_count(shape: str) -> None:
    import transformers

    cfg = full_config(shape)
    cls = getattr(transformers, cfg.architectures[0])
    full = _count(cls, cfg)
    info = model_info(cfg)
    c = info.counts
    assert (c.linear, c.head, c.embedding, c.other, c.linear_modules, c.linear_in_out, c.qk_norms) == full
    assert _count(cls, _with_layers(cfg, 1))[0] < full[0]


def test_known_sizes() -> None:
    q8 = model_info(full_config("Qwen3-8B")).summary
    assert 8.1e9 < q8.params < 8.3e9 and not q8.tied_embeddings
    l70 = model_info(full_config("Llama-3.1-70B")).summary
    assert 70.5e9 < l70.params < 70.6e9
    assert model_info(full_config("Qwen3-30B-A3B")).summary.is_moe


def test_missing_and_corrupt(tmp_path: Path, tiny_model: Any) -> None:
    with pytest.raises(ModelNotFoundError):
        model_info(tmp_path / "nope")
    with pytest.raises(ModelNotFoundError):
        model_info(tmp_path)  # a directory without config.json
    with pytest.raises(ModelNotFoundError) as e:
        model_info("someone/not-cached-model")
    assert "Hub cache" in str(e.value)
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "config.json").write_text('{"model_type": "no-such-type"}')
    with pytest.raises(CheckpointError):
        model_info(bad)
    src = Path(tiny_model("llama"))
    trunc = tmp_path / "trunc"
    trunc.mkdir()
    (trunc / "config.json").write_text((src / "config.json").read_text())
    data = (src / "model.safetensors").read_bytes()
    (trunc / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError) as e2:
        model_info(trunc)
    assert "truncated" in str(e2.value)


def test_a_weights_file_is_not_a_model(tmp_path: Path, tiny_model: Any) -> None:
    """A .safetensors file passed as the model raised UnicodeDecodeError after reading it whole as text."""
    src = Path(tiny_model("llama"))
    with pytest.raises(ConfigurationError) as e:
        model_info(src / "model.safetensors")
    assert "weights file" in e.value.message and repr(str(src)) in (e.value.fix or "")
    alone = tmp_path / "model.safetensors"
    alone.write_bytes((src / "model.safetensors").read_bytes())
    with pytest.raises(ConfigurationError, match="weights file") as e2:
        model_info(alone)
    assert "config.json" in (e2.value.fix or "")
    binary = tmp_path / "weights.dat"  # bytes that are no text, under a name cudaload does not know
    binary.write_bytes(b"\x80\xff\x00" * 8)
    with pytest.raises(CheckpointError, match="cannot read") as e3:
        model_info(binary)
    assert e3.value.fix


def test_an_unreadable_model_folder_says_chmod(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A folder this user may not enter: Path.is_file raised PermissionError out of model_info. Root enters
    every folder, so the refusal stat(2) gives another user is stood for here."""
    folder = tmp_path / "locked"
    folder.mkdir()
    (folder / "config.json").write_text('{"model_type": "qwen3"}')
    is_file = Path.is_file

    def refused(self: Path) -> bool:
        if self.parent == folder:
            raise PermissionError(13, "Permission denied", str(self))
        return is_file(self)

    monkeypatch.setattr(Path, "is_file", refused)
    with pytest.raises(ModelNotFoundError, match="cannot be read") as e:
        model_info(folder)
    assert f"chmod -R a+rX {str(folder)!r}" in (e.value.fix or "")


@pytest.mark.skipif(os.geteuid() == 0, reason="root enters folders whatever their mode")
def test_an_unreadable_model_folder_says_chmod_for_real(tmp_path: Path) -> None:
    folder = tmp_path / "locked"
    folder.mkdir()
    (folder / "config.json").write_text('{"model_type": "qwen3"}')
    folder.chmod(0)
    try:
        with pytest.raises(ModelNotFoundError, match="cannot be read"):
            model_info(folder)
    finally:
        folder.chmod(0o700)


def test_sharded_checkpoint(tiny_model: Any) -> None:
    path = Path(tiny_model("llama", max_shard_size="100KB"))
    assert (path / "model.safetensors.index.json").is_file()
    s = model_info(path).summary
    assert s.safetensors and s.weights_bytes == s.params * 4


def test_explicit_model_class(tiny_model: Any) -> None:
    info = model_info(tiny_model("llama"), model_class="AutoModelForSequenceClassification")
    assert info.class_name == "LlamaForSequenceClassification" and info.task_type == "SEQ_CLS"
    with pytest.raises(CheckpointError):
        model_info(tiny_model("llama"), model_class="NoSuchModel")


def test_corrupt_header_says_its_fix_once(tmp_path: Path) -> None:
    """Issue 16.9: a corrupt header length was wrapped twice, so the message carried its fix twice."""
    import struct

    from cudaload.errors import CheckpointError
    from cudaload.model_info import read_header

    f = tmp_path / "model.safetensors"
    f.write_bytes(struct.pack("<Q", 10**9) + b"{}")
    with pytest.raises(CheckpointError) as ei:
        read_header(f)
    assert str(ei.value).count("re-download") == 1
    for body in (b"[1, 2]", b'{"w": {"dtype": "F32", "shape": [1]}}'):  # not an object / no data_offsets
        f.write_bytes(struct.pack("<Q", len(body)) + body)
        with pytest.raises(CheckpointError, match="corrupt header"):
            read_header(f)


def test_unknown_model_type_is_short_with_close_names(tmp_path: Path) -> None:
    """Issue 16.9: the error listed every model type transformers knows (~12 KB)."""
    import json as _json

    from cudaload.errors import CheckpointError
    from cudaload.model_info import model_info

    (tmp_path / "config.json").write_text(_json.dumps({"model_type": "lama", "hidden_size": 8}))
    with pytest.raises(CheckpointError) as ei:
        model_info(tmp_path)
    text = str(ei.value)
    assert len(text) < 600 and "llama" in text


def test_tiny_config_overrides_are_applied() -> None:
    """cudaload.testing.tiny_config's keyword overrides replace its keys (they were shadowed by the family's)."""
    from cudaload.testing.models import tiny_config

    c = tiny_config("qwen3", vocab_size=999, tie_word_embeddings=False)
    assert (c.vocab_size, c.tie_word_embeddings) == (999, False)
    assert tiny_config("gpt2", n_layer=3).n_layer == 3
    assert tiny_config("qwen3").vocab_size != 999
