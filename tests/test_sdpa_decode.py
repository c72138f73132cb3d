"""cudaload's sdpa variants (cudaload_sdpa, cudaload_sdpa_nocudnn): the pure dispatch policy over snapshots and
profiles, the attention functions through real transformers models on the CPU (same logits and tokens as
sdpa, masks and padding, torch.compile), the cuDNN flag left as it was, and on the GPU the dispatch they
avoid and the logits within bf16 tolerance."""

from __future__ import annotations

import copy
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from cudaload.capabilities import Capabilities
from cudaload.model_info import model_info
from cudaload.plans.decision import Candidate
from cudaload.policies import sdpa_dispatch
from cudaload.policies.attention import choose_attention
from cudaload.policies.sdpa_dispatch import SDPA_DECODE, SDPA_NO_CUDNN, SdpaFacts, cudnn_takes_decode
from cudaload.profiles import hardware
from cudaload.testing import full_config, tiny_config

FIXTURES = Path(__file__).parent / "fixtures"
OK_SDPA = Candidate("sdpa", True, ("fine",))


def _facts(helps: bool = True, gpu: str = "NVIDIA H200/sm90") -> SdpaFacts:
    return SdpaFacts(
        gpu=gpu,
        versions={"torch": "2.11.0"},
        date="2026-12-02",
        speedup_first_seen=(1.9, 2.1, 2.5) if helps else (0.95, 0.99, 1.02),
        ratio_repeated=(0.98, 1.0, 1.02),
        works=10,
        source="test",
    )


# -- the pure policy -----------------------------------------------------------------------------------------


def test_cudnn_predicted_on_sm90_and_sm100_only() -> None:
    assert cudnn_takes_decode(hardware("H200"))[0]
    assert cudnn_takes_decode(hardware("H100-SXM"))[0]
    for name in ("A100-80GB", "L4", "RTX-4090"):
        takes, why = cudnn_takes_decode(hardware(name))
        assert not takes and "sm90 and sm100" in why
    assert not cudnn_takes_decode(Capabilities())[0]


def test_cudnn_prediction_reads_torch_cudnn_and_the_environment() -> None:
    h = hardware("H200")
    assert not cudnn_takes_decode(replace(h, torch_version="2.4.1", torch_cuda_version="12.4"))[0]
    assert not cudnn_takes_decode(replace(h, torch_version="2.11.0", torch_cuda_version=None))[0]
    assert not cudnn_takes_decode(
        replace(h, torch_version="2.11.0", torch_cuda_version="13.0", cudnn_version="9.5.1")
    )[0]
    assert cudnn_takes_decode(
        replace(h, torch_version="2.11.0", torch_cuda_version="13.0", cudnn_version="9.13.0")
    )[0]
    off = replace(h, env=(("TORCH_CUDNN_SDPA_PREFERRED", "0"),))
    takes, why = cudnn_takes_decode(off)
    assert not takes and "TORCH_CUDNN_SDPA_PREFERRED" in why
    assert not cudnn_takes_decode(replace(h, env=(("TORCH_CUDNN_SDPA_DEPRIORITIZED", "1"),)))[0]


def test_candidates_follow_sdpa_and_the_prediction() -> None:
    by = {c.name: c for c in sdpa_dispatch.candidates(hardware("H200"), OK_SDPA, [_facts()])}
    assert by[SDPA_DECODE].ok and by[SDPA_NO_CUDNN].ok
    assert "measured on NVIDIA H200 (sm90)" in by[SDPA_DECODE].reasons[1]
    bad = Candidate("sdpa", False, ("softcap",))
    assert not any(c.ok for c in sdpa_dispatch.candidates(hardware("H200"), bad, []))
    a100 = sdpa_dispatch.candidates(hardware("A100-80GB"), OK_SDPA, [_facts()])
    assert not any(c.ok for c in a100) and "exactly what sdpa runs" in a100[0].reasons[0]


def test_facts_round_trip_and_pick_the_same_compute_capability() -> None:
    f = _facts()
    assert SdpaFacts.from_dict(f.to_dict()) == f
    assert sdpa_dispatch.facts_for(hardware("H100-SXM"), [f]) == f  # same sm90
    assert sdpa_dispatch.facts_for(hardware("B200"), [f]) is None
    assert f.helps and not _facts(helps=False).helps


def test_helps_asks_the_median_repeated_work_and_bounds_the_worst() -> None:
    # the shipped H200 facts: per-work repeated ratios 0.94-1.04, median 1.00 -> the variant is the default
    assert replace(_facts(), ratio_repeated=(0.94, 1.0, 1.04)).helps
    # the median work slower than the bar, or one work clearly slower than the noise: plain sdpa
    assert not replace(_facts(), ratio_repeated=(0.93, 0.96, 1.0)).helps
    assert not replace(_facts(), ratio_repeated=(0.85, 1.0, 1.04)).helps
    assert sdpa_dispatch.REPEATED_WORST < sdpa_dispatch.REPEATED_FLOOR
    # the bounds themselves pass; just under either fails
    assert replace(_facts(), ratio_repeated=(0.90, 0.97, 1.0)).helps
    assert not replace(_facts(), ratio_repeated=(0.899, 0.97, 1.0)).helps
    assert not replace(_facts(), ratio_repeated=(0.90, 0.969, 1.0)).helps


def test_plan_with_shipped_facts_lets_a_short_declared_work_take_the_variant() -> None:
    """Through plan(), with the facts cudaload ships for the H200 and a model no prior covers: the short-decode
    rule gives way to cudaload_sdpa, and the reasons say why."""
    import cudaload
    from cudaload.testing import tiny_config

    p = cudaload.plan(tiny_config("qwen3"), hardware="H200", batch_size=1, seq_len=300, new_tokens=60)
    assert p.attention.choice == SDPA_DECODE
    assert any("not applied" in r for r in p.attention.reasons)
    # no declared work: the default, without the rule's note
    d = cudaload.plan(tiny_config("qwen3"), hardware="H200").attention
    assert d.choice == SDPA_DECODE and not any("not applied" in r for r in d.reasons)


def test_default_choice_is_the_variant_only_where_measured_to_help() -> None:
    info = model_info(full_config("Qwen3-8B"))
    h200 = hardware("H200")
    d = choose_attention(info, h200, dtype="bfloat16", sdpa_facts=[_facts()])
    assert d.choice == SDPA_DECODE
    assert any("sdpa, without cuDNN on lengths met" in r for r in d.reasons)
    # the fallback walks torch's own sdpa next
    assert [c.name for c in d.candidates if c.ok][:2] == [SDPA_DECODE, "sdpa"]
    # not measured to help, not measured at all, another architecture: plain sdpa; training: not the variant
    # (torch's own varlen kernels, cudaload_varlen, issue 44)
    assert choose_attention(info, h200, dtype="bfloat16", sdpa_facts=[_facts(helps=False)]).choice == "sdpa"
    assert choose_attention(info, h200, dtype="bfloat16", sdpa_facts=[]).choice == "sdpa"
    assert (
        choose_attention(info, hardware("A100-80GB"), dtype="bfloat16", sdpa_facts=[_facts()]).choice
        == "sdpa"
    )
    assert (
        choose_attention(info, h200, dtype="bfloat16", intent="training", sdpa_facts=[_facts()]).choice
        == "cudaload_varlen"
    )


def _declared(timings: dict[str, float], repeated: dict[str, float] | None = None) -> Any:
    """The 8B shape's attention decision on an H200 for a declared 8 x 2048 + 32 work with these timings."""
    return choose_attention(
        model_info(full_config("Qwen3-8B")),
        hardware("H200"),
        dtype="bfloat16",
        work=(8, 2080),
        timings=timings,
        timings_repeated=repeated,
        timings_source="test",
        sdpa_facts=[_facts()],
    )


def test_declared_work_weighs_first_seen_seconds_and_shows_repeated() -> None:
    d = _declared(
        {"sdpa": 5.0, SDPA_DECODE: 2.6, "eager": 3.0}, repeated={"sdpa": 2.5, SDPA_DECODE: 2.55, "eager": 2.9}
    )
    assert d.choice == SDPA_DECODE
    assert any(r.startswith("the same work on lengths already met") and "sdpa 2.50 s" in r for r in d.reasons)


def test_explicit_variant_where_it_does_nothing_is_refused() -> None:
    from cudaload.errors import InvalidChoiceError

    info = model_info(full_config("Qwen3-8B"))
    with pytest.raises(InvalidChoiceError, match="cannot be used here"):
        choose_attention(info, hardware("A100-80GB"), dtype="bfloat16", requested=SDPA_DECODE)


def test_plan_explains_the_variant_and_memory_treats_it_as_sdpa() -> None:
    import cudaload

    p = cudaload.plan(full_config("Qwen3-8B"), hardware="H200")
    assert p.attention.choice == SDPA_DECODE  # the shipped facts (H200, sm90)
    assert "sdpa, without cuDNN on lengths met" in p.explain()
    plain = cudaload.plan(full_config("Qwen3-8B"), hardware="H200", attn="sdpa")
    assert p.memory.total == plain.memory.total


def test_capabilities_carry_the_cudnn_version() -> None:
    caps = replace(hardware("H200"), cudnn_version="9.13.0.50")
    assert Capabilities.from_json(caps.to_json()).cudnn_version == "9.13.0.50"


# -- the attention functions on the CPU ----------------------------------------------------------------------

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def models() -> dict[str, Any]:
    from transformers import AutoModelForCausalLM

    from cudaload.execute.runtime.sdpa_decode import register

    register()
    out = {}
    state = None
    for name in ("sdpa", SDPA_DECODE, SDPA_NO_CUDNN):
        torch.manual_seed(0)
        m = AutoModelForCausalLM.from_config(copy.deepcopy(tiny_config("qwen3")), attn_implementation=name)
        m.eval()
        if state is None:
            state = m.state_dict()
        else:
            m.load_state_dict(state)
        out[name] = m
    return out


def _batch(padded: bool) -> tuple[Any, Any]:
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(4, 300, (3, 20), generator=g)
    mask = torch.ones_like(ids)
    if padded:
        for row, n in enumerate((20, 14, 9)):
            ids[row, : 20 - n] = 0
            mask[row, : 20 - n] = 0
    return ids, mask


def test_registered_under_transformers_extension_points(models: dict[str, Any]) -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    from cudaload.execute.runtime.sdpa_decode import register, registered

    register()  # idempotent
    assert registered() == [SDPA_DECODE, SDPA_NO_CUDNN]
    for name in (SDPA_DECODE, SDPA_NO_CUDNN):
        assert name in AttentionInterface._global_mapping
        assert ALL_MASK_ATTENTION_FUNCTIONS[name] is sdpa_mask
        assert models[name].config._attn_implementation == name


@pytest.mark.parametrize("padded", [False, True])
def test_same_logits_and_tokens_as_sdpa(models: dict[str, Any], padded: bool) -> None:
    ids, mask = _batch(padded)
    with torch.no_grad():
        ref = models["sdpa"](input_ids=ids, attention_mask=mask).logits
        ref_out = models["sdpa"].generate(
            ids, attention_mask=mask, max_new_tokens=6, min_new_tokens=6, do_sample=False, pad_token_id=0
        )
    for name in (SDPA_DECODE, SDPA_NO_CUDNN):
        with torch.no_grad():
            got = models[name](input_ids=ids, attention_mask=mask).logits
            out = models[name].generate(
                ids, attention_mask=mask, max_new_tokens=6, min_new_tokens=6, do_sample=False, pad_token_id=0
            )
        torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
        assert torch.equal(out, ref_out)


def test_cudnn_only_for_shapes_that_recur_and_the_flag_is_restored(
    models: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    import threading

    from cudaload.policies.sdpa_dispatch import RECUR

    ids, mask = _batch(False)
    flags: list[bool] = []
    orig_sdpa = torch.nn.functional.scaled_dot_product_attention

    def record(*a: Any, **k: Any) -> Any:
        flags.append(torch._C._get_cudnn_sdp_enabled())
        return orig_sdpa(*a, **k)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", record)
    layers = models[SDPA_DECODE].config.num_hidden_layers
    per_call: list[list[bool]] = []

    def run() -> None:  # a new thread: its counts (like cuDNN's graph cache) start empty
        for _ in range(RECUR + 1):
            flags.clear()
            with torch.no_grad():
                models[SDPA_DECODE](input_ids=ids, attention_mask=mask)
            per_call.append(list(flags))

    t = threading.Thread(target=run)
    t.start()
    t.join()
    assert [len(f) for f in per_call] == [layers] * (RECUR + 1)
    # the first RECUR forwards of a shape skip cuDNN, the next one leaves torch's choice to torch
    assert all(not any(f) for f in per_call[:RECUR])
    assert all(per_call[RECUR])
    assert torch._C._get_cudnn_sdp_enabled()


def test_decode_steps_go_to_cudnn_only_where_its_build_can_pay() -> None:
    """A prompt shape from its third meeting; a padded decode step (a mask) from its 65th; an unpadded decode
    step never (H200 run42: cuDNN saves too little there to repay a 40-60 ms build)."""
    import threading

    from cudaload.execute.runtime.sdpa_decode import _recurs
    from cudaload.policies.sdpa_dispatch import RECUR, RECUR_MASKED_DECODE, recur_threshold

    assert recur_threshold(7, True) == recur_threshold(7, False) == RECUR
    assert recur_threshold(1, True) == RECUR_MASKED_DECODE > RECUR
    assert recur_threshold(1, False) is None
    layer = torch.nn.Module()
    layer.layer_idx = 3
    q1, q7, k = torch.zeros(1, 4, 1, 8), torch.zeros(1, 4, 7, 8), torch.zeros(1, 4, 30, 8)
    mask = torch.ones(1, 1, 1, 30, dtype=torch.bool)
    seen: dict[str, list[bool]] = {}

    def run() -> None:  # a new thread: its counts start empty
        seen["prompt"] = [_recurs(layer, q7, k, None) for _ in range(RECUR + 2)]
        seen["padded"] = [_recurs(layer, q1, k, mask) for _ in range(RECUR_MASKED_DECODE + 2)]
        seen["unpadded"] = [_recurs(layer, q1, k, None) for _ in range(300)]

    t = threading.Thread(target=run)
    t.start()
    t.join()
    assert seen["prompt"] == [False] * RECUR + [True, True]
    assert seen["padded"] == [False] * RECUR_MASKED_DECODE + [True, True]
    assert not any(seen["unpadded"])


def test_a_user_who_turned_cudnn_off_keeps_it_off(models: dict[str, Any]) -> None:
    ids, mask = _batch(False)
    torch.backends.cuda.enable_cudnn_sdp(False)
    try:
        with torch.no_grad():
            models[SDPA_DECODE].generate(ids, attention_mask=mask, max_new_tokens=3, min_new_tokens=3)
        assert not torch._C._get_cudnn_sdp_enabled()
    finally:
        torch.backends.cuda.enable_cudnn_sdp(True)


def test_compiles_with_fullgraph() -> None:
    from cudaload.execute.runtime.sdpa_decode import _without_cudnn

    def f(q: Any, k: Any, v: Any) -> Any:
        return _without_cudnn(torch.nn.functional.scaled_dot_product_attention, q, k, v)

    q, k = torch.randn(1, 2, 1, 16), torch.randn(1, 2, 9, 16)
    got = torch.compile(f, fullgraph=True, backend="eager")(q, k, k)
    torch.testing.assert_close(got, torch.nn.functional.scaled_dot_product_attention(q, k, k))
    assert torch._C._get_cudnn_sdp_enabled()


# -- on the GPU -----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def gpu_models() -> dict[str, Any]:
    from transformers import AutoModelForCausalLM

    from cudaload.execute.runtime.sdpa_decode import register

    register()
    cfg = full_config("Qwen3-0.6B")
    cfg.num_hidden_layers = 4
    out = {}
    state = None
    for name in ("sdpa", SDPA_DECODE, "eager"):
        torch.manual_seed(0)
        with torch.device("cuda"):
            m = AutoModelForCausalLM.from_config(
                copy.deepcopy(cfg), dtype=torch.bfloat16, attn_implementation=name
            )
        m.eval()
        if state is None:
            state = m.state_dict()
        else:
            m.load_state_dict(state)
        out[name] = m
    return out


@pytest.mark.gpu
def test_gpu_dispatch_and_what_the_variant_runs(gpu_models: dict[str, Any]) -> None:
    from cudaload.execute.runtime.sdpa_decode import confirm, decode_backend

    seen = decode_backend("cuda", torch.bfloat16, 16, 8, 128)
    keep, _seen, why = confirm(gpu_models[SDPA_DECODE])
    cc = torch.cuda.get_device_capability()
    if cc in ((9, 0), (10, 0)):
        assert "cudnn_attention" in seen.values(), seen
        assert keep, why
    torch.backends.cuda.enable_cudnn_sdp(False)
    try:
        assert "cudnn_attention" not in decode_backend("cuda", torch.bfloat16, 16, 8, 128).values()
    finally:
        torch.backends.cuda.enable_cudnn_sdp(True)


@pytest.mark.gpu
@pytest.mark.parametrize("padded", [False, True])
def test_gpu_logits_within_bf16_tolerance(gpu_models: dict[str, Any], padded: bool) -> None:
    ids, mask = _batch(padded)
    ids, mask = ids.cuda(), mask.cuda()
    kw = dict(
        attention_mask=mask,
        max_new_tokens=8,
        min_new_tokens=8,
        do_sample=False,
        pad_token_id=0,
        output_logits=True,
        return_dict_in_generate=True,
    )
    with torch.no_grad():
        ref = gpu_models["sdpa"].generate(ids, **kw)
        got = gpu_models[SDPA_DECODE].generate(ids, **kw)
        eager = gpu_models["eager"].generate(ids, **kw)
    for a, b, e in zip(got.logits, ref.logits, eager.logits, strict=True):
        # the variant differs from sdpa by at most what sdpa differs from eager (kernels differ, bf16)
        tol = max(float((b - e).abs().max()), 0.05)
        assert float((a - b).abs().max()) <= 2 * tol


@pytest.mark.gpu
def test_gpu_static_cache_and_compile(gpu_models: dict[str, Any]) -> None:
    m = gpu_models[SDPA_DECODE]
    ids, mask = _batch(False)
    ids, mask = ids.cuda(), mask.cuda()
    kw = dict(attention_mask=mask, max_new_tokens=6, min_new_tokens=6, do_sample=False, pad_token_id=0)
    with torch.no_grad():
        ref = m.generate(ids, **kw)
        compiled = m.generate(ids, cache_implementation="static", compile_config=None, **kw)
    assert compiled.shape == ref.shape
    assert torch._C._get_cudnn_sdp_enabled()


def test_the_two_variants_are_one_candidate_on_first_seen_timings() -> None:
    # the same kernels on first-seen lengths: nocudnn's lower sample speaks for cudaload_sdpa too
    d = _declared({"sdpa": 5.0, SDPA_DECODE: 2.9, SDPA_NO_CUDNN: 2.4, "eager": 2.6})
    assert d.choice == SDPA_DECODE
    assert any("weighed at the lower of its and" in r for r in d.reasons)
    # explicitly, nocudnn is still there
    info = model_info(full_config("Qwen3-8B"))
    explicit = choose_attention(info, hardware("H200"), dtype="bfloat16", requested=SDPA_NO_CUDNN)
    assert explicit.choice == SDPA_NO_CUDNN


def test_short_single_sequence_gives_way_to_the_variant_where_it_is_the_default() -> None:
    """The short-decode eager rule was measured against plain sdpa on repeated lengths; against cudaload_sdpa on
    first-seen lengths eager lost on the H200's 8B shape (runs 31-32, 35), so where the variant is the default
    the rule does not fire; elsewhere (no facts, facts that say it does not help, A100) it still does."""
    info = model_info(full_config("Qwen3-8B"))
    h200 = hardware("H200")
    d = choose_attention(info, h200, dtype="bfloat16", work=(1, 544), sdpa_facts=[_facts()])
    assert d.choice == SDPA_DECODE
    assert any("not applied" in r and "9.15 s vs 8.44 s" in r for r in d.reasons)
    for facts in ([], [_facts(helps=False)]):
        assert (
            choose_attention(info, h200, dtype="bfloat16", work=(1, 544), sdpa_facts=facts).choice == "eager"
        )
    a100 = choose_attention(
        info, hardware("A100-80GB"), dtype="bfloat16", work=(1, 544), sdpa_facts=[_facts()]
    )
    assert a100.choice == "eager"
    # timings still decide over both rules
    timed = choose_attention(
        info,
        h200,
        dtype="bfloat16",
        work=(1, 544),
        sdpa_facts=[_facts()],
        timings={"eager": 1.0, SDPA_DECODE: 1.2},
    )
    assert timed.choice == "eager"
