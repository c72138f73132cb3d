"""Several GPUs: the parallelism decision over profiles and snapshots (pure, CPU only)."""

from __future__ import annotations

import dataclasses
import json
import warnings
from pathlib import Path
from typing import Any

import pytest

from cudaload import plan
from cudaload.capabilities import GPU, Capabilities, Distributed
from cudaload.errors import (
    ConfigurationError,
    DependencyError,
    DeviceSelectionError,
    DoesNotFitError,
    InvalidChoiceError,
)
from cudaload.model_info import model_info
from cudaload.plans.plan import Parallelism, Plan
from cudaload.policies.parallelism import (
    NCCL_BYTES,
    ParallelFacts,
    choose_parallelism,
    merge_training_arguments,
    model_facts,
    parallel_training_arguments,
)
from cudaload.profiles import hardware
from cudaload.testing import full_config

FIXTURES = Path(__file__).parent / "fixtures"
GiB = 1 << 30

#: Llama-3.1-405B's public config.json values
LLAMA_405B: dict[str, Any] = {
    "model_type": "llama",
    "vocab_size": 128256,
    "hidden_size": 16384,
    "intermediate_size": 53248,
    "num_hidden_layers": 126,
    "num_attention_heads": 128,
    "num_key_value_heads": 8,
    "max_position_embeddings": 131072,
    "rope_theta": 500000.0,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "architectures": ["LlamaForCausalLM"],
}


def torchrun(caps: Capabilities, world: int, rank: int = 0) -> Capabilities:
    """``caps`` as seen from a torchrun worker of ``world`` ranks on one node (source stays as given)."""
    return dataclasses.replace(
        caps, distributed=Distributed(local_rank=rank, rank=rank, world_size=world, local_world_size=world)
    )


def per_gpu(p: Plan, name: str | None = None) -> float:
    assert p.parallelism is not None
    v = p.parallelism.per_gpu_bytes(name)
    assert v is not None
    return v / GiB


# -- training --------------------------------------------------------------------------------------------
def test_8b_full_finetune_on_2xh200_under_torchrun_is_fsdp2() -> None:
    """The 2-GPU run bench_parallel.py part c measures: a replica with fp32 AdamW state and DDP's buckets
    does not fit one H200; sharded over two it does."""
    caps = torchrun(hardware("2xH200"), 2)
    p = plan(full_config("Qwen3-8B"), hardware=caps, intent="training", seq_len=512, batch_size=1)
    par = p.parallelism
    assert par is not None and par.choice == "fsdp2" and par.launched and par.world_size == 2
    ddp = par.decision.candidate("ddp")
    assert ddp is not None and not ddp.ok
    budget = par.budget_per_gpu
    assert budget is not None
    # 16 bytes/param (bf16 weights + grads, fp32 master + AdamW) replicated, plus a bucket copy of the grads
    assert per_gpu(p, "ddp") * GiB > budget * 0.95
    sharded = par.per_gpu["fsdp2"]
    n = p.model.params
    assert abs(sharded["sharded_state"] - n * 16 / 2) < 0.02 * n * 8
    assert 60 < per_gpu(p) < 80 and per_gpu(p) * GiB < budget
    assert sharded["nccl"] == NCCL_BYTES
    # this rank's part: the weights load onto its own GPU, the memory is the per-GPU figure on both
    assert p.placement.devices == ("cuda:0",)
    assert p.memory.per_device == {"cuda:0": sharded["total"], "cuda:1": sharded["total"]}
    ta = parallel_training_arguments(p)
    assert ta["fsdp"] is True
    cfg = ta["fsdp_config"]
    assert cfg["version"] == 2 and cfg["transformer_layer_cls_to_wrap"] == ["Qwen3DecoderLayer"]
    # FSDP checkpoints activations exactly when the per-GPU activation term assumed it (seq_len 512 fits
    # without): the plan's own checkpointing decision is the one each rank runs with
    assert p.gradient_checkpointing is not None and p.gradient_checkpointing.choice == "off"
    assert cfg["activation_checkpointing"] is False and cfg["cpu_offload"] is False
    assert p.optimizer is not None and p.optimizer.choice == par.config["optimizer"] == "adamw_torch_fused"
    assert "torchrun --nproc_per_node 2" in p.explain()


def test_small_lora_under_torchrun_is_ddp() -> None:
    caps = torchrun(hardware("2xH200"), 2, rank=1)
    p = plan(full_config("Qwen3-0.6B"), hardware=caps, intent="lora", seq_len=512, batch_size=2)
    par = p.parallelism
    assert par is not None and par.choice == "ddp"
    assert p.placement.devices == ("cuda:1",)  # rank 1 loads onto cuda:LOCAL_RANK
    terms = par.per_gpu["ddp"]
    assert terms["ddp_buckets"] == p.memory.terms.get("ddp_buckets", terms["ddp_buckets"])
    assert terms["ddp_buckets"] > 0  # the adapters' gradients, copied into DDP's buckets
    assert parallel_training_arguments(p) == {"ddp_find_unused_parameters": False}


def test_70b_full_finetune_on_8xh100_needs_offload_or_more_gpus() -> None:
    """Sharded 8 ways, 70B's fp32 AdamW state alone (16 B/param / 8 = 131 GiB) exceeds an 80 GB GPU: the
    plan says so and names what fits, before anything loads. Left to choose, the optimizer ladder fits it
    without offload (a memory-saving optimizer comes before offload, as on one process)."""
    h = hardware("8xH100-80GB")
    adamw = "adamw_torch_fused"
    with pytest.raises(DoesNotFitError) as e:
        plan(full_config("Llama-3.1-70B"), hardware=h, intent="training", seq_len=2048, optimizer=adamw)
    msg = str(e.value)
    assert "fsdp2:" in msg and "allow_offload=True" in msg and "GPUs like NVIDIA H100" in msg
    auto = plan(full_config("Llama-3.1-70B"), hardware=h, intent="training", seq_len=2048)
    assert auto.parallelism is not None and auto.parallelism.choice == "fsdp2"
    assert auto.optimizer is not None and auto.optimizer.choice not in (adamw, "adamw_torch")
    assert auto.parallelism.config["optimizer"] == auto.optimizer.choice
    assert per_gpu(auto) * GiB < (auto.parallelism.budget_per_gpu or 0)
    p = plan(
        full_config("Llama-3.1-70B"),
        hardware=h,
        intent="training",
        seq_len=2048,
        allow_offload=True,
        optimizer=adamw,
    )
    par = p.parallelism
    assert par is not None and par.choice == "fsdp2_offload" and not par.launched
    assert per_gpu(p) * GiB < (par.budget_per_gpu or 0)
    assert per_gpu(p, "fsdp2") > 80  # sharded but not offloaded: over the card
    cfg = parallel_training_arguments(p)["fsdp_config"]
    assert cfg["cpu_offload"] is True and cfg["transformer_layer_cls_to_wrap"] == ["LlamaDecoderLayer"]
    # bf16 weights (141 GB) fit no GPU whole: every rank loads on its CPU (all but local rank 0 then hold zeros
    # on 5.17-5.22), the Trainer puts each rank's shard on its own GPU
    assert cfg["cpu_ram_efficient_loading"] is True and p.placement.devices == ("cpu",)
    assert par.config["weights_on_cpu"] is True
    assert "torchrun --nproc_per_node 8" in p.explain()


def test_70b_full_finetune_on_16xh100_is_fsdp2_without_offload() -> None:
    p = plan(full_config("Llama-3.1-70B"), hardware=hardware("24xH100-80GB"), intent="training", seq_len=2048)
    par = p.parallelism
    assert par is not None and par.choice == "fsdp2"
    assert per_gpu(p) < 78


def test_70b_lora_on_8xh100_shards_the_frozen_base() -> None:
    p = plan(full_config("Llama-3.1-70B"), hardware=hardware("8xH100-80GB"), intent="lora", seq_len=2048)
    par = p.parallelism
    assert par is not None and par.choice == "fsdp2"
    assert per_gpu(p, "ddp") > 130  # a bf16 replica of 70B alone is 131 GiB
    assert 20 < per_gpu(p) < 60
    assert par.per_gpu["fsdp2"]["sharded_state"] < par.per_gpu["ddp"]["model_state"] / 7


def test_qlora_under_fsdp_stores_4bit_as_bf16() -> None:
    """70B in nf4 (~37 GiB) fits no 24 GB L4 whole: QLoRA is sharded, and bitsandbytes must store the 4-bit
    weights as bf16 for FSDP to shard them."""
    caps = torchrun(hardware("8xL4"), 8).with_packages(["bitsandbytes"])
    p = plan(full_config("Llama-3.1-70B"), hardware=caps, intent="qlora", seq_len=1024)
    par = p.parallelism
    assert par is not None and par.choice == "fsdp2"
    assert p.quantization.choice == "nf4" and p.quantization_config is not None
    assert p.quantization_config["bnb_4bit_quant_storage"] == "bfloat16"
    assert p.quantization_config["bnb_4bit_quant_type"] == "nf4"
    assert any("bnb_4bit_quant_storage" in r for r in par.decision.reasons)
    # on H100s a 4-bit replica fits with checkpointing (as peft's QLoRA recipe runs it): DDP, and the storage
    # stays bitsandbytes' default (without checkpointing it does not, and FSDP2 shards instead)
    big = plan(
        full_config("Llama-3.1-70B"),
        hardware=torchrun(hardware("8xH100-80GB"), 8).with_packages(["bitsandbytes"]),
        intent="qlora",
        seq_len=1024,
        gradient_checkpointing=True,
    )
    assert big.parallelism is not None and big.parallelism.choice == "ddp"
    assert big.quantization_config is not None and "bnb_4bit_quant_storage" not in big.quantization_config
    with pytest.raises(DoesNotFitError, match="does not fit"):
        plan(full_config("Llama-3.1-70B"), hardware=caps, intent="qlora", seq_len=1024, parallelism="ddp")


def test_deepspeed_is_planned_when_assumed_and_explained() -> None:
    h = torchrun(hardware("2xH200"), 2)
    cfg = full_config("Qwen3-8B")
    auto = plan(cfg, hardware=h, intent="training", seq_len=512, assume_installed=["deepspeed"])
    assert auto.parallelism is not None and auto.parallelism.choice == "fsdp2"  # native unless asked for
    z2 = auto.parallelism.decision.candidate("deepspeed_zero2")
    assert z2 is not None and z2.ok
    alt = auto.parallelism.config["deepspeed_alternative"]
    assert alt["strategy"] == "deepspeed_zero2" and alt["config"]["zero_optimization"]["stage"] == 2
    assert "DeepSpeed instead (deepspeed_zero2)" in auto.explain()
    ds = plan(
        cfg,
        hardware=h,
        intent="training",
        seq_len=512,
        assume_installed=["deepspeed"],
        parallelism="deepspeed",
    )
    assert ds.parallelism is not None and ds.parallelism.choice == "deepspeed_zero2"
    conf = ds.parallelism.config["deepspeed_config"]
    assert conf["zero_optimization"]["stage"] == 2
    assert parallel_training_arguments(ds) == {"deepspeed": conf}
    off = plan(
        full_config("Llama-3.1-70B"),
        hardware=hardware("8xH100-80GB"),
        intent="training",
        seq_len=2048,
        allow_offload=True,
        assume_installed=["deepspeed"],
        parallelism="deepspeed",
        optimizer="adamw_torch_fused",  # fp32 AdamW states: only offloaded do they fit (auto picks Adafactor)
    )
    assert off.parallelism is not None and off.parallelism.choice == "deepspeed_zero3_offload"
    z = off.parallelism.config["deepspeed_config"]["zero_optimization"]
    assert (
        z["stage"] == 3
        and z["offload_optimizer"]["device"] == "cpu"
        and z["offload_param"]["device"] == "cpu"
    )
    with pytest.raises(DependencyError, match="deepspeed"):
        plan(cfg, hardware=h, intent="training", seq_len=512, parallelism="deepspeed")
    no = auto.parallelism.decision.candidate("deepspeed_zero3")
    plain = plan(cfg, hardware=h, intent="training", seq_len=512)
    assert plain.parallelism is not None
    z3 = plain.parallelism.decision.candidate("deepspeed_zero3")
    assert "deepspeed_alternative" not in plain.parallelism.config
    assert (
        no is not None
        and z3 is not None
        and not z3.ok
        and "deepspeed is not installed" in " ".join(z3.reasons)
    )


# -- inference -------------------------------------------------------------------------------------------
def test_405b_inference_on_8xh100_is_tp8_with_fp8() -> None:
    p = plan(LLAMA_405B, hardware=hardware("8xH100-80GB"), seq_len=4096)
    par = p.parallelism
    assert par is not None and par.choice == "tp_fp8" and par.world_size == 8
    assert per_gpu(p, "tp") > 80  # bf16 shards: 101 GB per GPU
    assert 45 < per_gpu(p) < 70
    assert par.config["quantization_config"]["quant_method"] == "fp8"
    assert par.config["from_pretrained"]["distributed_config"] == {"tp_plan": "auto", "tp_size": 8}
    assert "torchrun --nproc_per_node 8" in p.explain()
    # nothing fits one process without bitsandbytes: this process's part is its TP shard
    assert p.placement.devices == ("cuda:0",) and len(p.memory.per_device) == 8


def test_405b_on_8xa100_has_no_fp8_so_no_tp() -> None:
    caps = hardware("8xA100-80GB").with_packages(["bitsandbytes"])
    p = plan(LLAMA_405B, hardware=caps, seq_len=4096)
    par = p.parallelism
    assert par is not None and par.choice == "layer_split"
    fp8 = par.decision.candidate("tp_fp8")
    tp = par.decision.candidate("tp")
    assert fp8 is not None and not fp8.ok and "no fp8" in " ".join(fp8.reasons)
    assert tp is not None and not tp.ok
    assert p.quantization.choice == "int8"


def test_bitsandbytes_weights_are_not_tensor_parallel() -> None:
    info = model_info(full_config("Llama-3.1-70B"))
    caps = torchrun(hardware("4xA100-80GB"), 4)
    par = choose_parallelism(
        info, caps, intent="inference", dtype="bfloat16", quantization="int8", seq_len=2048, batch_size=1,
        facts=model_facts(info), single_fits=False,
    )  # fmt: skip
    assert par is not None
    tp = par.decision.candidate("tp")
    assert tp is not None and not tp.ok and "update_tp_plan" in " ".join(tp.reasons)


def test_70b_under_torchrun_on_4xh100_is_tp_unquantized() -> None:
    """Under torchrun a model one GPU cannot hold is tensor-parallel in bf16, not quantized to int8 per rank."""
    caps = torchrun(hardware("4xH100-80GB"), 4, rank=2).with_packages(["bitsandbytes"])
    p = plan(full_config("Llama-3.1-70B"), hardware=caps, seq_len=4096)
    par = p.parallelism
    assert par is not None and par.choice == "tp"
    assert p.quantization.choice is None and p.quantization_config is None
    assert "tensor parallel" in p.quantization.reasons[0]
    assert p.placement.devices == ("cuda:2",)
    assert 35 < per_gpu(p) < 45


def test_fits_one_gpu_every_rank_its_own_replica_unless_latency_is_asked() -> None:
    caps = torchrun(hardware("2xH200"), 2)
    p = plan(full_config("Qwen3-8B"), hardware=caps, seq_len=2048)
    assert p.parallelism is not None and p.parallelism.choice == "single"
    fast = plan(full_config("Qwen3-8B"), hardware=caps, seq_len=2048, lower_latency=True)
    assert fast.parallelism is not None and fast.parallelism.choice == "tp"
    assert per_gpu(fast) < per_gpu(p)


def test_one_process_on_several_gpus_splits_layers_and_says_how_to_launch() -> None:
    caps = Capabilities.from_json((FIXTURES / "h200.json").read_text())
    g = dataclasses.replace(caps.gpus[0], total_memory=80 * GiB, free_memory=78 * GiB)
    two = dataclasses.replace(caps, gpus=(g, dataclasses.replace(g, index=1, nvml_index=1)))
    p = plan(full_config("Llama-3.1-70B"), hardware=two, seq_len=4096, quantization="none")
    par = p.parallelism
    assert par is not None and par.choice == "layer_split" and not par.launched
    tp = par.decision.candidate("tp")
    assert tp is not None and tp.ok  # possible, with torchrun
    assert p.placement.devices == ("cuda:0", "cuda:1")  # unchanged: the fit ladder's split


def test_one_gpu_has_no_parallelism() -> None:
    caps = Capabilities.from_json((FIXTURES / "h200.json").read_text())
    p = plan(full_config("Qwen3-8B"), hardware=caps)
    assert p.parallelism is None
    assert "parallelism" not in p.explain()
    assert json.loads(p.to_json())["parallelism"] is None


# -- bad input before any weights move -------------------------------------------------------------------
def test_tp_world_size_must_divide_the_heads() -> None:
    caps = torchrun(hardware("3xH100-80GB"), 3)
    with pytest.raises(ConfigurationError) as e:
        plan(full_config("Llama-3.1-70B"), hardware=caps, seq_len=4096, quantization="none")
    msg = str(e.value)
    assert "64 attention heads and 8 KV heads" in msg and "--nproc_per_node in {1, 2, 4, 8}" in msg
    with pytest.raises(ConfigurationError, match="not divisible by 3"):
        plan(full_config("Qwen3-8B"), hardware=caps, seq_len=512, parallelism="tp")


def test_nccl_missing_is_an_error_naming_the_fix() -> None:
    info = model_info(full_config("Qwen3-0.6B"))
    caps = torchrun(hardware("2xH200"), 2)
    kw: dict[str, Any] = dict(intent="lora", dtype="bfloat16", quantization=None, seq_len=512, batch_size=1)
    with pytest.raises(DependencyError) as e:
        choose_parallelism(info, caps, nccl=False, **kw)
    assert "is_nccl_available" in str(e.value) and "pytorch.org" in (e.value.fix or "")
    assert choose_parallelism(info, caps, nccl=True, **kw) is not None


def test_mixed_gpu_models_across_ranks() -> None:
    caps = torchrun(Capabilities.from_json((FIXTURES / "mixed_4090_3090.json").read_text()), 2)
    with pytest.raises(DeviceSelectionError) as e:
        plan(full_config("Qwen3-0.6B"), hardware=caps, intent="lora", seq_len=512)
    msg = str(e.value)
    uuid = caps.gpus[0].uuid
    assert "RTX 4090" in msg and "RTX 3090" in msg
    assert f"CUDA_VISIBLE_DEVICES={uuid} torchrun --nproc_per_node 1" in (e.value.fix or "")
    # the same GPUs in one process are fine: a layer split may mix models
    one = plan(full_config("Qwen3-0.6B"), hardware=dataclasses.replace(caps, distributed=Distributed()))
    assert one.parallelism is not None and one.parallelism.choice == "single"


def test_a_rank_whose_gpu_is_already_full() -> None:
    h = torchrun(hardware("2xH200"), 2)
    busy = dataclasses.replace(h.gpus[1], free_memory=2 * GiB)
    caps = dataclasses.replace(h, gpus=(h.gpus[0], busy))
    with pytest.raises(DoesNotFitError) as e:
        plan(full_config("Qwen3-8B"), hardware=caps, intent="lora", seq_len=512)
    msg = str(e.value)
    assert "cuda:1" in msg and "2.0 GiB free" in msg and "already held by other processes" in msg
    assert "CUDA_VISIBLE_DEVICES" in (e.value.fix or "")


def test_strategy_requests_are_checked() -> None:
    caps = torchrun(hardware("2xH200"), 2)
    with pytest.raises(InvalidChoiceError):
        plan(full_config("Qwen3-0.6B"), hardware=caps, intent="lora", parallelism="tp")
    with pytest.raises(InvalidChoiceError):
        plan(full_config("Qwen3-0.6B"), hardware=caps, parallelism="fsdp2")
    with pytest.raises(InvalidChoiceError, match="one process"):
        plan(full_config("Qwen3-0.6B"), hardware=caps, parallelism="layer_split")
    with pytest.raises(ConfigurationError, match="not a valid parallelism"):
        plan(full_config("Qwen3-0.6B"), hardware=caps, parallelism="zero")
    forced = plan(full_config("Qwen3-0.6B"), hardware=caps, intent="lora", parallelism="fsdp2")
    assert forced.parallelism is not None and forced.parallelism.choice == "fsdp2"
    assert forced.parallelism.decision.explicit


# -- facts, serialisation, TrainingArguments -------------------------------------------------------------
def test_model_facts_come_from_the_classes() -> None:
    f = model_facts(model_info(full_config("Qwen3-8B")))
    assert f.decoder_layer_class == "Qwen3DecoderLayer" and f.head_tp
    assert "layers.*.self_attn.q_proj" in f.tp_plan
    assert model_facts(model_info(full_config("Llama-3.1-70B"))).decoder_layer_class == "LlamaDecoderLayer"
    # no tp plan: tensor parallelism is rejected with the reason
    info = model_info(full_config("Llama-3.1-70B"))
    par = choose_parallelism(
        info, torchrun(hardware("4xH100-80GB"), 4), intent="inference", dtype="bfloat16", quantization=None,
        seq_len=1024, batch_size=1, facts=ParallelFacts(decoder_layer_class="X"), single_fits=False,
    )  # fmt: skip
    assert par is not None
    tp = par.decision.candidate("tp")
    assert tp is not None and not tp.ok and "base_model_tp_plan" in " ".join(tp.reasons)


@pytest.mark.parametrize(
    ("cfg", "hw", "kw"),
    [
        ("Qwen3-8B", "2xH200", {"intent": "training", "seq_len": 512}),
        ("Llama-3.1-70B", "8xH100-80GB", {"intent": "lora", "seq_len": 2048}),
        ("Qwen3-0.6B", "2xH200", {"intent": "lora"}),
    ],
)
def test_plan_json_round_trip_with_parallelism(cfg: str, hw: str, kw: dict[str, Any]) -> None:
    p = plan(full_config(cfg), hardware=torchrun(hardware(hw), int(hw.split("x")[0])), **kw)
    assert p.parallelism is not None
    back = Plan.from_json(p.to_json())
    assert back == p
    assert back.parallelism == p.parallelism
    d = json.loads(p.to_json())["parallelism"]
    chosen = next(c for c in d["candidates"] if c["name"] == d["choice"])
    assert chosen["per_gpu_bytes"] == p.parallelism.per_gpu_bytes()
    assert Parallelism.from_dict(d) == p.parallelism


def test_fsdp_training_arguments_build_without_deprecations(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """What transformers (installed) accepts: fsdp=True + fsdp_config, nothing deprecated; gradient
    checkpointing dropped in favour of FSDP's activation checkpointing."""
    import transformers

    from cudaload import training_arguments

    p = plan(
        full_config("Qwen3-8B"), hardware=torchrun(hardware("2xH200"), 2), intent="training", seq_len=512
    )
    merged = merge_training_arguments(training_arguments(p), p)
    assert merged == training_arguments(p)  # training_arguments() merges them already (under torchrun)
    assert "gradient_checkpointing" not in merged and "gradient_checkpointing_kwargs" not in merged
    assert merged["fsdp"] is True and not isinstance(merged["fsdp"], str)
    for k in ("bf16", "tf32", "optim"):  # the rest of training_arguments is kept
        merged.pop(k, None)
    transformers.utils.logging.enable_propagation()  # transformers warns through logging as well
    try:
        with warnings.catch_warnings(record=True) as seen, caplog.at_level("WARNING"):
            warnings.simplefilter("always")
            args = transformers.TrainingArguments(output_dir=str(tmp_path), use_cpu=True, **merged)
    finally:
        transformers.utils.logging.disable_propagation()
    assert args.fsdp_config["version"] == 2
    assert args.fsdp_config["transformer_layer_cls_to_wrap"] == ["Qwen3DecoderLayer"]
    said = [str(w.message) for w in seen] + [r.getMessage() for r in caplog.records]
    ours = ("fsdp", "checkpointing", "ddp", "tp_plan")
    dep = [m for m in said if "deprecat" in m.lower() and any(k in m.lower() for k in ours)]
    assert not dep
    # the check can fail: the legacy string form is reported as deprecated by this transformers
    if tuple(int(x) for x in transformers.__version__.split(".")[:2]) < (5, 20):
        caplog.clear()
        transformers.utils.logging.enable_propagation()
        try:
            with caplog.at_level("WARNING"):
                transformers.TrainingArguments(
                    output_dir=str(tmp_path),
                    use_cpu=True,
                    fsdp="full_shard auto_wrap",
                    fsdp_config={"version": 2},
                )
        finally:
            transformers.utils.logging.disable_propagation()
        assert any("deprecated" in r.getMessage() and "fsdp" in r.getMessage() for r in caplog.records)


def test_ddp_training_arguments_are_accepted(tmp_path: Path) -> None:
    import transformers

    p = plan(full_config("Qwen3-0.6B"), hardware=torchrun(hardware("2xH200"), 2), intent="lora")
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path), use_cpu=True, **parallel_training_arguments(p)
    )
    assert args.ddp_find_unused_parameters is False


def test_explain_shows_every_candidate_with_per_gpu_numbers() -> None:
    p = plan(
        full_config("Qwen3-8B"), hardware=torchrun(hardware("2xH200"), 2), intent="training", seq_len=512
    )
    text = p.explain()
    assert "parallelism: fsdp2 (2 GPUs, launched under torchrun)" in text
    for name in ("ddp", "fsdp2", "fsdp2_offload", "deepspeed_zero2", "deepspeed_zero3"):
        assert f"{name}: " in text
    assert "GiB/GPU" in text and "fsdp=True" in text and "launch: torchrun --nproc_per_node 2" in text


def test_gpu_identity_helpers() -> None:
    # the profiles the decisions above use exist as composed names
    assert len(hardware("8xH100-80GB").gpus) == 8
    assert isinstance(hardware("2xH200").gpus[0], GPU)


def test_one_process_on_several_gpus_training_is_told_how_to_launch() -> None:
    caps = Capabilities.from_json((FIXTURES / "h200.json").read_text())
    g = dataclasses.replace(caps.gpus[0], total_memory=80 * GiB, free_memory=78 * GiB)
    four = dataclasses.replace(
        caps, gpus=tuple(dataclasses.replace(g, index=i, nvml_index=i) for i in range(4))
    )
    p = plan(full_config("Llama-3.1-70B"), hardware=four, intent="lora", seq_len=1024)
    par = p.parallelism
    # this process can only split layers (one GPU busy at a time); the plan says how 4 processes would run
    assert par is not None and par.choice == "fsdp2" and not par.launched
    assert len(p.placement.devices) == 4 and p.placement.device_map == "balanced"
    assert par.launch == "torchrun --nproc_per_node 4 your_script.py"
    assert any("launch one process per GPU" in r for r in par.decision.reasons)
    two = dataclasses.replace(four, gpus=four.gpus[:2])
    # two such GPUs hold it split in this one process at seq_len 4096 but not sharded over 2 ranks: the
    # layer split stands (no error), and the parallelism says why no multi-process strategy is chosen
    split = plan(full_config("Llama-3.1-70B"), hardware=two, intent="lora", seq_len=4096)
    assert split.parallelism is not None and split.parallelism.choice is None
    assert split.placement.devices == ("cuda:0", "cuda:1")
    assert any("no multi-process strategy fits" in r for r in split.parallelism.decision.reasons)
    # longer, neither fits: the error says how many GPUs would
    with pytest.raises(DoesNotFitError, match="3 GPUs like NVIDIA H200 with FSDP2"):
        plan(full_config("Llama-3.1-70B"), hardware=two, intent="lora", seq_len=8192)


def test_torchrun_on_cpus_has_no_gpu_parallelism() -> None:
    """Ranks on CPUs (gloo) each hold a replica; there are no GPUs to share."""
    caps = torchrun(Capabilities(source="detected", host_memory=64 << 30), 2)
    p = plan(full_config("Qwen3-0.6B"), hardware=caps, intent="lora", seq_len=128)
    assert p.parallelism is None and p.placement.devices == ("cpu",)
    with pytest.raises(ConfigurationError, match="needs GPUs"):
        plan(full_config("Qwen3-0.6B"), hardware=caps, intent="lora", seq_len=128, parallelism="fsdp2")


# -- benchmarks/bench_parallel.py ------------------------------------------------------------------------
def _bench() -> Any:
    import importlib.util
    import sys

    path = Path(__file__).parent.parent / "benchmarks" / "bench_parallel.py"
    spec = importlib.util.spec_from_file_location("bench_parallel", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["bench_parallel"] = mod
    spec.loader.exec_module(mod)
    return mod


def test_bench_compares_the_allocator_peak_with_the_plans_allocator_part() -> None:
    bench = _bench()
    p = plan(
        full_config("Qwen3-8B"), hardware=torchrun(hardware("2xH200"), 2), intent="training", seq_len=512
    )
    assert p.parallelism is not None
    summary = {"parallelism": p.parallelism.to_dict(), "memory_total": p.memory.total}
    terms = p.parallelism.per_gpu["fsdp2"]
    assert bench._planned_per_gpu(summary) == terms["total"]
    assert bench._planned_allocated(summary) == terms["total"] - terms["cuda_context"] - terms["nccl"]
    res = {
        "meta": {"date": "d", "smoke": False, "budget_s": 300},
        "parts": {
            "c": {
                "world_size": 2, "batch_size_per_rank": 1, "seq_len": 512, "steps": 10, "loss_first": 12.0,
                "loss_last": 11.0, "loss_down": True, "step_s_median": 0.5, "step_s_spread": [0.4, 0.6],
                "plan": summary,
                "ranks": [{"rank": r, "memory": {"device": f"cuda:{r}", "peak_allocated": 70 * GiB}} for r in (0, 1)],
            }
        },
    }  # fmt: skip
    md = bench.render_markdown(res)
    ratio = 70 * GiB / bench._planned_allocated(summary)
    assert f"| {ratio:.3g} |" in md and "plan.parallelism.choice = fsdp2" in md


@pytest.mark.slow
def test_bench_parallel_smoke_runs_on_this_cpu(tmp_path: Path) -> None:
    """torchrun with 2 gloo processes: DDP LoRA and FSDP2 train (loss goes down), TP logits match one process."""
    import subprocess
    import sys

    root = Path(__file__).parent.parent
    out = tmp_path / "out"
    r = subprocess.run(
        [sys.executable, str(root / "benchmarks" / "bench_parallel.py"), "--smoke", "--out", str(out),
         "--work", str(tmp_path / "work"), "--parts", "a,c,d,e", "--budget-s", "240"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    res = json.loads((out / "results.json").read_text())
    a, c, d = (res["parts"][k] for k in "acd")
    assert "error" not in a and a["loss_down"] and a["plan"]["parallelism"]["choice"] == "ddp"
    assert "error" not in c and c["loss_down"] and len(c["ranks"]) == 2
    # each rank held half the parameters (FSDP2 shards of the same model)
    assert sum(rk["local_params"] for rk in c["ranks"]) == c["parameters"]
    assert "error" not in d and d["logits"]["within_bf16_tolerance"]
    assert "skipped" in res["parts"]["e"]
    assert (out / "results.md").read_text().startswith("# Several GPUs")


def test_training_arguments_merge_the_parallel_settings() -> None:
    """training_arguments(plan) carries the parallelism's settings for the ranks (torchrun, or a profile),
    with the checkpointing and optimizer each rank was planned with; a process on this machine outside
    torchrun gets its own placement's arguments."""
    from cudaload import training_arguments

    p = plan(full_config("Llama-3.1-70B"), hardware=hardware("8xH100-80GB"), intent="lora", seq_len=2048)
    par = p.parallelism
    assert par is not None and par.choice == "fsdp2"
    # one process splitting the layers keeps its activations spread; a rank holds all of its batch's
    assert p.gradient_checkpointing is not None and p.gradient_checkpointing.choice == "off"
    assert par.config["gradient_checkpointing"] is True
    args = training_arguments(p)
    assert args["fsdp"] is True and args["fsdp_config"]["activation_checkpointing"] is True
    assert not any(k.endswith("checkpointing") for k in args)
    assert args["optim"] == par.config["optimizer"]
    # DDP: model-level checkpointing as the ranks were planned
    small = plan(full_config("Qwen3-0.6B"), hardware=torchrun(hardware("2xH200"), 2), intent="lora")
    assert small.parallelism is not None and small.parallelism.choice == "ddp"
    a = training_arguments(small)
    name = "activation_checkpointing" if "activation_checkpointing" in a else "gradient_checkpointing"
    assert a[name] is small.parallelism.config["gradient_checkpointing"]
    assert a["ddp_find_unused_parameters"] is False
    # outside torchrun on this machine: the layer split runs, nothing distributed is passed
    caps = Capabilities.from_json((FIXTURES / "h200.json").read_text())
    g = dataclasses.replace(caps.gpus[0], total_memory=80 * GiB, free_memory=78 * GiB)
    four = dataclasses.replace(
        caps, gpus=tuple(dataclasses.replace(g, index=i, nvml_index=i) for i in range(4))
    )
    here = plan(full_config("Llama-3.1-70B"), hardware=four, intent="lora", seq_len=1024)
    assert here.parallelism is not None and here.parallelism.choice == "fsdp2"
    assert "fsdp" not in training_arguments(here)


def test_tp_under_torchrun_loads_through_from_pretrained_with_its_distributed_config() -> None:
    """What load_model hands transformers for a tensor-parallel rank: no device_map (transformers places the
    shards), DistributedConfig(tp_plan='auto', tp_size=N), and from_pretrained, never the fast path."""
    from cudaload.execute.from_pretrained import _load_kwargs

    caps = torchrun(hardware("4xH100-80GB"), 4, rank=2).with_packages(["bitsandbytes"])
    p = plan(full_config("Llama-3.1-70B"), hardware=caps, seq_len=4096)
    assert p.parallelism is not None and p.parallelism.choice == "tp" and p.parallelism.launched
    assert p.load_path.choice == "from_pretrained" and "tensor parallel" in p.load_path.reasons[0]
    kw = _load_kwargs(p, {})
    assert "device_map" not in kw and "max_memory" not in kw and "quantization_config" not in kw
    dc = kw["distributed_config"]
    assert dc.tp_plan == "auto" and dc.tp_size == 4
    # the same model without torchrun: a layer split in one process, with its device_map
    one = plan(full_config("Llama-3.1-70B"), hardware=hardware("4xH100-80GB"), seq_len=4096)
    assert "distributed_config" not in _load_kwargs(one, {})


def test_tp_fp8_rank_gets_transformers_fp8_config() -> None:
    from transformers import FineGrainedFP8Config

    from cudaload.execute.from_pretrained import _load_kwargs

    p = plan(LLAMA_405B, hardware=torchrun(hardware("8xH100-80GB"), 8, rank=5), seq_len=4096)
    assert p.parallelism is not None and p.parallelism.choice == "tp_fp8" and p.parallelism.launched
    kw = _load_kwargs(p, {})
    assert isinstance(kw["quantization_config"], FineGrainedFP8Config)
    assert kw["quantization_config"].weight_block_size == [128, 128] and kw["distributed_config"].tp_size == 8


def test_fsdp_rank_with_weights_too_big_for_a_gpu_loads_on_cpu_through_from_pretrained() -> None:
    """70B full fine-tune under torchrun on 8 x H100: bf16 weights (141 GB) fit no GPU whole, so no rank may load
    them onto its GPU; each rank loads on the CPU through from_pretrained and the Trainer shards them
    (fsdp_config cpu_ram_efficient_loading)."""
    from cudaload.execute.from_pretrained import _load_kwargs
    from cudaload.execute.sharded import fsdp_weights_on_cpu

    p = plan(
        full_config("Llama-3.1-70B"),
        hardware=torchrun(hardware("8xH100-80GB"), 8, rank=3),
        intent="training",
        seq_len=2048,
    )
    par = p.parallelism
    assert par is not None and par.choice == "fsdp2" and par.launched and par.config["weights_on_cpu"]
    assert p.placement.devices == ("cpu",) and "every rank loads them on its CPU" in p.placement.reasons[0]
    assert p.load_path.choice == "from_pretrained" and "each rank's CPU" in p.load_path.reasons[0]
    assert _load_kwargs(p, {})["device_map"] == "cpu" and fsdp_weights_on_cpu(p)
    assert parallel_training_arguments(p)["fsdp_config"]["cpu_ram_efficient_loading"] is True
    # 8B on 2 x H200 fits each GPU whole: every rank loads onto its own GPU, by the fast path where it can
    small = plan(full_config("Qwen3-8B"), hardware=torchrun(hardware("2xH200"), 2, rank=1), intent="training")
    assert small.placement.devices == ("cuda:1",) and not fsdp_weights_on_cpu(small)


def test_cpu_staged_fsdp_states_the_host_memory_it_needs() -> None:
    """Every rank of the node holds the weights on its CPU and accelerate upcasts the trainable ones to fp32
    before sharding: 8 ranks x 70.6 G params x 4 B = ~2.1 TiB for a 70B full fine-tune. Stated where the host
    has room, named as a reason (with the fixes) where it has not."""
    caps = torchrun(hardware("8xH100-80GB"), 8, rank=0)
    big = dataclasses.replace(caps, host_memory=4 << 40)
    p = plan(full_config("Llama-3.1-70B"), hardware=big, intent="training", seq_len=2048)
    par = p.parallelism
    assert par is not None and par.config["weights_on_cpu"]
    n = p.model.params
    assert par.config["host_bytes_per_node"] == 8 * 4 * n
    stated = [r for r in par.decision.reasons if "host memory while the Trainer shards" in r]
    assert len(stated) == 1 and "this host has" not in stated[0]
    small = dataclasses.replace(caps, host_memory=1 << 40)
    q = plan(full_config("Llama-3.1-70B"), hardware=small, intent="training", seq_len=2048)
    assert q.parallelism is not None
    text = " ".join(q.parallelism.decision.reasons)
    assert "this host has 1024" in text and "fewer ranks per node" in text


def test_cpu_staged_fsdp_names_no_host_memory_fix_that_changes_nothing() -> None:
    """Loading in float32 puts 4 bytes per parameter on every rank's CPU, as accelerate's upcast of bf16 does:
    the plan's own number does not move, so the host-memory refusal must not offer it as a fix."""
    caps = dataclasses.replace(torchrun(hardware("8xH100-80GB"), 8, rank=0), host_memory=1 << 40)
    kw: dict[str, Any] = dict(hardware=caps, intent="training", seq_len=2048, allow_offload=True)
    bf16 = plan(full_config("Llama-3.1-70B"), **kw).parallelism
    fp32 = plan(full_config("Llama-3.1-70B"), dtype="float32", **kw).parallelism
    assert bf16 is not None and fp32 is not None
    assert bf16.config["host_bytes_per_node"] == fp32.config["host_bytes_per_node"]
    text = " ".join(bf16.decision.reasons)
    assert "this host has 1024" in text and "fewer ranks per node" in text
    assert "dtype='float32'" not in text


def _load_model_staged_worker(rank: int, world: int, port: int, path: str, gpu_bytes: int, out: str) -> None:
    import json
    import os

    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_RANK=str(rank),
    )
    import cudaload

    caps = _small_gpus(rank, world, gpu_bytes)
    import torch
    import torch.distributed as dist

    fsdp_vars = ("ACCELERATE_USE_FSDP", "FSDP_CPU_RAM_EFFICIENT_LOADING")
    before = [os.environ.get(k) for k in fsdp_vars]  # a TrainingArguments earlier in pytest may have set one
    # fast=False: the whole-model CPU load (the fast path's sharded FSDP2 load is tests/test_sharded_load.py's)
    model = cudaload.load_model(
        path, hardware=caps, intent="training", seq_len=64, allow_offload=True, prefetch=False, fast=False
    )
    p = model.cudaload_plan
    torch.save({k: v.detach().clone() for k, v in model.state_dict().items()}, f"{out}/load{rank}.pt")
    res = {
        "devices": list(p.placement.devices),
        "verified_devices": p.verified["devices"],
        "notes": p.verified["notes"],
        "probe": p.verified["phases"].get("probe"),
        "group": dist.is_available() and dist.is_initialized(),
        "env_unchanged": [os.environ.get(k) for k in fsdp_vars] == before,
    }
    with open(f"{out}/load{rank}.json", "w") as fh:
        json.dump(res, fh)


def _small_gpus(rank: int, world: int, gpu_bytes: int) -> Capabilities:
    """2 x H200 shrunk to ``gpu_bytes`` each, as a torchrun rank sees them (a recorded machine, not a profile)."""
    caps = torchrun(hardware("2xH200"), world, rank=rank)
    gpus = tuple(dataclasses.replace(g, total_memory=gpu_bytes, free_memory=gpu_bytes) for g in caps.gpus)
    return dataclasses.replace(caps, gpus=gpus, source="snapshot:small-gpus")


@pytest.mark.slow
def test_load_model_under_torchrun_stages_on_the_cpu_and_verifies(tmp_path: Path) -> None:
    """The whole load_model on two torchrun-like ranks for a plan whose weights (300 M params, bf16) fit no GPU
    whole: each rank loads through from_pretrained on its CPU, every rank holds the checkpoint's weights (never
    transformers' 5.17-5.22 zeros, which a Trainer without cpu_ram_efficient_loading would shard and train), the
    probe is skipped, verify() accepts the CPU-placed model, and load_model creates no process group and sets
    no FSDP variables."""
    import json
    import socket

    import torch
    import torch.multiprocessing as mp
    import transformers

    from cudaload.testing.models import make_tokenizer

    cfg = transformers.Qwen3Config(
        vocab_size=1024,
        hidden_size=512,
        intermediate_size=1536,
        num_hidden_layers=96,
        num_attention_heads=8,
        num_key_value_heads=4,
        head_dim=64,
        max_position_embeddings=512,
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    path = tmp_path / "model"
    transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).save_pretrained(path)
    make_tokenizer(1024).save_pretrained(path)
    gpu_bytes = 1300 * 10**6
    p = plan(
        str(path), hardware=_small_gpus(0, 2, gpu_bytes), intent="training", seq_len=64, allow_offload=True
    )
    assert p.parallelism is not None and p.parallelism.config.get("weights_on_cpu")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(
        _load_model_staged_worker, args=(2, port, str(path), gpu_bytes, str(tmp_path)), nprocs=2, join=True
    )
    from safetensors.torch import load_file

    ck: dict[str, Any] = {}
    for f in sorted(path.glob("*.safetensors")):
        ck.update(load_file(str(f)))
    for r in range(2):
        res = json.loads((tmp_path / f"load{r}.json").read_text())
        assert res["devices"] == ["cpu"] and res["verified_devices"] == ["cpu"]
        assert res["group"] is False and res["env_unchanged"]
        assert any("loaded them on its CPU (every rank holds them)" in n for n in res["notes"])
        w = torch.load(tmp_path / f"load{r}.pt")
        for k, v in ck.items():
            assert torch.equal(w[k], v), (r, k)
