"""cudaload's chunked loss in the plan (issue 44 item 4): offered where Liger's fused loss cannot run, taken only
where memory is short, counted by the memory model, refused with a reason where the head's logits are
transformed, and put on the model by load_model() wherever the plan took it."""

from __future__ import annotations

import dataclasses
import tempfile
from pathlib import Path
from typing import Any

import pytest
import torch

import cudaload
from cudaload.errors import InvalidChoiceError
from cudaload.execute.chunked_loss import has_chunked_loss
from cudaload.model_info import model_info
from cudaload.planner import plan
from cudaload.policies.memory.constants import CHUNK_MIN_ROWS, chunk_rows
from cudaload.profiles import hardware
from cudaload.testing import full_config

GiB = 1 << 30
CONTEXT = 700 << 20  # bench_fit_boundary.py's CUDA context outside the emulated card


def _qlora(card_gib: float, seq_len: int, packages: tuple[str, ...] = (), **kw: Any) -> Any:
    caps = hardware("H100").with_packages(["bitsandbytes", "peft", *packages], [])
    return plan(
        full_config("Llama-3.1-8B"),
        hardware=caps,
        intent="qlora",
        seq_len=seq_len,
        batch_size=1,
        max_memory={"cuda:0": int(card_gib * GiB) + CONTEXT},
        **kw,
    )


def _longest(card_gib: float, **kw: Any) -> int:
    """The longest seq_len (a multiple of 256) the plan accepts on the card."""
    lo, hi = 0, 1 << 17
    while hi - lo > 256:
        mid = (lo + hi) // 2 // 256 * 256
        try:
            _qlora(card_gib, mid, **kw)
            lo = mid
        except cudaload.DoesNotFitError:
            hi = mid
    return lo


def test_chunk_rows_follow_liger_with_a_floor() -> None:
    assert chunk_rows(9216, 4096, 128256) == 512  # liger: next_power_of_2(cdiv(9216, cdiv(128256, 4096)))
    assert chunk_rows(2400, 4096, 151936) == CHUNK_MIN_ROWS  # a short step: the floor, not 65 rows
    assert chunk_rows(100, 4096, 151936) == 100  # never more rows than the step has
    with pytest.raises(ValueError):
        chunk_rows(0, 4096, 151936)


def test_on_a_24_gib_card_the_chunked_loss_fits_a_longer_sequence_than_transformers_loss() -> None:
    """No Liger installed: the plan's boundary with the chunked loss against transformers' loss, and the plan at
    that boundary takes it (the fp32 logits over the step were most of the step's memory)."""
    std = _longest(24, loss="transformers")
    auto = _longest(24)
    assert auto >= 2 * std
    p = _qlora(24, auto)
    assert p.training is not None and p.training.loss.choice == "cudaload_chunked"
    assert p.training.step.fused_loss
    assert "only a fused loss lets the step fit" in p.training.loss.reasons[0]
    assert {c.name for c in p.training.loss.candidates} == {"transformers", "liger", "cudaload_chunked"}
    liger = p.training.loss.candidate("liger")
    assert liger is not None and not liger.ok and "liger-kernel is not installed" in " ".join(liger.reasons)
    assert "cudaload_chunked" in p.explain()
    # transformers' loss at that length does not fit, and says so
    with pytest.raises(cudaload.DoesNotFitError):
        _qlora(24, auto, loss="transformers")


def test_with_room_transformers_loss_stays_and_liger_is_taken_first_where_installed() -> None:
    short = _qlora(24, 1024)
    assert short.training is not None and short.training.loss.choice == "transformers"
    assert "cudaload's chunked loss" in " ".join(short.training.loss.reasons)
    liger = ("liger-kernel",)
    # Liger's boundary (its slack is larger than the chunked loss's: the chunked boundary is further out)
    p = _qlora(24, _longest(24, packages=liger), packages=liger)
    assert p.training is not None and p.training.loss.choice == "liger"
    chunked = p.training.loss.candidate("cudaload_chunked")
    assert chunked is not None and chunked.ok and "taken first" in " ".join(chunked.reasons)


def test_a_head_whose_logits_are_transformed_is_refused_with_its_reason() -> None:
    from cudaload.testing import tiny_config

    cfg = tiny_config("gemma2", final_logit_softcapping=30.0)
    assert model_info(cfg).head_transform == "final_logit_softcapping=30.0"
    assert model_info(full_config("Qwen3-8B")).head_transform is None
    caps = hardware("H100").with_packages(["peft"], [])
    with pytest.raises(InvalidChoiceError, match="cudaload_chunked") as e:
        plan(cfg, hardware=caps, intent="lora", seq_len=256, batch_size=1, loss="cudaload_chunked")
    assert "final_logit_softcapping" in " ".join(e.value.reasons)
    p = plan(cfg, hardware=caps, intent="lora", seq_len=256, batch_size=1)
    assert p.training is not None
    c = p.training.loss.candidate("cudaload_chunked")
    assert c is not None and not c.ok


def test_the_plan_round_trips_with_the_chunked_loss() -> None:
    p = _qlora(24, _longest(24))
    back = type(p).from_json(p.to_json())
    assert back == p and back.training is not None and back.training.loss.choice == "cudaload_chunked"


def test_load_model_puts_the_chunked_loss_on_the_model_the_plan_took_it_for() -> None:
    """CPU, fp32, a tiny Qwen3 with LoRA: loss='cudaload_chunked' asked for, the model comes back with it on,
    ``verified`` says so, and a training step's loss and LoRA gradients are transformers' own."""
    from cudaload.testing import make_tiny

    path = str(make_tiny("qwen3", Path(tempfile.mkdtemp()) / "tiny"))
    kw: dict[str, Any] = dict(intent="lora", seq_len=64, batch_size=2, dtype="float32")
    chunked = cudaload.load_model(path, loss="cudaload_chunked", **kw)
    plain = cudaload.load_model(path, **kw)
    plain.load_state_dict(chunked.state_dict())
    assert has_chunked_loss(chunked) and not has_chunked_loss(plain)
    assert chunked.cudaload_plan.training.loss.choice == "cudaload_chunked"
    assert "installed" in chunked.cudaload_plan.verified["chunked_loss"]
    described = cudaload.training_setup(chunked, [{"input_ids": list(range(3, 40))}] * 4).describe()
    assert "the cudaload_chunked loss" in described
    torch.manual_seed(0)
    ids = torch.randint(3, 90, (2, 24))
    labels = ids.clone()
    labels[1, 18:] = -100
    losses, grads = [], []
    for m in (chunked, plain):
        m.train()
        out = m(input_ids=ids, labels=labels)
        out.loss.backward()
        losses.append(float(out.loss.detach()))
        grads.append({n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None})
    assert losses[0] == pytest.approx(losses[1], rel=1e-5)
    assert grads[0].keys() == grads[1].keys() and grads[0]
    for name, g in grads[0].items():
        torch.testing.assert_close(g, grads[1][name], rtol=1e-4, atol=1e-6)


def test_moe_and_sharded_parallelism_never_get_the_chunked_loss() -> None:
    """A mixture-of-experts model's loss adds its router's (refused at plan time, not after the load), and FSDP2
    shards the head the chunked path reads: the plan is sized again with transformers' loss and says why."""
    moe = model_info(full_config("Qwen3-30B-A3B"))
    from cudaload.policies.training.loss import chunked_problems

    assert any("router" in r for r in chunked_problems(moe))
    caps = hardware("2xA100-80GB").with_packages(["peft"], [])
    kw: dict[str, Any] = dict(intent="lora", seq_len=16384, batch_size=4)
    ddp = plan(full_config("Qwen3-8B"), hardware=caps, **kw)
    assert ddp.parallelism is not None and ddp.parallelism.choice == "ddp"
    assert ddp.training is not None and ddp.training.loss.choice == "cudaload_chunked"
    sharded = plan(full_config("Qwen3-8B"), hardware=caps, parallelism="fsdp2", **kw)
    assert sharded.parallelism is not None and sharded.parallelism.choice == "fsdp2"
    assert sharded.training is not None and sharded.training.loss.choice == "transformers"
    c = sharded.training.loss.candidate("cudaload_chunked")
    assert c is not None and not c.ok and "fsdp2 shards" in " ".join(c.reasons)
    with pytest.raises(InvalidChoiceError, match="cudaload_chunked"):
        plan(full_config("Qwen3-8B"), hardware=caps, parallelism="fsdp2", loss="cudaload_chunked", **kw)


def test_a_full_fine_tune_counts_the_heads_gradient_the_fused_loss_makes_in_its_forward() -> None:
    from cudaload.plans.training import StepShape
    from cudaload.policies.memory import activations as acts

    info = model_info(full_config("Qwen3-0.6B"))
    step = StepShape(8192, 1, 8192, packed=True, fused_loss=True)
    frozen, _ = acts._loss_bytes(info, step, 2)
    trained, _ = acts._loss_bytes(info, step, 2, head_trains=True)
    s = info.summary
    assert trained - frozen == s.vocab_size * s.hidden_size * 2
    rows = chunk_rows(8192, s.hidden_size, s.vocab_size)
    assert frozen >= 8192 * s.hidden_size * 2 + rows * s.vocab_size * 12
    std, _ = acts._loss_bytes(info, dataclasses.replace(step, fused_loss=False), 2)
    assert std > trained  # the fp32 logits of 8,192 tokens are still far more


def test_adapters_put_on_the_head_after_the_install_set_the_chunked_loss_aside(recwarn: Any) -> None:
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from cudaload.execute.chunked_loss import install_chunked_loss, remove_chunked_loss
    from cudaload.testing import make_tiny

    path = make_tiny("qwen3", Path(tempfile.mkdtemp()) / "tiny")
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    install_chunked_loss(model)
    peft = get_peft_model(model, LoraConfig(r=4, target_modules=["q_proj", "lm_head"]))
    peft.train()
    ids = torch.randint(3, 90, (1, 16))
    out = peft(input_ids=ids, labels=ids)
    assert out.logits is not None  # the model's own forward ran: the head's adapters are in the loss
    out.loss.backward()
    head = peft.get_base_model().lm_head
    assert head.lora_B["default"].weight.grad is not None
    assert any("set aside" in str(w.message) for w in recwarn.list)
    # a forward replaced after the install (as TRL's fused head does) stays; the chunked loss says it was not removed
    base = peft.get_base_model()
    ours = base.forward
    base.forward = lambda *a, **k: ours(*a, **k)
    with pytest.warns(RuntimeWarning, match="not removed"):
        assert remove_chunked_loss(peft) is False
    assert has_chunked_loss(peft)


def test_the_chunked_loss_under_full_checkpointing_plans_its_measured_allocator_slack() -> None:
    """Capped-card boundaries with the chunked loss reserved 0.37-0.94 bytes per logit above their allocated peak
    (CHUNKED_SLACK_PER_LOGIT); Liger's fused loss, transformers' loss and a chunked step without checkpointing
    keep the slack fitted where none was measured lower (ALLOCATOR_SLACK_PER_LOGIT)."""
    from cudaload.plans.training import StepShape
    from cudaload.policies.memory import (
        ALLOCATOR_SLACK_PER_LOGIT,
        CHUNKED_SLACK_PER_LOGIT,
        breakdown,
    )

    info = model_info(full_config("Llama-3.1-8B"))
    logits = 8192 * info.summary.vocab_size

    def slack(gc: bool, every: int = 1, **kw: Any) -> float:
        step = StepShape(8192, 1, 8192, packed=True, checkpoint_every=every, **kw)
        b = breakdown(
            info,
            dtype="bfloat16",
            quantization="nf4",
            intent="qlora",
            seq_len=8192,
            batch_size=1,
            attn="flash_attention_2",
            optimizer="paged_adamw_8bit",
            gradient_checkpointing=gc,
            step=step,
        )
        return b.terms["allocator_slack"] / logits

    assert CHUNKED_SLACK_PER_LOGIT < ALLOCATOR_SLACK_PER_LOGIT
    assert slack(True, fused_loss=True, chunked_loss=True) == pytest.approx(CHUNKED_SLACK_PER_LOGIT, rel=1e-6)
    assert slack(True, fused_loss=True) == pytest.approx(ALLOCATOR_SLACK_PER_LOGIT, rel=1e-6)  # Liger
    assert slack(True, chunked_loss=True) == pytest.approx(ALLOCATOR_SLACK_PER_LOGIT, rel=1e-6)  # not taken
    assert slack(False, fused_loss=True, chunked_loss=True) == pytest.approx(
        ALLOCATOR_SLACK_PER_LOGIT, rel=1e-6
    )
    assert slack(True, 2, fused_loss=True, chunked_loss=True) == pytest.approx(
        ALLOCATOR_SLACK_PER_LOGIT, rel=1e-6
    )
    # the plan marks which fused loss its ladder would take, and round-trips it; a plan saved before reads False
    p = _qlora(24, _longest(24))
    assert p.training is not None and p.training.step.chunked_loss and p.training.step.fused_loss
    d = p.training.step.to_dict()
    del d["chunked_loss"]
    assert not StepShape.from_dict(d).chunked_loss
    caps = hardware("H100").with_packages(["bitsandbytes", "peft", "liger-kernel"], [])
    lp = plan(full_config("Llama-3.1-8B"), hardware=caps, intent="qlora", seq_len=1024, batch_size=1)
    assert lp.training is not None and not lp.training.step.chunked_loss
