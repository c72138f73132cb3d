"""A checkpoint whose tensors do not cover its model is refused (CheckpointCoverageError naming them), on the
fast path and through from_pretrained, unless the new weights are meant (``new_weights=``); what was meant is
in ``plan.verified["checkpoint"]``. What transformers itself expects (tied weights, a head the class does not
build) loads as before."""

from __future__ import annotations

import dataclasses
import gc
import shutil
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

import cudaload
from cudaload.capabilities import Capabilities
from cudaload.checkpoint_coverage import check_coverage, matches, new_weights_option
from cudaload.errors import (
    CheckpointCoverageError,
    CheckpointError,
    ConfigurationError,
    LoadError,
)
from cudaload.execute.load_path import _load_once
from cudaload.plans.decision import Candidate, Decision


@pytest.fixture(scope="module")
def caps() -> Capabilities:
    return cudaload.detect()


@pytest.fixture(autouse=True)
def _private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDALOAD_CACHE", str(tmp_path / "cache"))


def _rewrite(src: Path, dst: Path, edit: Callable[[dict[str, Any]], None]) -> Path:
    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst)
    tensors = load_file(str(src / "model.safetensors"))
    edit(tensors)
    save_file(tensors, str(dst / "model.safetensors"), metadata={"format": "pt"})
    return dst


def _missing_norm(tiny_model: Callable[..., Path], tmp_path: Path) -> Path:
    return _rewrite(tiny_model("llama"), tmp_path / "missing", lambda t: t.pop("model.norm.weight"))


def _fast_plan(path: Path, caps: Capabilities, **options: Any) -> Any:
    """The plan with the fast path forced (the planner gives it GPUs only; it loads on the CPU too)."""
    plan = cudaload.plan(str(path), hardware=caps, **options)
    fast = Decision("fast", candidates=(Candidate("fast", True), Candidate("from_pretrained", True)))
    return dataclasses.replace(plan, load_path=fast)


# ---- refused: missing, unexpected, reshaped --------------------------------------------------------------------


def test_missing_tensor_refused_through_from_pretrained(
    tiny_model: Callable[..., Path], tmp_path: Path, caps: Capabilities
) -> None:
    path = _missing_norm(tiny_model, tmp_path)
    with pytest.raises(CheckpointCoverageError) as e:
        cudaload.load_model(str(path), hardware=caps, fast=False)
    err = e.value
    assert isinstance(err, CheckpointError) and isinstance(err, ValueError)
    assert err.missing == ("model.norm.weight",) and not err.unexpected and not err.mismatched
    assert "model.norm.weight" in str(err) and "randomly initialised" in str(err)
    assert err.fix is not None and "new_weights=['model.norm.*']" in err.fix


def test_missing_tensor_refused_on_the_fast_path(
    tiny_model: Callable[..., Path], tmp_path: Path, caps: Capabilities
) -> None:
    path = _missing_norm(tiny_model, tmp_path)
    plan = _fast_plan(path, caps)
    with pytest.raises(CheckpointCoverageError, match=r"model\.norm\.weight") as e:
        _load_once(plan, "AutoModelForCausalLM", {})
    assert e.value.missing == ("model.norm.weight",)
    # the fast path did the load (it was not a step aside to from_pretrained that refused)
    model, taken, _ = _load_once(plan, "AutoModelForCausalLM", {}, new_weights=("model.norm",))
    assert taken == "fast" and model.cudaload_fastload["missing_keys"] == ["model.norm.weight"]


def test_many_missing_tensors_named_first_few_and_counted(
    tiny_model: Callable[..., Path], tmp_path: Path, caps: Capabilities
) -> None:
    def drop(t: dict[str, Any]) -> None:
        for k in [k for k in t if k.startswith("model.layers.1.")]:
            del t[k]

    path = _rewrite(tiny_model("llama"), tmp_path / "layer", drop)
    with pytest.raises(CheckpointCoverageError) as e:
        cudaload.load_model(str(path), hardware=caps)
    assert len(e.value.missing) == 9
    text = str(e.value)
    assert "9 tensors of the model not in the checkpoint" in text and "and 4 more" in text
    # the suggested patterns work: one per layer
    assert e.value.fix is not None and "new_weights=['model.layers.1.*']" in e.value.fix
    model = cudaload.load_model(str(path), hardware=caps, new_weights=["model.layers.1.*"])
    assert model.cudaload_plan.verified["checkpoint"]["new_weights"] == sorted(e.value.missing)


def test_unexpected_tensor_inside_the_architecture_refused(
    tiny_model: Callable[..., Path], tmp_path: Path, caps: Capabilities
) -> None:
    def add(t: dict[str, Any]) -> None:
        t["model.layers.0.extra.weight"] = torch.ones(3, 3)
        # a legacy per-layer buffer: transformers drops it itself
        t["model.layers.0.self_attn.rotary_emb.inv_freq"] = torch.ones(8)

    path = _rewrite(tiny_model("llama"), tmp_path / "unexpected", add)
    for plan in (cudaload.plan(str(path), hardware=caps), _fast_plan(path, caps)):
        with pytest.raises(CheckpointCoverageError, match=r"model\.layers\.0\.extra\.weight") as e:
            _load_once(plan, "AutoModelForCausalLM", {})
        assert e.value.unexpected == ("model.layers.0.extra.weight",)  # inv_freq is transformers' own rule
        assert e.value.fix is not None and "new_weights=['model.layers.0.extra.*']" in e.value.fix


def test_fewer_layers_than_saved_refused_then_meant(
    tiny_model: Callable[..., Path], caps: Capabilities
) -> None:
    path = tiny_model("llama")
    with pytest.raises(CheckpointCoverageError, match="no place in this model") as e:
        cudaload.load_model(str(path), hardware=caps, num_hidden_layers=1)
    assert len(e.value.unexpected) == 9
    model = cudaload.load_model(str(path), hardware=caps, num_hidden_layers=1, new_weights="model.layers.1.*")
    assert len(model.cudaload_plan.verified["checkpoint"]["unused"]) == 9


def test_wrong_shape_refused_on_both_paths(
    tiny_model: Callable[..., Path], tmp_path: Path, caps: Capabilities
) -> None:
    path = _rewrite(
        tiny_model("llama"), tmp_path / "shape", lambda t: t.__setitem__("model.norm.weight", torch.ones(5))
    )
    for plan in (cudaload.plan(str(path), hardware=caps), _fast_plan(path, caps)):
        with pytest.raises(
            CheckpointCoverageError, match=r"model\.norm\.weight \(checkpoint \[5\] vs model \[64\]\)"
        ) as e:
            _load_once(plan, "AutoModelForCausalLM", {})
        # from_pretrained raises RuntimeError here: cudaload's error is one too
        assert isinstance(e.value, LoadError) and isinstance(e.value, RuntimeError)
        assert e.value.mismatched == ("model.norm.weight",)
        assert e.value.fix is not None and "ignore_mismatched_sizes=True" in e.value.fix
    # transformers' own opt-in, and new_weights naming it, re-initialise it and say so
    for meant in ({"ignore_mismatched_sizes": True}, {"new_weights": ["model.norm.*"]}):
        model = cudaload.load_model(str(path), hardware=caps, **meant)
        cov = model.cudaload_plan.verified["checkpoint"]
        assert cov["new_weights"] == ["model.norm.weight"]
        assert cov["mismatched"] == [["model.norm.weight", [5], [64]]]
        assert model.model.norm.weight.shape == (64,)
    model, taken, _ = _load_once(
        _fast_plan(path, caps), "AutoModelForCausalLM", {}, new_weights=("model.norm.*",)
    )
    assert taken == "fast" and model.cudaload_fastload["mismatched_keys"] == [
        ("model.norm.weight", [5], [64])
    ]


# ---- meant: a new head -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "head", "pattern"),
    [
        ("llama", ["score.weight"], "score"),
        ("bert", ["classifier.bias", "classifier.weight"], "classifier.*"),
    ],
)
def test_new_head_needs_new_weights_and_is_recorded(
    tiny_model: Callable[..., Path], caps: Capabilities, kind: str, head: list[str], pattern: str
) -> None:
    path = tiny_model(kind)
    with pytest.raises(CheckpointCoverageError) as e:
        cudaload.load_model(str(path), hardware=caps, task="sequence-classification")
    assert list(e.value.missing) == head
    assert e.value.fix is not None and f"new_weights=[{pattern!r}]" in e.value.fix  # the fix's own value
    model = cudaload.load_model(
        str(path), hardware=caps, task="sequence-classification", new_weights=[pattern]
    )
    verified = model.cudaload_plan.verified
    assert verified["checkpoint"]["new_weights"] == head
    assert (
        "initialised anew, not read from the checkpoint: " + ", ".join(head) in model.cudaload_plan.explain()
    )
    assert cudaload.Plan.from_json(model.cudaload_plan.to_json()) == model.cudaload_plan
    # True accepts any new tensor; a pattern that names another module does not cover the head
    model = cudaload.load_model(str(path), hardware=caps, task="sequence-classification", new_weights=True)
    assert model.cudaload_plan.verified["checkpoint"]["new_weights"] == head
    with pytest.raises(CheckpointCoverageError):
        cudaload.load_model(
            str(path), hardware=caps, task="sequence-classification", new_weights=["lm_head*"]
        )


def test_new_head_meant_on_the_fast_path(tiny_model: Callable[..., Path], caps: Capabilities) -> None:
    plan = _fast_plan(tiny_model("llama"), caps, model_class="AutoModelForSequenceClassification")
    with pytest.raises(CheckpointCoverageError, match=r"score\.weight"):
        _load_once(plan, "AutoModelForSequenceClassification", {})
    model, taken, notes = _load_once(plan, "AutoModelForSequenceClassification", {}, new_weights=("score.*",))
    assert taken == "fast" and notes == [] and type(model).__name__ == "LlamaForSequenceClassification"


# ---- not refused: what transformers itself expects ---------------------------------------------------------------


def test_full_and_tied_checkpoints_load_with_nothing_new(
    tiny_model: Callable[..., Path], caps: Capabilities
) -> None:
    """qwen3's tiny config ties lm_head to the embeddings: the checkpoint holds one of them, none is missing."""
    for kind in ("llama", "qwen3", "gpt2", "bert"):
        model = cudaload.load_model(str(tiny_model(kind)), hardware=caps)
        assert model.cudaload_plan.verified["checkpoint"] == {
            "new_weights": [],
            "mismatched": [],
            "unused": [],
        }
    from safetensors import safe_open

    with safe_open(str(tiny_model("qwen3") / "model.safetensors"), "pt") as f:
        assert "lm_head.weight" not in set(f.keys())
    plan = _fast_plan(tiny_model("qwen3"), caps)
    model, taken, _ = _load_once(plan, "AutoModelForCausalLM", {})
    assert taken == "fast" and model.lm_head.weight is model.model.embed_tokens.weight


def test_base_model_from_a_head_checkpoint_drops_the_head(
    tiny_model: Callable[..., Path], caps: Capabilities
) -> None:
    """AutoModel on a causal-LM checkpoint (embeddings): lm_head has no place in the base model, as transformers
    expects; recorded, not refused."""
    model = cudaload.load_model(str(tiny_model("llama")), hardware=caps, task="embedding")
    assert type(model).__name__ == "LlamaModel"
    assert model.cudaload_plan.verified["checkpoint"]["unused"] == ["lm_head.weight"]
    assert "1 checkpoint tensors unused: lm_head.weight" in model.cudaload_plan.explain()


# ---- leaves nothing behind ---------------------------------------------------------------------------------------


def test_refused_model_is_freed(
    tiny_model: Callable[..., Path], tmp_path: Path, caps: Capabilities, monkeypatch: pytest.MonkeyPatch
) -> None:
    from cudaload import checkpoint_coverage
    from cudaload.execute import load_path

    seen: list[weakref.ref[Any]] = []
    original = checkpoint_coverage.architecture_names

    def spy(model: Any) -> Any:
        seen.append(weakref.ref(model))
        return original(model)

    monkeypatch.setattr(load_path, "architecture_names", spy)
    path = _missing_norm(tiny_model, tmp_path)
    with pytest.raises(CheckpointCoverageError) as e:
        cudaload.load_model(str(path), hardware=caps)
    gc.collect()
    assert len(seen) == 1 and seen[0]() is None, "the refused model is still alive"
    # called directly, the error keeps its traceback (every frame of the load): the model is not among them
    with pytest.raises(CheckpointCoverageError) as e:
        _load_once(_fast_plan(path, caps), "AutoModelForCausalLM", {})
    gc.collect()
    assert e.value.__traceback__ is not None
    assert len(seen) == 2 and seen[1]() is None, "the refused model is held by the error's frames"


# ---- the keyword -------------------------------------------------------------------------------------------------


def test_new_weights_option_checked() -> None:
    assert new_weights_option(None) is False and new_weights_option(False) is False
    assert new_weights_option(True) is True
    assert new_weights_option("score.*") == ("score.*",)
    assert new_weights_option(["score.*", " classifier "]) == ("score.*", "classifier")
    for bad in (1, {"score": 1}, [], ["score", 3], [""]):
        with pytest.raises(ConfigurationError, match="new_weights"):
            new_weights_option(bad)


def test_new_weights_is_load_model_only(tiny_model: Callable[..., Path], caps: Capabilities) -> None:
    from cudaload.request import Request

    # plan() loads nothing: it has no such option
    with pytest.raises(ConfigurationError, match="new_weights"):
        Request.build(str(tiny_model("llama")), entry="plan", hardware=caps, new_weights=True)
    with pytest.raises(ConfigurationError, match="not True or a list"):
        cudaload.load_model(str(tiny_model("llama")), hardware=caps, new_weights=3)  # type: ignore[arg-type]
    req = Request.build(str(tiny_model("llama")), entry="load_model", hardware=caps, new_weights=["score.*"])
    assert req.new_weights == ("score.*",) and req.load_kwargs()["new_weights"] == ("score.*",)


def test_matches_globs_and_modules() -> None:
    assert matches("score.weight", ("score",)) and matches("score.weight", ("score.*",))
    assert matches("cls.predictions.decoder.bias", ("cls.*",)) and matches("x.y", True)
    assert not matches("scores.weight", ("score",)) and not matches("score.weight", False)


def test_check_coverage_reads_the_architecture() -> None:
    """A checkpoint tensor of a part the class does not build is dropped as transformers expects; one inside the
    base model is refused; BERT's pooler, which BertForMaskedLM builds without, counts as such a part."""
    base = frozenset({"embeddings", "encoder"})
    report = {"missing_keys": set(), "unexpected_keys": {"pooler.dense.bias", "cls.seq_relationship.weight"}}
    common: dict[str, Any] = {
        "ignore_mismatched_sizes": False,
        "prefix": "bert",
        "where": "x",
        "model_name": "M",
    }
    got = check_coverage(report, new_weights=False, base_names=base, **common)
    assert got["unused"] == ["cls.seq_relationship.weight", "pooler.dense.bias"]
    for key in ("bert.encoder.layer.9.attention.self.query.weight", "encoder.layer.9.output.dense.weight"):
        with pytest.raises(CheckpointCoverageError) as e:
            check_coverage({"unexpected_keys": [key]}, new_weights=False, base_names=base, **common)
        assert e.value.unexpected == (key,)


def test_architecture_read_inside_a_peft_model(tiny_model: Callable[..., Path]) -> None:
    """The sharded loader wraps LoRA before it shards: the report still names the model inside the PeftModel."""
    peft = pytest.importorskip("peft")
    import transformers

    from cudaload.checkpoint_coverage import architecture_names

    model = transformers.AutoModelForCausalLM.from_pretrained(tiny_model("llama"))
    plain = architecture_names(model)
    wrapped = peft.get_peft_model(model, peft.LoraConfig(r=2, target_modules=["q_proj"]))
    assert architecture_names(wrapped) == plain
    assert plain[0] == "model" and {"layers", "norm", "embed_tokens"} <= plain[1]
