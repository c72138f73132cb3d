"""The training plan over profiles (pure): layout, attention for training, the step bound and the loss through
the fit ladder, LoRA dropout, QLoRA's preparation, what training_arguments / training_setup / TRL get."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

import cudaload
from cudaload.errors import ConfigurationError, DoesNotFitError, InvalidChoiceError
from cudaload.model_info import model_info
from cudaload.planner import plan
from cudaload.plans.plan import Plan
from cudaload.plans.training import StepShape
from cudaload.policies.memory import allocated_bytes, estimate
from cudaload.policies.training import TYPICAL_FILL, step_bounds
from cudaload.profiles import hardware
from cudaload.testing import full_config, tiny_config

Q8 = full_config("Qwen3-8B")


def h200(*pkgs: str) -> Any:
    return hardware("H200").with_packages(["peft", *pkgs], [])


def test_8b_lora_on_an_h200_with_fa4_packs_with_varlen_boundaries_and_no_checkpointing() -> None:
    p = plan(Q8, hardware=h200("flash-attn-4"), intent="lora", seq_len=2048, batch_size=8)
    t = p.training
    assert t is not None and p.attention.choice == "flash_attention_4"
    assert p.attention.reasons[0].startswith("training: measured on NVIDIA H200")
    assert t.layout.choice == "packed" and t.boundaries == "cu_seq_lens"
    assert p.gradient_checkpointing is not None and p.gradient_checkpointing.choice == "off"
    # the largest bound that fits without checkpointing, between batch x seq_len and a quarter of it
    assert 8 * 2048 * TYPICAL_FILL <= t.step.tokens < 8 * 2048
    assert t.step == dataclasses.replace(t.step, sequences=8, longest=2048, packed=True, fused_loss=False)
    assert p.memory.per_device["cuda:0"] <= p.memory.budget["cuda:0"]
    # the larger bound is refused with the reason (its need against the budget)
    bigger = t.tokens_per_step.candidate(f"{8 * 2048:,}")
    assert bigger is not None and not bigger.ok and "does not fit" in " ".join(bigger.reasons)
    assert p.peft is not None and p.peft["lora_dropout"] == 0.0
    assert t.lora_dropout is not None and "PEFT's own default" in t.lora_dropout.reasons[0]
    text = p.explain()
    assert "batch layout: packed" in text and "tokens per step:" in text and "LoRA dropout: 0" in text


def test_sdpa_packs_by_position_ids_with_its_bias_in_memory_and_the_default_install_runs_varlen() -> None:
    fa4 = plan(Q8, hardware=h200("flash-attn-4"), intent="lora", seq_len=2048, batch_size=8)
    p = plan(Q8, hardware=h200(), intent="lora", seq_len=2048, batch_size=8, attn="sdpa")
    t = p.training
    assert t is not None and p.attention.choice == "sdpa" and t.boundaries == "position_ids"
    assert any("attention bias per layer" in n for n in p.memory.notes)
    assert fa4.training is not None and t.step.tokens <= fa4.training.step.tokens
    # without a flash package the plan's own choice is torch's varlen kernels (issue 44): boundaries, no bias
    auto = plan(Q8, hardware=h200(), intent="lora", seq_len=2048, batch_size=8)
    assert auto.attention.choice == "cudaload_varlen" and auto.training is not None
    assert auto.training.boundaries == "cu_seq_lens"
    assert not any("attention bias per layer" in n for n in auto.memory.notes)
    assert auto.memory.terms["activations"] < p.memory.terms["activations"] or (
        auto.training.step.tokens > t.step.tokens
    )


def test_training_attention_follows_the_architecture_where_nothing_was_measured() -> None:
    a100 = hardware("A100-80GB").with_packages(["peft", "flash-attn", "flash-attn-4"], [])
    p = plan(Q8, hardware=a100, intent="lora", seq_len=2048, batch_size=8)
    # FA4's backward needs sm90+: on sm80 FA2 (varlen forward and backward) is the kernel
    assert p.attention.choice == "flash_attention_2"
    assert p.attention.reasons[0].startswith("training: a flash kernel with varlen forward and backward")
    fa4 = p.attention.candidate("flash_attention_4")
    assert fa4 is not None and not fa4.ok
    # inference is unchanged: sdpa without timings
    assert plan(Q8, hardware=a100, seq_len=2048, batch_size=8).attention.choice == "sdpa"


def test_eager_or_a_non_causal_model_is_padded_and_explicit_packing_is_honoured_or_refused() -> None:
    p = plan(Q8, hardware=h200(), intent="lora", seq_len=2048, batch_size=8, attn="eager")
    assert p.training is not None and p.training.layout.choice == "padded"
    assert p.training.group_by_length and "tokens^2" in p.training.layout.reasons[0]
    forced = plan(
        Q8, hardware=h200(), intent="lora", seq_len=512, batch_size=4, attn="eager", batch_layout="packed"
    )
    assert forced.training is not None and forced.training.layout.choice == "packed"
    assert forced.training.layout.explicit and any("tokens^2" in r for r in forced.training.layout.reasons)
    cls = {"model_class": "AutoModelForSequenceClassification"}
    with pytest.raises(InvalidChoiceError, match="packed"):
        plan(
            tiny_config("qwen3"),
            hardware=h200(),
            intent="training",
            seq_len=128,
            batch_layout="packed",
            **cls,
        )
    seq_cls = plan(tiny_config("qwen3"), hardware=h200(), intent="training", seq_len=128, **cls)
    assert seq_cls.training is not None and seq_cls.training.layout.choice == "padded"
    with pytest.raises(ConfigurationError, match="batch_layout"):
        plan(Q8, hardware=h200(), intent="lora", batch_layout="flat")


def test_declared_nothing_assumes_trainers_batch_and_says_so() -> None:
    p = plan(Q8, hardware=h200("flash-attn-4"), intent="lora")
    t = p.training
    assert t is not None and p.batch_size == 8 and t.step.sequences == 8 and t.step.longest == 4096
    assert any("Trainer's default per_device_train_batch_size" in a for a in t.assumed)
    assert any("declare seq_len=" in a for a in t.assumed)
    # a declared batch is taken as given
    declared = plan(Q8, hardware=h200("flash-attn-4"), intent="lora", seq_len=1024, batch_size=2)
    assert declared.training is not None and declared.training.assumed == ()
    assert declared.batch_size == 2


def test_an_assumed_batch_may_shrink_to_one_sequence_a_declared_one_raises_with_fixes_that_fit() -> None:
    a100 = hardware("A100-40GB").with_packages(["peft"], [])
    p = plan(Q8, hardware=a100, intent="lora", seq_len=8192)
    # 8 assumed sequences of 8,192 tokens down to a quarter of them do not fit a 40 GB card; one sequence does
    assert p.training is not None and p.training.step.tokens == 8192 and p.training.step.sequences == 8
    # a declared batch of 4 x 4,096 for LoRA on 18 GiB of the card: the 8B weights leave room for far less
    # (a full fine-tune of the 8B shape now fits the whole 40 GB card with the chunked loss and Adafactor)
    small = {"cuda:0": 18 << 30}
    with pytest.raises(DoesNotFitError) as e:
        plan(
            full_config("Llama-3.1-8B"),
            hardware=a100,
            intent="lora",
            seq_len=4096,
            batch_size=4,
            max_memory=small,
        )
    assert any(s.kind in ("seq_len", "tokens_per_step") for s in e.value.suggestions)
    for s in e.value.suggestions:
        if s.kind in ("seq_len", "tokens_per_step"):
            kw = (
                {"seq_len": s.value} if s.kind == "seq_len" else {"seq_len": 4096, "tokens_per_step": s.value}
            )
            plan(
                full_config("Llama-3.1-8B"),
                hardware=a100,
                intent="lora",
                batch_size=4,
                max_memory=small,
                **kw,
            )


def test_liger_is_chosen_only_where_it_alone_avoids_checkpointing() -> None:
    """A card whose budget lies between what the smallest bound needs with the fused loss and with transformers'
    loss (no checkpointing): only the fused loss avoids checkpointing there, so it is chosen; with room, never."""
    info = model_info(Q8)
    kw: dict[str, Any] = dict(dtype="bfloat16", quantization=None, intent="lora", seq_len=2048, batch_size=2)
    smallest = StepShape(2048, 2, 2048, packed=True, cast_outside_autocast=True)  # as the plan has it

    def need(fused: bool) -> int:
        t = estimate(
            info, gradient_checkpointing=False, step=dataclasses.replace(smallest, fused_loss=fused), **kw
        )
        return t["total"]

    budget = (need(False) + need(True)) // 2
    card = dataclasses.replace(
        h200("liger-kernel"),
        gpus=tuple(dataclasses.replace(g, free_memory=budget) for g in hardware("H200").gpus),
    )
    tight = plan(Q8, hardware=card, intent="lora", seq_len=2048, batch_size=2)
    assert tight.training is not None and tight.training.loss.choice == "liger"
    assert tight.gradient_checkpointing is not None and tight.gradient_checkpointing.choice == "off"
    assert tight.training.step.fused_loss and tight.training.loss.reasons[0].startswith("only a fused loss")
    args = cudaload.training_arguments(tight)
    assert args["use_liger_kernel"] is True and args["liger_kernel_config"]["fused_linear_cross_entropy"]
    assert not args["liger_kernel_config"]["rms_norm"]
    roomy = plan(Q8, hardware=h200("liger-kernel"), intent="lora", seq_len=2048, batch_size=8)
    assert roomy.training is not None and roomy.training.loss.choice == "transformers"
    assert "slower" in " ".join(roomy.training.loss.reasons)
    with pytest.raises(InvalidChoiceError, match="liger"):
        plan(Q8, hardware=h200(), intent="lora", seq_len=2048, batch_size=8, loss="liger")
    with pytest.raises(ConfigurationError, match="loss"):
        plan(Q8, hardware=h200(), intent="lora", loss="fast")


def test_fused_loss_and_packing_shrink_the_estimate_as_the_model_says() -> None:
    info = model_info(Q8)
    kw: dict[str, Any] = dict(dtype="bfloat16", quantization=None, intent="lora", seq_len=2048, batch_size=8)
    padded = estimate(info, gradient_checkpointing=False, step=StepShape.padded(8, 2048), **kw)
    half = estimate(info, gradient_checkpointing=False, step=StepShape(8192, 8, 2048, packed=True), **kw)
    fused = estimate(
        info, gradient_checkpointing=False, step=StepShape(8192, 8, 2048, packed=True, fused_loss=True), **kw
    )
    assert allocated_bytes(half) < allocated_bytes(padded)
    # the fp32 logits of 8192 tokens over the vocabulary (12 bytes each) are the difference, nearly
    assert allocated_bytes(half) - allocated_bytes(fused) > 0.9 * 8192 * 151936 * 12
    dropout = estimate(
        info,
        gradient_checkpointing=False,
        step=StepShape(8192, 8, 2048, packed=True, lora_dropout=0.05),
        **kw,
    )
    assert allocated_bytes(dropout) > allocated_bytes(half)


def test_explicit_tokens_per_step_and_checkpointing_are_honoured() -> None:
    p = plan(
        Q8, hardware=h200("flash-attn-4"), intent="lora", seq_len=2048, batch_size=8, tokens_per_step=4096
    )
    assert p.training is not None and p.training.step.tokens == 4096 and p.training.tokens_per_step.explicit
    on = plan(
        Q8,
        hardware=h200("flash-attn-4"),
        intent="lora",
        seq_len=2048,
        batch_size=8,
        gradient_checkpointing=True,
    )
    assert on.gradient_checkpointing is not None and on.gradient_checkpointing.choice == "on"
    assert on.training is not None and on.training.step.tokens == 8 * 2048  # no reason to shrink the step
    with pytest.raises(ConfigurationError, match="longest sequence must fit"):
        plan(Q8, hardware=h200(), intent="lora", seq_len=2048, batch_size=8, tokens_per_step=1024)
    assert step_bounds(8, 2048, None)[0] == 16384 and step_bounds(8, 2048, 5000) == [5000]
    # the full step is tried as it is (not rounded to tiles), the smaller ones never below one sequence
    assert step_bounds(3, 1000, None)[0] == 3000 and min(step_bounds(3, 1000, None)) >= 1000
    with pytest.raises(ConfigurationError, match="cannot be reached"):
        plan(Q8, hardware=h200(), intent="lora", seq_len=2048, batch_size=2, tokens_per_step=8192)


def test_lora_overrides_and_qlora_preparation() -> None:
    p = plan(
        Q8, hardware=h200(), intent="lora", seq_len=512, batch_size=4, lora={"r": 64, "lora_dropout": 0.1}
    )
    assert p.peft is not None and p.peft["r"] == 64 and p.peft["lora_dropout"] == 0.1
    assert p.training is not None and p.training.lora_dropout is not None and p.training.lora_dropout.explicit
    assert p.training.step.lora_dropout == 0.1
    q = plan(Q8, hardware=h200("bitsandbytes"), intent="qlora", seq_len=512, batch_size=4)
    assert (
        q.training is not None
        and q.training.kbit_upcast is not None
        and q.training.kbit_upcast.choice == "bf16"
    )
    assert not q.training.step.kbit_upcast
    assert q.optimizer is not None and q.optimizer.choice == "adamw_torch_fused"


def test_training_arguments_and_trl_follow_the_layout() -> None:
    packed = plan(Q8, hardware=h200("flash-attn-4"), intent="lora", seq_len=2048, batch_size=8)
    a = cudaload.training_arguments(packed)
    # the declared sequences a step; training_setup, whose data set holds whole steps, gives 1
    assert a["per_device_train_batch_size"] == 8 and "train_sampling_strategy" not in a
    assert cudaload.training_setup(packed).arguments["per_device_train_batch_size"] == 1
    padded = plan(Q8, hardware=h200(), intent="lora", seq_len=2048, batch_size=8, batch_layout="padded")
    b = cudaload.training_arguments(padded)
    assert b["per_device_train_batch_size"] == 8 and b["train_sampling_strategy"] == "group_by_length"
    assert packed.training is not None
    trl = cudaload.sft_config_arguments(packed)
    assert (
        trl["packing"]
        and trl["packing_strategy"] == "bfd"
        and trl["max_length"] == packed.training.step.tokens
        and trl["per_device_train_batch_size"] == 1
    )
    assert cudaload.sft_config_arguments(padded)["max_length"] == 2048
    with pytest.raises(ConfigurationError, match="takes a Plan"):
        cudaload.training_arguments("x")  # type: ignore[arg-type]


def test_training_arguments_are_fields_of_the_installed_trainingarguments() -> None:
    import transformers
    from transformers import TrainingArguments

    p = plan(Q8, hardware=h200("flash-attn-4", "liger-kernel"), intent="lora", seq_len=2048, batch_size=8)
    here = dataclasses.replace(p, hardware={**p.hardware, "transformers": transformers.__version__})
    known = {f.name for f in dataclasses.fields(TrainingArguments)}
    for pl in (
        here,
        dataclasses.replace(here, training=dataclasses.replace(here.training, group_by_length=True)),
    ):  # type: ignore[arg-type]
        assert set(cudaload.training_arguments(pl)) <= known


def test_trl_sftconfig_takes_the_arguments() -> None:
    """Real TRL (the dev set installs it): every keyword is an SFTConfig field and TRL takes the values (the
    GPU precision flags are switched off: this machine has none)."""
    trl = pytest.importorskip("trl")
    p = plan(Q8, hardware=h200("flash-attn-4"), intent="lora", seq_len=2048, batch_size=8)
    args = cudaload.sft_config_arguments(p)
    assert set(args) <= {f.name for f in dataclasses.fields(trl.SFTConfig)}
    cpu = {**args, "bf16": False, "tf32": False, "use_cpu": True}
    cfg = trl.SFTConfig(output_dir="/tmp/cudaload-trl", **cpu)
    assert cfg.packing and cfg.packing_strategy == "bfd" and cfg.padding_free
    assert (
        p.training is not None
        and cfg.max_length == p.training.step.tokens
        and cfg.per_device_train_batch_size == 1
    )


def test_the_training_section_round_trips_through_json() -> None:
    p = plan(Q8, hardware=h200("flash-attn-4", "bitsandbytes"), intent="qlora", seq_len=2048, batch_size=8)
    back = Plan.from_json(p.to_json())
    assert back == p
    d = json.loads(p.to_json())["training"]
    assert d["expects"] == {
        "longest_sequence": 2048,
        "sequences_per_step": 8,
        "tokens_per_step": d["step"]["tokens"],
    }


def test_training_setup_packs_to_the_plan_and_refuses_what_is_not_a_plan() -> None:
    p = plan(Q8, hardware=h200("flash-attn-4"), intent="lora", seq_len=64, batch_size=4)
    assert p.training is not None
    data = [{"input_ids": list(range(5, 5 + n))} for n in (10, 60, 33, 7, 64, 50, 12, 40)]
    s = cudaload.training_setup(p, data)
    assert len(s.train_dataset) >= 2
    for item in s.train_dataset:
        assert len(item["input_ids"]) <= 4 and sum(map(len, item["input_ids"])) <= p.training.step.tokens
    assert s.data_collator.boundaries == "cu_seq_lens"  # type: ignore[union-attr]
    assert "packed steps of at most 4 sequences" in s.describe()
    with pytest.raises(ConfigurationError, match="seq_len=70"):
        cudaload.training_setup(p, [*data, {"input_ids": list(range(70))}])
    with pytest.raises(ConfigurationError, match="not str"):
        cudaload.training_setup("model")
    inference = plan(Q8, hardware=h200(), seq_len=64)
    with pytest.raises(ConfigurationError, match="inference"):
        cudaload.training_setup(inference)


def test_a_runtime_fallback_plans_the_training_section_again(tiny_model: Any) -> None:
    """A packed plan made for flash attention's varlen kernels (boundaries once per step, no bias) is planned
    again when the load falls back to sdpa: the boundaries become the position ids and the bound is sdpa's."""
    from cudaload.execute import replanned
    from cudaload.request import Request

    path = str(tiny_model("qwen3"))
    kw = {"hardware": h200("flash-attn-4"), "intent": "lora", "seq_len": 256, "batch_size": 8}
    first = plan(path, **kw)
    assert first.training is not None and first.training.boundaries == "cu_seq_lens"
    req = Request.build(path, **kw)
    again = replanned(req, req.hardware, first, "sdpa", ["runtime fallback: flash_attention_4 -> sdpa: x"])
    assert again.training is not None and again.training.boundaries == "position_ids"
    assert again.attention.choice == "sdpa" and again.attention.reasons[0].startswith("runtime fallback")


def test_a_padded_plan_checks_lengths_and_a_classifier_keeps_its_own_collator() -> None:
    padded = plan(Q8, hardware=h200(), intent="lora", seq_len=16, batch_size=4, batch_layout="padded")
    long = [{"input_ids": list(range(3, 103))}]
    with pytest.raises(ConfigurationError, match="seq_len=100"):
        cudaload.training_setup(padded, long)
    cut = cudaload.training_setup(padded, long, truncate=True).train_dataset
    assert cut == [{"input_ids": list(range(3, 19))}]
    cls = plan(
        tiny_config("qwen3"),
        hardware=h200(),
        intent="training",
        seq_len=64,
        model_class="AutoModelForSequenceClassification",
    )
    assert cls.training is not None and not cls.training.causal_lm
    rows = [{"input_ids": [5, 6, 7], "labels": 1}]
    s = cudaload.training_setup(cls, rows)
    assert s.data_collator is None and s.train_dataset is rows and "not a causal LM" in s.describe()


def test_lora_rank_and_dropout_reach_the_memory_the_ranks_are_sized_with_too() -> None:
    small = plan(Q8, hardware=h200(), intent="lora", seq_len=512, batch_size=4)
    big = plan(Q8, hardware=h200(), intent="lora", seq_len=512, batch_size=4, lora={"r": 256})
    assert big.memory.terms["adapters"] == 16 * small.memory.terms["adapters"]
    assert big.training is not None and big.training.step.lora_r == 256
    # where no single process fits, the ranks' step keeps the plan's dropout (and so its memory)
    from cudaload.capabilities import Distributed

    h = hardware("2xH200")
    g = dataclasses.replace(h.gpus[0], free_memory=20 << 30)
    ranks = dataclasses.replace(
        h.with_packages(["peft"], []),
        gpus=(g,),
        distributed=Distributed(local_rank=0, rank=0, world_size=2, local_world_size=1),
    )
    p = plan(Q8, hardware=ranks, intent="lora", seq_len=2048, lora={"lora_dropout": 0.1}, loss="transformers")
    assert p.parallelism is not None and p.parallelism.choice == "fsdp2"
    assert p.training is not None and p.training.step.lora_dropout == 0.1
    assert p.training.tokens_per_step.reasons[0].startswith("no single process fits")


def test_an_undeclared_batch_fills_packed_steps_to_their_token_bound_a_declared_one_caps_them() -> None:
    """batch_size left out: each packed step holds as many sequences as its token bound takes (what TRL's packing
    does with the same plan, measured faster a token on short data); declared: at most that many. Padded steps
    have no such decision; a plan saved before it caps the steps at ``step.sequences``."""
    data = [{"input_ids": list(range(5, 5 + n))} for n in [12, 7, 30, 9, 15, 5, 22, 11] * 12]
    filled = plan(Q8, hardware=h200("flash-attn-4"), intent="lora", seq_len=64)
    t = filled.training
    assert t is not None and t.packed and t.fills_steps
    assert t.sequences_per_step is not None and t.sequences_per_step.choice == "fill"
    assert not t.sequences_per_step.explicit
    assert "sequences per step: fill" in filled.explain() and "declare batch_size" in filled.explain()
    assert t.expects()["sequences_per_step"] == t.step.tokens
    s = cudaload.training_setup(filled, data)
    assert s.train_dataset.summary.max_step_sequences > t.step.sequences  # more than the 8 it was sized for
    for item in s.train_dataset:
        assert sum(map(len, item["input_ids"])) <= t.step.tokens
    assert f"filled up to {t.step.tokens:,} tokens" in s.describe()
    assert f"(packed steps filled up to {t.step.tokens:,} tokens)" in filled.explain().splitlines()[2]
    assert type(filled).from_json(filled.to_json()) == filled

    capped = plan(Q8, hardware=h200("flash-attn-4"), intent="lora", seq_len=64, batch_size=8)
    c = capped.training
    assert c is not None and not c.fills_steps
    assert c.sequences_per_step is not None and c.sequences_per_step.choice == "batch_size"
    assert c.sequences_per_step.explicit
    assert "filled" not in capped.explain().splitlines()[2]
    assert c.step.tokens == t.step.tokens  # the same memory either way: a packed step's follows its tokens
    cs = cudaload.training_setup(capped, data)
    assert cs.train_dataset.summary.max_step_sequences <= 8
    assert len(cs.train_dataset) > len(s.train_dataset)

    old = json.loads(filled.to_json())
    del old["training"]["sequences_per_step"]
    before = Plan.from_dict(old)
    assert before.training is not None and not before.training.fills_steps
    assert cudaload.training_setup(before, data).train_dataset.summary.max_step_sequences <= t.step.sequences

    padded = plan(Q8, hardware=h200(), intent="lora", seq_len=64, batch_layout="padded")
    assert padded.training is not None and padded.training.sequences_per_step is None
