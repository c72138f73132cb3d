"""The planner's decision table: (hardware, model, intent, packages) -> the decision and its reason."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from cudaload.capabilities import GPU, Capabilities, Distributed
from cudaload.errors import CudaloadError, DoesNotFitError, InvalidChoiceError
from cudaload.planner import plan
from cudaload.plans.plan import Plan
from cudaload.profiles import hardware
from cudaload.testing import full_config

CPU = Capabilities(source="test:cpu", host_memory=64 << 30)


def hw(name: str, installed: tuple[str, ...] = (), missing: tuple[str, ...] = ()) -> Capabilities:
    caps = hardware(name)
    return caps.with_packages(installed, missing) if installed or missing else caps


def reasons(p: Plan, field: str, name: str) -> str:
    d = getattr(p, field)
    c = d.candidate(name)
    assert c is not None, f"{name} not among {field} candidates"
    return " ".join(c.reasons)


# (id, profile, shape, intent, installed packages, kwargs, field, expected choice, text in the reasons)
TABLE: list[tuple[str, str, str, str, tuple[str, ...], dict[str, Any], str, Any, str]] = [
    ("h200-bf16", "H200", "Qwen3-8B", "inference", (), {}, "dtype", "bfloat16", "native"),
    ("t4-fp16", "T4", "Qwen3-0.6B", "inference", (), {}, "dtype", "float16", "no native bf16"),
    ("v100-fp16", "V100-32GB", "Qwen3-0.6B", "inference", (), {}, "dtype", "float16", "no native bf16"),
    # on the H200 the default is sdpa with cuDNN kept off lengths met for the first times (cudaload_sdpa)
    (
        "h200-sdpa-no-flash",
        "H200",
        "Qwen3-8B",
        "inference",
        (),
        {},
        "attention",
        "cudaload_sdpa",
        "sdpa, without cuDNN on lengths met",
    ),
    (
        "h200-sdpa-over-fa3-untimed",
        "H200",
        "Qwen3-8B",
        "inference",
        ("flash-attn-3", "flash-attn-4", "flash-attn"),
        {},
        "attention",
        "cudaload_sdpa",
        "measured on NVIDIA H200 (sm90)",
    ),
    (
        "h200-sdpa-over-fa4-untimed",
        "H200",
        "Qwen3-8B",
        "inference",
        ("flash-attn-4", "flash-attn"),
        {},
        "attention",
        "cudaload_sdpa",
        "first-seen lengths",
    ),
    (
        "b200-sdpa-untimed",
        "B200",
        "Qwen3-8B",
        "inference",
        ("flash-attn", "flash-attn-4"),
        {},
        "attention",
        "sdpa",
        "cudaload tune",
    ),
    (
        "a100-sdpa-untimed",
        "A100-80GB",
        "Qwen3-8B",
        "inference",
        ("flash-attn", "flash-attn-4"),
        {},
        "attention",
        "sdpa",
        "flash_attention_2",
    ),
    ("l4-sdpa", "L4", "Qwen3-0.6B", "inference", ("flash-attn",), {}, "attention", "sdpa", "no warm-up"),
    (
        "t4-sdpa",
        "T4",
        "Qwen3-0.6B",
        "inference",
        ("flash-attn",),
        {},
        "attention",
        "sdpa",
        "no extra package",
    ),
    (
        "h200-training-varlen-flash-untimed",
        "H200",
        "Qwen3-0.6B",
        "training",
        ("flash-attn-3",),
        {},
        "attention",
        "flash_attention_3",
        "varlen forward and backward",
    ),
    (
        "gemma-softcap-eager-not-flex-compile",
        "H200",
        "Gemma-2-9B",
        "inference",
        (),
        {},
        "attention",
        "eager",
        "flex_attention would cost",
    ),
    (
        "gemma-softcap-t4-eager",
        "T4",
        "Gemma-2-9B",
        "inference",
        ("bitsandbytes",),
        {},
        "attention",
        "eager",
        "soft-capping exactly",
    ),
    (
        "gemma-fa2-hd256",
        "A100-80GB",
        "Gemma-2-9B",
        "inference",
        ("flash-attn",),
        {},
        "attention",
        "flash_attention_2",
        "usable",
    ),
    ("70b-one-h200", "H200", "Llama-3.1-70B", "inference", (), {}, "quantization", None, "fits on one GPU"),
    (
        "70b-split",
        "2xH100-SXM",
        "Llama-3.1-70B",
        "inference",
        (),
        {},
        "quantization",
        None,
        "split over 2 GPUs",
    ),
    (
        "70b-int8-h100",  # int8 at ~1.02 bytes/param (measured on the H200) fits 80 GB
        "H100-SXM",
        "Llama-3.1-70B",
        "inference",
        ("bitsandbytes",),
        {},
        "quantization",
        "int8",
        "does not fit",
    ),
    (
        "70b-nf4-l40s",  # 48 GB: int8 does not fit either, nf4 does
        "L40S",
        "Llama-3.1-70B",
        "inference",
        ("bitsandbytes",),
        {},
        "quantization",
        "nf4",
        "does not fit",
    ),
    (
        "8b-int8-t4",
        "T4",
        "Qwen3-8B",
        "inference",
        ("bitsandbytes",),
        {"seq_len": 1024},
        "quantization",
        "int8",
        "does not fit",
    ),
    (
        "qlora-t4",
        "T4",
        "Qwen3-8B",
        "qlora",
        ("bitsandbytes",),
        {"seq_len": 512},
        "quantization",
        "nf4",
        "fits",
    ),
    ("lora-h200", "H200", "Qwen3-8B", "lora", (), {}, "quantization", None, "fits"),
]


@pytest.mark.parametrize(
    ("profile", "shape", "intent", "pkgs", "kw", "field", "choice", "why"),
    [t[1:] for t in TABLE],
    ids=[t[0] for t in TABLE],
)
def test_table(
    profile: str,
    shape: str,
    intent: str,
    pkgs: tuple[str, ...],
    kw: dict[str, Any],
    field: str,
    choice: Any,
    why: str,
) -> None:
    p = plan(full_config(shape), hardware=hw(profile, pkgs), intent=intent, **kw)
    d = getattr(p, field)
    assert d.choice == choice, p.explain()
    text = " ".join(d.reasons) + " " + " ".join(" ".join(c.reasons) for c in d.candidates)
    text += " " + " ".join(p.placement.reasons)
    assert why in text, p.explain()


def test_cpu_plan_is_fp32_sdpa_one_clear_line(tiny_model: Any) -> None:
    p = plan(tiny_model("qwen3"), hardware=CPU)
    assert (p.dtype.choice, p.attention.choice, p.placement.device_map) == ("float32", "sdpa", "cpu")
    assert p.placement.reasons == ("no GPU visible: the model runs on the CPU",)
    assert "no GPU" in reasons(p, "attention", "flash_attention_2")
    assert p.load_path.choice == "from_pretrained"


def test_rejections_keep_their_reasons() -> None:
    p = plan(full_config("Qwen3-0.6B"), hardware=hw("T4", ("flash-attn",)))
    assert "sm80" in reasons(p, "attention", "flash_attention_2")
    assert "sm8x and sm90 only" in reasons(p, "attention", "flash_attention_3")
    assert "not installed" in reasons(p, "attention", "flash_attention_4")
    assert "no native bf16" in reasons(p, "dtype", "bfloat16")


def test_flash_needs_half_precision() -> None:
    p = plan(full_config("Qwen3-0.6B"), hardware=hw("H200", ("flash-attn-3",)), dtype="float32")
    assert p.attention.choice == "sdpa"
    assert "float16 or bfloat16" in reasons(p, "attention", "flash_attention_3")


def test_head_dim_limit_fa4_blackwell() -> None:
    caps = Capabilities(source="t", gpus=(GPU(0, "B200", (10, 0), 180 << 30),)).with_packages(
        ["flash-attn-4"]
    )
    cfg = full_config("Qwen3-0.6B")
    cfg.head_dim = 192
    p = plan(cfg, hardware=caps)
    assert "8..128 or exactly 256" in reasons(p, "attention", "flash_attention_4")
    cfg.head_dim = 512
    p = plan(cfg, hardware=hw("H200", ("flash-attn",)))
    assert "256" in reasons(p, "attention", "flash_attention_2")


def test_vllm_flash_attn3_is_not_called_forward_only() -> None:
    # its flash_attn_interface.FlashAttnFunc has a backward (kernels-community vllm-flash-attn3)
    p = plan(full_config("Qwen3-0.6B"), hardware=hw("H200"), intent="training")
    assert "forward-only" not in reasons(p, "attention", "kernels-community/vllm-flash-attn3")


def test_explicit_attention_honoured_or_refused() -> None:
    p = plan(full_config("Qwen3-0.6B"), hardware=hw("H200", ("flash-attn",)), attn="flash_attention_2")
    assert p.attention.choice == "flash_attention_2" and p.attention.explicit
    assert plan(full_config("Qwen3-0.6B"), hardware=hw("H200"), attn="eager").attention.choice == "eager"
    with pytest.raises(InvalidChoiceError) as e:
        plan(full_config("Qwen3-0.6B"), hardware=hw("T4"), attn="flash_attention_2")
    assert "sm80" in str(e.value) and "not installed" in str(e.value)
    with pytest.raises(InvalidChoiceError):
        plan(full_config("Qwen3-0.6B"), hardware=hw("T4"), attn="flash_attention_9")


def test_explicit_dtype() -> None:
    assert plan(full_config("Qwen3-0.6B"), hardware=hw("H200"), dtype="fp16").dtype.choice == "float16"
    with pytest.raises(InvalidChoiceError) as e:
        plan(full_config("Qwen3-0.6B"), hardware=hw("T4"), dtype="bf16")
    assert "emulates" in str(e.value)
    with pytest.raises(InvalidChoiceError):
        plan(full_config("Qwen3-0.6B"), hardware=hw("T4"), dtype="int3")


def test_checkpoint_dtype_respected() -> None:
    cfg = full_config("Qwen3-0.6B")
    cfg.dtype = "float16"
    p = plan(cfg, hardware=hw("H200"))
    assert p.dtype.choice == "float16" and "stored in float16" in p.dtype.reasons[0]


def test_gemma_fp16_warns_with_fp32_alternative() -> None:
    p = plan(full_config("Gemma-2-9B"), hardware=hw("T4", ("bitsandbytes",)))
    assert p.dtype.choice == "float16"
    assert any("overflow" in w and "float32" in w for w in p.warnings)
    assert not any("overflow" in w for w in plan(full_config("Gemma-2-9B"), hardware=hw("H200")).warnings)


def test_qlora_config_is_explicit() -> None:
    p = plan(full_config("Qwen3-8B"), hardware=hw("A10G", ("bitsandbytes",)), intent="qlora", seq_len=512)
    assert p.quantization_config == {
        "load_in_4bit": True,
        "bnb_4bit_quant_type": "nf4",
        "bnb_4bit_use_double_quant": True,
        "bnb_4bit_compute_dtype": "bfloat16",
    }
    assert p.peft == {
        "r": 16,
        "lora_alpha": 32,
        "lora_dropout": 0.0,
        "target_modules": "all-linear",
        "bias": "none",
        "task_type": "CAUSAL_LM",
    }
    assert p.training is not None and p.training.kbit_upcast is not None
    assert p.training.kbit_upcast.choice == "bf16"  # bf16 compute: no fp32 cast of the rest
    assert p.memory.terms["adapters"] > 0 and p.memory.terms["kv_cache"] == 0
    t4 = plan(full_config("Qwen3-0.6B"), hardware=hw("T4", ("bitsandbytes",)), intent="qlora")
    assert (
        t4.quantization_config is not None and t4.quantization_config["bnb_4bit_compute_dtype"] == "float16"
    )
    # fp16 compute: peft's fp32 cast of everything not 4-bit, as its recipe does
    assert t4.training is not None and t4.training.kbit_upcast is not None
    assert t4.training.kbit_upcast.choice == "fp32"


def test_quantization_rules() -> None:
    with pytest.raises(InvalidChoiceError):
        plan(
            full_config("Qwen3-0.6B"),
            hardware=hw("H200", ("bitsandbytes",)),
            intent="training",
            quantization="nf4",
        )
    with pytest.raises(InvalidChoiceError) as e:
        plan(full_config("Qwen3-0.6B"), hardware=hw("H200", missing=("bitsandbytes",)), quantization="int8")
    assert "bitsandbytes is not installed" in str(e.value)
    p = plan(full_config("Qwen3-0.6B"), hardware=hw("H200", ("bitsandbytes",)), quantization="int8")
    assert p.quantization.choice == "int8" and p.quantization.explicit
    with pytest.raises(CudaloadError) as e2:
        plan(full_config("Qwen3-0.6B"), hardware=hw("H200", missing=("bitsandbytes",)), intent="qlora")
    assert "bitsandbytes" in str(e2.value)


def test_does_not_fit_says_what_would() -> None:
    with pytest.raises(DoesNotFitError) as e:
        plan(full_config("Llama-3.1-70B"), hardware=hw("H100-SXM", missing=("bitsandbytes",)))
    msg = str(e.value)
    # offload is suggested only where it fits: a profile states no host memory (issue 15: every suggestion
    # is followed in tests/test_memory_suggestions.py)
    assert "GPUs like" in msg and "allow_offload" not in msg
    caps = replace(hw("H100-SXM", missing=("bitsandbytes",)), host_memory=512 << 30)
    with pytest.raises(DoesNotFitError) as e:
        plan(full_config("Llama-3.1-70B"), hardware=caps)
    assert "allow_offload" in str(e.value)
    with pytest.raises(DoesNotFitError) as e:
        plan(
            full_config("Qwen3-8B"),
            hardware=hw("A100-80GB", ("bitsandbytes",)),
            intent="training",
            seq_len=2048,
            optimizer="adamw_torch_fused",  # with optimizer="auto" 8-bit AdamW fits (issue 15)
        )
    assert "qlora" in str(e.value) and "optimizer='adamw_8bit' fits" in str(e.value)
    with pytest.raises(DoesNotFitError) as e:
        plan(full_config("Qwen3-8B"), hardware=hw("T4", missing=("bitsandbytes",)), seq_len=40960)
    assert "GPUs like" in str(e.value)


def test_shorter_sequence_is_suggested() -> None:
    caps = Capabilities(source="t", gpus=(GPU(0, "X", (9, 0), 20 << 30),))
    with pytest.raises(DoesNotFitError) as e:
        plan(full_config("Qwen3-8B"), hardware=caps, seq_len=40960, quantization="none")
    assert "seq_len <= " in str(e.value)


def test_offload_only_when_allowed() -> None:
    caps = replace(hw("T4", missing=("bitsandbytes",)), host_memory=512 << 30)
    with pytest.raises(DoesNotFitError):
        plan(full_config("Qwen3-8B"), hardware=caps)
    p = plan(full_config("Qwen3-8B"), hardware=caps, allow_offload=True)
    assert p.placement.offload and "cpu" in p.placement.devices
    assert p.load_path.choice == "from_pretrained" and any("offload" in w for w in p.warnings)


def test_split_budgets_and_balance() -> None:
    p = plan(full_config("Llama-3.1-70B"), hardware=hw("4xA100-80GB"))
    assert p.placement.device_map == "balanced"
    assert p.placement.devices == ("cuda:0", "cuda:1", "cuda:2", "cuda:3")
    assert p.placement.max_memory is not None and set(p.placement.max_memory) == {"0", "1", "2", "3"}
    used = [p.memory.per_device[d] for d in p.placement.devices]
    assert max(used) - min(used) < 0.1 * max(used)  # balanced, not filled in order
    assert all(p.memory.per_device[d] <= p.memory.budget[d] for d in p.memory.per_device)


def test_estimate_gives_the_plans_terms() -> None:
    """policies.estimate (no plan needed) and plan() count the same bytes for the same split."""
    from cudaload.model_info import model_info
    from cudaload.policies import estimate

    cfg = full_config("Llama-3.1-70B")
    p = plan(cfg, hardware=hw("4xA100-80GB"), seq_len=4096)
    est = estimate(
        model_info(cfg),
        dtype=p.dtype.choice or "",
        quantization=p.quantization.choice,
        intent=p.intent,
        seq_len=p.seq_len,
        batch_size=p.batch_size,
        attn=p.attention.choice or "",
        devices=len(p.placement.devices),
    )
    assert est.pop("total") == sum(p.memory.terms.values())
    assert est == p.memory.terms
    assert est["cuda_context"] > 0 and est["activations"] > 0


def test_max_memory_limits_the_plan() -> None:
    p = plan(full_config("Qwen3-0.6B"), hardware=hw("H200"), max_memory={0: "4GiB"})
    assert p.memory.budget["cuda:0"] == 4 << 30
    with pytest.raises(DoesNotFitError):
        plan(full_config("Qwen3-8B"), hardware=hw("H200", missing=("bitsandbytes",)), max_memory={0: "4GiB"})


def test_torchrun_uses_local_rank() -> None:
    caps = replace(
        hw("2xH100-SXM"), distributed=Distributed(local_rank=1, rank=3, world_size=4, local_world_size=2)
    )
    p = plan(full_config("Qwen3-0.6B"), hardware=caps)
    assert p.placement.device_map == "cuda:1" and p.placement.devices == ("cuda:1",)
    assert "LOCAL_RANK" in p.placement.reasons[0]


def test_torchrun_never_splits() -> None:
    caps = replace(
        hw("2xH100-SXM", missing=("bitsandbytes",)),
        distributed=Distributed(local_rank=0, rank=0, world_size=2, local_world_size=2),
    )
    # 70B does not fit one H100: under torchrun that is tensor parallelism (each rank's shard on its own GPU),
    # never a device_map split across GPUs from every rank
    p = plan(full_config("Llama-3.1-70B"), hardware=caps)
    assert p.parallelism is not None and p.parallelism.choice == "tp"
    assert p.placement.device_map == "cuda:0" and p.placement.devices == ("cuda:0",)
    with pytest.raises(DoesNotFitError):
        plan(full_config("Llama-3.1-70B"), hardware=caps, parallelism="single")


def test_picks_the_gpu_with_room_and_names_it_under_cvd() -> None:
    caps = Capabilities(
        source="t",
        env=(("CUDA_VISIBLE_DEVICES", "2,3"),),
        gpus=(
            GPU(0, "H100", (9, 0), 80 << 30, free_memory=1 << 30, nvml_index=2),
            GPU(1, "H100", (9, 0), 80 << 30, free_memory=79 << 30, nvml_index=3),
        ),
    )
    p = plan(full_config("Qwen3-0.6B"), hardware=caps)
    assert p.placement.device_map == "cuda:1"
    assert "nvidia-smi calls it GPU 3" in " ".join(p.placement.reasons)


def test_load_path(tiny_model: Any) -> None:
    path = tiny_model("qwen3")
    small = plan(path, hardware=hw("H200")).load_path
    assert small.choice == "from_pretrained" and "not known to beat from_pretrained" in small.reasons[0]
    assert plan(path, hardware=hw("H200"), fast=True).load_path.choice == "fast"
    assert plan(path, hardware=hw("H200"), fast=False).load_path.choice == "from_pretrained"
    with pytest.raises(InvalidChoiceError):
        plan(path, hardware=Capabilities(), fast=True)  # no GPU: the fast path cannot do it
    q = plan(path, hardware=hw("H200", ("bitsandbytes",)), quantization="nf4")
    assert q.load_path.choice == "from_pretrained" and "not known to beat" in q.load_path.reasons[0]
    # int8/nf4 are quantized on the GPU by cudaload's quantized fast path (size permitting, or forced)
    qf = plan(path, hardware=hw("H200", ("bitsandbytes",)), quantization="nf4", fast=True).load_path
    assert qf.choice == "fast" and "bitsandbytes' own functions" in qf.reasons[0]
    assert (
        "not a local directory" in plan(full_config("Qwen3-0.6B"), hardware=hw("H200")).load_path.reasons[0]
    )


def test_json_round_trip_and_schema_keys(tiny_model: Any) -> None:
    p = plan(tiny_model("gemma2"), hardware=hw("A100-80GB", ("flash-attn", "bitsandbytes")), intent="qlora")
    assert Plan.from_json(p.to_json()) == p
    d = json.loads(p.to_json())
    for key in (
        "model",
        "hardware",
        "dtype",
        "attention",
        "quantization",
        "placement",
        "memory",
        "kernels",
        "warnings",
        "load_path",
    ):
        assert key in d
    assert {"type", "params", "layers", "head_dim"} <= set(d["model"])
    assert {"choice", "candidates"} <= set(d["attention"])
    assert d["quantization"]["method"] == "nf4"
    assert {"device_map", "devices", "offload"} <= set(d["placement"])
    assert all(isinstance(v, int) for v in d["memory"]["terms"].values())


def test_deterministic() -> None:
    a = plan(full_config("Qwen3-30B-A3B"), hardware=hw("2xA100-80GB", ("bitsandbytes",)))
    b = plan(full_config("Qwen3-30B-A3B"), hardware=hw("2xA100-80GB", ("bitsandbytes",)))
    assert a.to_json() == b.to_json()


def test_70b_plans_from_the_config_alone() -> None:
    """No weights exist: the parameter count comes from the config (speed is measured in benchmarks/)."""
    cfg = full_config("Llama-3.1-70B")
    cfg.num_hidden_layers = 81  # a config never counted before: no cache hit
    p = plan(cfg, hardware=hw("8xH100-SXM"))
    assert p.model.weights_source == "config" and 70e9 < p.model.params < 72e9
    assert len(p.placement.devices) > 1


def test_explain_mentions_choices_rejections_memory_warnings() -> None:
    p = plan(full_config("Gemma-2-9B"), hardware=hw("T4", ("bitsandbytes",)))
    text = p.explain()
    for s in (
        "dtype: float16",
        "attention: eager",
        "no sdpa",
        # eager's seq_len^2 scores at 4096 (10 bytes/element, measured 9.2 on the H200) push int8 over 14.5 GiB
        "quantization: nf4",
        "no int8",
        "kv_cache",
        "cuda_context",
        "on cuda:0",
        "warnings:",
        "overflow",
    ):
        assert s in text, s


def test_cli_plan(tiny_model: Any, capsys: pytest.CaptureFixture[str]) -> None:
    from cudaload.commands.cli import main

    path = str(Path(tiny_model("qwen3")) / "config.json")
    assert main(["plan", path, "--hardware", "H200", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["dtype"]["choice"] == "bfloat16"
    assert main(["plan", path, "--hardware", "T4", "--dtype", "bf16"]) == 2
    assert "emulates" in capsys.readouterr().err
    assert (
        main(
            [
                "plan",
                path,
                "--hardware",
                "T4",
                "--assume-installed",
                "flash-attn",
                "--attn",
                "flash_attention_2",
            ]
        )
        == 2
    )


def test_declared_single_short_sequence_picks_eager_on_gpus() -> None:
    """One sequence of at most 1024 tokens is decode-bound: eager was fastest on the H200 (1 x 512 + 32:
    eager 1.03 s, sdpa 1.07 s, FA4 1.84 s; /work/shared/device/README.md, 2026-11-30). Where measurements
    exist (the H200's shipped priors) they decide; the rule speaks for GPUs without them (an A100 here)."""
    cfg = full_config("Qwen3-8B")
    a100 = hw("A100-80GB", ("flash-attn",))
    short = plan(cfg, hardware=a100, batch_size=1, seq_len=544).attention
    assert short.choice == "eager" and short.reasons[0].startswith("declared work: 1 sequence")
    assert "1.03 s" in short.reasons[0]
    assert {c.name for c in short.candidates if c.ok} >= {"flash_attention_2", "sdpa", "eager"}
    # batched, longer, undeclared or training: sdpa (no timings, no first-use cost)
    assert plan(cfg, hardware=a100, batch_size=8, seq_len=2080).attention.choice == "sdpa"
    assert plan(cfg, hardware=a100, batch_size=1, seq_len=4096).attention.choice == "sdpa"
    h200 = hw("H200", ("flash-attn-4",))
    # measured on the H200 on first-seen lengths: the shipped priors decide there (8B: cudaload_sdpa 1.07 s,
    # eager 1.51 s, plain sdpa 2.68 s at 1 x 512 + 32; the 0.6B shape: eager)
    measured = plan(cfg, hardware=h200, batch_size=1, seq_len=544).attention
    assert measured.choice == "cudaload_sdpa" and measured.reasons[0].startswith("shipped prior: NVIDIA H200")
    small = plan(full_config("Qwen3-0.6B"), hardware=h200, batch_size=1, seq_len=544).attention
    assert small.choice == "eager" and small.reasons[0].startswith("shipped prior: NVIDIA H200")
    assert plan(cfg, hardware=h200, seq_len=544).attention.choice == "cudaload_sdpa"
    assert plan(cfg, hardware=h200, batch_size=1).attention.choice == "cudaload_sdpa"
    # training is not a generate() work: the backend measured for training there (cudaload.policies.training)
    lora = plan(cfg, hardware=h200, batch_size=1, seq_len=512, intent="lora").attention
    assert lora.choice == "flash_attention_4" and lora.reasons[0].startswith(
        "training: measured on NVIDIA H200"
    )
    explicit = plan(cfg, hardware=h200, batch_size=1, seq_len=544, attn="flash_attention_4").attention
    assert explicit.choice == "flash_attention_4" and explicit.explicit
    assert (
        plan(full_config("Qwen3-0.6B"), hardware=hw("T4"), batch_size=1, seq_len=544).attention.choice
        == "sdpa"
    )


def test_eager_chosen_on_purpose_is_not_warned_about() -> None:
    h200 = hw("H200", ("flash-attn-4",))
    short = plan(full_config("Qwen3-0.6B"), hardware=h200, batch_size=1, seq_len=544)
    assert short.attention.choice == "eager"
    assert not any("no fused backend" in w for w in short.warnings)
