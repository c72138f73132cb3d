"""Packed training on a real GPU (the H200 device machine): a packed step with flash attention's varlen kernels
(boundaries once per step) trains like the padded batch of the same sequences within bf16 tolerance, no
packed sequence sees its neighbour, and what cudaload hands Trainer trains (LoRA, and QLoRA where
bitsandbytes is installed)."""

from __future__ import annotations

import importlib.util
import random
from pathlib import Path
from typing import Any

import pytest
import torch

import cudaload
from cudaload.train.data import PackedCollator, PaddedCollator

pytestmark = pytest.mark.gpu

FA4 = (
    importlib.util.find_spec("flash_attn") is not None
    and importlib.util.find_spec("flash_attn.cute") is not None
)
PACKED_ATTN = ["sdpa", *(["flash_attention_4"] if FA4 else [])]


@pytest.fixture(autouse=True)
def _private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDALOAD_CACHE", str(tmp_path / "cache"))


def _seqs(n: int = 6, seed: int = 0) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    return [{"input_ids": [rng.randrange(3, 500) for _ in range(rng.randrange(16, 300))]} for _ in range(n)]


def _on_gpu(batch: dict[str, Any]) -> dict[str, Any]:
    return {k: v.cuda() if isinstance(v, torch.Tensor) else v for k, v in batch.items()}


def _model(path: Path, attn: str) -> Any:
    from transformers import AutoModelForCausalLM

    return (
        AutoModelForCausalLM.from_pretrained(path, attn_implementation=attn, dtype=torch.bfloat16)
        .cuda()
        .train()
    )


def _loss_grads(model: Any, batch: dict[str, Any]) -> tuple[float, dict[str, torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    loss = model(**_on_gpu(batch)).loss
    loss.backward()
    return float(loss.detach()), {
        n: p.grad.float() for n, p in model.named_parameters() if p.grad is not None
    }


@pytest.mark.parametrize("attn", PACKED_ATTN)
def test_packed_step_trains_like_the_padded_batch_on_gpu(small_model: Path, attn: str) -> None:
    seqs = _seqs()
    ref = _model(small_model, "sdpa")
    l_pad, g_pad = _loss_grads(ref, PaddedCollator()(seqs))
    model = _model(small_model, attn)
    boundaries = "cu_seq_lens" if attn.startswith("flash") else "position_ids"
    l_pack, g_pack = _loss_grads(model, PackedCollator(boundaries=boundaries)(seqs))
    assert l_pack == pytest.approx(l_pad, rel=2e-2)
    for n, g in g_pad.items():
        cos = torch.nn.functional.cosine_similarity(g.flatten(), g_pack[n].flatten(), dim=0)
        assert cos > 0.99, (n, float(cos))


@pytest.mark.parametrize("attn", PACKED_ATTN)
def test_no_packed_sequence_attends_to_its_neighbour_on_gpu(small_model: Path, attn: str) -> None:
    model = _model(small_model, attn).eval()
    a, b = _seqs(2, seed=5)
    boundaries = "cu_seq_lens" if attn.startswith("flash") else "position_ids"
    packed = PackedCollator(boundaries=boundaries)([a, b])
    packed.pop("labels")
    n = len(a["input_ids"])
    with torch.no_grad():
        both = model(**_on_gpu(packed)).logits[0].float()
        alone = model(input_ids=torch.tensor([b["input_ids"]]).cuda()).logits[0].float()
        # the control: the same row with the boundaries hidden (one sequence) does see the neighbour
        row = packed["input_ids"].cuda()
        leaky = model(
            input_ids=row, position_ids=torch.arange(row.shape[1], device="cuda")[None], use_cache=False
        )
    err = (both[n:] - alone).abs().max() / alone.abs().max()
    leak = (leaky.logits[0].float()[n:] - alone).abs().max() / alone.abs().max()
    assert err < 2e-2 < leak, (float(err), float(leak))


def test_load_model_and_training_setup_train_packed(small_model: Path, tmp_path: Path) -> None:
    from transformers import Trainer, TrainingArguments

    model = cudaload.load_model(str(small_model), intent="lora", seq_len=512, batch_size=8)
    p = model.cudaload_plan
    assert p.training is not None and p.training.layout.choice == "packed"
    assert (p.attention.choice == "flash_attention_4") == FA4
    assert p.gradient_checkpointing is not None and p.gradient_checkpointing.choice == "off"
    assert p.peft is not None and p.peft["lora_dropout"] == 0.0
    setup = cudaload.training_setup(model, _seqs(64, seed=1))
    args = TrainingArguments(output_dir=str(tmp_path), max_steps=4, report_to=[], **setup.arguments)
    out = Trainer(
        model=model, args=args, train_dataset=setup.train_dataset, data_collator=setup.data_collator
    ).train()
    assert out.training_loss == out.training_loss and out.training_loss > 0  # finite


@pytest.mark.skipif(importlib.util.find_spec("bitsandbytes") is None, reason="bitsandbytes is not installed")
def test_qlora_trains_packed_in_bf16(small_model: Path, tmp_path: Path) -> None:
    from transformers import Trainer, TrainingArguments

    model = cudaload.load_model(str(small_model), intent="qlora", seq_len=512, batch_size=8)
    p = model.cudaload_plan
    assert p.training is not None and p.training.kbit_upcast is not None
    assert p.training.kbit_upcast.choice == "bf16"
    # no fp32 cast: what is not 4-bit stays bf16, the adapters are fp32
    dtypes = {
        str(t.dtype) for n, t in model.named_parameters() if "lora_" not in n and t.dtype.is_floating_point
    }
    assert "torch.float32" not in dtypes
    setup = cudaload.training_setup(model, _seqs(64, seed=2))
    args = TrainingArguments(output_dir=str(tmp_path), max_steps=3, report_to=[], **setup.arguments)
    out = Trainer(
        model=model, args=args, train_dataset=setup.train_dataset, data_collator=setup.data_collator
    ).train()
    assert out.training_loss == out.training_loss and out.training_loss > 0
