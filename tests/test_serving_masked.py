"""The masked paged paths' per-step transient (issue 18: "never an out-of-memory crash").

On the H200, the serving plan's settings for Qwen3-0.6B (block 256 x 752 blocks, max_batch_tokens 8192) run with
``paged|eager`` died: "Tried to allocate 36.00 GiB" in the step, "98.00 GiB" in the graph warm-up
(benchmarks/results/2026-12-01-h200/run7-serving/serving2.log:15-19). These tests derive both figures from
transformers 5.17's own shapes, check the formula against the live tensors of transformers' own
``eager_paged_attention_forward`` on the CPU, and check that the plan now keeps the transient inside the device.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import cudaload
from cudaload.errors import DoesNotFitError
from cudaload.model_info import model_info
from cudaload.policies import serving as sv
from cudaload.testing import full_config

FIXTURES = Path(__file__).resolve().parent / "fixtures"
H200 = str(FIXTURES / "h200.json")
GiB = 1 << 30

#: the measured run (run7-serving): the plan's settings with attn_implementation "paged|eager"
RUN7_BLOCK, RUN7_BLOCKS, RUN7_M = 256, 752, 8192


def _qwen06() -> Any:
    s = model_info(full_config("Qwen3-0.6B")).summary
    assert (s.num_heads, s.num_kv_heads, s.head_dim, s.layers) == (16, 8, 128, 28)
    return s


def _eager_plan(hardware: str, **kw: Any) -> sv.ServingPlan:
    p = cudaload.plan(full_config("Qwen3-0.6B"), hardware=hardware, intent="serving", attn="eager", **kw)
    assert p.serving is not None
    return p.serving


def _fits_by_the_formula(s: sv.ServingPlan, dtype: str = "bfloat16") -> tuple[int, int]:
    """(bytes the settings need by an independent sum of the terms, bytes the device may hold)."""
    info = _qwen06()
    block = int(s.block_size.choice or 0)
    n = s.num_blocks * block
    m = s.max_batch_tokens
    q, k = sv.warmup_keys(cache_tokens=n, max_batch_tokens=m)
    assert k <= n + m  # never wider than the mask (input_outputs.py:185-190)
    tr = sv.masked_step_transient(
        heads=info.num_heads,
        kv_heads=info.num_kv_heads,
        head_dim=info.head_dim,
        dtype=dtype,
        q_tokens=q,
        keys=k,
        eager=s.attention.choice == "paged|eager",
    )
    io = 2 if s.async_batching.choice == "on" else 1
    mask = io * m * (n + m) * 2  # the static 4D mask, one per IO set (input_outputs.py:185-190)
    kv = n * s.kv_bytes_per_token
    mem = s.memory
    used = (
        mem["weights"] + mem["cuda_context"] + mem["working_set"] + mem["headroom"] + kv + mask + tr["peak"]
    )
    return used, mem["device"]


# -- the formula reproduces the measured allocations ---------------------------------------------------------
def test_the_formula_reproduces_the_36_gib_step_and_the_98_gib_warmup_of_run7() -> None:
    info = _qwen06()
    n = RUN7_BLOCK * RUN7_BLOCKS
    assert n == 192_512
    # a prefill chunk of 8192 tokens over requests that had ~60k tokens cached: transformers pads the read to
    # 16384-token steps (model_runner.py:86) and attends it plus the new tokens (input_outputs.py:472)
    q, k = sv.step_keys(8192, 60_000, cache_tokens=n, max_batch_tokens=RUN7_M, graphs=True)
    assert (q, k) == (8192, 65_536 + 8192)
    step = sv.masked_step_transient(
        heads=info.num_heads,
        kv_heads=info.num_kv_heads,
        head_dim=info.head_dim,
        dtype="bfloat16",
        q_tokens=q,
        keys=k,
        eager=True,
    )
    assert step["softmax_fp32"] == 36 * GiB  # "Tried to allocate 36.00 GiB" (serving2.log:19)
    assert step["scores"] == 18 * GiB and step["fp32_at_softmax"] == 2
    # the warm-up's largest step: 8192 queries over the whole cache (model_runner.py:241-244)
    q, k = sv.warmup_keys(cache_tokens=n, max_batch_tokens=RUN7_M)
    assert (q, k) == (8192, 200_704)
    warm = sv.masked_step_transient(
        heads=info.num_heads,
        kv_heads=info.num_kv_heads,
        head_dim=info.head_dim,
        dtype="bfloat16",
        q_tokens=q,
        keys=k,
        eager=True,
    )
    assert warm["softmax_fp32"] == 98 * GiB  # "Tried to allocate 98.00 GiB" (serving2.log:15)
    # all of it alive at the softmax: the scores, their fp32 copy and the fp32 softmax, plus the repeated K/V
    assert warm["peak"] == 16 * 8192 * 200_704 * 10 + warm["repeated_kv"]
    # sdpa's fused kernels hold none of it: only the gathered and repeated K/V
    sdpa = sv.masked_step_transient(
        heads=16, kv_heads=8, head_dim=128, dtype="bfloat16", q_tokens=q, keys=k, eager=False
    )
    assert "scores" not in sdpa and sdpa["peak"] == (2 * 16 + 8) * 200_704 * 128 * 2 < 2 * GiB


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
def test_the_terms_named_at_the_softmax_add_up_to_its_bytes(dtype: str) -> None:
    """explain() prints "scores X GiB + k x fp32 Y GiB at the softmax": that sum is what _eager_score_phases
    says is alive there (float32: the scores are the only copy, then one softmax tensor: 8 bytes, not 12)."""
    tr = sv.masked_step_transient(
        heads=4, kv_heads=2, head_dim=8, dtype=dtype, q_tokens=16, keys=100, eager=True
    )
    n = 4 * 16 * 100
    at_softmax, at_cast = sv._eager_score_phases(dtype)
    assert tr["scores"] + tr["fp32_at_softmax"] * tr["softmax_fp32"] == n * at_softmax
    assert tr["peak"] == tr["repeated_kv"] + n * max(at_softmax, at_cast)


def test_the_padding_is_transformers_own() -> None:
    pytest.importorskip("torch")
    import transformers

    if not transformers.__version__.startswith("5.17."):
        pytest.skip("mirrors transformers 5.17's ModelRunner")
    from transformers.generation.continuous_batching.initialization import FALLBACK_DEFAULTS
    from transformers.generation.continuous_batching.model_runner import ModelRunner

    assert FALLBACK_DEFAULTS["q_padding_interval_size"] == sv.TF_Q_PADDING
    assert FALLBACK_DEFAULTS["kv_padding_interval_size"] == sv.TF_KV_PADDING
    n = RUN7_BLOCK * RUN7_BLOCKS
    runner = SimpleNamespace(
        pad_inputs=True,
        cache=SimpleNamespace(max_batch_tokens=RUN7_M, num_pages=n),
        cb_config=SimpleNamespace(
            q_padding_interval_size=sv.TF_Q_PADDING,
            kv_padding_interval_size=sv.TF_KV_PADDING,
            max_requests_per_batch=64,
        ),
    )
    for q, kv in ((8192, 60_000), (100, 5), (8000, 190_000), (64, 0), (8192, n - RUN7_M)):
        tq, tkv = ModelRunner.maybe_pad_inputs(runner, q, kv, False)  # type: ignore[arg-type]
        assert sv.step_keys(q, kv, cache_tokens=n, max_batch_tokens=RUN7_M, graphs=True) == (tq, tkv + tq)


def _bench() -> Any:
    """benchmarks/investigations/bench_masked_transient.py as a module: its LiveBytes (the CPU stand-in for
    the allocator's peak) is what this file's live-tensor check uses too."""
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "investigations" / "bench_masked_transient.py"
    spec = importlib.util.spec_from_file_location("bench_masked_transient", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])  # float16 takes a fused softmax on CUDA only
def test_the_formula_matches_the_live_tensors_of_transformers_own_eager_paged_attention(dtype: str) -> None:
    torch = pytest.importorskip("torch")
    import transformers

    if not transformers.__version__.startswith("5.17."):
        pytest.skip(
            "drives 5.17's PagedAttentionCache.update (5.22 moved the read-back into cache allocators)"
        )
    from transformers.generation.continuous_batching.cache import PagedAttentionCache
    from transformers.integrations.eager_paged import eager_paged_attention_forward

    heads, kv_heads, d, q_len, cached = 8, 2, 32, 96, 1000
    keys = cached + q_len
    dt = getattr(torch, dtype)
    # transformers' own PagedAttentionCache.update on the attributes it reads: one full-attention layer
    cache = SimpleNamespace(
        layer_index_to_group_indices={0: (0, 0)},
        key_cache=[torch.randn(keys + 8, kv_heads, d, dtype=dt)],
        value_cache=[torch.randn(keys + 8, kv_heads, d, dtype=dt)],
        sliding_windows={0: 1},
    )
    cache.update = PagedAttentionCache.update.__get__(cache)  # type: ignore[attr-defined]
    module = SimpleNamespace(layer_idx=0, num_key_value_groups=heads // kv_heads)
    q = torch.randn(1, heads, q_len, d, dtype=dt)
    k = torch.randn(1, kv_heads, q_len, d, dtype=dt)
    v = torch.randn(1, kv_heads, q_len, d, dtype=dt)
    mask = torch.zeros(1, 1, q_len, keys, dtype=dt)
    read = [torch.arange(keys)]
    write = [torch.arange(cached, keys)]
    probe = _bench().LiveBytes([q, k, v, mask, *read, *write, *cache.key_cache, *cache.value_cache])
    with torch.no_grad(), probe.mode:
        out, weights = eager_paged_attention_forward(
            module, q, k, v, mask, d**-0.5, cache=cache, read_index=read, write_index=write
        )
        del out, weights
    formula = sv.masked_step_transient(
        heads=heads, kv_heads=kv_heads, head_dim=d, dtype=dtype, q_tokens=q_len, keys=keys, eager=True
    )
    # the formula names exactly what is alive at the peak: the repeated K/V and the score tensors
    assert probe.peak == formula["peak"], (probe.peak, formula)
    per_score = (probe.peak - formula["repeated_kv"]) / (heads * q_len * keys)
    assert per_score == {"bfloat16": 10, "float32": 8}[dtype]


# -- the plan keeps it inside the device ---------------------------------------------------------------------
def test_eager_on_the_h200_lowers_max_batch_tokens_until_the_scores_fit() -> None:
    s = _eager_plan(H200, seq_len=2304, batch_size=64)
    assert s.attention.choice == "paged|eager" and s.attn_implementation == "paged|eager"
    # the same declared work as the measured run: every request fits at once, as with sdpa
    sdpa = cudaload.plan(
        full_config("Qwen3-0.6B"), hardware=H200, intent="serving", seq_len=2304, batch_size=64
    )
    assert sdpa.serving is not None
    assert s.num_blocks == sdpa.serving.num_blocks == RUN7_BLOCKS
    assert sdpa.serving.max_batch_tokens == RUN7_M
    # ... but not at the 8192-token steps that crashed: rejected with the figure, and a smaller step chosen
    assert s.batch_tokens is not None
    rejected = s.batch_tokens.candidate("8192")
    assert rejected is not None and not rejected.ok
    assert any("16 heads" in r and "more than" in r for r in rejected.reasons)
    assert s.max_batch_tokens < RUN7_M and s.max_batch_tokens >= 256
    assert any("lowered from 8192" in r for r in s.batch_tokens.reasons)
    used, device = _fits_by_the_formula(s)
    assert used <= device, (used / GiB, device / GiB)
    # the plan's own sum agrees: the scores are inside cache_and_buffers
    m = s.memory
    assert (
        m["weights"] + m["cuda_context"] + m["working_set"] + m["headroom"] + m["cache_and_buffers"] <= device
    )
    # the measured settings, counted the same way, do not fit the same device
    crashed = replace(s, max_batch_tokens=RUN7_M)
    used_crashed, _ = _fits_by_the_formula(crashed)
    assert used_crashed > device
    assert "paged|eager per-layer transient" in "\n".join(s.notes)


def test_undeclared_eager_work_keeps_the_scores_no_larger_than_the_cache() -> None:
    s = _eager_plan(H200)
    assert s.attention.choice == "paged|eager"
    used, device = _fits_by_the_formula(s)
    assert used <= device
    info = _qwen06()
    n = s.num_blocks * int(s.block_size.choice or 0)
    q, k = sv.warmup_keys(cache_tokens=n, max_batch_tokens=s.max_batch_tokens)
    tr = sv.masked_step_transient(
        heads=info.num_heads, kv_heads=8, head_dim=128, dtype="bfloat16", q_tokens=q, keys=k, eager=True
    )
    assert tr["peak"] - tr["repeated_kv"] <= 1.05 * n * s.kv_bytes_per_token


@pytest.mark.parametrize("card", ["L4", "RTX-4090"])
def test_a_24_gb_card_keeps_eager_where_it_fits_and_falls_back_to_sdpa_where_not(card: str) -> None:
    small = _eager_plan(card, seq_len=2304, batch_size=8)
    assert small.attention.choice == "paged|eager"
    used, device = _fits_by_the_formula(small)
    assert used <= device
    assert small.cache_tokens >= 8 * (2304 // 256 + 2) * 256
    # 64 such requests need ~17.6 GiB of KV: beside it no step size leaves room for eager's scores
    big = _eager_plan(card, seq_len=2304, batch_size=64)
    assert big.attention.choice == "paged|sdpa" and big.attn_implementation == "paged|sdpa"
    eager = big.attention.candidate("paged|eager")
    assert eager is not None and not eager.ok and any("rejected" in r for r in eager.reasons)
    assert any("paged|eager" in r for r in big.attention.reasons)
    used, device = _fits_by_the_formula(big)
    assert used <= device


def _direct_info(**kw: Any) -> Any:
    return replace(model_info(full_config("Qwen3-0.6B")), **kw)


def _direct(info: Any, **kw: Any) -> sv.ServingPlan:
    args: dict[str, Any] = {
        "dtype": "bfloat16",
        "attention_choice": "eager",
        "quantization": None,
        "weights_bytes": info.counts.total * 2,
        "device_total": 24 * GiB,
        "device_budget": 24 * GiB,
        "gpu_name": "NVIDIA L4",
        "seq_len": 2304,
        "batch_size": 64,
        "transformers_version": "5.17.0",
    }
    args.update(kw)
    return sv.plan_serving(info, **args)


def test_a_model_without_sdpa_keeps_eager_at_the_smallest_step_and_queues() -> None:
    s = _direct(_direct_info(supports_sdpa=False))
    assert s.attention.choice == "paged|eager" and s.max_batch_tokens == 256
    assert any("queues the rest" in w for w in s.warnings)
    used, device = _fits_by_the_formula(s)
    assert used <= device
    # a single request longer than what fits beside the scores: a planning error naming the fixes
    with pytest.raises(DoesNotFitError) as e:
        _direct(_direct_info(supports_sdpa=False), seq_len=200_000, batch_size=1)
    assert "paged|eager's scores" in str(e.value)
    assert e.value.fix and "flash-attn" in e.value.fix and "seq_len" in e.value.fix


def test_footprint_counts_the_scores_as_the_formula_does() -> None:
    base = {"layers": 28, "kv_heads": 8, "head_dim": 128, "heads": 16, "hidden": 1024, "vocab": 151936}
    plain = sv.CacheShape(**base, dtype_bytes=2, masked=True, fast_decode=False, repeated_kv_peak=True)
    eager = replace(plain, score_bytes=sv.eager_score_bytes("bfloat16"))
    assert sv.eager_score_bytes("bfloat16") == 10
    assert sv.eager_score_bytes("float16") == 8 and sv.eager_score_bytes("float32") == 8
    for m, n in ((8192, 192_512), (2048, 192_512), (256, 1_000_000)):

        def peaks(shape: sv.CacheShape, m: int = m, n: int = n) -> list[int]:
            return [
                cn * n + cm * m + cmn * m * n + cmm * m * m
                for cm, cn, cmn, cmm in sv.footprint_coefficients(
                    shape, io_multiplier=1, max_blocks_per_request=0
                )
            ]

        lm_p, attn_p = peaks(plain)
        lm_e, attn_e = peaks(eager)
        # the scores over M queries and K = N + M keys join the attention peak only
        assert lm_e == lm_p and attn_e - attn_p == 16 * m * (n + m) * 10
        assert sv.footprint(eager, m, n, io_multiplier=1, max_blocks_per_request=0) == max(lm_e, attn_e)
        # and the cache solved for a budget fits it with the scores
        got = sv.solve_cache_tokens(eager, m, 100 * GiB, io_multiplier=2, max_blocks_per_request=0)
        assert sv.footprint(eager, m, got, io_multiplier=2, max_blocks_per_request=0) <= 100 * GiB


def test_settle_keeps_the_scores_inside_the_measured_free_memory() -> None:
    s = _eager_plan(H200, seq_len=2304, batch_size=64)
    shape = sv.CacheShape(
        layers=28,
        kv_heads=8,
        head_dim=128,
        heads=16,
        hidden=1024,
        vocab=151936,
        dtype_bytes=2,
        masked=True,
        fast_decode=False,
        repeated_kv_peak=True,
        score_bytes=10,
    )
    io = 2 if s.async_batching.choice == "on" else 1
    block = int(s.block_size.choice or 0)
    planned = sv.footprint(
        shape, s.max_batch_tokens, s.cache_tokens, io_multiplier=io, max_blocks_per_request=0
    )
    assert planned == s.memory["cache_and_buffers"]
    free = s.memory["working_set"] + s.memory["headroom"] + planned // 3
    tight = sv.settle(s, free)
    assert 0 < tight.num_blocks < s.num_blocks
    usable = free - s.memory["working_set"] - s.memory["headroom"]
    after = sv.footprint(
        shape, s.max_batch_tokens, tight.num_blocks * block, io_multiplier=io, max_blocks_per_request=0
    )
    assert after <= usable


def test_the_graphs_reasons_quote_the_measured_masked_steps_not_the_floor_as_a_step_time() -> None:
    s = cudaload.plan(full_config("Qwen3-0.6B"), hardware=H200, intent="serving", seq_len=2304, batch_size=64)
    assert s.serving is not None
    g = s.serving.cuda_graphs
    assert g.choice == "on"
    text = " ".join(g.reasons)
    assert "bandwidth floor" in text and "on the GPU" not in text
    assert "90.7 ms" in text and "run7-serving" in text
    assert "not measured apart" in text


def test_the_loaded_model_takes_sdpa_where_the_serving_plan_replaced_eager() -> None:
    """transformers pages the model's own attention when the manager starts (continuous_api.py:651-683): the
    fallback only holds if the loaded model runs sdpa."""
    pytest.importorskip("torch")
    from transformers import AutoModelForCausalLM

    from cudaload.execute.serving import attach_serving
    from cudaload.testing import tiny_config

    config = tiny_config("qwen3")
    p = cudaload.plan(config, intent="serving", attn="eager", seq_len=64, batch_size=4)
    assert (
        p.serving is not None and p.serving.attention.choice == "paged|eager"
    )  # no GPU: nothing to run out of
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    verified: dict[str, Any] = {}
    kept = attach_serving(model, p, verified)
    assert model.config._attn_implementation == "eager" and "serving_attention" not in verified
    switched = replace(
        p, serving=replace(p.serving, attention=sv._eager_to_sdpa(p.serving.attention, "test"))
    )
    attach_serving(model, switched, verified)
    assert model.config._attn_implementation == "sdpa" and verified["serving_attention"] == "sdpa"
    assert kept.serving is not None and kept.serving.num_blocks == p.serving.num_blocks


def test_the_transient_benchmark_smoke_run_measures_the_formula_on_cpu(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    import json

    import transformers

    if not transformers.__version__.startswith("5.17."):
        pytest.skip("the benchmark's stub cache drives 5.17's PagedAttentionCache.update")
    mod = _bench()
    assert mod.main(["--smoke", "--out", str(tmp_path)]) == 0
    res = json.loads((tmp_path / "masked_transient.json").read_text())
    assert len(res["cases"]) == len(mod.SMOKE_CASES)
    for e in res["cases"]:
        eager = e["eager"]
        # transformers' own eager forward allocates exactly what the plan counts
        assert eager["peak_bytes"] == eager["formula_bytes"] and eager["n"] == 2
        assert e["sdpa"]["peak_bytes"] > 0 and e["sdpa"]["ms_median"] > 0
    assert "| eager |" in (tmp_path / "masked_transient.md").read_text()
