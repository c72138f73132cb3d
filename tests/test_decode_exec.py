"""The decode section executed (issue 35): the compile cache's files, the generation config a compiled plan sets,
the compiled path's greedy tokens against the dynamic path's, no recompile inside a bucket, and the compile
artifacts carried from one process to a fresh one."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from cudaload import compile_cache
from cudaload.errors import ConfigurationError, CudaloadWarning
from cudaload.plans.decision import Decision
from cudaload.plans.decode import DecodePlan

# -- compile_cache: pure -----------------------------------------------------------------------------------------


def _env(tmp_path: Path) -> dict[str, str]:
    return {"CUDALOAD_CACHE": str(tmp_path / "cache")}


def test_save_then_load_round_trips_and_creates_the_folder(tmp_path: Path) -> None:
    env = _env(tmp_path)
    assert compile_cache.load("k/1", env) is None
    assert not compile_cache.present("k/1", env)
    path = compile_cache.save("k/1", b"\x00artifact", env)
    assert path == compile_cache.path_for("k/1", env) and path.name == "k_1.bin"
    assert compile_cache.load("k/1", env) == b"\x00artifact"
    assert compile_cache.present("k/1", env)
    compile_cache.save("k/1", b"newer", env)  # replaced whole
    assert compile_cache.load("k/1", env) == b"newer"
    assert os.listdir(path.parent) == ["k_1.bin"]  # no temporary file left


def test_load_without_a_key_or_of_an_empty_file_is_none(tmp_path: Path) -> None:
    env = _env(tmp_path)
    assert compile_cache.load(None, env) is None and compile_cache.load("", env) is None
    p = compile_cache.path_for("k", env)
    p.parent.mkdir(parents=True)
    p.write_bytes(b"")
    assert compile_cache.load("k", env) is None


def test_save_refuses_no_bytes(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="non-empty bytes"):
        compile_cache.save("k", b"", _env(tmp_path))


def test_a_failed_write_keeps_the_old_file_and_leaves_no_part(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = _env(tmp_path)
    path = compile_cache.save("k", b"old", env)
    assert path is not None

    def fail(src: str, dst: str) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", fail)
    with pytest.warns(CudaloadWarning, match="could not write .*No space left"):
        assert compile_cache.save("k", b"new and longer", env) is None
    assert path.read_bytes() == b"old"
    assert os.listdir(path.parent) == ["k.bin"]


def test_an_unusable_cache_folder_warns_and_goes_on(tmp_path: Path) -> None:
    blocker = tmp_path / "cache"
    blocker.write_text("a file where the cache folder should be")
    env = {"CUDALOAD_CACHE": str(blocker)}
    with pytest.warns(CudaloadWarning, match="CUDALOAD_CACHE to a writable folder"):
        assert compile_cache.save("k", b"data", env) is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a missing artifact is no warning
        assert compile_cache.load("k", env) is None


def test_an_unreadable_artifact_warns_and_is_none(tmp_path: Path) -> None:
    env = _env(tmp_path)
    compile_cache.path_for("k", env).mkdir(parents=True)  # a folder where the file should be: read fails
    with pytest.warns(CudaloadWarning, match="could not read"):
        assert compile_cache.load("k", env) is None


# -- apply_decode ------------------------------------------------------------------------------------------------


def _plan(compiled: bool = True, **kw: Any) -> DecodePlan:
    choice = "compiled" if compiled else "dynamic"
    base: dict[str, Any] = {"mode": Decision(choice=choice, reasons=("test",))}
    if compiled:
        base.update(
            max_cache_len=64,
            cache_buckets=(64, 128),
            batch_sizes=(1,),
            # the policy's settings (dynamic False: one graph per bucket and batch) on a backend the CPU runs fast
            compile={"backend": "aot_eager", "mode": None, "fullgraph": False, "dynamic": False},
            cache_key="test-key",
        )
    base.update(kw)
    return DecodePlan(**base)


@pytest.fixture
def tiny_lm(tiny_model: Callable[..., Path]) -> Iterator[Any]:
    import torch
    from transformers import AutoModelForCausalLM

    torch._dynamo.reset()
    model = AutoModelForCausalLM.from_pretrained(tiny_model("qwen3"), dtype=torch.float32).eval()
    yield model
    torch._dynamo.reset()


def test_a_compiled_plan_sets_exactly_the_static_cache_and_the_compile_config(tiny_lm: Any) -> None:
    from transformers import CompileConfig

    from cudaload.execute.decode import apply_decode

    before = tiny_lm.generation_config.to_dict()
    got = apply_decode(tiny_lm, _plan())
    gc = tiny_lm.generation_config
    assert gc.cache_implementation == "static" and gc.max_cache_len == 64
    want = CompileConfig(backend="aot_eager", mode=None, fullgraph=False, dynamic=False)  # type: ignore[arg-type]
    assert gc.compile_config == want
    after = gc.to_dict()
    assert {k for k in after if after[k] != before.get(k)} == {
        "cache_implementation",
        "max_cache_len",
        "compile_config",
    }
    assert got == {
        "mode": "compiled",
        "applied": True,
        "cache_implementation": "static",
        "compile_config": {"backend": "aot_eager", "mode": None, "fullgraph": False, "dynamic": False},
        "max_cache_len": 64,
        # the late stop (cudaload.execute.runtime.decode_loop) is for CUDA: a CPU model keeps transformers' loop, and says why
        "stop_check": "transformers' (the model is on cpu, not CUDA: the host waits for nothing there)",
        "compiles_on_device": False,  # a CPU model: transformers compiles there only with _compile_all_devices
    }


def test_a_dynamic_plan_leaves_the_generation_config_alone(tiny_lm: Any) -> None:
    from cudaload.execute.decode import apply_decode, warm_decode

    before = tiny_lm.generation_config.to_dict()
    assert apply_decode(tiny_lm, _plan(compiled=False)) == {"mode": "dynamic"}
    assert tiny_lm.generation_config.to_dict() == before
    assert tiny_lm.generation_config.compile_config is None
    assert warm_decode(tiny_lm, _plan(compiled=False))["compiled"] is False


def test_bad_compiled_plans_are_refused_with_the_fix(tiny_lm: Any) -> None:
    from cudaload.execute.decode import apply_decode, warm_decode

    with pytest.raises(ConfigurationError, match="not CompileConfig's") as e:
        apply_decode(tiny_lm, _plan(compile={"backend": "inductor", "cudagraphs": True}))
    assert "fullgraph, dynamic, backend, mode and options" in (e.value.fix or "")
    with pytest.raises(ConfigurationError, match="2 slots or more"):
        apply_decode(tiny_lm, _plan(max_cache_len=None))
    apply_decode(tiny_lm, _plan())
    with pytest.raises(ConfigurationError, match="does not fit the static cache of 64") as e:
        warm_decode(tiny_lm, _plan(), prompt_len=61)
    assert "from 1 to 60" in (e.value.fix or "")
    with pytest.raises(ConfigurationError, match="at least one token after the prefill"):
        warm_decode(tiny_lm, _plan(), new_tokens=1)


def test_every_installed_transformers_sizes_the_static_cache_ahead() -> None:
    # apply_decode sets GenerationConfig.max_cache_len (the bucket); a transformers without the field would size the
    # static cache per call and recompile for new lengths: this fails on such a release
    from transformers import GenerationConfig

    assert "max_cache_len" in vars(GenerationConfig())


def test_artifacts_torch_cannot_read_are_reported_not_raised(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from cudaload.execute.decode import load_artifacts

    monkeypatch.setenv("CUDALOAD_CACHE", str(tmp_path))
    compile_cache.save("k", b"not torch's artifacts")
    got = load_artifacts("k")
    assert got["bytes"] == len(b"not torch's artifacts") and "error" in got
    assert load_artifacts("absent") == {"bytes": 0}


# -- the compiled path on the CPU --------------------------------------------------------------------------------


def _greedy(model: Any, ids: Any, new: int) -> tuple[list[list[int]], float]:
    """Greedy tokens and the smallest top-2 logit margin over the steps (how far from a tie each pick was)."""
    out = model.generate(
        input_ids=ids,
        attention_mask=ids.new_ones(ids.shape),
        max_new_tokens=new,
        min_new_tokens=new,
        do_sample=False,
        output_logits=True,
        return_dict_in_generate=True,
        pad_token_id=0,
    )
    margin = min(float((lg.float().topk(2).values.diff(dim=-1).abs()).min()) for lg in out.logits)
    return out.sequences[:, ids.shape[1] :].tolist(), margin


def _prompts(vocab: int) -> list[Any]:
    import torch

    g = torch.Generator().manual_seed(0)
    return [torch.randint(3, vocab, (b, n), generator=g) for b, n in ((1, 9), (1, 23), (2, 14))]


def test_compiled_static_decode_gives_the_dynamic_paths_tokens_without_recompiling(tiny_lm: Any) -> None:
    """fp32 on the CPU, transformers' own compile path (aot_eager: dynamo and AOTAutograd, no C++ compile): the same
    greedy tokens as the DynamicCache path, and after the warm-up no new graph for other prompt lengths in the
    bucket."""
    from torch._dynamo.utils import counters

    from cudaload.execute.decode import apply_decode, warm_decode

    prompts = _prompts(tiny_lm.config.vocab_size)
    dynamic = [_greedy(tiny_lm, p, 12) for p in prompts]
    assert not hasattr(tiny_lm, "_compiled_call")
    plan = _plan(batch_sizes=(1, 2))
    apply_decode(tiny_lm, plan)
    tiny_lm.generation_config.compile_config._compile_all_devices = (
        True  # transformers' switch to compile on CPU
    )
    warm = warm_decode(tiny_lm, plan)
    assert warm["compiled"] and warm["batch_sizes"] == [1, 2] and warm["prompt_len"] == 16
    graphs = counters["stats"]["unique_graphs"]
    assert graphs >= 1
    for p, (tokens, margin) in zip(prompts, dynamic, strict=True):
        assert margin > 1e-4  # not tied: fp32 on one device must then agree exactly
        got, _ = _greedy(tiny_lm, p, 12)
        assert got == tokens
    assert counters["stats"]["unique_graphs"] == graphs, "a prompt length inside the bucket compiled again"


_ROUND_TRIP = r"""
import json, sys, torch
from transformers import AutoModelForCausalLM
from torch._dynamo.utils import counters
from cudaload.plans.decision import Decision
from cudaload.plans.decode import DecodePlan
from cudaload.execute.decode import apply_decode, warm_decode

model = AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.float32).eval()
plan = DecodePlan(mode=Decision(choice="compiled", reasons=("test",)), max_cache_len=48, cache_buckets=(48,),
                  batch_sizes=(1,), compile={"backend": "inductor", "mode": "default", "dynamic": False},
                  cache_key="roundtrip")
apply_decode(model, plan)
model.generation_config.compile_config._compile_all_devices = True
got = warm_decode(model, plan)
got["inductor"] = dict(counters["inductor"])
print("RESULT " + json.dumps(got))
"""


def test_compile_artifacts_carry_to_a_fresh_process(tmp_path: Path, tiny_model: Callable[..., Path]) -> None:
    """Inductor on the CPU, two processes with separate inductor caches: the first compiles cold and saves the
    artifacts under CUDALOAD_CACHE; the second loads them and finds its FX graph there (a hit, no miss), where its own
    empty inductor cache alone would have compiled it again."""
    from torch._inductor.cpp_builder import get_cpp_compiler

    try:
        get_cpp_compiler()
    except Exception as e:  # inductor's CPU backend writes C++: without a compiler it cannot run here
        pytest.skip(f"inductor needs a C++ compiler on the CPU: {e}")
    model = tiny_model("qwen3")
    results = []
    for run in ("first", "second"):
        env = {
            **os.environ,
            "CUDALOAD_CACHE": str(tmp_path / "cudaload"),
            "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / f"inductor-{run}"),
        }
        proc = subprocess.run(
            [sys.executable, "-c", _ROUND_TRIP, str(model)],
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))
        results.append(json.loads(line.removeprefix("RESULT ")))
    first, second = results
    assert first["compiled"] and first["artifacts_loaded"] == {"bytes": 0}
    assert first["inductor"].get("fxgraph_cache_miss", 0) >= 1 and not first["inductor"].get(
        "fxgraph_cache_hit"
    )
    saved = first["artifacts_saved"]
    assert saved["bytes"] > 0 and Path(saved["path"]).parent == tmp_path / "cudaload" / "compile"
    assert (
        second["artifacts_loaded"]["bytes"] == saved["bytes"] and second["artifacts_loaded"]["entries"] >= 1
    )
    assert second["inductor"].get("fxgraph_cache_hit", 0) >= 1
    assert not second["inductor"].get("fxgraph_cache_miss"), "the second process compiled its graph again"


# -- on the GPU: inductor with CUDA graphs -----------------------------------------------------------------------


@pytest.fixture
def gpu_lm(small_model: Path) -> Iterator[Any]:
    import torch
    from transformers import AutoModelForCausalLM

    torch._dynamo.reset()
    model = AutoModelForCausalLM.from_pretrained(
        str(small_model), dtype=torch.bfloat16, device_map="cuda"
    ).eval()
    yield model
    del model
    torch._dynamo.reset()
    torch.cuda.empty_cache()


@pytest.fixture
def gpu_lm_grouped(small_model: Path) -> Iterator[Any]:
    """The small model on cudaload_sdpa: its compiled decode steps run the grouped attention."""
    import torch
    from transformers import AutoModelForCausalLM

    from cudaload.execute.runtime.sdpa_decode import register

    register()
    torch._dynamo.reset()
    model = AutoModelForCausalLM.from_pretrained(
        str(small_model), dtype=torch.bfloat16, device_map="cuda", attn_implementation="cudaload_sdpa"
    ).eval()
    yield model
    del model
    torch._dynamo.reset()
    torch.cuda.empty_cache()


def _gpu_plan() -> DecodePlan:
    # the policy's compile settings (inductor, reduce-overhead's CUDA graphs, static shapes)
    from cudaload.policies.decode import COMPILE_CONFIG

    return _plan(max_cache_len=256, cache_buckets=(256,), batch_sizes=(1, 2), compile=dict(COMPILE_CONFIG))


@pytest.mark.gpu
@pytest.mark.parametrize("lm", ["gpu_lm", "gpu_lm_grouped"])
def test_gpu_compiled_decode_matches_the_dynamic_path_where_logits_are_not_tied(
    lm: str, request: pytest.FixtureRequest
) -> None:
    """bf16 on CUDA, inductor with CUDA graphs: each greedy token matches the dynamic path's up to the first step
    whose dynamic top-2 margin is within 4 bf16 steps of the top logit (where either pick is right and the paths
    may part: this random model's logits are ~2, a step there is 2**-7). On sdpa and on cudaload_sdpa (grouped
    decode attention)."""
    import torch

    gpu_lm = request.getfixturevalue(lm)

    from cudaload.execute.decode import apply_decode, warm_decode

    g = torch.Generator().manual_seed(1)
    shapes = ((1, 40), (1, 120), (1, 7), (1, 90), (1, 200), (1, 33), (2, 64))
    prompts = [torch.randint(3, 512, shape, generator=g).cuda() for shape in shapes]
    new = 24
    dynamic = []
    for p in prompts:
        out = gpu_lm.generate(
            input_ids=p,
            attention_mask=torch.ones_like(p),
            max_new_tokens=new,
            min_new_tokens=new,
            do_sample=False,
            output_logits=True,
            return_dict_in_generate=True,
            pad_token_id=0,
        )
        top2 = torch.stack([lg.float().topk(2).values for lg in out.logits], dim=1)  # (batch, steps, 2)
        ulp = torch.finfo(torch.bfloat16).eps * torch.exp2(torch.floor(torch.log2(top2[..., 0].abs())))
        dynamic.append((out.sequences[:, p.shape[1] :], top2[..., 0] - top2[..., 1], 4 * ulp))
    plan = _gpu_plan()
    # the compiled calls run cudaload.execute.runtime.decode_loop
    assert apply_decode(gpu_lm, plan)["stop_check"] == "late"
    warm = warm_decode(gpu_lm, plan)
    assert warm["compiled"]
    compared = 0
    for p, (tokens, margin, tie) in zip(prompts, dynamic, strict=True):
        got = gpu_lm.generate(
            input_ids=p,
            attention_mask=torch.ones_like(p),
            max_new_tokens=new,
            min_new_tokens=new,
            do_sample=False,
        )[:, p.shape[1] :]
        for row in range(p.shape[0]):
            for step in range(new):
                if float(margin[row, step]) < float(
                    tie[row, step]
                ):  # a bf16 near-tie: the paths may part here
                    break
                assert int(got[row, step]) == int(tokens[row, step]), (row, step)
                compared += 1
    print(f"greedy tokens compared outside bf16 near-ties: {compared}")
    assert compared >= new  # at least a sequence's worth of tokens compared, not all skipped as ties


@pytest.mark.gpu
def test_gpu_prompt_lengths_inside_the_bucket_do_not_recompile(gpu_lm: Any) -> None:
    import torch
    from torch._dynamo.utils import counters

    from cudaload.execute.decode import apply_decode, warm_decode

    plan = _gpu_plan()
    apply_decode(gpu_lm, plan)
    warm = warm_decode(gpu_lm, plan)
    assert warm["compiled"] and warm["second_s"] < warm["compile_s"]
    graphs = counters["stats"]["unique_graphs"]
    for n in (30, 100, 200):
        p = torch.arange(3, 3 + n, device="cuda").view(1, n)
        gpu_lm.generate(input_ids=p, attention_mask=torch.ones_like(p), max_new_tokens=16, do_sample=False)
    assert counters["stats"]["unique_graphs"] == graphs, "a prompt length inside the bucket compiled again"


# -- load_model: the decode step of _ready -----------------------------------------------------------------------


def test_load_model_records_a_dynamic_decode_and_leaves_generate_alone(
    tiny_model: Callable[..., Path],
) -> None:
    import cudaload

    model = cudaload.load_model(
        str(tiny_model("qwen3")), device_map="cpu", seq_len=128, new_tokens=64, batch_size=1, warmup=True
    )
    plan = model.cudaload_plan
    assert plan.decode is not None and plan.decode.mode.choice == "dynamic"
    assert plan.verified["decode"] == {"mode": "dynamic"}
    assert (
        model.generation_config.cache_implementation is None
        and model.generation_config.compile_config is None
    )


@pytest.mark.gpu
def test_gpu_load_model_compiled_decode_is_warm_before_the_first_generate(small_model: Path) -> None:
    import torch
    from torch._dynamo.utils import counters

    import cudaload

    torch._dynamo.reset()
    model = cudaload.load_model(
        str(small_model), seq_len=512, new_tokens=64, batch_size=1, decode="compiled", warmup=True
    )
    got = model.cudaload_plan.verified["decode"]
    assert got["applied"] and got["cache_implementation"] == "static"
    assert got["max_cache_len"] == model.cudaload_plan.decode.max_cache_len >= 512
    assert got["warmup"]["compiled"] and got["warmup"]["batch_sizes"] == list(
        model.cudaload_plan.decode.batch_sizes
    )
    graphs = counters["stats"]["unique_graphs"]
    p = torch.arange(3, 3 + 300, device="cuda").view(1, 300)
    model.generate(input_ids=p, attention_mask=torch.ones_like(p), max_new_tokens=64, do_sample=False)
    assert counters["stats"]["unique_graphs"] == graphs, "the first generate() after the warm-up compiled"
    del model
    torch._dynamo.reset()


@pytest.mark.gpu
def test_gpu_precompile_saves_artifacts_a_fresh_process_loads(small_model: Path, tmp_path: Path) -> None:
    """`cudaload precompile --decode` twice, each a fresh process with its own empty inductor cache: the second
    loads the first's artifacts and compiles from them (FX-graph hits, no miss), and says so."""
    runs = []
    for run in ("first", "second"):
        env = {
            **os.environ,
            "CUDALOAD_CACHE": str(tmp_path / "cudaload"),
            "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / f"inductor-{run}"),
        }
        args = [
            "precompile",
            "--decode",
            str(small_model),
            "--seq-len",
            "512",
            "--new-tokens",
            "64",
            "--json",
        ]
        proc = subprocess.run(
            [sys.executable, "-m", "cudaload", *args], env=env, capture_output=True, text=True, timeout=600
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        runs.append(json.loads(proc.stdout))
    first, second = (r["verified"]["warmup"] for r in runs)
    assert first["artifacts_loaded"] == {"bytes": 0} and first["artifacts_saved"]["bytes"] > 0
    assert Path(first["artifacts_saved"]["path"]).parent == tmp_path / "cudaload" / "compile"
    assert first["graphs_compiled"] >= 1
    assert second["artifacts_loaded"]["entries"] >= 1
    assert second["graphs_from_cache"] >= 1 and second["graphs_compiled"] == 0
    print("compile seconds, cold then from the artifacts:", first["compile_s"], second["compile_s"])


# -- cudaload precompile --decode: refused before torch is imported ----------------------------------------------

_CHILD = """
import json, sys
from cudaload.commands.cli import main
rc = main(json.loads(sys.argv[1]))
print(json.dumps({"rc": rc, "heavy": sorted(m for m in ("torch", "transformers") if m in sys.modules)}))
"""


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["precompile", "--seq-len", "512"], "--seq-len size the compiled decode that --decode MODEL warms"),
        (["precompile", "--decode", "MODEL", "--check"], "--check byte-compile packages"),
        (["precompile", "--decode", "MODEL"], "Fix: add --seq-len N"),
        (["precompile", "--decode", "MODEL", "--seq-len", "0"], "must be 1 or more"),
        (["precompile", "--decode", "/no/such/model", "--seq-len", "64"], "/no/such/model"),
        (["precompile", "--decode", "MODEL", "--seq-len", "64", "--new-tokens", "64"], "--new-tokens"),
    ],
)
def test_precompile_decode_refuses_bad_values_before_torch(
    args: list[str], says: str, tiny_model: Callable[..., Path]
) -> None:
    model = str(tiny_model("qwen3"))
    args = [model if a == "MODEL" else a for a in args]
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, json.dumps(args)], capture_output=True, text=True, timeout=120
    )
    assert says in proc.stderr
    if not proc.stdout:  # argparse's own refusal: it exits while parsing, before any command runs
        assert proc.returncode == 2 and "usage:" in proc.stderr
        return
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["rc"] == 2, proc.stderr
    assert got["heavy"] == [], "torch or transformers was imported before the refusal"


def test_precompile_decode_without_a_gpu_names_what_is_missing(tiny_model: Callable[..., Path]) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA GPU is visible: the compiled decode can run here")
    args = ["precompile", "--decode", str(tiny_model("qwen3")), "--seq-len", "128", "--new-tokens", "64"]
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, json.dumps(args)], capture_output=True, text=True, timeout=300
    )
    assert json.loads(proc.stdout.strip().splitlines()[-1])["rc"] == 2, proc.stderr
    assert "a compiled decode cannot run here" in proc.stderr and "no CUDA GPU" in proc.stderr
    # the fix is the machine's, not the dynamic decode (which would precompile nothing)
    assert "Fix: run where a CUDA GPU is visible" in proc.stderr and "dynamic" not in proc.stderr


def test_a_dynamic_plan_clears_a_checkpoints_static_cache(tiny_lm: Any) -> None:
    """A generation_config.json asking for a static-type cache (Gemma-2's "hybrid") would compile on the first
    generate(): a dynamic plan clears it and records what the checkpoint asked for."""
    from cudaload.execute.decode import apply_decode

    tiny_lm.generation_config.cache_implementation = "hybrid"
    got = apply_decode(tiny_lm, _plan(compiled=False))
    assert got == {"mode": "dynamic", "checkpoint_cache_implementation": "hybrid"}
    assert tiny_lm.generation_config.cache_implementation is None


def test_a_warm_up_that_does_not_compile_puts_the_dynamic_cache_back(tiny_lm: Any) -> None:
    """On the CPU transformers does not compile (no _compile_all_devices): the warm-up reports it, the plan's
    fields are undone, and a warning says so, rather than leaving an uncompiled static cache."""
    from cudaload.execute.decode_calls import ready_decode

    plan = _plan(compile={"fullgraph": False, "dynamic": False, "mode": "reduce-overhead"})
    with pytest.warns(CudaloadWarning, match="did not compile"):
        got = ready_decode(tiny_lm, plan, warm=True)
    assert got["warmup"]["compiled"] is False and "dynamic cache is kept" in got["undone"]
    gc = tiny_lm.generation_config
    assert gc.cache_implementation is None and gc.compile_config is None and gc.max_cache_len is None


def test_a_warm_up_that_does_not_compile_leaves_a_plan_that_says_dynamic(
    tiny_lm: Any, tiny_model: Callable[..., Path]
) -> None:
    """The load's plan says what the model runs: a compiled decode undone after its warm-up is replanned dynamic,
    its decision says why (and what the plan had chosen), and ``verified["replanned"]`` lists it, as a runtime
    attention fallback's new plan does."""
    from dataclasses import replace
    from types import SimpleNamespace

    import cudaload
    from cudaload.execute.load import _ready
    from cudaload.plans.plan import Plan

    first = cudaload.plan(
        str(tiny_model("qwen3")), device_map="cpu", seq_len=128, new_tokens=64, batch_size=1
    )
    first = replace(
        first, decode=_plan(compile={"fullgraph": False, "dynamic": False, "mode": "reduce-overhead"})
    )
    verified: dict[str, Any] = {"load_path": "from_pretrained", "replanned": []}
    with pytest.warns(CudaloadWarning, match="did not compile"):
        _, got = _ready(SimpleNamespace(warmup=True), tiny_lm, first, verified)  # type: ignore[arg-type]
    assert got.decode is not None and not got.decode.compiled and got.decode.mode.choice == "dynamic"
    assert got.decode.max_cache_len is None and got.decode.generation_settings() == {}
    assert got.decode.mode.reasons == (
        "replanned after loading: the warm-up's generate() did not compile: the dynamic cache is kept",
        "the plan chose compiled: test",
    )
    assert got.verified is not None and got.verified["replanned"] == [
        "decode planned again as dynamic: the warm-up's generate() did not compile: the dynamic cache is kept"
    ]
    assert "decode: dynamic" in got.explain() and "replanned after loading" in got.explain()
    assert Plan.from_json(got.to_json()).decode == got.decode


def test_a_dynamic_plan_keeps_a_checkpoints_dynamic_cache_kind(tiny_lm: Any) -> None:
    """ "offloaded" is a dynamic cache (no compile): a dynamic plan leaves it as the checkpoint asked."""
    from cudaload.execute.decode import apply_decode

    tiny_lm.generation_config.cache_implementation = "offloaded"
    assert apply_decode(tiny_lm, _plan(compiled=False)) == {"mode": "dynamic"}
    assert tiny_lm.generation_config.cache_implementation == "offloaded"
