"""The compiled decode step's attention (cudaload.execute.runtime.sdpa_decode.grouped_decode_attention): the same outputs as
transformers' sdpa over masked caches (fp32 to rounding; bf16 within eager's precision) (GQA and not, padded batches, a few queries, a custom scale), taken only
inside a compiled graph and only where it computes what sdpa would, and generate()'s compiled static-cache path
through it giving the dynamic path's greedy tokens."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")


class _Layer(torch.nn.Module):
    def __init__(self, groups: int) -> None:
        super().__init__()
        self.num_key_value_groups = groups
        self.is_causal = True
        self.layer_idx = 0


def _problem(
    batch: int, heads: int, kv_heads: int, queries: int, slots: int, valid: list[int]
) -> tuple[Any, ...]:
    g = torch.Generator().manual_seed(heads * 100 + kv_heads * 10 + queries)
    q = torch.randn(batch, heads, queries, 16, generator=g)
    k = torch.randn(batch, kv_heads, slots, 16, generator=g)
    v = torch.randn(batch, kv_heads, slots, 16, generator=g)
    mask = torch.zeros(batch, 1, queries, slots, dtype=torch.bool)
    for row, n in enumerate(
        valid
    ):  # left padding of 3 - row slots, then n valid ones; the rest unused (zeros)
        start = 3 - row
        k[row, :, start + n :] = 0
        v[row, :, start + n :] = 0
        for i in range(queries):  # causal among the new queries
            mask[row, 0, i, start : start + n - queries + 1 + i] = True
    return q, k, v, mask


@pytest.mark.parametrize(("heads", "kv_heads"), [(4, 4), (4, 2), (8, 2)])
@pytest.mark.parametrize("queries", [1, 3])
def test_grouped_attention_equals_transformers_sdpa(heads: int, kv_heads: int, queries: int) -> None:
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    from cudaload.execute.runtime.sdpa_decode import grouped_decode_attention

    q, k, v, mask = _problem(2, heads, kv_heads, queries, 24, [9, 15])
    layer = _Layer(heads // kv_heads)
    for scaling in (None, 0.3):
        ref, _ = sdpa_attention_forward(layer, q, k, v, mask, scaling=scaling)
        got, weights = grouped_decode_attention(q, k, v, mask, scaling)
        assert weights is None and got.shape == ref.shape == (2, queries, heads, 16)
        torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)


def test_bf16_within_eager_precision_other_value_widths_and_a_shared_mask() -> None:
    """bf16 inputs: bf16 scores (eager's arithmetic), so within bf16 tolerance of sdpa, not equal; a value head
    wider than the query's (MLA-style); one mask row for a batch of two."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    from cudaload.execute.runtime.sdpa_decode import grouped_decode_attention

    q, k, v, mask = _problem(2, 8, 2, 1, 64, [30, 50])
    layer = _Layer(4)
    ref = sdpa_attention_forward(layer, q, k, v, mask)[0]
    got = grouped_decode_attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), mask, None)[0]
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), ref, rtol=0.03, atol=0.03)
    wide = torch.randn(2, 2, 64, 24, generator=torch.Generator().manual_seed(5))
    one = mask[:1]
    ref_w = sdpa_attention_forward(layer, q, k, wide, one)[0]
    got_w = grouped_decode_attention(q, k, wide, one, None)[0]
    assert got_w.shape == (2, 1, 8, 24)
    torch.testing.assert_close(got_w, ref_w, rtol=1e-5, atol=1e-5)


def test_soft_capping_is_never_dropped_by_the_compiled_step() -> None:
    from cudaload.execute.runtime.sdpa_decode import _grouped_applies

    q, k, _, mask = _problem(1, 8, 2, 1, 20, [9])
    assert _grouped_applies(q, k, mask, {"scaling": 0.2, "dropout": 0.0})
    assert not _grouped_applies(q, k, mask, {"softcap": 50.0})


def _compiled(fn: Callable[..., Any]) -> Callable[..., Any]:
    torch._dynamo.reset()
    return torch.compile(fn, backend="eager", fullgraph=True)


@pytest.mark.parametrize("variant", ["cudaload_sdpa", "cudaload_sdpa_nocudnn"])
def test_a_compiled_masked_decode_step_runs_grouped_and_nothing_else_does(
    variant: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    from cudaload.execute.runtime import sdpa_decode

    fn = {
        "cudaload_sdpa": sdpa_decode.sdpa_decode_forward,
        "cudaload_sdpa_nocudnn": sdpa_decode.sdpa_no_cudnn_forward,
    }[variant]
    taken: list[tuple[int, ...]] = []
    real = sdpa_decode.grouped_decode_attention

    def spy(query: Any, *a: Any) -> Any:
        taken.append(tuple(query.shape))
        return real(query, *a)

    monkeypatch.setattr(sdpa_decode, "grouped_decode_attention", spy)
    layer = _Layer(4)
    q, k, v, mask = _problem(2, 8, 2, 1, 20, [7, 12])
    ref, _ = sdpa_attention_forward(layer, q, k, v, mask)

    got, _ = _compiled(lambda q, k, v, m: fn(layer, q, k, v, m))(q, k, v, mask)
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
    assert taken == [(2, 8, 1, 16)]

    # eager: transformers' sdpa as before (cuDNN rule only)
    taken.clear()
    torch.testing.assert_close(fn(layer, q, k, v, mask)[0], ref, rtol=1e-5, atol=1e-5)
    assert taken == []
    # compiled, but what grouped would not compute as sdpa does: no mask (sdpa's causal / GQA path), a
    # position bias, dropout, a prefill longer than a decode step
    cases: list[tuple[Any, dict[str, Any]]] = [
        (None, {}),
        (mask, {"position_bias": torch.zeros(2, 8, 1, 20)}),
        (mask, {"dropout": 0.1}),
        (mask, {"s_aux": torch.zeros(8)}),
        (mask, {"sinks": torch.zeros(8)}),
        (torch.zeros(2, 1, 1, 20).masked_fill(~mask, -1e9), {}),  # an additive float mask
        (mask.expand(2, 8, 1, 20), {}),  # a mask per head
    ]
    for m, kw in cases:
        _compiled(lambda q, k, v, m, kw=kw: fn(layer, q, k, v, m, **kw))(q, k, v, m)
    # one mask row broadcast over three queries (sdpa takes it; grouped wants a row per query)
    q3 = _problem(2, 8, 2, 3, 20, [7, 12])[0]
    _compiled(lambda q, k, v, m: fn(layer, q, k, v, m))(q3, k, v, mask)
    qp, kp, vp, mp = _problem(2, 8, 2, 12, 20, [14, 15])
    _compiled(lambda q, k, v, m: fn(layer, q, k, v, m))(qp, kp, vp, mp)
    assert taken == []


def test_compiled_static_decode_through_cudaload_sdpa_gives_the_dynamic_tokens(
    tiny_model: Callable[..., Path],
) -> None:
    """generate()'s compiled static-cache path with the model on cudaload_sdpa (fp32, CPU, aot_eager): each
    decode step runs the grouped attention, and the greedy tokens are the dynamic path's."""
    from transformers import AutoModelForCausalLM

    from cudaload.execute.decode import apply_decode, warm_decode
    from cudaload.execute.runtime import sdpa_decode
    from cudaload.plans.decision import Decision
    from cudaload.plans.decode import DecodePlan

    sdpa_decode.register()
    torch._dynamo.reset()
    model = AutoModelForCausalLM.from_pretrained(
        tiny_model("qwen3"), dtype=torch.float32, attn_implementation="cudaload_sdpa"
    ).eval()
    g = torch.Generator().manual_seed(3)
    prompts = [
        torch.randint(3, model.config.vocab_size, (b, n), generator=g) for b, n in ((1, 9), (1, 23), (2, 14))
    ]

    def greedy(ids: Any) -> tuple[list[list[int]], float]:
        out = model.generate(
            input_ids=ids,
            attention_mask=ids.new_ones(ids.shape),
            max_new_tokens=10,
            min_new_tokens=10,
            do_sample=False,
            output_logits=True,
            return_dict_in_generate=True,
            pad_token_id=0,
        )
        margin = min(float(lg.topk(2).values.diff(dim=-1).abs().min()) for lg in out.logits)
        return out.sequences[:, ids.shape[1] :].tolist(), margin

    dynamic = [greedy(p) for p in prompts]
    plan = DecodePlan(
        mode=Decision(choice="compiled", reasons=("test",)),
        max_cache_len=64,
        cache_buckets=(64,),
        batch_sizes=(1, 2),
        compile={"backend": "aot_eager", "mode": None, "fullgraph": False, "dynamic": False},
        cache_key="grouped-test",
    )
    apply_decode(model, plan)
    model.generation_config.compile_config._compile_all_devices = (
        True  # transformers' switch to compile on CPU
    )
    taken: list[int] = []
    real = sdpa_decode.grouped_decode_attention

    def spy(query: Any, *a: Any) -> Any:
        taken.append(query.shape[2])
        return real(query, *a)

    sdpa_decode.grouped_decode_attention = spy  # type: ignore[assignment]
    try:
        assert warm_decode(model, plan)["compiled"]
        for p, (tokens, margin) in zip(prompts, dynamic, strict=True):
            assert margin > 1e-4  # not tied: fp32 must then agree exactly
            assert greedy(p)[0] == tokens
    finally:
        sdpa_decode.grouped_decode_attention = real  # type: ignore[assignment]
        torch._dynamo.reset()
    # traced once per layer per compiled graph (batch 1 and 2), one query each
    assert taken and set(taken) == {1}
    assert len(taken) % model.config.num_hidden_layers == 0
