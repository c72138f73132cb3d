"""PEFT's fp32 copy of each adapted input, skipped under autocast (issue 33): the plan's decision, the memory it
saves, and the same loss and gradients to the bit with and without it (CPU, bf16 autocast)."""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path
from typing import Any

import pytest
import torch

import cudaload
from cudaload.execute.adapters import apply_adapter_cast
from cudaload.model_info import model_info
from cudaload.planner import plan
from cudaload.policies.memory import estimate
from cudaload.profiles import hardware
from cudaload.testing import full_config

peft = pytest.importorskip("peft")

Q8 = full_config("Qwen3-8B")


def _h200(*pkgs: str) -> Any:
    return hardware("H200").with_packages(["peft", *pkgs], [])


def test_bf16_lora_skips_the_copy_under_autocast_and_says_why() -> None:
    p = plan(Q8, hardware=_h200(), intent="lora", seq_len=2048, batch_size=8)
    t = p.training
    assert t is not None and t.adapter_cast is not None
    assert t.adapter_cast.choice == "outside-autocast" and t.step.cast_outside_autocast
    assert "bnb.py:543-546" in t.adapter_cast.reasons[0]
    assert "adapter input cast: outside-autocast" in p.explain()
    assert {c.name for c in t.adapter_cast.candidates} == {"outside-autocast", "peft"}
    # round trip
    from cudaload.plans.plan import Plan

    back = Plan.from_json(p.to_json())
    assert back.training is not None and back.training.adapter_cast == t.adapter_cast
    assert back.training.step.cast_outside_autocast


def test_fp16_qlora_keeps_peft_and_fp32_has_no_decision() -> None:
    q = plan(Q8, hardware=_h200("bitsandbytes"), intent="qlora", seq_len=512, batch_size=4, dtype="float16")
    assert q.training is not None and q.training.adapter_cast is not None
    assert q.training.adapter_cast.choice == "peft" and "no-op" in q.training.adapter_cast.reasons[0]
    f = plan(Q8, hardware=_h200(), intent="lora", seq_len=512, batch_size=4, dtype="float32")
    assert f.training is not None and f.training.adapter_cast is None


def test_the_memory_model_charges_no_copy_when_the_cast_is_skipped() -> None:
    p = plan(Q8, hardware=_h200(), intent="lora", seq_len=2048, batch_size=8, gradient_checkpointing=False)
    assert p.training is not None
    step = p.training.step
    info = model_info(Q8)
    kw: dict[str, Any] = dict(dtype="bfloat16", quantization=None, intent="lora", seq_len=2048, batch_size=8)
    skipped = estimate(info, **kw, step=step, gradient_checkpointing=False)
    copied = estimate(
        info, **kw, step=dataclasses.replace(step, cast_outside_autocast=False), gradient_checkpointing=False
    )
    # per token and layer the copies are 2 bytes x (5h + q + inter) less the shared inputs 2 x (2h + inter)
    s = info.summary
    per_token = 2 * (5 * s.hidden_size + s.num_heads * s.head_dim + info.intermediate_size) - 2 * (
        2 * s.hidden_size + info.intermediate_size
    )
    saved = copied["activations"] - skipped["activations"]
    assert saved == pytest.approx(step.tokens * s.layers * per_token, rel=0.01)


def _peft_model(path: Path) -> Any:
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).train()
    cfg = peft.LoraConfig(r=8, lora_alpha=16, target_modules="all-linear", init_lora_weights=False)
    return peft.get_peft_model(base, cfg)


def _step(model: Any, ids: torch.Tensor, autocast: bool) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    return loss.detach(), grads


def test_skipping_the_copy_gives_the_same_loss_and_gradients_to_the_bit(tiny_model: Any) -> None:
    path = Path(tiny_model("qwen3"))
    ref = _peft_model(path)
    fast = copy.deepcopy(ref)
    p = plan(str(path), hardware=_h200(), intent="lora", seq_len=64, batch_size=2)
    assert apply_adapter_cast(fast, p) > 0
    ids = torch.randint(5, 100, (2, 16), generator=torch.Generator().manual_seed(1))
    for autocast in (True, False):  # outside autocast PEFT's cast stays: bf16 input, fp32 adapters
        l_ref, g_ref = _step(ref, ids, autocast)
        l_fast, g_fast = _step(fast, ids, autocast)
        assert torch.equal(l_ref, l_fast), autocast
        assert g_ref.keys() == g_fast.keys() and g_ref
        for n in g_ref:
            assert torch.equal(g_ref[n], g_fast[n]), (autocast, n)
    # the switch follows autocast each call
    layer = next(m for m in fast.modules() if isinstance(m, peft.tuners.lora.LoraLayer))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        fast(input_ids=ids)
    assert layer.cast_input_dtype_enabled is False
    fast(input_ids=ids)
    assert layer.cast_input_dtype_enabled is True


def test_a_plan_without_the_decision_leaves_peft_as_it_is(tiny_model: Any) -> None:
    path = Path(tiny_model("qwen3"))
    model = _peft_model(path)
    p = plan(str(path), hardware=_h200(), intent="lora", seq_len=64, batch_size=2, dtype="float32")
    assert apply_adapter_cast(model, p) == 0
    assert all(not m._forward_pre_hooks for m in model.modules() if isinstance(m, peft.tuners.lora.LoraLayer))


def test_load_model_applies_the_planned_cast(
    tiny_model: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CUDALOAD_CACHE", str(tmp_path / "cache"))
    model = cudaload.load_model(str(tiny_model("qwen3")), intent="lora", dtype="bfloat16")
    t = model.cudaload_plan.training
    assert t is not None and t.adapter_cast is not None and t.adapter_cast.choice == "outside-autocast"
    assert model.cudaload_plan.verified["adapter_cast_layers"] == sum(
        1 for m in model.modules() if isinstance(m, peft.tuners.lora.LoraLayer)
    )
