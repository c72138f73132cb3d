"""TRL's SFTTrainer runs the plan (issue 41): ``SFTConfig(**sft_config_arguments(plan))`` with a tiny model on the
CPU, a few optimizer steps over the plan's bfd packing, and no plan hands TRL the Liger fused loss it refuses.
Real TRL: the dev set (.venvs/newest) installs it; other sets skip."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

import cudaload
from cudaload.testing import make_tiny

trl = pytest.importorskip("trl")


def test_sfttrainer_trains_a_few_steps_on_the_plans_packing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch
    from datasets import Dataset

    monkeypatch.setenv("CUDALOAD_CACHE", str(tmp_path / "cache"))
    path = str(make_tiny("qwen3", tmp_path / "m"))
    kw = dict(intent="lora", seq_len=64, batch_size=4, dtype="float32", batch_layout="packed")
    model = cudaload.load_model(path, **kw)  # packed: the CPU would pad, the GPU plans pack
    p = model.cudaload_plan
    assert p.training is not None and p.training.packed
    args = cudaload.sft_config_arguments(p)
    assert "use_liger_kernel" not in args and "liger_kernel_config" not in args
    cfg = trl.SFTConfig(
        output_dir=str(tmp_path / "out"),
        **{**args, "bf16": False, "tf32": False, "use_cpu": True},
        max_steps=3,
        report_to=[],
        save_strategy="no",
        logging_steps=1,
    )
    assert cfg.packing and cfg.padding_free and cfg.max_length == p.training.step.tokens
    g = torch.Generator().manual_seed(0)
    vocab = model.config.vocab_size
    lengths = [int(x) for x in torch.randint(8, 64, (24,), generator=g)]
    rows = [{"input_ids": torch.randint(5, vocab, (n,), generator=g).tolist()} for n in lengths]
    before = {n: q.detach().clone() for n, q in model.named_parameters() if q.requires_grad}
    trainer = trl.SFTTrainer(model=model, args=cfg, train_dataset=Dataset.from_list(rows))
    out = trainer.train()
    assert out.global_step == 3
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert losses and all(torch.isfinite(torch.tensor(v)) for v in losses)
    assert any(not torch.equal(before[n], q) for n, q in model.named_parameters() if n in before)


def test_no_plan_hands_trl_ligers_fused_loss() -> None:
    from cudaload.profiles import hardware
    from cudaload.testing import full_config

    h200 = hardware("H200").with_packages(["flash-attn-4", "liger-kernel", "peft", "bitsandbytes"])
    seen_liger = False
    for intent in ("lora", "qlora", "training"):
        for seq_len in (512, 4096, 16384):
            p = cudaload.plan(
                full_config("Qwen3-8B"), hardware=h200, intent=intent, seq_len=seq_len, batch_size=8
            )
            seen_liger |= cudaload.training_arguments(p).get("use_liger_kernel", False)
            args = cudaload.sft_config_arguments(p)
            assert not args.get("use_liger_kernel") and "liger_kernel_config" not in args, (intent, seq_len)
            fields = {f.name for f in dataclasses.fields(trl.SFTConfig)}
            assert set(args) <= fields
    assert seen_liger, "no plan in the grid chose Liger's loss: the check above proves nothing"
