"""Compiled decoder layers for training (issue 44, item 1): the planned decision over explicit facts and
profiles, the data-time decision in training_setup, and on the CPU that compiled layers train like eager ones
(fp32, tiny model; inductor's CPU backend). The GPU test (marker ``gpu``) trains a tiny bf16 LoRA compiled with
cudaload_varlen's packed steps."""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path
from typing import Any

import pytest
import torch

import cudaload
from cudaload.errors import ConfigurationError
from cudaload.execute.layer_compile import is_compiled
from cudaload.plans.decision import Decision
from cudaload.plans.training import TrainingPlan
from cudaload.policies.training.compile import (
    choose_layer_compile,
    layer_compile_for_run,
    payback_tokens,
)
from cudaload.policies.training_facts import LayerCompileFacts
from cudaload.profiles import hardware


def _facts(**kw: Any) -> LayerCompileFacts:
    base: dict[str, Any] = dict(
        gpu="NVIDIA H100 80GB HBM3/sm90",
        versions={"torch": "2.11.0"},
        date="2026-12-07",
        model="Qwen3-8B",
        intent="lora",
        layout="packed",
        attention="cudaload_varlen",
        tokens_per_step=2290,
        step_s=0.35,
        compiled_step_s=0.25,
        compile_s=70.0,
        source="test",
    )
    base.update(kw)
    return LayerCompileFacts(**base)


def _caps(name: str = "H100", torch_version: str = "2.11.0") -> Any:
    return dataclasses.replace(hardware(name), torch_version=torch_version, torch_cuda_version="13.0")


def _choose(caps: Any, facts: list[LayerCompileFacts], **kw: Any) -> tuple[Decision, int | None]:
    q: dict[str, Any] = dict(intent="lora", layout="packed", attention="cudaload_varlen")
    q.update(kw)
    return choose_layer_compile(caps, facts, **q)


def test_measured_faster_here_is_planned_with_its_payback() -> None:
    d, payback = _choose(_caps(), [_facts()])
    assert (
        d.choice == "layers" and payback == 700 * 2290
    )  # 70 s / (0.35 - 0.25) s a step, 2,290 tokens a step
    assert "from ~1,603,000 tokens (~700 steps of the record's)" in d.reasons[0] and "1.40x" in d.reasons[1]
    assert d.candidate("off") is not None and d.candidate("off").ok  # type: ignore[union-attr]


def test_the_same_architecture_borrows_the_record_and_says_so() -> None:
    d, _ = _choose(_caps("H200"), [_facts()])
    assert d.choice == "layers" and "the same architecture as this GPU" in d.reasons[1]


@pytest.mark.parametrize(
    ("caps_kw", "query", "facts_kw", "why"),
    [
        ({"torch_version": "2.10.1"}, {}, {}, "measured on torch 2.11 and later"),
        ({}, {"intent": "training"}, {}, "not measured for training"),
        ({}, {"attention": "sdpa"}, {}, "not measured for lora with packed steps and sdpa"),
        ({}, {"layout": "padded"}, {}, "not measured for lora with padded steps"),
        ({}, {"parallel": True}, {}, "split across ranks"),
        ({}, {"remote_code": True}, {}, "remote code"),
        ({}, {"causal_lm": False}, {}, "not a causal LM"),
        ({}, {}, {"gpu": "NVIDIA A100-SXM4-80GB/sm80"}, "not measured"),
        ({}, {}, {"compiled_step_s": 0.36}, "measured no faster"),
        ({}, {"intent": "inference"}, {}, "does not train"),
        ({}, {"moe": True}, {}, "mixture-of-experts"),
    ],
)
def test_off_where_it_cannot_run_or_was_not_measured(
    caps_kw: dict[str, Any], query: dict[str, Any], facts_kw: dict[str, Any], why: str
) -> None:
    d, payback = _choose(_caps(**caps_kw), [_facts(**facts_kw)], **query)
    assert d.choice == "off" and payback is None
    layers = d.candidate("layers")
    assert layers is not None and not layers.ok and any(why in r for r in layers.reasons), layers.reasons


def test_no_gpu_is_off() -> None:
    caps = dataclasses.replace(_caps(), gpus=())
    d, _ = _choose(caps, [_facts()])
    assert d.choice == "off" and any("no CUDA GPU" in r for r in d.reasons)


def test_payback_is_none_without_a_saving() -> None:
    assert payback_tokens(_facts(compiled_step_s=0.35)) is None
    assert payback_tokens(_facts(compile_s=0.0001, tokens_per_step=1)) == 1


def test_the_data_decides_against_its_payback() -> None:
    planned, payback = _choose(_caps(), [_facts()])
    assert payback == 1_603_000
    short = layer_compile_for_run(planned, payback, 1_602_999, None)
    assert short.choice == "off" and "1,602,999 tokens, fewer than the ~1,603,000" in short.reasons[0]
    assert short.candidate("off").ok  # type: ignore[union-attr]
    assert layer_compile_for_run(planned, payback, 1_603_000, None).choice == "layers"
    assert (
        layer_compile_for_run(planned, payback, None, None).choice == "layers"
    )  # unknown: taken as repaying
    forced = layer_compile_for_run(planned, payback, 3, True)
    assert forced.choice == "layers" and forced.explicit
    assert layer_compile_for_run(planned, payback, 10**9, False).choice == "off"
    off, _ = _choose(_caps(torch_version="2.9.0"), [_facts()])
    assert layer_compile_for_run(off, None, 10**9, None).choice == "off"
    asked = layer_compile_for_run(off, None, 1, True)
    # what was asked is the choice and its candidate is ok; what the plan found against it is said, labelled
    assert asked.choice == "layers" and asked.candidate("layers").ok  # type: ignore[union-attr]
    assert asked.reasons[0] == "compile_layers=True (requested explicitly)"
    assert asked.reasons[1].startswith("the plan chose off: ")
    assert layer_compile_for_run(None, None, 1, None).choice == "off"


def test_the_training_section_round_trips_and_explains_it() -> None:
    d, payback = _choose(_caps(), [_facts()])
    plan = cudaload.plan(_tiny_path(), hardware=_caps(), intent="lora", seq_len=256)
    assert plan.training is not None
    tp = dataclasses.replace(plan.training, layer_compile=d, layer_compile_payback_tokens=payback)
    back = TrainingPlan.from_dict(tp.to_dict())
    assert back.layer_compile == d and back.layer_compile_payback_tokens == payback
    assert any(line.startswith("compiled layers: layers") for line in back.explain_lines())
    old = tp.to_dict()
    del old["layer_compile"], old["layer_compile_payback_tokens"]
    assert TrainingPlan.from_dict(old).layer_compile is None  # a plan saved before


_TINY: dict[str, str] = {}


def _tiny_path() -> str:
    if "p" not in _TINY:
        import tempfile

        from cudaload.testing import make_tiny

        _TINY["p"] = str(make_tiny("qwen3", Path(tempfile.mkdtemp()) / "tiny"))
    return _TINY["p"]


def test_an_h100_lora_plan_compiles_from_the_shipped_record() -> None:
    """The shipped priors hold H100 records for 8B LoRA and QLoRA, packed, cudaload_varlen: plans there take
    them."""
    plan = cudaload.plan(_tiny_path(), hardware=_caps(), intent="lora", seq_len=256, batch_size=8)
    assert plan.attention.choice == "cudaload_varlen" and plan.training is not None
    assert plan.training.layer_compile is not None and plan.training.layer_compile.choice == "layers"
    assert plan.training.layer_compile_payback_tokens and plan.training.layer_compile_payback_tokens > 100_000
    q = cudaload.plan(
        _tiny_path(),
        hardware=_caps(),
        intent="qlora",
        seq_len=256,
        batch_size=8,
        assume_installed=["bitsandbytes"],
    )
    assert q.training is not None and q.training.layer_compile is not None
    assert q.training.layer_compile.choice == "layers"
    cpu = cudaload.plan(_tiny_path(), intent="lora", seq_len=256, batch_size=8, hardware=hardware("H100"))
    assert cpu.training is not None and cpu.training.layer_compile is not None
    assert cpu.training.layer_compile.choice == "off"  # a CPU build of torch: sdpa, not measured


def test_compiled_layers_keep_two_intermediates_fewer_for_lora_and_the_plan_says_so_but_sizes_eager() -> None:
    """What inductor keeps for backward (gpu5/gpu8 on the H100: the compiled 8B LoRA and QLoRA steps allocated
    51.3 KB per token per layer fewer than eager, 2.09 x the MLP's intermediate in bf16): the memory model counts
    it for a compiled step, and the plan, sized for eager layers, says it."""
    from cudaload.model_info import model_info
    from cudaload.plans.training import StepShape
    from cudaload.policies.memory import compiled_layers_saving, estimate
    from cudaload.testing import full_config

    info = model_info(full_config("Qwen3-8B"))
    step = StepShape(tokens=4579, sequences=8, longest=1523, packed=True, cast_outside_autocast=True)
    kw: dict[str, Any] = dict(
        dtype="bfloat16", quantization=None, intent="lora", seq_len=1523, batch_size=8,
        attn="flash_attention_2", optimizer="adamw_torch_fused", gradient_checkpointing=False,
    )  # fmt: skip
    eager = estimate(info, step=step, **kw)["activations"]
    compiled = estimate(info, step=dataclasses.replace(step, compiled_layers=True), **kw)["activations"]
    per = 2 * 2 * 12288 * 4579 * 36  # two bf16 intermediates a token in each of 36 layers
    assert eager - compiled == per
    assert (
        compiled_layers_saving(info, intent="lora", step=step, act_bytes=2, gradient_checkpointing=False)
        == per
    )
    # half the layers checkpointed: those keep only their input, compiled or not
    half = dataclasses.replace(step, checkpoint_every=2)
    assert compiled_layers_saving(
        info, intent="lora", step=half, act_bytes=2, gradient_checkpointing=True
    ) == (per // 2)
    # not measured: dropout (the adapters keep their own copies), an fp32 stream, a full fine-tune: eager's figure
    for s, intent, a in (
        (dataclasses.replace(step, lora_dropout=0.05), "lora", 2),
        (step, "qlora", 4),
        (step, "training", 2),
    ):
        assert (
            compiled_layers_saving(info, intent=intent, step=s, act_bytes=a, gradient_checkpointing=False)
            == 0
        )
    assert StepShape.from_dict(dataclasses.replace(step, compiled_layers=True).to_dict()).compiled_layers
    assert not StepShape.from_dict(
        {"tokens": 1, "sequences": 1, "longest": 1}
    ).compiled_layers  # saved before

    plan = cudaload.plan(_tiny_path(), hardware=_caps(), intent="lora", seq_len=256, batch_size=8)
    assert plan.training is not None and plan.training.layer_compile is not None
    assert plan.training.layer_compile.choice == "layers" and not plan.training.step.compiled_layers
    assert any(
        "below the plan's" in r and "sized for eager layers" in r for r in plan.training.layer_compile.reasons
    ), plan.training.layer_compile.reasons


def _rows(n: int, seed: int = 0) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    return [{"input_ids": [rng.randrange(3, 90) for _ in range(rng.randrange(8, 40))]} for _ in range(n)]


def _steps(model: Any, setup: Any, n: int) -> list[float]:
    torch.manual_seed(0)
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    losses = []
    for i in range(n):
        batch = setup.data_collator([setup.train_dataset[i]])
        loss = model(**batch).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(float(loss.detach()))
    return losses


def test_training_setup_compiles_on_request_and_trains_like_eager(tmp_path: Path) -> None:
    """CPU, fp32: compiled layers give eager's losses over three optimizer steps of packed data; the default on
    this machine (a CPU, no record) compiles nothing and says why."""
    kw: dict[str, Any] = dict(intent="lora", seq_len=64, batch_size=4, dtype="float32")
    eager = cudaload.load_model(_tiny_path(), **kw)
    compiled = cudaload.load_model(_tiny_path(), **kw)
    compiled.load_state_dict(eager.state_dict())
    data = _rows(24)
    plain = cudaload.training_setup(eager, data)
    assert plain.compiled_layers == 0 and plain.layer_compile is not None
    assert plain.layer_compile.choice == "off"
    setup = cudaload.training_setup(compiled, data, compile_layers=True)
    layers = compiled.get_base_model().model.layers
    assert setup.compiled_layers == len(layers) > 0 and setup.layer_compile is not None
    assert setup.layer_compile.choice == "layers" and setup.layer_compile.explicit
    assert all(is_compiled(layer) for layer in layers)
    assert "decoder layers compiled" in setup.describe()
    torch._dynamo.reset()
    got, want = _steps(compiled, setup, 3), _steps(eager, plain, 3)
    assert got == pytest.approx(want, rel=1e-4, abs=1e-5)


def test_refusals_leave_the_model_uncompiled(tmp_path: Path) -> None:
    model = cudaload.load_model(_tiny_path(), intent="lora", seq_len=64, batch_size=4, dtype="float32")
    layers = model.get_base_model().model.layers
    with pytest.raises(ConfigurationError, match="compile_layers"):
        cudaload.training_setup(model, _rows(4), compile_layers="yes")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError):
        cudaload.training_setup(model, [{"input_ids": [1.5, 2.0]}], compile_layers=True)
    assert not any(is_compiled(layer) for layer in layers)
    with pytest.raises(ConfigurationError, match="given a Plan, not the model"):
        cudaload.training_setup(model.cudaload_plan, _rows(4), compile_layers=True)
    assert not any(is_compiled(layer) for layer in layers)


@pytest.mark.gpu
def test_gpu_compiled_layers_train_packed_like_eager(tmp_path: Path) -> None:
    """bf16 LoRA, packed steps on the plan's attention (cudaload_varlen without a flash-attn package): three
    optimizer steps compiled against eager, losses within bf16 tolerance."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")
    kw: dict[str, Any] = dict(intent="lora", seq_len=256, batch_size=8)
    eager = cudaload.load_model(_tiny_path(), **kw)
    compiled = cudaload.load_model(_tiny_path(), **kw)
    compiled.load_state_dict(eager.state_dict())
    data = _rows(48, seed=1)
    plain = cudaload.training_setup(eager, data, compile_layers=False)
    setup = cudaload.training_setup(compiled, data, compile_layers=True)
    assert setup.compiled_layers > 0

    def on_gpu(s: Any) -> Any:
        class S:
            train_dataset = s.train_dataset

            @staticmethod
            def data_collator(f: Any) -> Any:
                return {
                    k: v.cuda() if isinstance(v, torch.Tensor) else v for k, v in s.data_collator(f).items()
                }

        return S

    got, want = _steps(compiled, on_gpu(setup), 3), _steps(eager, on_gpu(plain), 3)
    assert got == pytest.approx(want, rel=3e-2), (got, want)


def test_attention_for_training_ranks_a_backend_at_its_compiled_rate() -> None:
    """The shipped H100 records: flash_attention_4 7,190 and cudaload_varlen 7,002 tokens/s eager, and
    cudaload_varlen's layers 1.43x compiled. With flash-attn-4 installed, an H100 LoRA plan takes cudaload_varlen
    (and its compiled layers) where the layers can be compiled, flash_attention_4 where they cannot."""
    kw: dict[str, Any] = dict(intent="lora", seq_len=256, batch_size=8, assume_installed=["flash-attn-4"])
    plan = cudaload.plan(_tiny_path(), hardware=_caps(), **kw)
    assert plan.attention.choice == "cudaload_varlen"
    assert any("with compiled decoder layers" in r for r in plan.attention.reasons)
    assert plan.training is not None and plan.training.layer_compile is not None
    assert plan.training.layer_compile.choice == "layers"
    old = cudaload.plan(_tiny_path(), hardware=_caps(torch_version="2.10.0"), **kw)
    assert old.attention.choice == "flash_attention_4"
    assert not any("compiled" in r for r in old.attention.reasons)


def test_a_backend_another_record_of_this_architecture_measured_is_scaled_in() -> None:
    """The H200's training record measured flash_attention_4 and sdpa; the H100's (same sm90) flash_attention_4
    and cudaload_varlen: on the H200, cudaload_varlen ranks at the H100's ratio to flash_attention_4 applied to
    the H200's flash_attention_4, then at its compiled rate."""
    kw: dict[str, Any] = dict(intent="lora", seq_len=256, batch_size=8, assume_installed=["flash-attn-4"])
    plan = cudaload.plan(_tiny_path(), hardware=_caps("H200"), **kw)
    assert plan.attention.choice == "cudaload_varlen"
    scaled = next(r for r in plan.attention.reasons if r.startswith("cudaload_varlen ~"))
    assert "8,317 tokens/s here" in scaled and "the same architecture" in scaled  # 8,540 * 7,002 / 7,190
    old = cudaload.plan(_tiny_path(), hardware=_caps("H200", torch_version="2.10.0"), **kw)
    assert old.attention.choice == "flash_attention_4"  # 8,540 against ~8,317, layers not compiled there


def _train_facts(gpu: str, rates: dict[str, float], date: str = "2026-12-07") -> Any:
    from cudaload.policies.training_facts import TrainingFacts

    return TrainingFacts(
        gpu=gpu,
        versions={},
        date=date,
        model="m",
        intent="lora",
        layout="packed",
        tokens_per_s=rates,
        source="test",
    )


def _lora_attention(caps: Any, training: list[Any], compiled: list[LayerCompileFacts]) -> Decision:
    from cudaload.model_info import model_info
    from cudaload.policies.attention import choose_attention
    from cudaload.testing import full_config

    info = model_info(full_config("Qwen3-8B"))
    return choose_attention(
        info, caps, dtype="bfloat16", intent="lora", training_facts=training, layer_compile_facts=compiled
    )


def test_explicit_facts_the_compiled_rate_reorders_measured_backends() -> None:
    caps = _caps().with_packages(["flash-attn-4"])
    h100 = _train_facts(
        "NVIDIA H100 80GB HBM3/sm90", {"flash_attention_4": 7190.0, "cudaload_varlen": 7002.0}
    )
    assert _lora_attention(caps, [h100], []).choice == "flash_attention_4"
    faster = _facts(step_s=0.35, compiled_step_s=0.25)  # 1.4x: 9,803 against 7,190
    d = _lora_attention(caps, [h100], [faster])
    assert d.choice == "cudaload_varlen"
    assert any("with compiled decoder layers: ~9,803 tokens/s" in r for r in d.reasons), d.reasons
    barely = _facts(step_s=0.35, compiled_step_s=0.345)  # 1.01x: 7,104, still below 7,190
    assert _lora_attention(caps, [h100], [barely]).choice == "flash_attention_4"
    fa4_compiled = _facts(attention="flash_attention_4", step_s=0.36, compiled_step_s=0.24)  # 1.5x: 10,785
    assert _lora_attention(caps, [h100], [faster, fa4_compiled]).choice == "flash_attention_4"
    old_torch = _caps(torch_version="2.10.0").with_packages(["flash-attn-4"])  # layers cannot compile there
    assert _lora_attention(old_torch, [h100], [faster]).choice == "flash_attention_4"


def test_explicit_facts_a_backend_is_scaled_in_from_the_same_architecture_only() -> None:
    caps = _caps("H200").with_packages(["flash-attn-4"])
    h200 = _train_facts("NVIDIA H200/sm90", {"flash_attention_4": 8540.0, "sdpa": 5662.0}, date="2026-12-03")
    h100 = _train_facts(
        "NVIDIA H100 80GB HBM3/sm90", {"flash_attention_4": 7190.0, "cudaload_varlen": 7002.0}
    )
    a100 = _train_facts("NVIDIA A100-SXM4-80GB/sm80", {"flash_attention_4": 100.0, "cudaload_varlen": 1000.0})
    faster = _facts(step_s=0.35, compiled_step_s=0.25)
    # the H200's own record is chosen (same name); cudaload_varlen ~8,317 (8,540 x 7,002 / 7,190) eager
    d = _lora_attention(caps, [h200, h100], [])
    assert d.choice == "flash_attention_4"
    d = _lora_attention(caps, [h200, h100], [faster])  # ~11,644 compiled
    assert d.choice == "cudaload_varlen"
    assert any(r.startswith("cudaload_varlen ~8,317 tokens/s here") for r in d.reasons), d.reasons
    # an sm80 record lends nothing to an sm90 GPU, even one that says cudaload_varlen is 10x faster there
    assert _lora_attention(caps, [h200, a100], []).choice == "flash_attention_4"
    # no varlen kernel the H200 record measured is valid here (flash-attn-3 installed, not flash-attn-4): nothing
    # to scale against, so the installed, unmeasured flash package keeps its place ahead of cudaload_varlen
    fa3 = _caps("H200").with_packages(["flash-attn-3"])
    assert _lora_attention(fa3, [h200, h100], [faster]).choice == "flash_attention_3"


@pytest.mark.parametrize(
    ("hardware_kw", "plan_kw"),
    [
        ({"count": 2}, {}),  # two GPUs: the step is split across ranks, the layers are not compiled there
        ({}, {"batch_layout": "padded"}),  # padded steps: not measured compiled
    ],
)
def test_no_compiled_rate_where_the_plan_will_not_compile(
    hardware_kw: dict[str, Any], plan_kw: dict[str, Any]
) -> None:
    caps = _caps()
    if hardware_kw.get("count"):
        caps = dataclasses.replace(caps, gpus=(caps.gpus[0], dataclasses.replace(caps.gpus[0], index=1)))
    plan = cudaload.plan(
        _tiny_path(),
        hardware=caps,
        intent="lora",
        seq_len=256,
        batch_size=8,
        assume_installed=["flash-attn-4"],
        **plan_kw,
    )
    assert plan.attention.choice == "flash_attention_4"
    assert not any("compiled" in r for r in plan.attention.reasons)
    assert plan.training is not None and plan.training.layer_compile is not None
    assert plan.training.layer_compile.choice == "off"


def test_compile_layers_false_puts_an_earlier_compile_back_to_eager() -> None:
    model = cudaload.load_model(_tiny_path(), intent="lora", seq_len=64, batch_size=4, dtype="float32")
    layers = model.get_base_model().model.layers
    assert cudaload.training_setup(model, _rows(4), compile_layers=True).compiled_layers == len(layers)
    assert all(is_compiled(layer) for layer in layers)
    again = cudaload.training_setup(model, _rows(4), compile_layers=False)
    assert (
        again.compiled_layers == 0 and again.layer_compile is not None and again.layer_compile.choice == "off"
    )
    assert not any(is_compiled(layer) for layer in layers)


def test_decoder_layers_are_the_decoders_own_before_a_longer_list() -> None:
    """A vision-language model's vision tower may hold more blocks than its language model has layers: the
    decoder's own layers are taken (get_decoder())."""
    from cudaload.execute.layer_compile import compile_problem, decoder_layers

    class Block(torch.nn.Module):
        pass

    class Decoder(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layers = torch.nn.ModuleList(Block() for _ in range(2))

    class Model(torch.nn.Module):
        _no_split_modules = ("Block",)

        def __init__(self) -> None:
            super().__init__()
            self.vision = torch.nn.ModuleList(Block() for _ in range(5))
            self.language = Decoder()

        def get_decoder(self) -> Decoder:
            return self.language

    m = Model()
    assert decoder_layers(m) == list(m.language.layers)
    del Model.get_decoder
    assert decoder_layers(m) == list(m.vision)  # no decoder to ask: the longest list of the layer class
    assert decoder_layers(torch.nn.Linear(2, 2)) == []
    assert compile_problem(torch.nn.Linear(2, 2)) is None  # on the CPU inductor writes C++, no triton needed


def test_compiled_layers_serve_training_only() -> None:
    """One graph for every layer while training with use_cache=False (what cudaload's collators and TRL pass);
    a training call that carries a KV cache, an evaluation under no_grad and generate() run the layers' own
    forward, so no graph per layer (each reads its layer_idx) piles up to torch's recompile limit."""
    from torch._dynamo.utils import counters
    from transformers import AutoModelForCausalLM

    from cudaload.execute.layer_compile import compile_layers, eager_layers
    from cudaload.testing import tiny_config

    torch._dynamo.reset()
    counters.clear()
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(tiny_config("qwen3"), dtype=torch.float32).train()
    eager = AutoModelForCausalLM.from_config(tiny_config("qwen3"), dtype=torch.float32).train()
    eager.load_state_dict(model.state_dict())
    ids = torch.randint(5, 90, (1, 20))
    assert compile_layers(model) == len(model.model.layers)
    got = model(ids, labels=ids, use_cache=False).loss
    want = eager(ids, labels=ids, use_cache=False).loss
    assert float(got.detach()) == pytest.approx(float(want.detach()), rel=1e-5)
    got.backward()
    graphs = dict(counters["stats"])
    assert graphs.get("unique_graphs") == 1
    model(ids, labels=ids).loss.backward()  # the config's use_cache: a cache in training
    model.eval()
    with torch.no_grad():
        model(ids)
        model.generate(ids, max_new_tokens=3, do_sample=False)
    assert dict(counters["stats"]) == graphs
    assert eager_layers(model) == len(model.model.layers) and not any(
        is_compiled(x) for x in model.model.layers
    )
    assert all("forward" not in layer.__dict__ for layer in model.model.layers)  # the class's forward again


@pytest.mark.parametrize(
    ("transformers_version", "compiles"), [("5.17.0", True), ("5.22.2", True), ("5.24.0", False)]
)
def test_checkpointing_inside_the_forward_compiles_nothing(transformers_version: str, compiles: bool) -> None:
    """From transformers 5.24 the layer's forward holds its checkpointing, and torch.compile of it captured no
    graph on the CPU: with checkpointing planned, no compiled layers there; without it, they compile."""
    caps = dataclasses.replace(_caps(), transformers_version=transformers_version)
    d, _ = _choose(caps, [_facts()], checkpointing=True)
    assert (d.choice == "layers") == compiles
    if not compiles:
        assert any("checkpoints inside the layer's forward" in r for r in d.reasons)
    assert _choose(caps, [_facts()], checkpointing=False)[0].choice == "layers"
