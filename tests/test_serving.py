"""intent="serving": transformers' continuous-batching settings planned from memory (pure, over the real H200
snapshot), their agreement with transformers' own memory check, bad input, and the loaded model on the CPU."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable
from dataclasses import fields
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import cudaload
from cudaload.errors import ConfigurationError, DoesNotFitError
from cudaload.model_info import model_info
from cudaload.plans.plan import Plan
from cudaload.policies import serving as sv
from cudaload.testing import full_config

FIXTURES = Path(__file__).resolve().parent / "fixtures"
H200 = str(FIXTURES / "h200.json")
GiB = 1 << 30


def _serving_plan(shape: str, **kw: Any) -> Plan:
    return cudaload.plan(full_config(shape), hardware=H200, intent="serving", **kw)


def _direct(shape: str, **kw: Any) -> sv.ServingPlan:
    """plan_serving on its own: one 141 GB GPU unless told otherwise."""
    info = model_info(full_config(shape))
    args: dict[str, Any] = {
        "dtype": "bfloat16",
        "attention_choice": "sdpa",
        "quantization": None,
        "weights_bytes": info.counts.total * 2,
        "device_total": 140 * GiB,
        "device_budget": 140 * GiB,
        "gpu_name": "NVIDIA H200",
        "seq_len": None,
        "batch_size": None,
        "transformers_version": "5.17.0",
    }
    args.update(kw)
    return sv.plan_serving(info, **args)


# -- the plan on the H200 -------------------------------------------------------------------------------------
@pytest.mark.parametrize("shape", ["Qwen3-0.6B", "Qwen3-8B"])
def test_declared_work_gets_a_cache_sized_to_it_within_the_device(shape: str) -> None:
    p = _serving_plan(shape, seq_len=2304, batch_size=64)
    s = p.serving
    assert s is not None and p.intent == "serving"
    # the attention decision (sdpa on this H200: no flash package) in its paged form, for transformers 5.17
    assert p.attention.choice == "sdpa"
    assert s.attention.choice == "paged|sdpa" and s.attn_implementation == "paged|sdpa"
    block = int(s.block_size.choice or 0)
    # every declared request fits at once, whole blocks plus one each, with the scheduler's 15% margin
    assert s.cache_tokens >= 64 * (2304 // block + 2) * block
    assert s.concurrent_requests is not None and s.concurrent_requests >= 64
    assert s.max_requests_per_batch == 64
    # the memory it counts stays inside what the device may hold
    m = s.memory
    used = m["weights"] + m["cuda_context"] + m["working_set"] + m["headroom"] + m["cache_and_buffers"]
    assert used <= m["device"]
    assert m["headroom"] >= int(0.05 * 140 * GiB)
    kv_token = 2 * p.model.layers * p.model.num_kv_heads * p.model.head_dim * 2
    assert s.kv_bytes_per_token == kv_token
    # transformers' continuous-batching knobs, each decided with its candidates
    for dec in (s.attention, s.cuda_graphs, s.async_batching, s.block_size):
        assert dec.choice is not None and dec.reasons and len(dec.candidates) >= 2
    kw = s.continuous_batching_config()
    assert kw["num_blocks"] == s.num_blocks and kw["block_size"] == block
    assert kw["use_cuda_graph"] == (s.cuda_graphs.choice == "on")


def test_undeclared_work_fills_the_device_like_transformers_does() -> None:
    declared = _serving_plan("Qwen3-8B", seq_len=2304, batch_size=64).serving
    filled = _serving_plan("Qwen3-8B").serving
    assert declared is not None and filled is not None
    assert filled.cache_tokens > 3 * declared.cache_tokens
    assert filled.max_requests_per_batch is None  # transformers sizes it from its workload hints
    m = filled.memory
    assert (
        m["weights"] + m["cuda_context"] + m["working_set"] + m["headroom"] + m["cache_and_buffers"]
        <= m["device"]
    )


def test_serving_section_round_trips_through_json_and_explains_itself() -> None:
    p = _serving_plan("Qwen3-0.6B", seq_len=1024, batch_size=16)
    back = Plan.from_json(p.to_json())
    assert back == p
    assert back.serving is not None and back.serving.to_dict() == p.serving.to_dict()  # type: ignore[union-attr]
    text = p.explain()
    assert "serving (transformers continuous batching)" in text
    assert "ContinuousBatchingConfig(" in text and "paged|sdpa" in text
    inference = cudaload.plan(full_config("Qwen3-0.6B"), hardware=H200, seq_len=1024, batch_size=16)
    assert inference.serving is None and inference.to_dict()["serving"] is None


def test_serving_plans_the_model_like_inference() -> None:
    srv = _serving_plan("Qwen3-8B", seq_len=2048, batch_size=8)
    inf = cudaload.plan(full_config("Qwen3-8B"), hardware=H200, seq_len=2048, batch_size=8)
    assert srv.dtype.choice == inf.dtype.choice == "bfloat16"
    assert srv.quantization.choice == inf.quantization.choice is None
    assert srv.placement.device_map == inf.placement.device_map


def test_unknown_intent_lists_serving() -> None:
    with pytest.raises(ConfigurationError) as e:
        cudaload.plan(full_config("Qwen3-0.6B"), hardware=H200, intent="servng")
    assert "serving" in (e.value.fix or "")


# -- bad input ------------------------------------------------------------------------------------------------
def test_a_request_longer_than_the_kv_budget_is_a_planning_error_not_an_oom() -> None:
    # a 24 GiB GPU holding the 8B shape's 16.4 GB of weights: ~4 GiB of KV is ~30k tokens
    with pytest.raises(DoesNotFitError) as e:
        _direct(
            "Qwen3-8B",
            device_total=24 * GiB,
            device_budget=24 * GiB,
            gpu_name="L4",
            seq_len=100_000,
            batch_size=1,
        )
    assert "100000-token request" in str(e.value)
    assert e.value.fix and "seq_len" in e.value.fix


def test_no_room_for_any_cache_is_a_planning_error() -> None:
    with pytest.raises(DoesNotFitError) as e:
        _direct("Qwen3-8B", device_total=16 * GiB, device_budget=16 * GiB)
    assert "no room for a KV cache" in str(e.value) and e.value.fix


def test_more_concurrent_requests_than_blocks_queue_with_a_warning() -> None:
    p = _serving_plan("Qwen3-8B", seq_len=8192, batch_size=1024)
    s = p.serving
    assert s is not None
    assert s.concurrent_requests is not None and 0 < s.concurrent_requests < 1024
    assert any("queues the rest" in w for w in s.warnings)
    # the cache then takes what the device holds, not more
    m = s.memory
    assert (
        m["weights"] + m["cuda_context"] + m["working_set"] + m["headroom"] + m["cache_and_buffers"]
        <= m["device"]
    )


# -- decisions ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("choice", "paged", "masked"),
    [
        ("flash_attention_3", "paged|flash_attention_3", False),
        ("flash_attention_2", "paged|flash_attention_2", False),
        ("flash_attention_4", "paged|flash_attention_4", False),
        ("sdpa", "paged|sdpa", True),
        ("eager", "paged|eager", True),
        ("flex_attention", "paged|sdpa", True),
        ("kernels-community/vllm-flash-attn3", "paged|kernels-community/vllm-flash-attn3", False),
    ],
)
def test_paged_attention_follows_the_attention_decision(choice: str, paged: str, masked: bool) -> None:
    d = sv.choose_paged_attention(choice)
    assert d.choice == paged
    flex = d.candidate("flex_attention")
    assert flex is not None and not flex.ok
    # flash-attn-4's paged form runs from transformers 5.19 (5.17/5.18 pass its qv argument a tensor by position)
    tv = "5.22.2" if choice == "flash_attention_4" else "5.17.0"
    s = _direct("Qwen3-0.6B", attention_choice=choice, seq_len=2048, batch_size=32, transformers_version=tv)
    assert s.attention.choice == paged
    # no mask: graphs are transformers' own default and cudaload's too
    if not masked:
        assert s.cuda_graphs.choice == "on"


def test_flash_decode_path_keeps_256_token_blocks() -> None:
    short = _direct("Qwen3-0.6B", attention_choice="flash_attention_3", seq_len=256, batch_size=8)
    assert short.block_size.choice == "256"
    c128 = short.block_size.candidate("128")
    assert c128 is not None and not c128.ok
    sdpa = _direct("Qwen3-0.6B", attention_choice="sdpa", seq_len=256, batch_size=8)
    assert int(sdpa.block_size.choice or 0) <= 32  # waste under 1/16 of a 256-token request


def test_attention_name_follows_the_transformers_version() -> None:
    assert sv.transformers_name("paged|sdpa", "5.17.0") == "paged|sdpa"
    assert sv.transformers_name("paged|sdpa", "5.22.2") == "sdpa"
    # 5.19 already strips the prefix with a FutureWarning (modeling_utils.py:1737-1749); 5.18 registers it
    assert sv.transformers_name("paged|flash_attention_4", "5.19.0") == "flash_attention_4"
    assert sv.transformers_name("paged|flash_attention_4", "5.18.0") == "paged|flash_attention_4"
    assert sv.transformers_name("paged|flash_attention_3", "5.24.0") == "flash_attention_3"
    assert sv.transformers_name("paged|eager", "5.24.0") == "paged|eager"
    s = _direct("Qwen3-0.6B", transformers_version="5.24.0")
    assert s.attn_implementation == "sdpa" and s.attention.choice == "paged|sdpa"


def test_config_kwargs_follow_the_installed_field_names() -> None:
    s = _direct("Qwen3-0.6B", seq_len=1024, batch_size=8)
    kw = s.continuous_batching_config(["page_size", "num_blocks", "use_cuda_graph", "max_batch_tokens"])
    assert "block_size" not in kw and kw["page_size"] == int(s.block_size.choice or 0)
    assert set(kw) == {"page_size", "num_blocks", "use_cuda_graph", "max_batch_tokens"}


def test_cuda_graphs_on_a_launch_bound_host_and_off_on_a_fast_one() -> None:
    slow = _direct("Qwen3-8B", seq_len=2304, batch_size=64)  # H200 host: ~2 ms of launches per layer
    assert slow.cuda_graphs.choice == "on" and slow.async_batching.choice == "on"
    assert any("launch-bound" in r for r in slow.cuda_graphs.reasons)
    fast = _direct("Qwen3-8B", seq_len=2304, batch_size=64, launch_s_per_layer=20e-6)
    assert fast.cuda_graphs.choice == "off" and fast.async_batching.choice == "off"
    on = fast.cuda_graphs.candidate("on")
    assert on is not None and not on.ok and any("not launch-bound" in r for r in on.reasons)


def test_cuda_graphs_off_when_captures_cost_more_than_the_run() -> None:
    # a tiny declared run: two 256-token requests cannot repay ~tens of captures
    d, est = sv.decide_graphs(
        has_cuda=True,
        masked=True,
        layers=36,
        launch_s_per_layer=2e-3,
        weight_bytes=16 * GiB,
        kv_bytes_per_token=147456,
        kv_heads=8,
        heads=32,
        bandwidth=4.8e12,
        concurrent=2,
        context=128,
        cache_tokens=1_000_000,
        max_batch_tokens=8192,
        expected_steps=10,
    )
    assert d.choice == "off" and est["break_even_steps"] > 10
    assert any("captures cost" in r for r in d.reasons)


def test_no_gpu_turns_graphs_and_async_off() -> None:
    s = _direct("Qwen3-0.6B", device_total=None, device_budget=None, gpu_name=None, seq_len=64, batch_size=2)
    assert s.cuda_graphs.choice == "off" and s.async_batching.choice == "off"
    assert any("no CUDA" in r for r in s.cuda_graphs.reasons)
    assert s.num_blocks >= 2


def test_tensor_parallel_shards_the_cache_per_rank() -> None:
    one = _direct("Qwen3-8B", seq_len=4096, batch_size=256)
    two = _direct("Qwen3-8B", seq_len=4096, batch_size=256, world_size=2)
    assert two.tensor_parallel == 2 and two.kv_bytes_per_token * 2 == one.kv_bytes_per_token
    assert two.memory["weights"] * 2 == one.memory["weights"]
    assert any("tensor parallel" in n for n in two.notes)
    assert (two.concurrent_requests or 0) > (one.concurrent_requests or 0)


def test_settle_shrinks_the_cache_to_measured_free_memory_never_grows_it() -> None:
    s = _direct("Qwen3-8B", seq_len=2304, batch_size=64)
    planned = s.memory["cache_and_buffers"]
    plenty = sv.settle(s, planned + s.memory["working_set"] + s.memory["headroom"] + 10 * GiB)
    assert plenty == s
    tight = sv.settle(s, planned // 2 + s.memory["working_set"] + s.memory["headroom"])
    assert 0 < tight.num_blocks < s.num_blocks and any("measured" in n for n in tight.notes)
    # enough left for the 2304-token request it was planned for: settles; too little: refused, not an OOM later
    assert sv.settle(s, planned // 2 + s.memory["working_set"] + s.memory["headroom"], longest_request=2304)
    bare = s.memory["working_set"] + s.memory["headroom"] + s.memory.get("batch_buffers", 0)
    with pytest.raises(DoesNotFitError, match="less than one 2,304-token request needs") as e:
        sv.settle(s, bare + 100 * 1024, longest_request=2304)
    assert "nvidia-smi" in (e.value.fix or "")
    with pytest.raises(DoesNotFitError, match="less than one block needs"):
        sv.settle(s, s.memory["working_set"])


# -- the memory mirror agrees with transformers' own check ----------------------------------------------------
@pytest.mark.parametrize("shape", ["Qwen3-0.6B", "Qwen3-8B"])
@pytest.mark.parametrize("attn", ["paged|sdpa", "paged|flash_attention_2"])
@pytest.mark.parametrize("async_", [False, True])
def test_footprint_is_transformers_own_memory_polynomial(shape: str, attn: str, async_: bool) -> None:
    torch = pytest.importorskip("torch")
    import transformers

    if not transformers.__version__.startswith("5.17."):
        pytest.skip("mirrors transformers 5.17's PagedAttentionMemoryHandler (5.22 rewrote it in sectors)")
    from transformers.generation.configuration_utils import ContinuousBatchingConfig
    from transformers.generation.continuous_batching.cache import (
        PagedAttentionMemoryHandler,
        group_layers_by_attn_type,
    )

    config = full_config(shape)
    config._attn_implementation = attn
    max_blocks = 10 if attn.endswith("_2") else 0
    cb = ContinuousBatchingConfig(
        block_size=256, max_memory_percent=0.9, use_async_batching=async_, max_blocks_per_request=max_blocks
    )
    groups, types = group_layers_by_attn_type(config)
    handler = PagedAttentionMemoryHandler(
        config=config,
        continuous_batching_config=cb,
        dtype=torch.bfloat16,
        group_types=types,
        group_size=len(groups[0]),
    )
    info = model_info(config)
    shape_ = sv.CacheShape(
        layers=info.summary.layers,
        kv_heads=info.summary.num_kv_heads,
        head_dim=info.summary.head_dim,
        heads=info.summary.num_heads,
        hidden=info.summary.hidden_size,
        vocab=info.summary.vocab_size,
        dtype_bytes=2,
        masked=attn == "paged|sdpa",
        fast_decode=attn.endswith("_2"),
    )
    for m, blocks in ((256, 100), (8192, 752), (2048, 4000)):
        theirs = handler.compute_memory_footprint(m, blocks)
        ours = sv.footprint(
            shape_, m, blocks * 256, io_multiplier=2 if async_ else 1, max_blocks_per_request=max_blocks
        )
        assert ours == theirs, (m, blocks)
        # and the cache size solved for a budget fits that budget by transformers' reckoning
        n = sv.solve_cache_tokens(
            shape_, m, 40 * GiB, io_multiplier=2 if async_ else 1, max_blocks_per_request=max_blocks
        )
        assert handler.compute_memory_footprint(m, n // 256) <= 40 * GiB


# -- the loaded model on the CPU ------------------------------------------------------------------------------
@pytest.mark.slow
def test_load_model_serving_returns_a_model_ready_for_continuous_batching(
    tiny_model: Callable[..., Path],
) -> None:
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    model = cudaload.load_model(tiny_model("qwen3"), intent="serving", seq_len=64, batch_size=4)
    assert not model.training
    cfg = model.cudaload_cb_config
    assert isinstance(cfg, ContinuousBatchingConfig)
    plan = model.cudaload_plan
    assert plan.serving is not None and cfg.num_blocks == plan.serving.num_blocks
    assert plan.verified["serving"]["continuous_batching_config"]["num_blocks"] == cfg.num_blocks
    names = {f.name for f in fields(ContinuousBatchingConfig)}
    assert set(plan.serving.continuous_batching_config(names)) <= names
    model.generation_config.eos_token_id = None  # random weights: generate exactly max_new_tokens
    out = model.generate_batch(
        [[5, 6, 7, 8], [9, 10, 11], list(range(12, 40))], continuous_batching_config=cfg, max_new_tokens=5
    )
    assert sorted(len(r.generated_tokens) for r in out.values()) == [5, 5, 5]
    assert all(r.error is None for r in out.values())
    # the manager restored the planned attention on stop: a plain generate() still works
    assert model.config._attn_implementation == plan.attention.choice


@pytest.mark.gpu
def test_load_model_serving_on_the_gpu_pages_the_planned_attention(tiny_model: Callable[..., Path]) -> None:
    """On a GPU: the model load_model returns for serving generates through transformers' continuous batching with
    the plan's config and the attention the serving policy chose (paged FA4 where flash-attn-4 and transformers
    >= 5.19 are there, as measured in run10-serving-fa4-t522; paged sdpa otherwise)."""
    import torch
    import transformers

    from cudaload.detection.versions import version_tuple

    path = tiny_model("qwen3", "bfloat16")
    model = cudaload.load_model(path, intent="serving", seq_len=128, batch_size=8)
    plan = model.cudaload_plan
    assert plan.serving is not None and next(model.parameters()).is_cuda
    fa4 = (
        importlib.util.find_spec("flash_attn") is not None
        and importlib.util.find_spec("flash_attn.cute") is not None
    )
    new_tf = (version_tuple(transformers.__version__) or (0,))[:2] >= sv.FA4_PAGED_FROM
    usable = {c.name for c in plan.attention.candidates if c.ok}
    if fa4 and torch.cuda.get_device_capability()[0] in (9, 10):
        # flash-attn-4 serves sm90/sm100 (the attention rules): installed there, it must be usable
        assert "flash_attention_4" in usable
    if new_tf and "flash_attention_4" in usable and not usable & {"flash_attention_2", "flash_attention_3"}:
        assert plan.attention.choice == "flash_attention_4"
        assert plan.serving.attention.choice == "paged|flash_attention_4"
    else:
        assert plan.serving.attention.choice in (
            "paged|sdpa",
            "paged|flash_attention_2",
            "paged|flash_attention_3",
        )
    model.generation_config.eos_token_id = None
    out = model.generate_batch(
        [list(range(5, 5 + n)) for n in (4, 17, 33, 60)],
        continuous_batching_config=model.cudaload_cb_config,
        max_new_tokens=6,
    )
    assert all(r.error is None for r in out.values())
    assert sorted(len(r.generated_tokens) for r in out.values()) == [6, 6, 6, 6]
    assert model.config._attn_implementation == plan.attention.choice


# -- the benchmark's pure parts and its CPU smoke run ---------------------------------------------------------
BENCH = Path(__file__).resolve().parent.parent / "benchmarks" / "bench_serving.py"


def _bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("cudaload_bench_serving", BENCH)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def test_bench_workload_is_fixed_by_its_seed_and_inside_its_ranges() -> None:
    b = _bench()
    w = b.workload(64, seed=0, vocab=151936, prompt=(128, 2048), new=(128, 256))
    assert w == b.workload(64, seed=0, vocab=151936, prompt=(128, 2048), new=(128, 256))
    assert w != b.workload(64, seed=1, vocab=151936, prompt=(128, 2048), new=(128, 256))
    assert len(w) == 64
    assert all(128 <= len(p) <= 2048 and 128 <= k <= 256 for p, k in w)
    assert all(10 <= t < 151926 for p, _ in w for t in p)
    assert len({len(p) for p, _ in w}) > 32  # mixed lengths


def test_bench_helpers() -> None:
    b = _bench()
    assert b.percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert b.percentile([], 95) is None
    assert b.percentile([5.0], 95) == 5.0
    bound = b.decode_bound(4_800_000_000, 4.8e12, 64)
    assert bound["step_ms"] == pytest.approx(1.0) and bound["tokens_s_at_concurrency"] == pytest.approx(
        64_000
    )
    attn, kw = b.cb_kwargs_from(
        {"attn_implementation": "paged|sdpa", "continuous_batching": {"num_blocks": 3}}
    )
    assert attn == "paged|sdpa" and kw == {"num_blocks": 3}
    attn, kw = b.cb_kwargs_from({"num_blocks": 3, "use_cuda_graph": [True, False]})
    assert attn is None and kw == {"num_blocks": 3, "use_cuda_graph": (True, False)}
    runs = [
        {"tokens_s": 10.0, "p50_s": 1.0},
        {"tokens_s": 30.0, "p50_s": 3.0},
        {"tokens_s": 20.0, "p50_s": 2.0},
        {"error": "CUDA out of memory", "oom": True},
    ]
    s = b.summarize(runs)
    assert s["tokens_s"] == 20.0 and s["tokens_s_min"] == 10.0 and s["tokens_s_max"] == 30.0
    assert s["ooms"] == 1 and s["ok_runs"] == 3 and s["runs"] == 4
    assert b.is_oom("CUDA out of memory. Tried to allocate") and not b.is_oom("shape mismatch")


@pytest.mark.slow
def test_bench_smoke_runs_every_configuration_on_cpu(tmp_path: Path) -> None:
    import json

    b = _bench()
    b.main(["--smoke", "--out", str(tmp_path), "--variants", "{}"])
    res = json.loads((tmp_path / "serving.json").read_text())
    entry = res["models"]["tiny-qwen3"]
    import transformers

    assert entry["plan_settings"]["attn_implementation"] == sv.transformers_name(
        "paged|sdpa", transformers.__version__
    )
    for name in ("plan", "default", "padded4"):
        c = entry["configs"][name]
        assert c["ok_runs"] == 1 and c["tokens_s"] > 0 and c["ooms"] == 0
    runs = [r for r in entry["runs"] if r.get("config") in ("plan", "default")]
    assert all(
        r.get("wrong_lengths") is None and r["generated_tokens"] == entry["requested_tokens"] for r in runs
    )
    assert "| plan |" in (tmp_path / "serving.md").read_text()


def test_newer_transformers_memory_model_is_counted_no_smaller() -> None:
    """5.22+ counts masked kernels' repeated K/V heads at the attention peak: the plan for it must hold more
    per token, so its cache is smaller for the same device."""
    base = {"layers": 36, "kv_heads": 8, "head_dim": 128, "heads": 32, "hidden": 4096, "vocab": 151936}
    for masked in (True, False):
        old = sv.CacheShape(**base, dtype_bytes=2, masked=masked, fast_decode=False)
        new = sv.CacheShape(**base, dtype_bytes=2, masked=masked, fast_decode=False, repeated_kv_peak=True)
        for m, n in ((256, 1_000_000), (8192, 200_000)):
            f_old = sv.footprint(old, m, n, io_multiplier=1, max_blocks_per_request=0)
            f_new = sv.footprint(new, m, n, io_multiplier=1, max_blocks_per_request=0)
            assert f_new >= f_old
            if masked and n > 100 * m:  # the attention peak (not the logits') is the larger one there
                assert f_new > f_old
    # the plan counts them for every transformers version: the expanded copies are real memory either way
    s17 = _direct("Qwen3-8B", transformers_version="5.17.0")
    s24 = _direct("Qwen3-8B", transformers_version="5.24.0")
    assert s24.num_blocks == s17.num_blocks
    flash = _direct("Qwen3-8B", attention_choice="flash_attention_3")
    assert flash.num_blocks > s17.num_blocks  # no expanded heads without the mask


@pytest.mark.slow
def test_load_model_refused_by_settle_keeps_no_reference_to_the_model(
    tiny_model: Callable[..., Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """settle() raising inside attach_serving: the exception's traceback holds attach_serving's frame, whose
    ``model`` local would keep the whole model (its GPU memory) alive for as long as the caller keeps the error.
    The refusal stands in for the real one, which needs a GPU (settle runs only on a CUDA model)."""
    import gc
    import weakref

    import cudaload.execute.serving as ex

    refs: list[weakref.ref[Any]] = []

    def refusing(model: Any, plan: Plan, verified: dict[str, Any]) -> Plan:
        refs.append(weakref.ref(model))
        raise DoesNotFitError("serving: too little free after loading", fix="free the GPU memory")

    monkeypatch.setattr(ex, "attach_serving", refusing)
    with pytest.raises(DoesNotFitError) as e:
        cudaload.load_model(tiny_model("qwen3"), intent="serving", seq_len=64, batch_size=4, prefetch=False)
    gc.collect()
    assert e.value.fix == "free the GPU memory"
    assert len(refs) == 1 and refs[0]() is None, "the refused model is still referenced"


# -- the paged implementation for serving, apart from the one-batch attention choice ------------------------------
def _h200(tv: str, *installed: str) -> Any:
    import json
    from dataclasses import replace

    from cudaload.capabilities import Capabilities

    caps = Capabilities.from_dict(json.loads(Path(H200).read_text()))
    return replace(caps, transformers_version=tv).with_packages(installed)


def test_fa4_paged_form_blocked_before_transformers_5_19() -> None:
    # measured on the H200 (run9-serving-fa4-t517): transformers 5.17 hands cu_seq_lens_q to FA4's `qv`
    for tv in ("5.17.0", "5.18.0"):
        d = sv.choose_paged_attention("flash_attention_4", transformers_version=tv)
        assert d.choice == "paged|sdpa"
        assert "qv" in d.reasons[0] and "run9-serving-fa4-t517" in d.reasons[0]
        c = d.candidate("paged|flash_attention_4")
        assert c is not None and not c.ok
        # an auto choice with FA4 usable does not pick it either
        auto = sv.choose_paged_attention(
            "sdpa", usable=["sdpa", "eager", "flash_attention_4"], transformers_version=tv
        )
        assert auto.choice == "paged|sdpa"
        # the choice says what is given up and how to get it
        assert "upgrade transformers" in " ".join(auto.reasons) and "run10-serving-fa4-t522" in " ".join(
            auto.reasons
        )
    for tv in ("5.19.0", "5.22.2", "5.24.0"):
        d = sv.choose_paged_attention("flash_attention_4", transformers_version=tv)
        assert d.choice == "paged|flash_attention_4"


def test_serving_prefers_a_usable_flash_paged_form_over_the_one_batch_choice() -> None:
    d = sv.choose_paged_attention(
        "sdpa", usable=["sdpa", "eager", "flash_attention_4"], transformers_version="5.22.2"
    )
    assert d.choice == "paged|flash_attention_4"
    assert "run10-serving-fa4-t522" in " ".join(d.reasons)
    # transformers' own order for continuous batching when several flash packages are usable: FA3, FA2, then FA4
    d = sv.choose_paged_attention(
        "sdpa", usable=["sdpa", "flash_attention_2", "flash_attention_4"], transformers_version="5.22.2"
    )
    assert d.choice == "paged|flash_attention_2"
    d = sv.choose_paged_attention(
        "flash_attention_4", usable=["flash_attention_3", "flash_attention_4"], transformers_version="5.22.2"
    )
    assert d.choice == "paged|flash_attention_4"  # the attention decision's own flash choice comes first
    # nothing flash usable: the one-batch choice's paged form, as before
    assert sv.choose_paged_attention("eager", usable=["eager", "sdpa"]).choice == "paged|eager"


def test_serving_plan_loads_the_attention_its_paged_form_needs() -> None:
    new = _h200("5.22.2", "flash-attn-4")
    p = cudaload.plan(full_config("Qwen3-8B"), hardware=new, intent="serving", seq_len=2304, batch_size=64)
    assert p.attention.choice == "flash_attention_4"
    assert p.attention.reasons[0].startswith("serving: ")
    assert p.serving is not None and p.serving.attention.choice == "paged|flash_attention_4"
    # transformers >= 5.22 drops the paged| prefix for flash (the name the model is loaded and served with)
    assert p.serving.settings()["attn_implementation"] == "flash_attention_4"
    assert p.serving.cuda_graphs.choice == "on"
    # the round trip keeps it
    assert Plan.from_dict(p.to_dict()).attention.choice == "flash_attention_4"
    # generate() intent on the same machine keeps its own choice
    inf = cudaload.plan(full_config("Qwen3-8B"), hardware=new, intent="inference")
    assert inf.attention.choice == "cudaload_sdpa"
    # a named attention is respected
    named = cudaload.plan(
        full_config("Qwen3-8B"), hardware=new, intent="serving", attn="sdpa", seq_len=2304, batch_size=64
    )
    assert named.attention.choice == "sdpa" and named.serving is not None
    assert named.serving.attention.choice == "paged|sdpa"
    # transformers 5.17 with FA4 installed: FA4's paged form fails there, so sdpa is loaded and paged
    old = cudaload.plan(
        full_config("Qwen3-8B"),
        hardware=_h200("5.17.0", "flash-attn-4"),
        intent="serving",
        seq_len=2304,
        batch_size=64,
    )
    assert old.attention.choice == "sdpa"
    assert old.serving is not None and old.serving.attention.choice == "paged|sdpa"
    c = old.serving.attention.candidate("paged|flash_attention_4")
    assert c is not None and not c.ok and any("qv" in r for r in c.reasons)


def test_a_runtime_fallback_from_the_serving_flash_choice_goes_to_a_pageable_one() -> None:
    """The attention decision's candidates are the runtime fallback order (execute._next_attention): when serving
    replaces the one-batch choice by flash_attention_4 and FA4 fails its probe, the next one must be the one-batch
    choice (cudaload_sdpa), not an implementation continuous batching refuses (flex_attention: 'is not supported for
    continuous batching', transformers 5.24 continuous_api.py:779-784)."""
    from cudaload.execute.attention_probe import _next_attention

    p = cudaload.plan(
        full_config("Qwen3-0.6B"),
        hardware=_h200("5.22.2", "flash-attn-4"),
        intent="serving",
        seq_len=2304,
        batch_size=64,
    )
    assert p.attention.choice == "flash_attention_4"
    ok = [c.name for c in p.attention.candidates if c.ok]
    assert ok[0] == "flash_attention_4"
    # the one-batch choice on the H200: sdpa with cuDNN kept off new lengths; served as paged|sdpa after the
    # fallback (execute.replanned plans serving again for it)
    assert _next_attention(p, "flash_attention_4") == "cudaload_sdpa"


def test_fa4_hub_kernel_paged_form_blocked_before_transformers_5_19() -> None:
    # transformers 5.17 registers "paged|<kernel repo>" with the same positional paged_attention_forward
    # (modeling_flash_attention_utils.py:279-282 -> integrations/flash_paged.py:72-79): FA4's Hub build takes qv 4th
    d = sv.choose_paged_attention("kernels-community/flash-attn4", transformers_version="5.17.0")
    assert d.choice == "paged|sdpa"
    assert "qv" in d.reasons[0]
    auto = sv.choose_paged_attention(
        "kernels-community/flash-attn4",
        usable=["kernels-community/flash-attn4", "sdpa"],
        transformers_version="5.18.0",
    )
    assert auto.choice == "paged|sdpa"
    new = sv.choose_paged_attention("kernels-community/flash-attn4", transformers_version="5.22.2")
    assert new.choice == "paged|kernels-community/flash-attn4"


def test_fa4_rejected_by_the_attention_decision_is_not_served() -> None:
    """A model flash-attn-4 refuses (head dim not a multiple of 8) is not loaded with FA4 for serving even where
    flash-attn-4 is installed: the serving preference only picks among the attention decision's accepted ones."""
    cfg = full_config("Qwen3-0.6B")
    cfg.head_dim = 36
    p = cudaload.plan(
        cfg, hardware=_h200("5.22.2", "flash-attn-4"), intent="serving", seq_len=2304, batch_size=64
    )
    fa4 = p.attention.candidate("flash_attention_4")
    assert fa4 is not None and not fa4.ok and any("multiple of 8" in r for r in fa4.reasons)
    assert p.attention.choice == "sdpa"
    assert p.serving is not None and p.serving.attention.choice == "paged|sdpa"


@pytest.mark.slow
def test_attach_serving_pages_the_planned_attention_not_a_refused_one(
    tiny_model: Callable[..., Path],
) -> None:
    """attn="flash_attention_4" with transformers 5.17 for serving: the serving plan pages sdpa (FA4's paged form
    fails there, run9-serving-fa4-t517); the loaded model must then take sdpa, or the manager pages FA4 anyway
    (5.17 continuous_api.py:651-683 pages the model's current attention)."""
    from transformers import AutoModelForCausalLM

    from cudaload.execute.serving import attach_serving

    path = tiny_model("qwen3", "bfloat16")
    p = cudaload.plan(
        path,
        hardware=_h200("5.17.0", "flash-attn-4"),
        intent="serving",
        attn="flash_attention_4",
        seq_len=64,
        batch_size=4,
    )
    assert p.attention.choice == "flash_attention_4"
    assert p.serving is not None and p.serving.attention.choice == "paged|sdpa"
    model = AutoModelForCausalLM.from_pretrained(path, attn_implementation="sdpa")
    model.config._attn_implementation = "flash_attention_4"  # what from_pretrained sets on a machine with FA4
    verified: dict[str, Any] = {}
    attach_serving(model, p, verified)
    assert model.config._attn_implementation == "sdpa"
    assert verified["serving_attention"] == "sdpa"


@pytest.mark.slow
def test_the_installed_transformers_serves_with_the_name_the_plan_gives(
    tiny_model: Callable[..., Path],
) -> None:
    """With the installed transformers (5.17 .. 5.24): the model loaded with the plan's attention keeps, through
    the manager's start (switch_to_cb_friendly_attn), exactly the name settings()["attn_implementation"] says.
    FA4 cannot run on this CPU, but transformers' check of the name before any kernel runs is real."""
    import transformers
    from transformers import AutoModelForCausalLM
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    from cudaload.detection.versions import version_tuple
    from cudaload.execute.serving import attach_serving

    tv = transformers.__version__
    path = tiny_model("qwen3", "bfloat16")
    for attn in ("auto", "sdpa", "eager"):
        p = cudaload.plan(
            path, hardware=_h200(tv, "flash-attn-4"), intent="serving", attn=attn, seq_len=64, batch_size=4
        )
        assert p.serving is not None
        if attn == "auto":
            expect = "flash_attention_4" if (version_tuple(tv) or (0,))[:2] >= sv.FA4_PAGED_FROM else "sdpa"
            assert p.attention.choice == expect
        name = p.serving.settings()["attn_implementation"]
        model = AutoModelForCausalLM.from_pretrained(path, attn_implementation="sdpa")
        # as from_pretrained(attn_implementation=...) sets it (FA4 cannot be loaded on this CPU)
        model.config._attn_implementation = p.attention.choice
        attach_serving(model, p, {})
        model.init_continuous_batching(
            continuous_batching_config=ContinuousBatchingConfig(num_blocks=8, max_batch_tokens=64)
        )
        assert model.config._attn_implementation == name, (attn, tv)


def test_after_a_runtime_fallback_the_serving_section_is_planned_for_the_attention_loaded() -> None:
    """FA4 chosen for serving fails its probe and the model falls back to sdpa (execute.probe_and_fallback): the
    serving section planned for paged FA4 (no mask counted, graphs for an unmasked step) no longer describes the
    model; the load makes a new plan for sdpa (execute.replanned), whose paged sdpa's dense mask and repeated K/V
    the memory must hold, and whose attention decision says why it was made."""
    from cudaload.execute import replanned
    from cudaload.request import Request

    cfg = full_config("Qwen3-0.6B")
    kw: dict[str, Any] = dict(
        hardware=_h200("5.22.2", "flash-attn-4"), intent="serving", seq_len=2304, batch_size=64, attn="auto"
    )
    p = cudaload.plan(cfg, **kw)
    assert p.serving is not None and p.serving.attention.choice == "paged|flash_attention_4"
    assert p.attention_fallbacks and p.attention_fallbacks[0] != "flash_attention_4"
    req = Request.build(cfg, **kw)
    why = ["runtime fallback: flash_attention_4 -> sdpa: probe failed"]
    out = replanned(req, req.hardware, p, "sdpa", why)
    assert (
        out.attention.choice == "sdpa" and out.attention.reasons[0] == why[0] and not out.attention.explicit
    )
    assert out.serving is not None and out.serving.attention.choice == "paged|sdpa"
    assert out.serving.settings()["attn_implementation"] == "sdpa"
    direct = cudaload.plan(cfg, **{**kw, "attn": "sdpa"}).serving
    assert direct is not None and out.serving.num_blocks == direct.num_blocks
    # the first plan's order goes on after the backend now loaded
    order = [p.attention.choice, *p.attention_fallbacks]
    assert list(out.attention_fallbacks) == order[order.index("sdpa") + 1 :]


def test_the_plan_keeps_transformers_from_switching_the_served_attention() -> None:
    """From 5.19 the manager replaces an sdpa/eager model's attention by FA3 or FA2 (a package, or the Hub kernel)
    at its start unless ``auto_switch_to_flash`` is False (5.19 continuous_api.py:746-764, 5.24 :755-773): the
    served attention would then be one the plan did not size the cache for, or one the attention decision refused
    (FA3 drops attention sinks). The plan's config turns it off wherever the installed class has the field."""
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    s = _serving_plan("Qwen3-0.6B", seq_len=2048, batch_size=32).serving
    assert s is not None
    names = [f.name for f in fields(ContinuousBatchingConfig)]
    kw = s.continuous_batching_config(names)
    assert ("auto_switch_to_flash" in kw) == ("auto_switch_to_flash" in names)
    assert kw.get("auto_switch_to_flash", False) is False
    assert ContinuousBatchingConfig(**kw).__dict__.get("auto_switch_to_flash", False) is False
    # the 5.19+ field set, as a 5.24 install lists it
    assert (
        s.continuous_batching_config(["num_blocks", "auto_switch_to_flash"])["auto_switch_to_flash"] is False
    )
    assert "auto_switch_to_flash" not in s.continuous_batching_config(["num_blocks", "use_cuda_graph"])


def test_a_named_eager_is_kept_for_serving_with_its_measured_cost() -> None:
    d = sv.choose_paged_attention("eager")
    assert d.choice == "paged|eager"
    assert any("346 vs 549 tok/s" in r and "attn='sdpa'" in r for r in d.reasons)
    # a model without sdpa has nothing better to suggest
    alone = sv.choose_paged_attention("eager", supports_sdpa=False)
    assert alone.choice == "paged|eager" and not any("549" in r for r in alone.reasons)
