"""The training memory model term by term (issue 15): optimizers, gradient checkpointing, the fp32 loss,
eager scores, QLoRA's fp32 upcast, MoE experts per layer, and the fit boundary against published runs."""

from __future__ import annotations

from typing import Any

import pytest

import cudaload
from cudaload.capabilities import GPU, Capabilities
from cudaload.errors import DoesNotFitError, InvalidChoiceError
from cudaload.model_info import model_info
from cudaload.planner import plan
from cudaload.plans.training import StepShape
from cudaload.policies import memory as M
from cudaload.policies.memory import activations as MA  # where training_activations reads its constants
from cudaload.policies.memory import breakdown, estimate, param_split
from cudaload.policies.quantization import fit
from cudaload.profiles import hardware
from cudaload.testing import full_config

GiB = 1 << 30
Q8 = model_info(full_config("Qwen3-8B"))
Q06 = model_info(full_config("Qwen3-0.6B"))


def est(info: Any = Q8, **kw: Any) -> dict[str, int]:
    args: dict[str, Any] = {
        "dtype": "bfloat16",
        "quantization": None,
        "intent": "lora",
        "seq_len": 2048,
        "batch_size": 1,
    }
    args.update(kw)
    return estimate(info, **args)


def mixtral() -> Any:
    return full_config("Mixtral-8x7B")


# -- optimizer states ---------------------------------------------------------------------------------------
def test_optimizer_states_by_optimizer() -> None:
    n = Q06.counts.total
    by = {o: est(Q06, intent="training", optimizer=o, seq_len=512) for o in M.OPTIMIZERS}
    # fp32 AdamW with fp32 master weights (an fp32 model under bf16 autocast, as Trainer runs it): the fp32
    # weights (the dtype's share + the master's rest), fp32 gradients, fp32 exp_avg/exp_avg_sq: 16 B/param
    fp32 = by["adamw_torch_fused"]
    assert fp32["optimizer"] == 8 * n and fp32["master_weights"] == 2 * n and fp32["gradients"] == 4 * n
    assert fp32["weights"] + fp32["master_weights"] + fp32["gradients"] + fp32["optimizer"] == 16 * n
    # 8-bit AdamW: uint8 exp_avg + exp_avg_sq and an fp32 absmax per 256 values each, on bf16 weights
    assert by["adamw_8bit"]["optimizer"] == int(n * (2 + 8 / 256)) and by["adamw_8bit"]["master_weights"] == 0
    # paged: the same states live in managed memory and leave the GPU under pressure
    assert by["paged_adamw_8bit"]["optimizer"] == 0
    bd = breakdown(
        Q06,
        dtype="bfloat16",
        quantization=None,
        intent="training",
        seq_len=512,
        batch_size=1,
        optimizer="paged_adamw_8bit",
    )
    assert bd.host_bytes == int(n * (2 + 8 / 256)) and any("managed memory" in x for x in bd.notes)
    # Adafactor: one fp32 row + column vector per matrix, far below a byte per parameter
    assert 0 < by["adafactor"]["optimizer"] < n // 50
    assert by["sgd"]["optimizer"] == 0
    # the foreach AdamW step copies exp_avg_sq (4 B/param here) after backward: gradients + that copy peak
    foreach = by["adamw_torch"]
    assert foreach["optimizer_step"] > 0 and fp32["optimizer_step"] == 0
    assert foreach["gradients"] + foreach["activations"] + foreach["optimizer_step"] == 4 * n + 4 * n
    assert foreach["total"] == fp32["total"] + foreach["optimizer_step"]
    # Adafactor's step: three fp32 copies of the largest matrix (the 151936 x 1024 embedding)
    assert by["adafactor"]["total"] - by["sgd"]["total"] >= 3 * 4 * 151936 * 1024 - by["sgd"]["activations"]


def test_lora_optimizer_states_are_the_adapters() -> None:
    e = est(intent="lora")
    ap = M.adapter_params(Q8)
    assert e["adapters"] == 4 * ap and e["gradients"] == 4 * ap and e["optimizer"] == 8 * ap


# -- activations --------------------------------------------------------------------------------------------
def test_loss_logits_are_fp32_over_the_full_vocabulary() -> None:
    """transformers 5.17 loss/loss_utils.py:59 upcasts all batch x seq x vocab logits."""
    a = est(seq_len=8192)["activations"]
    b = est(seq_len=16384)["activations"]
    per_token = (b - a) / 8192
    # at least the loss (12 B per logit) and the checkpointed layer inputs; the loss dominates for Qwen3
    assert per_token >= 151936 * 12 + 36 * 4096 * 2
    assert per_token < 1.2 * (151936 * 12 + 36 * 4096 * 2)


def test_gradient_checkpointing_is_a_setting_not_an_assumption() -> None:
    on = est(seq_len=4096, gradient_checkpointing=True)["activations"]
    off = est(seq_len=4096, gradient_checkpointing=False)["activations"]
    # without checkpointing every layer keeps ~280 KB per token (norms, q/k/v, MLP, LoRA dropouts)
    assert off > 3 * on
    assert off - on > 36 * 4096 * 200_000


def test_qlora_residual_stream_and_head_are_fp32_where_peft_casts_them() -> None:
    """prepare_model_for_kbit_training casts embeddings, norms and head to fp32 (peft utils/other.py); the plan's
    bf16 preparation keeps them in the compute dtype, with LoRA's activations."""
    upcast = StepShape.padded(1, 4096, kbit_upcast=True)
    q = est(intent="qlora", quantization="nf4", seq_len=4096, step=upcast)
    lo = est(intent="lora", seq_len=4096)
    sp = param_split(Q8)
    unq = sp.embedding + sp.head + sp.outside_other + int(sp.layer_other * 36)
    nf4 = int(Q8.counts.linear * (0.5 + M.NF4_ABSMAX_DOUBLE_QUANT))
    assert q["weights"] == nf4 + 4 * unq
    assert q["activations"] > lo["activations"]  # fp32 checkpoints (4 B x hidden per layer and token)
    bf16 = est(intent="qlora", quantization="nf4", seq_len=4096)
    assert bf16["weights"] == nf4 + 2 * unq and bf16["activations"] == lo["activations"]


def test_eager_attention_matrix_term() -> None:
    scores = 8 * 32 * 2048 * 2048
    kw: dict[str, Any] = {"seq_len": 2048, "batch_size": 8, "gradient_checkpointing": False}
    sdpa = est(attn="sdpa", **kw)["activations"]
    eager = est(attn="eager", **kw)["activations"]
    # without checkpointing every layer keeps its fp32 softmax and bf16 probabilities
    assert eager - sdpa >= 36 * scores * (M.EAGER_SAVED_FP32 + 2)
    # with checkpointing one layer at a time holds them; the fp32 loss phase may be larger still
    small = {a: est(Q06, attn=a, seq_len=16384, batch_size=1)["activations"] for a in ("sdpa", "eager")}
    assert small["eager"] > small["sdpa"]
    # inference: the H200 measured 28.4 vs 19.2 GiB (eager vs sdpa) at batch 8 x 2048 on this shape
    inf = {
        a: est(intent="inference", seq_len=2048, batch_size=8, attn=a)["activations"]
        for a in ("sdpa", "eager")
    }
    diff = (inf["eager"] - inf["sdpa"]) / GiB
    assert 9.2 * 0.95 <= diff <= 9.2 * 1.15


def test_accumulation_keeps_gradients_through_the_forward() -> None:
    """Without accumulation the gradients appear as backward frees the activations (Trainer zeroes them with
    set_to_none); with it they persist through the next micro-step's forward and add to it."""

    def bd(steps: int) -> Any:
        return breakdown(
            Q06,
            dtype="bfloat16",
            quantization=None,
            intent="training",
            optimizer="adamw_8bit",
            seq_len=4096,
            batch_size=1,
            gradient_accumulation_steps=steps,
        )

    one, eight = bd(1), bd(8)
    grow = sum(eight.terms.values()) - sum(one.terms.values())
    assert 0 < grow <= one.terms["gradients"]
    assert any("micro-steps" in n for n in eight.notes)


# -- the plan -----------------------------------------------------------------------------------------------
def test_optimizer_is_a_planned_rung() -> None:
    """An 8B full fine-tune on a 48 GB card fits with paged 8-bit AdamW, as people run it."""
    caps = hardware("L40S").with_packages(["bitsandbytes"], [])
    p = plan(full_config("Llama-3.1-8B"), hardware=caps, intent="training", seq_len=512)
    assert p.optimizer is not None and p.optimizer.choice == "paged_adamw_8bit"
    rejected = {c.name: " ".join(c.reasons) for c in p.optimizer.candidates if not c.ok}
    assert "does not fit" in rejected["adamw_torch_fused"] and "does not fit" in rejected["adamw_8bit"]
    assert "not chosen automatically" in rejected["sgd"]
    assert cudaload.training_arguments(p)["optim"] == "paged_adamw_8bit"
    # without bitsandbytes the ladder goes on to Adafactor, and says why it skipped the 8-bit ones
    p2 = plan(full_config("Qwen3-0.6B"), hardware="T4", intent="training", seq_len=2048)
    assert p2.optimizer is not None and p2.optimizer.choice in ("adamw_torch_fused", "adafactor")
    c8 = p2.optimizer.candidate("adamw_8bit")
    assert c8 is not None and not c8.ok and "bitsandbytes" in " ".join(c8.reasons)


def test_explicit_optimizer_is_honoured_or_refused() -> None:
    p = plan(full_config("Qwen3-0.6B"), hardware="H200", intent="training", optimizer="adafactor")
    assert p.optimizer is not None and p.optimizer.choice == "adafactor" and p.optimizer.explicit
    with pytest.raises(InvalidChoiceError):
        plan(full_config("Qwen3-0.6B"), hardware="H200", intent="training", optimizer="adamw_8bit")
    with pytest.raises(InvalidChoiceError):
        plan(full_config("Qwen3-0.6B"), hardware="H200", intent="training", optimizer="lion")


def test_gradient_checkpointing_decision_and_training_arguments() -> None:
    short = plan(full_config("Qwen3-0.6B"), hardware="H200", intent="lora", seq_len=512)
    assert short.gradient_checkpointing is not None and short.gradient_checkpointing.choice == "off"
    long = plan(full_config("Qwen3-8B"), hardware="A100-40GB", intent="lora", seq_len=8192)
    assert long.gradient_checkpointing is not None and long.gradient_checkpointing.choice == "on"
    off = long.gradient_checkpointing.candidate("off")
    assert off is not None and "does not fit" in " ".join(off.reasons)
    args = cudaload.training_arguments(long)
    name = "activation_checkpointing" if "activation_checkpointing" in args else "gradient_checkpointing"
    assert args[name] is True and args[f"{name}_kwargs"] == {"use_reentrant": False}
    assert cudaload.training_arguments(short)[name] is False
    # qlora: decided like lora (load_model runs peft's k-bit preparation only where the plan casts to fp32, and
    # with the plan's checkpointing), on where the step does not fit without it
    caps = hardware("A100-40GB").with_packages(["bitsandbytes"], [])
    q = plan(full_config("Qwen3-8B"), hardware=caps, intent="qlora", seq_len=512, batch_size=1)
    assert q.gradient_checkpointing is not None and q.gradient_checkpointing.choice == "off"
    qlong = plan(
        full_config("Qwen3-8B"),
        hardware=caps,
        intent="qlora",
        seq_len=8192,
        batch_size=1,
        loss="transformers",
    )
    assert qlong.gradient_checkpointing is not None and qlong.gradient_checkpointing.choice == "on"
    # left to the plan, cudaload's chunked loss (no fp32 logits over the step) lets fewer layers be recomputed
    qauto = plan(full_config("Qwen3-8B"), hardware=caps, intent="qlora", seq_len=8192, batch_size=1)
    assert qauto.training is not None and qauto.training.loss.choice == "cudaload_chunked"
    assert qauto.gradient_checkpointing is not None and qauto.gradient_checkpointing.choice == "partial"
    assert qauto.checkpoint_every > 1
    # the decisions round-trip through JSON
    assert type(q).from_json(q.to_json()) == q


def test_training_arguments_name_the_checkpointing_field_of_the_targeted_transformers() -> None:
    from dataclasses import replace

    p = plan(full_config("Qwen3-0.6B"), hardware="H200", intent="lora", seq_len=512)
    old = replace(p, hardware={**p.hardware, "transformers": "5.17.0"})
    new = replace(p, hardware={**p.hardware, "transformers": "5.24.0"})
    assert "gradient_checkpointing" in cudaload.training_arguments(old)
    assert "activation_checkpointing" in cudaload.training_arguments(new)
    import dataclasses

    import transformers
    from transformers import TrainingArguments

    here = replace(p, hardware={**p.hardware, "transformers": transformers.__version__})
    known = {f.name for f in dataclasses.fields(TrainingArguments)}
    assert set(cudaload.training_arguments(here)) <= known


# -- MoE ----------------------------------------------------------------------------------------------------
def test_moe_expert_bytes_belong_to_their_layers() -> None:
    info = model_info(mixtral())
    sp = param_split(info)
    # the fused 3-D experts (8 x (2 x 14336 x 4096 + 4096 x 14336) per layer) are layer parameters
    assert sp.layer_other >= 8 * 3 * 14336 * 4096
    bd = breakdown(info, dtype="bfloat16", quantization=None, intent="inference", seq_len=4096, batch_size=1)
    assert bd.first_bytes < 2 * 32000 * 4096 * 2  # embedding side: not the experts
    assert bd.layer_weight_bytes >= 8 * 3 * 14336 * 4096 * 2


def test_bitsandbytes_leaves_fused_experts_in_bf16_and_says_how_much() -> None:
    """transformers 5.17-5.24 integrations/bitsandbytes.py:189 replaces only nn.Linear / Conv1D modules."""
    info = model_info(mixtral())
    bd = breakdown(info, dtype="bfloat16", quantization="nf4", intent="inference", seq_len=512, batch_size=1)
    note = next(n for n in bd.notes if "MoE expert" in n)
    experts = param_split(info).layer_other * 32 * 2 / GiB
    assert f"{experts:.2f} GiB" in note
    assert bd.terms["weights"] > 0.9 * experts * GiB  # nf4 barely shrinks Mixtral in transformers 5


def test_replace_with_bnb_linear_still_converts_only_linear_modules() -> None:
    """The rule above, checked against the installed transformers (fails when it learns to quantize experts)."""
    import inspect

    from transformers.integrations import bitsandbytes as tb

    src = inspect.getsource(tb.replace_with_bnb_linear)
    assert "type(module) is nn.Linear" in src and "expert" not in src.lower()


# -- published fit boundaries -------------------------------------------------------------------------------
#: how the published HF + FA2 QLoRA runs trained: peft's prepare_model_for_kbit_training (the fp32 cast, and
#: gradient checkpointing on), the QLoRA paper's paged 8-bit AdamW, padded batches, LoRA dropout as cudaload's
#: model was fitted with (0.05), no autocast around LoRA's forward
def _published(seq: int) -> StepShape:
    return StepShape.padded(1, seq, lora_dropout=0.05, kbit_upcast=True, autocast=False)


def _fits_published(cfg: Any, caps: Capabilities, seq: int, attn: str = "sdpa") -> bool:
    try:
        fit(
            model_info(cfg),
            caps,
            dtype="bfloat16",
            intent="qlora",
            seq_len=seq,
            batch_size=1,
            attn=attn,
            optimizer="paged_adamw_8bit",
            gradient_checkpointing=True,
            step=_published(seq),
        )
        return True
    except DoesNotFitError:
        return False


def _longest(cfg: Any, caps: Capabilities, attn: str = "sdpa") -> int:
    lo, hi = 0, 200_000
    while hi - lo > 64:
        mid = (lo + hi) // 2
        if _fits_published(cfg, caps, mid, attn):
            lo = mid
        else:
            hi = mid
    return lo


def test_qlora_fit_boundary_against_published_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Llama-3.1-8B QLoRA, batch 1, Hugging Face + FlashAttention-2: "Hugging Face + FA2 can only do 28,000 on a
    80GB GPU" and "HF+FA2 goes out of memory for 8GB GPUs" (https://unsloth.ai/blog/llama3-3, Dec 2024).
    Those runs used transformers 4.47, whose loss made a shifted contiguous copy of the fp32 logits
    (transformers 4.47.0 loss/loss_utils.py:38; 4.50 pads the labels instead, loss_utils.py:48): 4 more bytes
    per logit than transformers 5 (LOSS_BYTES_PER_LOGIT). FlashAttention-2 as they ran it: sdpa would take its
    score-materialising math path on QLoRA's fp32 q/k/v with grouped kv heads (M.sdpa_math)."""
    monkeypatch.setattr(MA, "LOSS_BYTES_PER_LOGIT", MA.LOSS_BYTES_PER_LOGIT + 4)
    caps = hardware("A100-80GB").with_packages(["bitsandbytes", "flash-attn"], [])
    got = _longest(full_config("Llama-3.1-8B"), caps, attn="flash_attention_2")
    assert 0.9 * 28_000 <= got <= 1.05 * 28_000, got
    small = Capabilities(source="t", gpus=(GPU(0, "8GB", (8, 6), 8 << 30),)).with_packages(
        ["bitsandbytes"], []
    )
    assert not _fits_published(full_config("Llama-3.1-8B"), small, 512)


@pytest.mark.xfail(
    strict=True,
    reason="70B QLoRA plans 8348 tokens (7469 even with the loss term 4 B/logit larger), 21% (8%) longer than "
    "HF+FA2 ran on 80 GB; the H200 calibration (run1/run7-memtrain) holds the 8B and 0.6B boundaries within "
    "10%, a 70B run was never measured (it needs a whole H200 session of device time)",
)
def test_qlora_70b_fit_boundary_against_published_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Llama-3.3-70B QLoRA batch 1, HF + FA2: 6,916 tokens on 80 GB, OOM on 48 GB (unsloth.ai/blog/llama3-3)."""
    monkeypatch.setattr(MA, "LOSS_BYTES_PER_LOGIT", MA.LOSS_BYTES_PER_LOGIT + 4)
    caps = hardware("A100-80GB").with_packages(["bitsandbytes", "flash-attn"], [])
    got = _longest(full_config("Llama-3.1-70B"), caps, attn="flash_attention_2")
    assert got <= 1.05 * 6_916, got


def test_qlora_70b_does_not_fit_48gb_as_published() -> None:
    caps = hardware("L40S").with_packages(["bitsandbytes"], [])
    assert not _fits_published(full_config("Llama-3.1-70B"), caps, 512)


def test_paged_states_must_fit_the_host() -> None:
    from dataclasses import replace

    caps = replace(hardware("L40S").with_packages(["bitsandbytes"], []), host_memory=8 << 30)
    p = plan(full_config("Llama-3.1-8B"), hardware=caps, intent="training", seq_len=512)
    assert p.optimizer is not None and p.optimizer.choice == "adafactor"
    paged = p.optimizer.candidate("paged_adamw_8bit")
    assert paged is not None and "exceed the host" in " ".join(paged.reasons)


@pytest.mark.parametrize(
    "bad", ["1.2.3GB", ".", "1..5GiB", -1, -0.5, float("inf"), float("nan"), True, "20 parsecs"]
)
def test_parse_size_refuses_what_is_no_size(bad: object) -> None:
    """ "1.2.3GB" raised a raw ValueError from float(), and negative sizes were taken as budgets."""
    from cudaload.errors import ConfigurationError
    from cudaload.policies.placement import budgets, parse_size

    with pytest.raises(ConfigurationError) as e:
        parse_size(bad)
    assert "'20GiB'" in (e.value.fix or "")
    with pytest.raises(ConfigurationError):
        budgets(hardware("H200"), {0: bad})


def test_parse_size_reads_sizes() -> None:
    from cudaload.policies.placement import parse_size

    assert parse_size("20GiB") == 20 << 30 and parse_size(" 1.5 GB ") == 1_500_000_000
    assert parse_size(".5MiB") == 1 << 19 and parse_size("2.") == 2 and parse_size(0) == 0
    assert parse_size(10**20) == 10**20 and parse_size(3.9) == 3
