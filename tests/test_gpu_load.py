"""load_model() on a real GPU (the H200 device machine): every backend there, quantization, LoRA/QLoRA steps,
the runtime fallback with a flash package that imports but fails, and memory back to baseline after failures."""

from __future__ import annotations

import gc
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch

import cudaload
from cudaload.errors import CheckpointError

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def _private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDALOAD_CACHE", str(tmp_path / "cache"))


def _allocated() -> int:
    gc.collect()
    torch.cuda.synchronize()
    return torch.cuda.memory_allocated()


def _logits(model: Any, n: int = 64) -> torch.Tensor:
    ids = torch.arange(n, device=next(model.parameters()).device).remainder(500).unsqueeze(0)
    with torch.no_grad():
        return model(ids).logits.float()


def test_auto_load_on_gpu_is_bf16_on_cuda0(small_model: Path) -> None:
    model = cudaload.load_model(str(small_model))
    plan = model.cudaload_plan
    assert plan.placement.devices == ("cuda:0",)
    assert plan.dtype.choice == "bfloat16"
    assert plan.verified["devices"] == ["cuda:0"]
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}


@pytest.mark.parametrize("attn", ["sdpa", "eager", "flash_attention_4"])
def test_every_backend_here_gives_the_same_logits(small_model: Path, attn: str) -> None:
    caps = cudaload.detect()
    if attn == "flash_attention_4" and not caps.usable("flash-attn-4"):
        pytest.skip("flash-attn-4 is not installed here (carry the fa4 wheels)")
    ref = _logits(cudaload.load_model(str(small_model), attn="eager"))
    model = cudaload.load_model(str(small_model), attn=attn)
    assert model.config._attn_implementation == attn
    torch.testing.assert_close(_logits(model), ref, rtol=3e-2, atol=3e-2)


def test_fast_path_matches_from_pretrained_bit_for_bit(small_model: Path) -> None:
    from transformers import AutoModelForCausalLM

    fast = cudaload.load_model(str(small_model), fast=True)  # small: auto would pick from_pretrained
    assert fast.cudaload_plan.verified["load_path"] == "fast"
    ref = AutoModelForCausalLM.from_pretrained(small_model, dtype=torch.bfloat16, device_map="cuda:0")
    sd_fast, sd_ref = fast.state_dict(), ref.state_dict()
    assert sd_fast.keys() == sd_ref.keys()
    for k in sd_ref:
        assert torch.equal(sd_fast[k], sd_ref[k]), k


@pytest.mark.parametrize("method", ["nf4", "int8"])
def test_bitsandbytes_quantization(small_model: Path, method: str) -> None:
    if not cudaload.detect().usable("bitsandbytes"):
        pytest.skip("bitsandbytes is not installed here (carry the quant wheels)")
    model = cudaload.load_model(str(small_model), quantization=method)
    plan = model.cudaload_plan
    assert plan.quantization.choice == method and plan.verified["quantization"] == method
    if method == "nf4":
        cfg = plan.quantization_config or {}
        assert cfg.get("bnb_4bit_quant_type") == "nf4" and cfg.get("bnb_4bit_compute_dtype") in (
            "bfloat16",
            torch.bfloat16,
        )
    assert torch.isfinite(_logits(model)).all()


@pytest.mark.parametrize("intent", ["lora", "qlora"])
def test_adapter_training_step(small_model: Path, intent: str) -> None:
    if intent == "qlora" and not cudaload.detect().usable("bitsandbytes"):
        pytest.skip("bitsandbytes is not installed here (carry the quant wheels)")
    model = cudaload.load_model(str(small_model), intent=intent)
    assert model.training
    params = [p for p in model.parameters() if p.requires_grad]
    before = [p.detach().clone() for p in params]
    opt = torch.optim.AdamW(params, lr=1e-2)
    ids = torch.arange(32, device="cuda:0").unsqueeze(0)
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    opt.step()
    assert torch.isfinite(loss)
    assert any(not torch.equal(a, b) for a, b in zip(params, before, strict=True))


def test_failed_load_returns_gpu_memory_to_baseline(small_model: Path, tmp_path: Path) -> None:
    """A checkpoint whose second shard is truncated: the first shard reaches the GPU, then the load fails."""
    from transformers import AutoModelForCausalLM

    sharded = tmp_path / "sharded"
    AutoModelForCausalLM.from_pretrained(small_model, dtype=torch.bfloat16).save_pretrained(
        sharded, max_shard_size="2MB"
    )
    shutil.copy(small_model / "tokenizer.json", sharded)
    shards = sorted(sharded.glob("model-*.safetensors"))
    assert len(shards) > 1
    data = shards[-1].read_bytes()
    shards[-1].write_bytes(data[: len(data) - 4096])
    torch.cuda.init()
    baseline = _allocated()
    for fast in (True, False):
        with pytest.raises(CheckpointError):
            cudaload.load_model(str(sharded), fast=fast)
        assert _allocated() == baseline, f"fast={fast}: {_allocated() - baseline} bytes left on the GPU"


_FAKE_FA2 = {
    "flash_attn/__init__.py": '__version__ = "2.8.3"\nfrom .flash_attn_interface import flash_attn_func, flash_attn_varlen_func, flash_attn_with_kvcache\n',
    "flash_attn/flash_attn_interface.py": textwrap.dedent("""
        def _fail(*a, **k):
            raise RuntimeError("CUDA error: no kernel image is available for execution on the device")
        flash_attn_func = flash_attn_varlen_func = flash_attn_with_kvcache = _fail
    """),
    "flash_attn/bert_padding.py": "def index_first_axis(*a, **k): raise RuntimeError('unused')\n"
    "pad_input = unpad_input = index_first_axis\n",
    "flash_attn_2_cuda.py": "",
    "flash_attn-2.8.3.dist-info/METADATA": "Metadata-Version: 2.1\nName: flash-attn\nVersion: 2.8.3\n",
    "flash_attn-2.8.3.dist-info/top_level.txt": "flash_attn\nflash_attn_2_cuda\n",
    "flash_attn-2.8.3.dist-info/RECORD": "",
}


def test_flash_package_that_imports_but_fails_falls_back(small_model: Path, tmp_path: Path) -> None:
    """FA2 on a GPU it was not built for imports fine and dies at the first forward: cudaload steps down."""
    fake = tmp_path / "fake_site"
    for rel, text in _FAKE_FA2.items():
        (fake / rel).parent.mkdir(parents=True, exist_ok=True)
        (fake / rel).write_text(text)
    script = textwrap.dedent(f"""
        import json, cudaload
        caps = cudaload.detect()
        assert caps.usable("flash-attn"), caps.package("flash-attn")
        # without measurements auto takes sdpa: a tune-cache entry (what `cudaload tune` would have stored on
        # a machine where this FA2 build once worked) makes FA2 the measured choice for the declared work
        from cudaload.model_info import model_info
        from cudaload.tuning import Entry, TimingCache, Work, bucket, gpu_id, package_versions, signature
        assert TimingCache().put(Entry(
            gpu=gpu_id(caps), versions=package_versions(caps),
            signature=signature(model_info({str(small_model)!r}), "bfloat16"), work=bucket(Work(1, 32, 8)),
            seconds={{"flash_attention_2": 0.1, "sdpa": 1.0, "eager": 1.0}}, date="2026-12-01T00:00:00"))
        m = cudaload.load_model({str(small_model)!r}, hardware=caps, batch_size=1, seq_len=40, new_tokens=8)
        p = m.cudaload_plan
        result = {{"choice": p.attention.choice, "fallbacks": p.verified["attention_fallbacks"],
                  "impl": m.config._attn_implementation}}
        del m
        # explicit: no fallback; the model was on the GPU when its probe failed, and must be gone after
        import gc, torch
        gc.collect(); base = torch.cuda.memory_allocated()
        try:
            cudaload.load_model({str(small_model)!r}, hardware=caps, attn="flash_attention_2")
        except cudaload.LoadError as e:
            result["explicit_error"] = str(e)
        gc.collect(); result["leaked"] = torch.cuda.memory_allocated() - base
        print(json.dumps(result))
    """)
    env = {
        **os.environ,
        "PYTHONPATH": f"{fake}:{os.environ.get('PYTHONPATH', '')}",
        "CUDALOAD_CACHE": str(tmp_path / "cache"),
    }
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["fallbacks"] and result["fallbacks"][0]["from"] == "flash_attention_2"
    assert "no kernel image" in result["fallbacks"][0]["reason"]
    assert result["impl"] == result["choice"] != "flash_attention_2"
    assert "fails on this machine" in result["explicit_error"]
    assert result["leaked"] == 0
