"""Attention rules taken from the released sources, one test per rule, and the choice among valid backends.

Each test names the source line the rule comes from (see the comments in the rule modules of
cudaload/policies/attention/ and in cudaload/detection/support.py). Model facts come from real transformers
configs through ``model_info``; hardware from profiles or a GPU built for the case (compute capability is what
the rules read).
"""

from __future__ import annotations

import logging
from dataclasses import replace
from functools import cache
from typing import Any

import pytest
from transformers import __version__ as _tf_version

from cudaload.capabilities import GPU, Capabilities, PackageInfo
from cudaload.detection.versions import version_tuple
from cudaload.errors import InvalidChoiceError
from cudaload.model_info import ModelInfo, model_info
from cudaload.plans.decision import Decision
from cudaload.policies import attention as A
from cudaload.policies.attention import choose_attention
from cudaload.profiles import hardware

VLLM_FA3 = "kernels-community/vllm-flash-attn3"
HUB_FA2 = "kernels-community/flash-attn2"
HUB_FA4 = "kernels-community/flash-attn4"
FLASH = ("flash-attn", "flash-attn-3", "flash-attn-4")

#: small but faithful configs: the attention shapes are the real ones, the widths and depths are cut
#: the installed release: model_info reads its modeling code, so a few facts differ by release
_TRANSFORMERS = version_tuple(_tf_version) or (0,)
_SMALL = {"num_hidden_layers": 2, "vocab_size": 256, "intermediate_size": 64}
CONFIGS: dict[str, dict[str, Any]] = {
    "llama": {"model_type": "llama", "hidden_size": 512, "num_attention_heads": 4, "num_key_value_heads": 2},
    "qwen3": {"model_type": "qwen3", "hidden_size": 256, "num_attention_heads": 4, "head_dim": 128},
    "mistral": {
        "model_type": "mistral",
        "hidden_size": 512,
        "num_attention_heads": 4,
        "sliding_window": 4096,
    },
    "mixtral": {
        "model_type": "mixtral",
        "hidden_size": 512,
        "num_attention_heads": 4,
        "num_local_experts": 2,
        "sliding_window": 4096,
    },
    "phi3": {
        "model_type": "phi3",
        "hidden_size": 384,
        "num_attention_heads": 4,
        "sliding_window": 2047,
        "pad_token_id": 0,
    },
    "gemma2": {"model_type": "gemma2", "hidden_size": 256, "num_attention_heads": 4, "head_dim": 256},
    "gemma3": {"model_type": "gemma3_text", "hidden_size": 256, "num_attention_heads": 4, "head_dim": 256},
    "deepseek_v3": {
        "model_type": "deepseek_v3",
        "hidden_size": 256,
        "num_attention_heads": 4,
        "q_lora_rank": 64,
        "kv_lora_rank": 64,
        "n_routed_experts": 4,
        "num_experts_per_tok": 2,
        "first_k_dense_replace": 1,
        "moe_intermediate_size": 32,
        "n_group": 1,
        "topk_group": 1,
    },
    "gpt_oss": {
        "model_type": "gpt_oss",
        "hidden_size": 256,
        "num_local_experts": 4,
        "num_attention_heads": 64,
    },
    "falcon": {"model_type": "falcon", "hidden_size": 256, "num_attention_heads": 4, "alibi": True},
    "falcon_rope": {"model_type": "falcon", "hidden_size": 256, "num_attention_heads": 4, "alibi": False},
}


@cache
def info(kind: str, **extra: Any) -> ModelInfo:
    return model_info({**_SMALL, **CONFIGS[kind], **extra})


def gpu(cc: tuple[int, int], *installed: str, name: str | None = None, **versions: str) -> Capabilities:
    caps = Capabilities(source="test", gpus=(GPU(0, name or f"GPU sm{cc[0]}{cc[1]}", cc, 80 << 30),))
    caps = caps.with_packages(installed) if installed else caps
    if versions:
        pkgs = {p.name: p for p in caps.packages}
        for key, v in versions.items():
            n = key.replace("_", "-")
            pkgs[n] = PackageInfo(n, installed=True, version=v, usable=True)
        caps = replace(caps, packages=tuple(pkgs.values()))
    return caps


def decide(i: ModelInfo, caps: Capabilities, **kw: Any) -> Decision:
    kw.setdefault("dtype", "bfloat16")
    return choose_attention(i, caps, **kw)


def why(d: Decision, name: str) -> str:
    c = d.candidate(name)
    assert c is not None
    return " | ".join(c.reasons)


def ok(d: Decision, name: str) -> bool:
    c = d.candidate(name)
    assert c is not None
    return c.ok


def flash_reasons(
    name: str, i: ModelInfo, caps: Capabilities, intent: str = "inference", dtype: str = "bfloat16"
) -> list[str]:
    """The source rules alone for a Hub-kernel form (its install / trust / cache preflight is another matter)."""
    return A._flash_checks(name, A._KERNEL_TO_IMPL.get(name, name), i, caps, dtype, intent)


# -- model facts read from the config ------------------------------------------------------------------------


def test_mla_head_dims_come_from_nope_plus_rope() -> None:
    # modeling_deepseek_v3.py:377 qk_head_dim = qk_nope_head_dim + qk_rope_head_dim; config head_dim is the rope part
    i = info("deepseek_v3")
    assert i.summary.head_dim == 64
    assert (i.flash_head_dim, i.value_head_dim) == (192, 128)


@pytest.mark.parametrize(
    ("kind", "head_dim", "window", "sliding_layers"),
    [
        ("llama", 128, None, 0),
        ("qwen3", 128, None, 0),  # use_sliding_window False: layer_types all full_attention
        ("mistral", 128, 4096, 2),
        ("mixtral", 128, 4096, 2),
        ("phi3", 96, 2047, 2),
        ("gemma2", 256, 4096, 1),  # alternating sliding / full
        ("gemma3", 256, 4096, 2),
        ("gpt_oss", 64, 128, 1),
        ("falcon", 64, None, 0),
    ],
)
def test_head_dim_and_sliding_window_per_family(
    kind: str, head_dim: int, window: int | None, sliding_layers: int
) -> None:
    i = info(kind)
    assert (i.flash_head_dim, i.value_head_dim) == (head_dim, head_dim)
    assert i.summary.sliding_window == window
    assert i.sliding_layers == sliding_layers


def test_sinks_alibi_softcap_and_model_tables() -> None:
    oss = info("gpt_oss")
    assert oss.sinks and oss.compatible_flash is not None and oss.compatible_flash[0] == VLLM_FA3
    assert not info("llama").sinks and info("llama").compatible_flash is None
    assert info("falcon").alibi and not info("falcon_rope").alibi
    if _TRANSFORMERS < (5, 25):
        assert info("falcon").attention_classes == ("eager", "sdpa", "flash_attention_2")
    else:  # 5.25 removed FALCON_ATTENTION_CLASSES: falcon takes any registered attention
        assert info("falcon").attention_classes is None
    assert info("llama").attention_classes is None
    assert info("gemma2").attn_softcapping == 50.0
    assert info("gemma3").attn_softcapping is None


@pytest.mark.parametrize(
    ("cfg", "dropout"),
    [
        ({"model_type": "llama", "attention_dropout": 0.1}, 0.1),
        ({"model_type": "gpt2", "attn_pdrop": 0.2, "n_layer": 2}, 0.2),
        ({"model_type": "bert", "attention_probs_dropout_prob": 0.3, "num_hidden_layers": 2}, 0.3),
    ],
)
def test_attention_dropout_under_each_familys_name(cfg: dict[str, Any], dropout: float) -> None:
    assert model_info({**cfg}).attention_dropout == pytest.approx(dropout)


def test_config_without_dtype_plans_without_the_torch_dtype_warning() -> None:
    # transformers 5 configuration_utils.PretrainedConfig.torch_dtype logs this on every read (warning_once)
    import transformers
    from transformers.utils import logging as tlog

    from cudaload.planner import plan

    seen: list[str] = []

    class Grab(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record.getMessage())

    handler = Grab()
    tlog.get_logger("transformers").addHandler(handler)
    try:
        logging.Logger.warning_once.cache_clear()  # type: ignore[attr-defined]
        p = plan(
            {"model_type": "llama", **_SMALL, "hidden_size": 128, "num_attention_heads": 2}, hardware="H200"
        )
        assert p.model.checkpoint_dtype is None
        during_plan = list(seen)
        # the handler does see the warning when something reads torch_dtype
        logging.Logger.warning_once.cache_clear()  # type: ignore[attr-defined]
        transformers.AutoConfig.for_model("llama").torch_dtype  # noqa: B018
    finally:
        tlog.get_logger("transformers").removeHandler(handler)
    assert not [m for m in during_plan if "torch_dtype" in m]
    assert any("torch_dtype" in m for m in seen[len(during_plan) :])


# -- rules that stop crashes ---------------------------------------------------------------------------------


def test_mla_fa4_on_sm100_rejects_the_padded_192() -> None:
    # interface.py:121-138: sm100 takes <=128, 256 or (192, 128); transformers pads v to 192 first
    i = info("deepseek_v3")
    d = decide(i, hardware("B200").with_packages(FLASH))
    assert not ok(d, "flash_attention_4") and "192" in why(d, "flash_attention_4")
    assert ok(d, "flash_attention_2")  # 192 <= 256, multiple of 8
    h = decide(i, hardware("H200").with_packages(FLASH))
    assert ok(h, "flash_attention_4") and ok(h, "flash_attention_3")  # sm90: 8..256


def test_sinks_need_a_sink_kernel() -> None:
    i = info("gpt_oss")
    h200 = hardware("H200").with_packages(FLASH)
    d = decide(i, h200)
    # transformers rewrites FA2 / FA3 requests for gpt-oss to kernels-community/vllm-flash-attn3
    for name in ("flash_attention_2", "flash_attention_3", HUB_FA2):
        assert not ok(d, name) and f"by {VLLM_FA3}" in why(d, name)
    assert ok(d, "flash_attention_4")  # sm90 forward takes learnable_sink
    assert flash_reasons(VLLM_FA3, i, h200) == []
    # FA4's sm80 / sm120 kernels assert no sink (flash_fwd.py:651)
    for profile in ("A100-80GB", "RTX-5090"):
        r = decide(i, hardware(profile).with_packages(FLASH))
        assert not ok(r, "flash_attention_4") and "Learnable sink" in why(r, "flash_attention_4")
    # vllm-flash-attn3's s_aux path: sm90 only, bf16 only
    assert any("Hopper (sm90) only" in r for r in flash_reasons(VLLM_FA3, i, hardware("A100-80GB")))
    assert any("bfloat16 only" in r for r in flash_reasons(VLLM_FA3, i, h200, dtype="float16"))


def test_sink_model_without_a_compatible_list_keeps_sinks_out_of_fa2() -> None:
    # a sink model transformers does not reroute (mimo_v2_flash, granite_swa...): FA2 has no s_aux argument
    i = replace(info("gpt_oss"), compatible_flash=None)
    d = decide(i, hardware("A100-80GB").with_packages(FLASH))
    assert not ok(d, "flash_attention_2") and "drop them" in why(d, "flash_attention_2")


def test_vllm_fa3_sinks_have_no_gradient_for_full_training() -> None:
    i = info("gpt_oss")
    h200 = hardware("H200")
    assert any("no gradient for the sinks" in r for r in flash_reasons(VLLM_FA3, i, h200, intent="training"))
    assert flash_reasons(VLLM_FA3, i, h200, intent="lora") == []  # sinks frozen under LoRA


def test_alibi_refuses_every_flash_backend() -> None:
    # modeling_falcon.py raises on alibi with flash (5.17 :476-477, 5.25 :567-571); up to 5.24
    # FALCON_ATTENTION_CLASSES holds only flash_attention_2, 5.25 dispatches through the attention interface
    caps = hardware("A100-80GB").with_packages(FLASH)
    d = decide(info("falcon"), caps)
    assert not ok(d, "flash_attention_2") and "ALiBi" in why(d, "flash_attention_2")
    assert ok(d, "sdpa") and d.choice == "sdpa"
    rope = decide(info("falcon_rope"), caps)
    assert ok(rope, "flash_attention_2")
    if _TRANSFORMERS < (5, 25):
        assert not ok(rope, "flash_attention_4") and "KeyError" in why(rope, "flash_attention_4")
    else:
        assert ok(rope, "flash_attention_4")


def test_fa4_hd256_backward_with_sliding_window_on_sm100() -> None:
    # sm100_hd256_2cta_fmha_backward.py:60 asserts not is_local (arch // 10 in [10, 11])
    i = info("gemma3")
    for cc in ((10, 0), (10, 3), (11, 0)):
        caps = gpu(cc, "flash-attn-4")
        assert "sliding window" in why(decide(i, caps, intent="lora"), "flash_attention_4")
        assert ok(decide(i, caps), "flash_attention_4")  # inference is fine
    assert ok(decide(i, hardware("H200").with_packages(FLASH), intent="lora"), "flash_attention_4")
    # transformers passes the window only past it (key_length > sliding_window): short declared work is fine
    b200 = gpu((10, 0), "flash-attn-4")
    assert ok(decide(i, b200, intent="lora", work=(4, 4096)), "flash_attention_4")
    assert not ok(decide(i, b200, intent="lora", work=(4, 4097)), "flash_attention_4")


def test_fa4_hd256_backward_softcap_on_sm100_and_sm120() -> None:
    i = info("gemma2")
    assert "soft-capping" in why(decide(i, gpu((10, 0), "flash-attn-4"), intent="lora"), "flash_attention_4")
    # sm120 backward: "score_mod backward not supported on SM 12.0" (interface.py:2350); hd 128 to isolate it
    small = model_info({**_SMALL, **CONFIGS["gemma2"], "head_dim": 128})
    assert "sm120 backward" in why(
        decide(small, gpu((12, 0), "flash-attn-4"), intent="lora"), "flash_attention_4"
    )
    assert ok(decide(small, gpu((12, 0), "flash-attn-4")), "flash_attention_4")


def test_fa2_has_no_sm110_kernel() -> None:
    # setup.py:70 FLASH_ATTN_CUDA_ARCHS "80;90;100;120", SASS only
    d = decide(info("llama"), gpu((11, 0), *FLASH))
    assert not ok(d, "flash_attention_2") and "no sm110 kernels" in why(d, "flash_attention_2")
    assert not ok(d, HUB_FA2) and "build.toml" in why(d, HUB_FA2)
    assert ok(d, "flash_attention_4")


@pytest.mark.parametrize("cc", [(10, 0), (10, 3), (12, 0), (12, 1)])
def test_fa2_blackwell_needs_273(cc: tuple[int, int]) -> None:
    i = info("llama")
    assert not ok(decide(i, gpu(cc, flash_attn="2.7.2")), "flash_attention_2")
    assert "2.7.3" in why(decide(i, gpu(cc, flash_attn="2.7.2")), "flash_attention_2")
    assert ok(decide(i, gpu(cc, flash_attn="2.7.3")), "flash_attention_2")


def test_fa2_dropout_with_softcap_in_training() -> None:
    # flash_api.cpp:397 / :838 "Softcapping does not support dropout for now" (dropout applies in training)
    i = info("gemma2", attention_dropout=0.1)
    caps = hardware("A100-80GB").with_packages(["flash-attn"])
    assert "Softcapping does not support dropout" in why(decide(i, caps, intent="lora"), "flash_attention_2")
    assert ok(decide(i, caps), "flash_attention_2")
    assert ok(decide(info("gemma2"), caps, intent="lora"), "flash_attention_2")


@pytest.mark.parametrize(
    ("profile", "bad"),
    [("A10G", True), ("RTX-4090", True), ("RTX-5090", True), ("A100-80GB", False), ("H200", False)],
)
def test_fa2_hd256_backward_dropout_on_99kb_parts(profile: str, bad: bool) -> None:
    # flash_bwd_launch_template.h:296-303: below 144 KB the hdim256 backward exists only without dropout
    i = info("gemma3", attention_dropout=0.1)
    caps = hardware(profile).with_packages(["flash-attn"])
    d = decide(i, caps, intent="lora")
    assert ("garbage" in why(d, "flash_attention_2")) is bad
    assert ok(decide(i, caps), "flash_attention_2")  # inference: no backward
    assert ok(decide(info("gemma3"), caps, intent="lora"), "flash_attention_2")  # no dropout


def test_fa3_head_dim_must_be_a_multiple_of_8() -> None:
    # hopper/flash_api.cpp:855 head_size % alignment (8 for 16-bit); hopper's flash_attn_interface.py pads
    # nothing, nor does vllm-flash-attn3's (flash_api_stable.cpp:857 the same check)
    i = info("qwen3", head_dim=100)
    d = decide(i, hardware("H200").with_packages(FLASH))
    assert not ok(d, "flash_attention_3") and "multiple of 8" in why(d, "flash_attention_3")
    assert any("multiple of 8" in r for r in flash_reasons(VLLM_FA3, i, hardware("H200")))
    assert ok(decide(info("qwen3", head_dim=96), hardware("H200").with_packages(FLASH)), "flash_attention_3")
    assert flash_reasons(VLLM_FA3, info("qwen3", head_dim=96), hardware("H200")) == []


@pytest.mark.parametrize(("head_dim", "padded"), [(100, 104), (36, 40), (250, 256), (252, 256), (254, 256)])
@pytest.mark.parametrize("cc", [(8, 0), (9, 0)])
def test_fa2_pads_a_head_dim_that_is_not_a_multiple_of_8(
    head_dim: int, padded: int, cc: tuple[int, int]
) -> None:
    # flash-attn 2.8.3 flash_attn_interface.py FlashAttnFunc.forward:829-833 pads q/k/v to a multiple of 8 and
    # :856 slices the output back; the op then checks the padded size (flash_api.cpp:393-394): <= 256
    i = info("qwen3", head_dim=head_dim)
    assert (i.flash_head_dim, i.value_head_dim) == (head_dim, head_dim)
    caps = gpu(cc, flash_attn="2.8.3")
    d = decide(i, caps)
    assert ok(d, "flash_attention_2"), why(d, "flash_attention_2")
    # valid, with what the padding costs said beside it
    assert f"pads q, k and v to {padded} on every call" in why(d, "flash_attention_2")
    assert "backward" not in why(d, "flash_attention_2")
    assert "keeps the padded q, k, v and output for backward" in why(
        decide(i, caps, intent="lora"), "flash_attention_2"
    )
    # the Hub build vendors the same interface (kernels-community flash-attn2 flash_attn_interface.py:868-871)
    assert flash_reasons(HUB_FA2, i, caps) == []
    # FA3 and FA4 pad nothing: the same head dim is refused there
    assert not ok(decide(i, gpu(cc, "flash-attn-3", "flash-attn-4")), "flash_attention_3")
    assert not ok(decide(i, gpu(cc, "flash-attn-3", "flash-attn-4")), "flash_attention_4")


@pytest.mark.parametrize(("head_dim", "padded"), [(258, 264), (260, 264), (264, 264), (512, 512)])
def test_fa2_head_dim_over_256_is_refused_after_padding(head_dim: int, padded: int) -> None:
    # flash_api.cpp:393 (forward), :830 (backward): at most 256, checked on the padded size
    i = info("qwen3", head_dim=head_dim)
    d = decide(i, gpu((9, 0), flash_attn="2.8.3"))
    assert not ok(d, "flash_attention_2")
    assert f"head dim {head_dim} > 256" in why(d, "flash_attention_2")
    assert f"pads it to {padded}" in why(d, "flash_attention_2")
    assert any("> 256" in r for r in flash_reasons(HUB_FA2, i, gpu((9, 0))))


def test_fa2_head_dim_multiple_of_8_has_no_padding_note() -> None:
    for hd in (96, 128, 256):
        d = decide(info("qwen3", head_dim=hd), gpu((8, 0), flash_attn="2.8.3"), intent="lora")
        assert ok(d, "flash_attention_2") and "pads" not in why(d, "flash_attention_2")


@pytest.mark.parametrize("cc", [(8, 0), (8, 6), (9, 0), (10, 0), (11, 0), (12, 0)])
def test_fa4_head_dim_not_a_multiple_of_8_on_every_architecture(cc: tuple[int, int]) -> None:
    # sm90-sm110: interface.py:847-849 alignment 8, asserted at :130 / :135; sm80/sm120: no Python check
    # (interface.py:848, :1777), but the SM80-MMA kernel needs 16-byte aligned rows (flash_fwd.py:63-64)
    i = info("qwen3", head_dim=100)
    d = decide(i, gpu(cc, "flash-attn-4"))
    assert not ok(d, "flash_attention_4") and "multiple of 8" in why(d, "flash_attention_4")
    assert any("multiple of 8" in r for r in flash_reasons(HUB_FA4, i, gpu(cc)))


def test_fa4_hub_build_has_no_hd256_on_sm100() -> None:
    # kernels-community/flash-attn4 vendors 4.0.0.beta8: its interface.py:102-117 takes 8..128 and (192, 128)
    # on sm100/sm110; the 4.0.0b36 package adds (256, 256) (interface.py:125, :134-138)
    i = info("qwen3", head_dim=256)
    for cc in ((10, 0), (10, 3), (11, 0)):
        assert ok(decide(i, gpu(cc, "flash-attn-4")), "flash_attention_4")
        r = flash_reasons(HUB_FA4, i, gpu(cc))
        assert any("4.0.0.beta8" in x and "8..128 only" in x for x in r), r
        assert flash_reasons(HUB_FA4, info("qwen3", head_dim=128), gpu(cc)) == []
    assert flash_reasons(HUB_FA4, i, gpu((9, 0))) == []  # sm90: 8..256 in both


def test_fa4_hd512_on_sm100_is_refused() -> None:
    # interface.py:124 lets (512, 512) through as the MLA absorbed qv form, which transformers never calls; a
    # plain call then needs 768 TMEM columns (flash_fwd_sm100.py:362-368)
    d = decide(info("qwen3", head_dim=512), gpu((10, 0), "flash-attn-4"))
    assert not ok(d, "flash_attention_4") and "8..128 or exactly 256" in why(d, "flash_attention_4")


def test_fa4_hd256_on_sm12x_needs_more_shared_memory_than_there_is() -> None:
    # flash_fwd_sm120.py:47-58 with interface.py:360-365 tiles: 128 KB for hd 256 > 99 KB; hd 192 fits
    d = decide(info("gemma3"), hardware("RTX-5090").with_packages(FLASH))
    assert not ok(d, "flash_attention_4") and "shared memory" in why(d, "flash_attention_4")
    assert ok(decide(info("deepseek_v3"), gpu((12, 1), "flash-attn-4")), "flash_attention_4")
    assert ok(decide(info("llama"), hardware("RTX-5090").with_packages(FLASH)), "flash_attention_4")


def test_fa4_head_dim_ranges_per_architecture() -> None:
    assert "8..128 or exactly 256" in why(
        decide(info("qwen3", head_dim=160), gpu((10, 0), "flash-attn-4")), "flash_attention_4"
    )
    assert ok(decide(info("qwen3", head_dim=256), gpu((10, 0), "flash-attn-4")), "flash_attention_4")
    assert ok(decide(info("qwen3", head_dim=160), gpu((9, 0), "flash-attn-4")), "flash_attention_4")
    assert "8..256" in why(
        decide(info("qwen3", head_dim=512), gpu((9, 0), "flash-attn-4")), "flash_attention_4"
    )


def test_no_flash_below_ampere_or_in_float32() -> None:
    d = decide(info("llama"), hardware("T4").with_packages(FLASH), dtype="float16")
    assert "sm80" in why(d, "flash_attention_2") and not ok(d, "flash_attention_4")
    d = decide(info("llama"), hardware("H200").with_packages(FLASH), dtype="float32")
    assert all(
        "float16 or bfloat16" in why(d, n)
        for n in ("flash_attention_2", "flash_attention_3", "flash_attention_4")
    )


def test_fa3_and_fa4_refuse_dropout_in_training_only() -> None:
    i = info("llama", attention_dropout=0.1)
    caps = hardware("H200").with_packages(FLASH)
    d = decide(i, caps, intent="training")
    assert "no dropout" in why(d, "flash_attention_3") and "no dropout" in why(d, "flash_attention_4")
    assert ok(d, "flash_attention_2")
    assert ok(decide(i, caps), "flash_attention_3")


# -- wrong rejections the old rules made -----------------------------------------------------------------------


def test_fa3_runs_on_sm8x() -> None:
    # hopper/setup.py builds *_sm80.cu for sm_80; static_switch.h routes 8.x there
    for profile in ("A100-80GB", "RTX-4090"):
        d = decide(info("llama"), hardware(profile).with_packages(["flash-attn-3"]), intent="lora")
        assert ok(d, "flash_attention_3"), why(d, "flash_attention_3")
    assert not ok(
        decide(info("llama"), hardware("B200").with_packages(["flash-attn-3"])), "flash_attention_3"
    )


def test_vllm_flash_attn3_runs_on_sm80_and_has_a_backward() -> None:
    # build.toml cuda-capabilities "8.0", "9.0a"; flash_attn_interface.FlashAttnFunc.backward
    for profile in ("A100-80GB", "H200"):
        for intent in ("inference", "training", "lora"):
            assert flash_reasons(VLLM_FA3, info("llama"), hardware(profile), intent=intent) == []
    for profile in ("B200", "RTX-5090"):
        assert any("build.toml" in r for r in flash_reasons(VLLM_FA3, info("llama"), hardware(profile)))


def test_fa4_forward_on_sm8x() -> None:
    # interface.py:845 forward asserts arch // 10 in [8..12]; :2288 backward in [9..12]
    caps = hardware("A100-80GB").with_packages(["flash-attn-4"])
    assert ok(decide(info("llama"), caps), "flash_attention_4")
    assert "backward asserts sm90+" in why(decide(info("llama"), caps, intent="lora"), "flash_attention_4")
    assert ok(decide(info("llama"), caps, intent="lora", requested="sdpa"), "sdpa")


@pytest.mark.parametrize(("cc", "valid"), [((6, 1), False), ((7, 0), True), ((7, 5), True), ((8, 0), True)])
def test_flex_attention_needs_triton_sm70(cc: tuple[int, int], valid: bool) -> None:
    # torch utils/_triton.py has_triton: CUDA major >= 7
    assert ok(decide(info("llama"), gpu(cc), dtype="float16"), "flex_attention") is valid


def test_flex_on_cpu_is_inference_only() -> None:
    cpu = Capabilities(source="cpu")
    assert ok(decide(info("llama"), cpu, dtype="float32"), "flex_attention")
    assert not ok(decide(info("llama"), cpu, dtype="float32", intent="lora"), "flex_attention")


# -- the choice: measured seconds and first-use costs ------------------------------------------------------------

H200_FA4 = hardware("H200").with_packages(["flash-attn-4"])
PRIOR = "shipped prior: H200, 2026-11-30, torch 2.11, transformers 5.17"


def test_untimed_default_is_sdpa_and_shows_what_fa4_would_cost() -> None:
    d = decide(info("llama"), H200_FA4)
    assert d.choice == "sdpa"
    assert "first use: +5.70 s" in why(d, "flash_attention_4")
    assert any("not measured" in r for r in d.reasons)


def test_timings_choose_the_least_total_including_first_use() -> None:
    i = info("llama")
    # the H200 8 x 2048 + 32 row: sdpa 1.52, FA4 1.80, eager 2.03
    d = decide(
        i, H200_FA4, timings={"sdpa": 1.52, "flash_attention_4": 1.80, "eager": 2.03}, timings_source=PRIOR
    )
    assert d.choice == "sdpa" and d.reasons[0].startswith(PRIOR)
    # FA4 faster in steady state but not by its first-use cost
    d = decide(i, H200_FA4, timings={"sdpa": 9.0, "flash_attention_4": 4.0})
    assert d.choice == "sdpa"
    assert any("flash_attention_4 9.70 s" in r for r in d.reasons)
    # faster by more than the first-use cost, or already paid in this process
    assert decide(i, H200_FA4, timings={"sdpa": 12.0, "flash_attention_4": 6.0}).choice == "flash_attention_4"
    paid = decide(
        i, H200_FA4, timings={"sdpa": 9.0, "flash_attention_4": 4.0}, first_use={"flash_attention_4": 0.0}
    )
    assert paid.choice == "flash_attention_4"
    # the left-padded row: eager fastest
    assert (
        decide(i, H200_FA4, timings={"sdpa": 2.42, "flash_attention_4": 3.05, "eager": 2.21}).choice
        == "eager"
    )


def test_timings_for_invalid_backends_are_ignored_and_said_so() -> None:
    d = decide(info("llama"), hardware("H200"), timings={"flash_attention_3": 0.5, "sdpa": 1.0, "eager": 1.2})
    assert d.choice == "sdpa"
    assert any("not valid here: flash_attention_3" in r for r in d.reasons)
    none_valid = decide(info("llama"), hardware("H200"), timings={"flash_attention_3": 0.5})
    assert none_valid.choice == "sdpa" and any("covers no valid backend" in r for r in none_valid.reasons)


def test_timings_override_the_short_decode_rule() -> None:
    i = info("llama")
    assert decide(i, H200_FA4, work=(1, 544)).choice == "eager"
    assert decide(i, H200_FA4, work=(1, 544), timings={"sdpa": 1.0, "eager": 1.1}).choice == "sdpa"
    assert decide(i, H200_FA4, work=(8, 2080)).choice == "sdpa"


def test_softcap_model_untimed_prefers_compiled_flash_then_eager_then_jit_for_training() -> None:
    i = info("gemma2")
    aot = decide(i, hardware("H200").with_packages(["flash-attn", "flash-attn-4"]))
    assert aot.choice == "flash_attention_2"
    only_fa4 = decide(i, H200_FA4)
    assert only_fa4.choice == "eager"
    assert any("flash_attention_4 would cost +5.70 s first" in r for r in only_fa4.reasons)
    assert decide(i, H200_FA4, intent="lora").choice == "flash_attention_4"  # amortised over the run


def test_first_use_table_is_data_from_the_measurements() -> None:
    assert A.FIRST_USE["flash_attention_4"].seconds == pytest.approx(2.7 + 3.0)
    assert A.first_use_costs(cold_files=True)["flash_attention_4"].seconds == pytest.approx(9.7 + 3.0)
    assert A.first_use_costs(fa4_cache_warm=True)["flash_attention_4"].seconds == pytest.approx(2.7 + 0.55)
    assert "sdpa" not in A.FIRST_USE and "eager" not in A.FIRST_USE


def test_explicit_requests_honoured_or_refused_with_every_reason() -> None:
    i = info("gemma3", attention_dropout=0.1)
    caps = hardware("RTX-4090").with_packages(FLASH)
    d = decide(i, caps, requested="flash_attention_2", timings={"flash_attention_2": 1.0, "sdpa": 0.9})
    assert d.choice == "flash_attention_2" and d.explicit
    assert any("sdpa 0.90 s" in r for r in d.reasons)
    with pytest.raises(InvalidChoiceError) as e:
        decide(i, caps, requested="flash_attention_2", intent="lora")
    assert "garbage" in str(e.value)
    with pytest.raises(InvalidChoiceError) as e:
        decide(info("gemma3"), caps, requested="flash_attention_4")
    assert "shared memory" in str(e.value)


@pytest.mark.parametrize("kind", sorted(CONFIGS))
@pytest.mark.parametrize("profile", ["T4", "A100-80GB", "RTX-4090", "H200", "B200", "RTX-5090", None])
def test_auto_never_raises(kind: str, profile: str | None) -> None:
    caps = hardware(profile).with_packages(FLASH) if profile else Capabilities(source="cpu")
    for intent in ("inference", "training", "lora"):
        for timings in (None, {"flash_attention_4": 1.0, "flash_attention_2": 2.0, "eager": 3.0}):
            d = decide(
                info(kind), caps, intent=intent, timings=timings, dtype="bfloat16" if profile else "float32"
            )
            c = d.candidate(d.choice or "")
            assert c is not None and c.ok and d.reasons


def test_explain_prints_the_costs_weighed() -> None:
    d = decide(info("llama"), H200_FA4, timings={"sdpa": 9.0, "flash_attention_4": 4.0}, timings_source=PRIOR)
    text = "\n".join(d.explain_lines("attention"))
    assert PRIOR in text and "first use not yet paid" in text and "flash_attention_4 +5.70 s" in text


def test_runtime_fallback_walks_from_the_choice_to_sdpa_then_eager() -> None:
    # cudaload.execute._next_attention takes the next valid candidate after a choice that fails at run time
    d = decide(info("llama"), H200_FA4, timings={"sdpa": 12.0, "flash_attention_4": 6.0})
    valid = [c.name for c in d.candidates if c.ok]
    assert valid[:3] == ["flash_attention_4", "sdpa", "eager"]
    assert all(not c.ok for c in d.candidates[len(valid) :])
