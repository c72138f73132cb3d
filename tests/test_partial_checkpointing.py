"""Partial activation checkpointing (issue 33): every n-th decoder layer checkpointed (transformers'
``every_n_layers``) as the training ladder's rung between the fused loss without checkpointing and every layer.
The memory model at its two ends, the planner over profiles (where partial is chosen, where every layer still is,
where it cannot run), the plan's JSON, what TrainingArguments and TRL get, and on the CPU a tiny model loaded
with a partial plan and one Trainer step that keeps exactly every n-th layer checkpointed."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

import cudaload
from cudaload.model_info import model_info
from cudaload.planner import plan
from cudaload.plans.plan import Plan
from cudaload.plans.training import StepShape
from cudaload.policies.memory import activations as acts
from cudaload.policies.memory import estimate
from cudaload.profiles import hardware
from cudaload.testing import full_config

GiB = 1 << 30
Q8 = full_config("Qwen3-8B")


def h200(**caps: Any) -> Any:
    return dataclasses.replace(hardware("H200").with_packages(["peft", "flash-attn-4"], []), **caps)


def lora_8b(budget_gib: float, **kw: Any) -> Plan:
    # transformers' loss: these cards are sized for the checkpointing rungs, which a fused loss would skip
    kw.setdefault("loss", "transformers")
    return plan(
        Q8,
        hardware=kw.pop("hardware", None) or h200(),
        intent="lora",
        seq_len=2048,
        batch_size=8,
        max_memory={"cuda:0": int(budget_gib * GiB)},
        **kw,
    )


def _phases(step: StepShape, gc: bool) -> acts.TrainingPhases:
    info = model_info(Q8)
    ph, _ = acts.training_activations(
        info,
        intent="lora",
        step=step,
        act_bytes=2,
        resid_bytes=2,
        attn="flash_attention_4",
        gradient_checkpointing=gc,
    )
    return ph


@pytest.mark.parametrize("packed", [True, False])
def test_partial_memory_is_full_checkpointing_at_n_1_and_tends_to_none_as_fewer_layers_are_checkpointed(
    packed: bool,
) -> None:
    step = StepShape(4096, 8, 2048, packed=packed) if packed else StepShape.padded(2, 2048)
    full, none = _phases(step, True), _phases(step, False)
    assert _phases(dataclasses.replace(step, checkpoint_every=1), True) == full
    L = model_info(Q8).summary.layers
    assert L == 36
    prev = full.kept
    for n in range(2, L + 3):
        ph = _phases(dataclasses.replace(step, checkpoint_every=n), True)
        c = -(-L // n)  # layers 0, n, 2n, ...: transformers' layer_index % every_n_layers == 0
        # the checkpointed layers keep their input, the others everything: the kept bytes are the two forms'
        # mix in proportion to the checkpointed layers, exactly
        assert ph.kept * L == c * full.kept + (L - c) * none.kept, n
        assert ph.layer == full.layer and ph.loss == none.loss  # one layer recomputed, whatever n
        assert full.kept <= prev <= ph.kept < none.kept
        prev = ph.kept
    # in the limit (one layer of 36 checkpointed) the kept bytes are none's less one layer's saving
    last = _phases(dataclasses.replace(step, checkpoint_every=L), True)
    assert none.kept - last.kept == (none.kept - full.kept) // L
    # the whole estimate: between every layer and none, equal to every layer's at n = 1
    kw: dict[str, Any] = dict(
        dtype="bfloat16",
        quantization=None,
        intent="lora",
        seq_len=2048,
        batch_size=8,
        attn="flash_attention_4",
    )
    t_full = estimate(model_info(Q8), gradient_checkpointing=True, step=step, **kw)["total"]
    t_none = estimate(model_info(Q8), gradient_checkpointing=False, step=step, **kw)["total"]
    t1 = estimate(
        model_info(Q8), gradient_checkpointing=True, step=dataclasses.replace(step, checkpoint_every=1), **kw
    )["total"]
    t2 = estimate(
        model_info(Q8), gradient_checkpointing=True, step=dataclasses.replace(step, checkpoint_every=2), **kw
    )["total"]
    assert t1 == t_full < t2 < t_none
    # without checkpointing checkpoint_every is not read
    assert (
        estimate(
            model_info(Q8),
            gradient_checkpointing=False,
            step=dataclasses.replace(step, checkpoint_every=3),
            **kw,
        )["total"]
        == t_none
    )


def test_checkpoint_every_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="checkpoint_every must be >= 1"):
        StepShape(4096, 8, 2048, checkpoint_every=0)


def test_where_every_layer_is_not_needed_partial_is_chosen_with_the_least_recompute_that_fits() -> None:
    p = lora_8b(44)
    t = p.training
    gc = p.gradient_checkpointing
    assert t is not None and gc is not None
    assert gc.choice == "partial" and p.checkpoint_every == t.step.checkpoint_every >= 2
    n = p.checkpoint_every
    assert p.memory.per_device["cuda:0"] <= p.memory.budget["cuda:0"]
    # the next n (fewer layers checkpointed) does not fit at the chosen bound, and without checkpointing nothing does
    info = model_info(Q8)
    kw: dict[str, Any] = dict(
        dtype="bfloat16",
        quantization=None,
        intent="lora",
        seq_len=2048,
        batch_size=8,
        attn="flash_attention_4",
    )
    more = -(-36 // (-(-36 // n) - 1))  # the smallest n checkpointing one layer fewer
    need = estimate(
        info, gradient_checkpointing=True, step=dataclasses.replace(t.step, checkpoint_every=more), **kw
    )["total"]
    assert need > p.memory.budget["cuda:0"]
    off = gc.candidate("off")
    assert off is not None and not off.ok and "does not fit" in " ".join(off.reasons)
    on = gc.candidate("on")
    assert on is not None and on.ok and "recomputes every layer" in " ".join(on.reasons)
    offload = gc.candidate("offload")
    assert offload is not None and not offload.ok and "not planned" in offload.reasons[0]
    why = " ".join(gc.reasons)
    assert f"every_n_layers={n}" in why and "1/(3n)" in why and "not measured" in why
    assert "no version recorded" in why  # a profile: transformers' floor assumed, said
    text = p.explain()
    assert f"gradient checkpointing: partial (every {n} layers)" in text
    assert any(f"every {n} layers" in note for note in p.memory.notes)


def test_full_checkpointing_where_partial_does_not_fit_and_none_where_nothing_is_needed() -> None:
    tight = lora_8b(38)
    assert tight.gradient_checkpointing is not None and tight.gradient_checkpointing.choice == "on"
    assert (
        tight.checkpoint_every == 1
        and tight.training is not None
        and tight.training.step.checkpoint_every == 1
    )
    part = tight.gradient_checkpointing.candidate("partial")
    assert part is not None and not part.ok and "every 2 layers" in part.reasons[0]
    roomy = lora_8b(56)
    assert roomy.gradient_checkpointing is not None and roomy.gradient_checkpointing.choice == "off"
    assert roomy.checkpoint_every == 0
    # an explicit request is every layer, never partial
    asked = lora_8b(44, gradient_checkpointing=True)
    assert asked.gradient_checkpointing is not None and asked.gradient_checkpointing.choice == "on"
    assert asked.checkpoint_every == 1


def test_partial_is_not_planned_on_a_transformers_without_every_n_layers() -> None:
    p = lora_8b(44, hardware=h200(transformers_version="5.16.0"))
    gc = p.gradient_checkpointing
    assert gc is not None and gc.choice == "on" and p.checkpoint_every == 1
    part = gc.candidate("partial")
    assert part is not None and not part.ok and "transformers 5.16.0 has no" in part.reasons[0]
    known = lora_8b(44, hardware=h200(transformers_version="5.17.0"))
    assert known.gradient_checkpointing is not None and known.gradient_checkpointing.choice == "partial"
    assert "no version recorded" not in " ".join(known.gradient_checkpointing.reasons)


def test_a_partial_plan_round_trips_and_a_plan_saved_before_it_reads_as_every_layer() -> None:
    p = lora_8b(44)
    back = Plan.from_json(p.to_json())
    assert (
        back.checkpoint_every == p.checkpoint_every >= 2
        and back.gradient_checkpointing == p.gradient_checkpointing
    )
    d = json.loads(lora_8b(38).to_json())
    del d["training"]["step"]["checkpoint_every"]  # as plans were saved before this field
    old = Plan.from_json(json.dumps(d))
    assert old.checkpoint_every == 1 and old.training is not None and old.training.step.checkpoint_every == 1


def test_trainer_and_trl_get_every_n_layers_so_their_own_enable_keeps_the_plan() -> None:
    p = lora_8b(44)
    n = p.checkpoint_every
    a = cudaload.training_arguments(p)
    assert a["gradient_checkpointing"] is True
    assert a["gradient_checkpointing_kwargs"] == {"use_reentrant": False, "every_n_layers": n}
    sft = cudaload.sft_config_arguments(p)
    assert sft["gradient_checkpointing_kwargs"]["every_n_layers"] == n
    full = cudaload.training_arguments(lora_8b(38))
    assert full["gradient_checkpointing_kwargs"] == {"use_reentrant": False}
    assert cudaload.training_arguments(lora_8b(56))["gradient_checkpointing"] is False


def _five_layers(tmp: Path) -> Path:
    import torch
    from transformers import AutoModelForCausalLM

    from cudaload.testing import make_tokenizer, tiny_config

    cfg = tiny_config("qwen3", num_hidden_layers=5)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(cfg).save_pretrained(tmp)
    make_tokenizer(cfg.vocab_size).save_pretrained(tmp)
    return tmp


def test_load_model_checkpoints_exactly_every_nth_layer_and_a_trainer_step_keeps_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch
    from transformers import Trainer, TrainingArguments

    from cudaload.train.arguments import ACTIVATION_CHECKPOINTING_SINCE

    monkeypatch.setenv("CUDALOAD_CACHE", str(tmp_path / "cache"))
    path = str(_five_layers(tmp_path / "m"))
    kw: dict[str, Any] = dict(intent="lora", seq_len=64, batch_size=4, batch_layout="padded", dtype="float32")
    whole = plan(path, **kw).memory.per_device["cpu"]
    # a CPU budget where checkpointing every 2nd layer (layers 0, 2, 4 of 5) is the cheapest that fits
    budget = next(
        b
        for b in (int(whole * (1 - k / 100)) for k in range(1, 80))
        if plan(path, max_memory={"cpu": b}, **kw).checkpoint_every == 2
    )
    model = cudaload.load_model(path, max_memory={"cpu": budget}, **kw)
    p = model.cudaload_plan
    assert p.gradient_checkpointing is not None and p.gradient_checkpointing.choice == "partial"
    layers = model.get_base_model().model.layers
    assert [bool(layer.gradient_checkpointing) for layer in layers] == [True, False, True, False, True]

    args = cudaload.training_arguments(p)
    new = (
        tuple(int(x) for x in __import__("transformers").__version__.split(".")[:2])
        >= ACTIVATION_CHECKPOINTING_SINCE
    )
    name = "activation_checkpointing" if new else "gradient_checkpointing"
    assert args.get(name) is True and args[f"{name}_kwargs"]["every_n_layers"] == 2
    rows = [{"input_ids": list(range(5, 5 + 16 + i)), "labels": list(range(5, 5 + 16 + i))} for i in range(8)]
    setup = cudaload.training_setup(model, rows)
    targs = TrainingArguments(
        output_dir=str(tmp_path / "out"),
        max_steps=1,
        report_to=[],
        use_cpu=True,
        save_strategy="no",
        **setup.arguments,
    )
    before = {n: q.detach().clone() for n, q in model.named_parameters() if q.requires_grad}
    Trainer(
        model=model, args=targs, train_dataset=setup.train_dataset, data_collator=setup.data_collator
    ).train()
    # Trainer enabled checkpointing again at train start (args say so), with the plan's every_n_layers
    assert [bool(layer.gradient_checkpointing) for layer in layers] == [True, False, True, False, True]
    assert any(not torch.equal(before[n], q) for n, q in model.named_parameters() if n in before)
