"""The graphed decode (issue 43): a decode step as a CUDA graph of the eager model, no compiler. On the CPU: what a
step's inputs depend on (``signature``) over the inputs transformers' own generate() hands a step, the late-stop
loop with a step function in place of the model, the per-call policy's three paths over explicit facts, and why a
model is refused. On a GPU (``gpu`` marker): the capture, replay and greedy parity with the dynamic path."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from cudaload.execute.decode_calls import graph_refusal
from cudaload.execute.runtime import decode_loop
from cudaload.execute.runtime.graphed_step import DecodeGraphs, signature
from cudaload.policies.decode import MARGIN
from cudaload.policies.decode_call import CallQuery, choose_call_decode
from cudaload.policies.decode_facts import DecodeFacts, Scaled


def _facts(dyn: float = 37.0, graphed: float | None = 9.0, capture: float = 0.5, comp: float = 6.2) -> Scaled:
    d: dict[str, Any] = {
        "gpu": "NVIDIA H200/sm90",
        "date": "2026-12-07",
        "model": "test",
        "weight_bytes": 16_400_000_000,
        "layers": 36,
        "dtype": "bfloat16",
        "dynamic_ms_per_token": [[1000, dyn]],
        "compiled_ms_per_token": [[1000, comp]],
        "compile_s": {"cold": 58.0, "warm": 12.0},
        "source": "explicit test facts",
    }
    if graphed is not None:
        d["graphed_ms_per_token"] = [[1000, graphed]]
        d["graph_capture_s"] = capture
    return Scaled(DecodeFacts.from_dict(d), 1.0, 1.0, "test")


def _q(**kw: Any) -> CallQuery:
    base: dict[str, Any] = {
        "batch": 1,
        "prompt_len": 640,
        "max_new_tokens": 64,
        "eos": False,
        "bucket": 1024,
        "facts": _facts(),
        "graphable": None,
    }
    base.update(kw)
    return CallQuery(**base)


# -- the policy ----------------------------------------------------------------------------------------------------


def test_a_short_call_is_graphed_where_the_capture_pays_within_it() -> None:
    got = choose_call_decode(_q())
    # 63 steps: dynamic 2.3 s; graphed 0.5 s capture + 0.57 s; compiled 58 s cold + 0.39 s
    assert got.graphed and got.bucket == 1024 and got.compile == "capture"
    assert got.expected["seconds_graphed"] == pytest.approx(0.5 + 63 * 9.0 / 1000)
    assert "saves 63 x (37.0 - 9.0) ms = 1.8 s > 0.50 s capture" in got.reason
    comp = got.decision.candidate("compiled")
    assert (
        comp is not None and comp.ok and "(6.2" not in comp.reasons[0] and "(9.0 - 6.2) ms" in comp.reasons[0]
    )


def test_too_few_steps_for_the_capture_stay_dynamic() -> None:
    # 3 steps save 84 ms against a 0.5 s capture
    got = choose_call_decode(_q(max_new_tokens=4))
    assert got.decision.choice == "dynamic" and "graphed: saves 3 x (37.0 - 9.0) ms = 0.1 s <" in got.reason


def test_a_very_long_call_compiles_against_the_graphed_path_not_the_dynamic_one() -> None:
    # cold: 58 s / (9.0 - 6.2) ms: past ~21,000 steps with the margin; warm (12 s): past ~5,000
    assert choose_call_decode(_q(max_new_tokens=3000, bucket=4096)).graphed
    warm = choose_call_decode(_q(max_new_tokens=8000, bucket=16384, warm=True))
    assert warm.compiled and warm.compile == "warm"
    # the break-even in steps: 12 + 6.2e-3 s <= (1 - MARGIN) x (0.5 + 9.0e-3 s)
    edge = (12 - (1 - MARGIN) * 0.5) / ((1 - MARGIN) * 9.0 - 6.2) * 1000
    assert choose_call_decode(_q(max_new_tokens=int(edge) + 3, bucket=16384, warm=True)).compiled
    assert choose_call_decode(_q(max_new_tokens=int(edge) - 3, bucket=16384, warm=True)).graphed


@pytest.mark.parametrize(
    ("over", "says"),
    [
        ({"graphable": "attention 'sdpa'"}, "cannot be captured here: attention 'sdpa'"),
        ({"graph_failed_here": True}, "capture failed earlier"),
        ({"facts": _facts(graphed=None)}, "no graphed decode measured"),
    ],
)
def test_the_graphed_path_closed_says_why_and_the_rest_decide(over: dict[str, Any], says: str) -> None:
    got = choose_call_decode(_q(**over))
    assert got.decision.choice == "dynamic" and says in got.reason
    g = got.decision.candidate("graphed")
    assert g is not None and not g.ok and any(says in r for r in g.reasons)
    assert choose_call_decode(_q(max_new_tokens=6000, bucket=8192, **over)).compiled


def test_facts_round_trip_with_the_graphed_fields() -> None:
    f = _facts().facts
    assert DecodeFacts.from_dict(f.to_dict()) == f and f.graphed
    assert not _facts(graphed=None).facts.graphed


# -- the step's inputs, as generate() hands them -------------------------------------------------------------------


@pytest.fixture
def lm(tiny_model: Callable[..., Path]) -> Any:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model("qwen3"), dtype=torch.float32).eval()
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model


def _prompt(batch: int = 2, n: int = 7) -> tuple[Any, Any]:
    import torch

    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, 90, (batch, n), generator=g)
    mask = torch.ones_like(ids)
    mask[-1, :2] = 0  # left padding
    return ids, mask


def _generate(model: Any, ids: Any, mask: Any, **kw: Any) -> Any:
    return type(model).generate(
        model, input_ids=ids, attention_mask=mask, max_new_tokens=6, min_new_tokens=6, do_sample=False, **kw
    )


def test_a_static_cache_step_has_one_signature_and_the_step_function_gives_transformers_tokens(
    lm: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(decode_loop, "late_stop_refusal", lambda *a: None)  # the CPU's refusal (tested apart)
    ids, mask = _prompt()
    want = _generate(lm, ids, mask)
    seen: list[Any] = []

    def step(**inputs: Any) -> Any:
        seen.append(signature(inputs))
        return lm(**inputs)

    static = {"cache_implementation": "static", "max_cache_len": 32, "disable_compile": True}
    got = _generate(lm, ids, mask, **static, custom_generate=decode_loop.graphed_sample(step))
    assert got.tolist() == want.tolist()
    assert len(seen) == 5 and None not in seen and len(set(seen)) == 1  # 6 tokens: the prefill's + 5 steps
    # DecodeGraphs on the CPU: every step eager, nothing captured, the same tokens
    graphs = DecodeGraphs(lm)
    again = _generate(lm, ids, mask, **static, custom_generate=decode_loop.graphed_sample(graphs.step))
    assert again.tolist() == want.tolist() and graphs.captures == [] and graphs.graphs == {}
    # the dynamic cache's steps: no signature (nothing static to capture)
    dyn: list[Any] = []

    def dyn_step(**inputs: Any) -> Any:
        dyn.append(signature(inputs))
        return lm(**inputs)

    _generate(lm, ids, mask, custom_generate=decode_loop.graphed_sample(dyn_step))
    assert dyn and all(s is None for s in dyn)


def test_signature_refuses_what_it_cannot_copy() -> None:
    import torch

    t = torch.zeros(2, 1, dtype=torch.long)
    assert signature({"input_ids": t, "use_cache": True}) == signature(
        {"input_ids": t.clone(), "use_cache": True}
    )
    assert signature({"input_ids": t}) != signature({"input_ids": torch.zeros(3, 1, dtype=torch.long)})
    assert signature({"input_ids": t, "x": object()}) is None
    assert signature({"input_ids": t, "past_key_values": object()}) is None


def test_graph_refusal_names_the_device_and_the_attention(lm: Any) -> None:
    import torch

    ids = torch.zeros(1, 3, dtype=torch.long)
    assert "CUDA graphs need CUDA" in (graph_refusal(lm, ids) or "")

    class OnCuda:
        device = torch.device("cuda")

    lm.config._attn_implementation = "sdpa"
    assert "attention 'sdpa'" in (graph_refusal(lm, OnCuda()) or "")
    lm.config._attn_implementation = "cudaload_sdpa"
    assert graph_refusal(lm, OnCuda()) is None


# -- the GPU -------------------------------------------------------------------------------------------------------


@pytest.mark.gpu
def test_on_a_gpu_the_step_is_captured_once_and_gives_the_dynamic_tokens(
    tiny_model: Callable[..., Path],
) -> None:
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs an NVIDIA GPU (runs on the H200 device machine)")
    from transformers import AutoModelForCausalLM

    from cudaload.execute.runtime import sdpa_decode

    sdpa_decode.register()
    model = AutoModelForCausalLM.from_pretrained(
        tiny_model("qwen3"), dtype=torch.bfloat16, attn_implementation="cudaload_sdpa"
    ).to("cuda")
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    ids, mask = (t.cuda() for t in _prompt())
    want = _generate(model, ids, mask)
    graphs = DecodeGraphs(model)
    static = {"cache_implementation": "static", "max_cache_len": 64, "disable_compile": True}
    for _ in range(2):
        got = _generate(model, ids, mask, **static, custom_generate=decode_loop.graphed_sample(graphs.step))
        assert got.tolist() == want.tolist()
    # one capture per call: transformers builds a new static cache for each generate() call; the graph of the
    # cache before is dropped
    assert len(graphs.captures) == 2 and all("seconds" in c for c in graphs.captures), graphs.captures
    assert len(graphs.graphs) == 1


def test_a_record_without_graphed_figures_borrows_those_of_its_architecture() -> None:
    from cudaload.policies.decode_facts import with_graphed

    h100 = _facts().facts
    h200 = DecodeFacts.from_dict({**_facts(graphed=None).facts.to_dict(), "gpu": "NVIDIA H200/sm90"})
    got = with_graphed(h200, [h200, h100])
    assert got.graphed and got.graphed_from == h100.gpu_name and got.graphed_ms == h100.graphed_ms
    assert DecodeFacts.from_dict(got.to_dict()) == got  # the per-call plan carries it as a dict
    other = DecodeFacts.from_dict({**h200.to_dict(), "gpu": "NVIDIA A100/sm80"})
    assert not with_graphed(other, [other, h100]).graphed  # another architecture lends nothing
    assert with_graphed(h100, [h100]) is h100


def test_a_batched_graphed_step_grows_by_its_own_measurement() -> None:
    """The graphed step's batch factor comes from its own batched measurement where there is one (H100, 8B: 13.87
    ms at batch 8 against 11.2 at batch 1), else from the compiled path's; the borrowing record takes it too."""
    from cudaload.policies.decode_facts import with_graphed

    base = _facts().facts.to_dict()
    compiled_only = DecodeFacts.from_dict({**base, "compiled_ms_per_step_batched": [[8, 1000, 6.2 * 1.65]]})
    assert compiled_only.graphed_batch_factor(8) == pytest.approx(1.65)  # no graphed batch measured
    both = DecodeFacts.from_dict(
        {**compiled_only.to_dict(), "graphed_ms_per_step_batched": [[8, 1000, 9.0 * 1.24]]}
    )
    assert both.graphed_batch_factor(1) == 1.0
    assert both.graphed_batch_factor(8) == pytest.approx(1.24)
    assert both.graphed_batch_factor(4) == pytest.approx(1 + 3 * 0.24 / 7)  # linear between them
    assert both.batch_factor(8) == pytest.approx(1.65)  # the compiled path keeps its own
    assert Scaled(both, 1.0, 1.0, "t").graphed_ms(1000, 8) == pytest.approx(9.0 * 1.24)
    assert DecodeFacts.from_dict(both.to_dict()) == both
    h100 = DecodeFacts.from_dict({**both.to_dict(), "gpu": "NVIDIA H100 80GB HBM3/sm90"})
    h200 = DecodeFacts.from_dict({**_facts(graphed=None).facts.to_dict(), "gpu": "NVIDIA H200/sm90"})
    assert with_graphed(h200, [h200, h100]).graphed_batched == h100.graphed_batched
