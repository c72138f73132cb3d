"""The fast path gives exactly what from_pretrained gives with the same arguments, or steps aside (issue 12).

Every test loads the same directory both ways on the CPU and compares: the state_dict bit for bit (keys, order,
dtypes, values: random inits of missing keys included, from the same seed), the config, the load report
(missing / unexpected / mismatched keys, as ``from_pretrained(output_loading_info=True)`` gives them) and the
warnings transformers logs. Where the fast path cannot do a load exactly it must raise ``StepAside`` (and
``load_model`` then uses from_pretrained); where from_pretrained fails, the fast path must fail too.

The default run covers the eight cases of issue 12 and a small sample of architectures; the sweep over every
transformers model type that builds from a shrunken default config is marked ``slow``.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import logging
import math
import os
import shutil
import struct
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from cudaload import fastload  # noqa: E402
from cudaload.errors import CheckpointError, LoadError  # noqa: E402
from cudaload.fastload import StepAside  # noqa: E402

# ---- helpers --------------------------------------------------------------------------------------------


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@contextmanager
def transformers_warnings() -> Iterator[list[str]]:
    """The warnings transformers logs (its loggers do not propagate to the root logger pytest captures)."""
    handler = _Records()
    root = logging.getLogger("transformers")
    root.addHandler(handler)
    try:
        yield handler.messages
    finally:
        root.removeHandler(handler)


@dataclasses.dataclass
class Loaded:
    model: Any
    report: dict[str, Any]
    warnings: list[str]


def _norm_report(missing: Any, unexpected: Any, mismatched: Any) -> dict[str, Any]:
    return {
        "missing_keys": sorted(missing),
        "unexpected_keys": sorted(unexpected),
        "mismatched_keys": sorted((k, tuple(a), tuple(b)) for k, a, b in mismatched),
    }


def reference(path: Path, auto_class: str, dtype: Any = None, device: str = "cpu", **kwargs: Any) -> Loaded:
    torch.manual_seed(1234)
    with transformers_warnings() as logs:
        model, info = getattr(transformers, auto_class).from_pretrained(
            path, dtype=dtype or torch.float32, device_map=device, output_loading_info=True, **kwargs
        )
    report = _norm_report(info["missing_keys"], info["unexpected_keys"], info["mismatched_keys"])
    return Loaded(model, report, list(logs))


def fast(path: Path, auto_class: str, dtype: Any = None, device: str = "cpu", **kwargs: Any) -> Loaded:
    torch.manual_seed(1234)
    with transformers_warnings() as logs:
        model = fastload.load(
            path, auto_class=auto_class, device=device, dtype=dtype or torch.float32, **kwargs
        )
    r = model.cudaload_fastload
    report = _norm_report(r["missing_keys"], r["unexpected_keys"], r.get("mismatched_keys", []))
    return Loaded(model, report, list(logs))


def assert_parity(ref: Loaded, got: Loaded) -> None:
    a, b = ref.model.state_dict(), got.model.state_dict()
    assert list(a) == list(b)
    for k in a:
        assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape, k
        assert a[k].device == b[k].device, k
        assert torch.equal(a[k], b[k]), f"{k} differs"
    ba, bb = dict(ref.model.named_buffers()), dict(got.model.named_buffers())
    assert ba.keys() == bb.keys()
    for k in ba:
        assert ba[k].dtype == bb[k].dtype and torch.equal(ba[k], bb[k]), f"buffer {k} differs"
    pa = [(n, p.requires_grad) for n, p in ref.model.named_parameters()]
    assert pa == [(n, p.requires_grad) for n, p in got.model.named_parameters()]  # ties: same names once
    assert ref.model.config.to_dict() == got.model.config.to_dict()
    assert ref.model.training == got.model.training
    if ref.model.can_generate():
        assert ref.model.generation_config.to_dict() == got.model.generation_config.to_dict()
    assert ref.report == got.report
    assert ref.warnings == got.warnings
    assert _conversions(ref.model) == _conversions(got.model)  # what save_pretrained undoes


def _conversions(model: Any) -> list[tuple[str, list[str], list[str]]]:
    return [
        (type(c).__name__, list(c.source_patterns), list(c.target_patterns))
        for c in getattr(model, "_weight_conversions", None) or []
    ]


def both(
    path: Path,
    auto_class: str = "AutoModelForCausalLM",
    dtype: Any = None,
    device: str = "cpu",
    **kwargs: Any,
) -> tuple[Loaded, Loaded]:
    ref = reference(path, auto_class, dtype, device, **kwargs)
    got = fast(path, auto_class, dtype, device, **kwargs)
    assert_parity(ref, got)
    return ref, got


def _tensors(file: Path) -> dict[str, Any]:
    from safetensors.torch import load_file

    return dict(load_file(str(file)))


def _save(tensors: dict[str, Any], file: Path) -> None:
    from safetensors.torch import save_file

    save_file(tensors, str(file), metadata={"format": "pt"})


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def _read_raw(file: Path) -> tuple[dict[str, Any], bytes]:
    data = file.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    return json.loads(data[8 : 8 + n]), data[8 + n :]


def _write_raw(file: Path, header: dict[str, Any], body: bytes) -> None:
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    file.write_bytes(struct.pack("<Q", len(raw)) + raw + body)


# ---- 1. from_pretrained keywords ------------------------------------------------------------------------


def test_config_overrides_are_applied(tiny_model: Callable[..., Path]) -> None:
    path = tiny_model("llama")
    ref, got = both(path, rms_norm_eps=0.5, use_cache=False)
    assert got.model.config.rms_norm_eps == 0.5 and got.model.config.use_cache is False
    ids = torch.arange(12).reshape(2, 6)
    with torch.no_grad():
        assert torch.equal(ref.model(ids).logits, got.model(ids).logits)


def test_variant_picks_the_variant_file(tiny_model: Callable[..., Path], tmp_path: Path) -> None:
    path = _copy(tiny_model("llama"), tmp_path / "v")
    t = _tensors(path / "model.safetensors")
    _save({k: v * 2 for k, v in t.items()}, path / "model.v1.safetensors")
    _, got = both(path, variant="v1")
    assert got.model.cudaload_fastload["files"] == ["model.v1.safetensors"]
    assert torch.equal(got.model.model.norm.weight, t["model.norm.weight"] * 2)


def test_subfolder(tiny_model: Callable[..., Path], tmp_path: Path) -> None:
    root = tmp_path / "repo"
    shutil.copytree(tiny_model("llama"), root / "sub")
    both(root, subfolder="sub")


def test_ignore_mismatched_sizes(tiny_model: Callable[..., Path], tmp_path: Path) -> None:
    path = _copy(tiny_model("llama"), tmp_path / "m")
    t = _tensors(path / "model.safetensors")
    t["model.norm.weight"] = torch.ones(5)
    t["model.layers.0.mlp.up_proj.weight"] = torch.ones(3, 3)
    _save(t, path / "model.safetensors")
    _, got = both(path, ignore_mismatched_sizes=True)
    assert [k for k, _, _ in got.report["mismatched_keys"]] == [
        "model.layers.0.mlp.up_proj.weight",
        "model.norm.weight",
    ]
    # without it both fail (from_pretrained: RuntimeError after its report; load_model calls that LoadError)
    with pytest.raises(RuntimeError):
        reference(path, "AutoModelForCausalLM")
    with pytest.raises(LoadError, match="ignore_mismatched_sizes"):
        fast(path, "AutoModelForCausalLM")


@pytest.mark.parametrize(
    ("kwargs", "word"),
    [
        ({"key_mapping": {"^model": "model"}}, "key_mapping"),
        ({"use_safetensors": False}, "use_safetensors"),
        ({"output_loading_info": True}, "output_loading_info"),
        ({"gguf_file": "x.gguf"}, "gguf_file"),
    ],
)
def test_keywords_only_from_pretrained_honours_step_aside(
    tiny_model: Callable[..., Path], kwargs: dict[str, Any], word: str
) -> None:
    path = tiny_model("llama")
    with pytest.raises(StepAside, match=word):
        fastload.load(path, device="cpu", dtype=torch.float32, **kwargs)
    ok, why = fastload.supports(path, **kwargs)
    assert not ok and word in why


def test_unknown_keyword_fails_as_from_pretrained_fails(tiny_model: Callable[..., Path]) -> None:
    """A keyword neither loader nor config knows goes to the model's __init__, which rejects it, both ways."""
    path = tiny_model("llama")
    with pytest.raises(TypeError):
        reference(path, "AutoModelForCausalLM", not_a_keyword=3)
    with pytest.raises(TypeError):
        fast(path, "AutoModelForCausalLM", not_a_keyword=3)


def test_plan_chooses_from_pretrained_for_keywords_it_cannot_honour() -> None:
    from cudaload.policies.load_path import choose_load_path, fast_kwargs_blockers

    info = _FakeInfo()
    placement = _placement(("cuda:0",))
    d = choose_load_path(info, quantization=None, placement=placement, prefer=None)
    assert d.choice == "fast"
    d = choose_load_path(
        info,
        quantization=None,
        placement=placement,
        from_pretrained_kwargs={"rms_norm_eps": 0.5, "variant": "v"},
    )
    assert d.choice == "fast"  # config overrides and variant are honoured
    d = choose_load_path(
        info, quantization=None, placement=placement, from_pretrained_kwargs={"key_mapping": {"a": "b"}}
    )
    assert d.choice == "from_pretrained" and "key_mapping" in " ".join(d.reasons)
    assert fast_kwargs_blockers({"state_dict": {}, "use_safetensors": False}) == [
        "from_pretrained keyword state_dict=: weights come from a state_dict, not the files",
        "from_pretrained keyword use_safetensors=False: the weights come from .bin files",
    ]
    assert fast_kwargs_blockers({"device_map": None, "use_safetensors": True}) == []


@dataclasses.dataclass
class _Summary:
    local_path: str | None = "/models/x"
    safetensors: bool = True
    weights_bytes: int = 16 * 10**9


@dataclasses.dataclass
class _FakeInfo:
    summary: _Summary = dataclasses.field(default_factory=_Summary)
    remote_code: bool = False


def _placement(devices: tuple[str, ...]) -> Any:
    from cudaload.plans.plan import Placement

    return Placement(device_map={"": devices[0]}, devices=devices)


def test_planner_passes_keywords_to_the_load_path_policy(tiny_model: Callable[..., Path]) -> None:
    """On the real H200's capabilities: fast=True with honoured keywords plans the fast path; a keyword only
    from_pretrained honours makes fast=True an invalid choice, and the default plan says why it is not fast."""
    import cudaload
    from cudaload.capabilities import Capabilities
    from cudaload.errors import InvalidChoiceError

    caps = Capabilities.from_json((Path(__file__).parent / "fixtures" / "h200.json").read_text())
    path = str(tiny_model("llama"))
    plan = cudaload.plan(path, hardware=caps, fast=True, from_pretrained_kwargs={"rms_norm_eps": 0.5})
    assert plan.load_path.choice == "fast"
    with pytest.raises(InvalidChoiceError) as err:
        cudaload.plan(path, hardware=caps, fast=True, from_pretrained_kwargs={"state_dict": {}})
    assert "state_dict" in str(err.value)
    plan = cudaload.plan(path, hardware=caps, from_pretrained_kwargs={"key_mapping": {"a": "b"}})
    assert plan.load_path.choice == "from_pretrained"
    fast_candidate = next(c for c in plan.load_path.candidates if c.name == "fast")
    assert any("key_mapping" in r for r in fast_candidate.reasons)


def test_load_model_fast_branch_honours_keywords(tiny_model: Callable[..., Path]) -> None:
    """load_model's fast branch (forced here on the CPU, the planner gives it GPUs only) with keywords."""
    import cudaload
    from cudaload.execute.load_path import _load_once
    from cudaload.plans.decision import Candidate, Decision

    path = tiny_model("llama")
    plan = cudaload.plan(str(path), hardware=cudaload.detect())
    plan = dataclasses.replace(
        plan,
        load_path=Decision("fast", candidates=(Candidate("fast", True), Candidate("from_pretrained", True))),
    )
    kwargs = {"rms_norm_eps": 0.5, "use_cache": False}
    model, taken, notes = _load_once(plan, "AutoModelForCausalLM", kwargs)
    assert taken == "fast" and notes == []
    # on a GPU machine the plan places the model on cuda:0: compare there
    ref = transformers.AutoModelForCausalLM.from_pretrained(
        path, dtype=model.dtype, device_map=str(model.device), **kwargs
    )
    assert model.config.rms_norm_eps == 0.5 and model.config.use_cache is False
    ids = torch.arange(12).reshape(2, 6).to(model.device)
    with torch.no_grad():
        assert torch.equal(ref(ids).logits, model(ids).logits)
    # a keyword the fast path cannot honour: from_pretrained, and the plan's notes say why
    model, taken, notes = _load_once(plan, "AutoModelForCausalLM", {"key_mapping": {"^x": "x"}})
    assert taken == "from_pretrained" and "key_mapping" in notes[0] and "stepped aside" in notes[0]


# ---- 2./4./5. which files, which copy --------------------------------------------------------------------


def test_single_file_wins_over_an_index(tiny_model: Callable[..., Path], tmp_path: Path) -> None:
    path = _copy(tiny_model("llama"), tmp_path / "both")
    sharded = tiny_model("llama", max_shard_size="40KB")
    for f in sharded.glob("model-*.safetensors"):
        _save({k: v + 1 for k, v in _tensors(f).items()}, path / f.name)
    shutil.copy(sharded / "model.safetensors.index.json", path)
    _, got = both(path)
    assert got.model.cudaload_fastload["files"] == ["model.safetensors"]
    assert fastload.read_header(path).files == (str(path / "model.safetensors"),)  # the reader's own rule


def test_transformers_weights_names_the_file(tiny_model: Callable[..., Path], tmp_path: Path) -> None:
    path = _copy(tiny_model("llama"), tmp_path / "tw")
    t = _tensors(path / "model.safetensors")
    _save({k: v * 3 for k, v in t.items()}, path / "custom.safetensors")
    cfg = json.loads((path / "config.json").read_text())
    cfg["transformers_weights"] = "custom.safetensors"
    (path / "config.json").write_text(json.dumps(cfg))
    _, got = both(path)
    assert got.model.cudaload_fastload["files"] == ["custom.safetensors"]


def test_tensor_in_two_shards_takes_the_later(tiny_model: Callable[..., Path], tmp_path: Path) -> None:
    path = _copy(tiny_model("llama", max_shard_size="40KB"), tmp_path / "dup")
    index = json.loads((path / "model.safetensors.index.json").read_text())["weight_map"]
    shards = sorted(set(index.values()))
    first, last = shards[0], shards[-1]
    name = next(k for k, v in index.items() if v == first)
    early = _tensors(path / first)
    late = _tensors(path / last)
    late[name] = early[name] * 5 + 1  # same tensor, other bytes, in a later shard the index does not name
    _save(late, path / last)
    _, got = both(path)
    assert torch.equal(got.model.state_dict()[name], early[name] * 5 + 1)


def test_index_entry_no_shard_holds(tiny_model: Callable[..., Path], tmp_path: Path) -> None:
    path = _copy(tiny_model("llama", max_shard_size="40KB"), tmp_path / "ghost")
    f = path / "model.safetensors.index.json"
    index = json.loads(f.read_text())
    first = sorted(set(index["weight_map"].values()))[0]
    index["weight_map"]["model.layers.0.ghost.weight"] = first
    victim = "model.layers.1.mlp.down_proj.weight"
    owner = index["weight_map"][victim]
    t = _tensors(path / owner)
    del t[victim]  # named by the index, held by no shard: a missing key for from_pretrained
    _save(t, path / owner)
    f.write_text(json.dumps(index))
    _, got = both(path)
    assert victim in got.report["missing_keys"]


# ---- 3. duplicates after renaming ------------------------------------------------------------------------


def test_duplicate_keys_first_in_transformers_order_wins(
    tiny_model: Callable[..., Path], tmp_path: Path
) -> None:
    path = _copy(tiny_model("llama"), tmp_path / "d")
    t = _tensors(path / "model.safetensors")
    t["norm.weight"] = t["model.norm.weight"] * 7  # renamed onto model.norm.weight (prefix), after it
    _save(t, path / "model.safetensors")
    _, got = both(path)
    assert torch.equal(got.model.model.norm.weight, t["model.norm.weight"])


def test_legacy_gamma_beside_weight(tiny_model: Callable[..., Path], tmp_path: Path) -> None:
    path = _copy(tiny_model("bert"), tmp_path / "g")
    t = _tensors(path / "model.safetensors")
    key = next(k for k in t if k.endswith("LayerNorm.weight"))
    t[key.replace(".weight", ".gamma")] = t[key] * 9
    _save(t, path / "model.safetensors")
    _, got = both(path, "AutoModel")
    assert _conversions(got.model)  # the legacy gamma/beta renaming was used, and is remembered


# ---- 6. malformed files ----------------------------------------------------------------------------------


def _offsets_by_start(header: dict[str, Any]) -> list[str]:
    return sorted((k for k in header if k != "__metadata__"), key=lambda k: header[k]["data_offsets"][0])


@pytest.mark.parametrize("how", ["overlap", "gap", "trailing", "bad_size", "unknown_dtype"])
def test_malformed_headers_fail_both_ways(tiny_model: Callable[..., Path], tmp_path: Path, how: str) -> None:
    path = _copy(tiny_model("llama"), tmp_path / how)
    f = path / "model.safetensors"
    header, body = _read_raw(f)
    names = _offsets_by_start(header)
    if how == "overlap":
        # two same-size neighbours: the second starts inside the first (and aliases its bytes)
        a, b = next(
            (x, y)
            for x, y in itertools.pairwise(names)
            if header[x]["shape"] == header[y]["shape"] and header[x]["dtype"] == header[y]["dtype"]
        )
        size = header[a]["data_offsets"][1] - header[a]["data_offsets"][0]
        header[b]["data_offsets"] = [header[a]["data_offsets"][0], header[a]["data_offsets"][0] + size]
    elif how == "gap":
        cut = header[names[1]]["data_offsets"][0]
        body = body[:cut] + b"\0" * 8 + body[cut:]
        for k in names[1:]:
            header[k]["data_offsets"] = [x + 8 for x in header[k]["data_offsets"]]
    elif how == "trailing":
        body += b"\0" * 8
    elif how == "bad_size":
        header[names[0]]["shape"] = [*header[names[0]]["shape"], 2]
    else:
        header[names[0]]["dtype"] = "Q9"
    _write_raw(f, header, body)
    with pytest.raises(Exception) as ref_err:
        transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, device_map="cpu")
    assert "safetensor" in f"{type(ref_err.value).__name__} {ref_err.value}".lower()
    with pytest.raises(CheckpointError, match=str(f)):
        fastload.load(path, device="cpu", dtype=torch.float32)
    ok, _ = fastload.supports(path)
    assert not ok


def test_header_checks_follow_safetensors(tmp_path: Path) -> None:
    """Header by header, the reader accepts exactly what safetensors' safe_open accepts."""
    from safetensors import safe_open

    from cudaload.fastload.reader import read_file_header

    f32 = {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}
    cases: dict[str, tuple[dict[str, Any], int]] = {
        "ok": ({"a": f32}, 8),
        "e8m0": ({"a": f32, "s": {"dtype": "F8_E8M0", "shape": [2], "data_offsets": [8, 10]}}, 10),
        "c64": ({"a": f32, "s": {"dtype": "C64", "shape": [2], "data_offsets": [8, 24]}}, 24),
        "f4": ({"a": f32, "s": {"dtype": "F4", "shape": [4], "data_offsets": [8, 10]}}, 10),
        "f4_odd": ({"a": f32, "s": {"dtype": "F4", "shape": [3], "data_offsets": [8, 10]}}, 10),
        "zero_size": ({"z": {"dtype": "F32", "shape": [0], "data_offsets": [0, 0]}, "a": f32}, 8),
        "out_of_order": ({"b": {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]}, "a": f32}, 16),
        "empty": ({}, 0),
        "gap": ({"a": f32, "b": {"dtype": "F32", "shape": [2], "data_offsets": [12, 20]}}, 20),
        "overlap": ({"a": f32, "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}, 12),
        "not_covered": ({"a": f32}, 12),
        "past_end": ({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}, 8),
        "negative": ({"a": {"dtype": "F32", "shape": [-2], "data_offsets": [0, 8]}}, 8),
        "metadata_int": ({"__metadata__": {"x": 1}, "a": f32}, 8),
        "unknown_dtype": ({"a": {"dtype": "Q9", "shape": [2], "data_offsets": [0, 2]}}, 2),
    }
    for name, (header, n) in cases.items():
        f = tmp_path / f"{name}.safetensors"
        _write_raw(f, header, b"\0" * n)
        try:
            with safe_open(str(f), "pt") as h:
                list(h.keys())
            theirs = True
        except Exception:
            theirs = False
        try:
            read_file_header(f)
            ours = True
        except CheckpointError:
            ours = False
        assert ours == theirs, f"{name}: safetensors {'accepts' if theirs else 'rejects'} it, the reader not"


# ---- 7. what from_pretrained loads, the fast path loads (or steps aside) --------------------------------


def _append_raw(file: Path, name: str, dtype: str, shape: list[int], nbytes: int) -> None:
    header, body = _read_raw(file)
    header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(body), len(body) + nbytes]}
    _write_raw(file, header, body + bytes(range(nbytes)))


@pytest.mark.parametrize(("dtype", "nbytes"), [("F8_E8M0", 4), ("C64", 32)])
def test_unused_tensor_of_a_dtype_the_fast_path_does_not_copy(
    tiny_model: Callable[..., Path], tmp_path: Path, dtype: str, nbytes: int
) -> None:
    path = _copy(tiny_model("llama"), tmp_path / dtype)
    _append_raw(path / "model.safetensors", "model.layers.0.scales", dtype, [4], nbytes)
    _, got = both(path)
    assert "model.layers.0.scales" in got.report["unexpected_keys"]


def test_used_tensor_of_a_dtype_the_fast_path_does_not_copy_steps_aside(
    tiny_model: Callable[..., Path], tmp_path: Path
) -> None:
    path = _copy(tiny_model("llama"), tmp_path / "c64")
    f = path / "model.safetensors"
    header, body = _read_raw(f)
    names = _offsets_by_start(header)
    last = names[-1]
    n = math.prod(header[last]["shape"])
    header[last]["dtype"] = "C64"
    header[last]["data_offsets"][1] = header[last]["data_offsets"][0] + 8 * n
    body = body[: header[last]["data_offsets"][0]] + b"\0" * (8 * n)
    _write_raw(f, header, body)
    with pytest.raises(StepAside, match="C64"):
        fastload.load(path, device="cpu", dtype=torch.float32)


# ---- 8. reports ------------------------------------------------------------------------------------------


def _marian(path: Path) -> Path:
    cfg = transformers.MarianConfig(
        vocab_size=128,
        d_model=32,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        max_position_embeddings=64,
        pad_token_id=0,
        decoder_start_token_id=0,
        eos_token_id=1,
    )
    torch.manual_seed(0)
    transformers.MarianMTModel(cfg).save_pretrained(path)
    return path


def test_report_marian_embed_positions(tmp_path: Path) -> None:
    both(_marian(tmp_path / "marian"), "AutoModelForSeq2SeqLM")


def test_report_legacy_rotary_inv_freq(tiny_model: Callable[..., Path], tmp_path: Path) -> None:
    path = _copy(tiny_model("llama"), tmp_path / "rot")
    t = _tensors(path / "model.safetensors")
    t["model.layers.0.self_attn.rotary_emb.inv_freq"] = torch.ones(8)
    t["model.layers.0.extra.weight"] = torch.ones(3, 3)
    _save(t, path / "model.safetensors")
    _, got = both(path)
    assert got.report["unexpected_keys"] == ["model.layers.0.extra.weight"]


def test_report_absent_tied_source(tiny_model: Callable[..., Path], tmp_path: Path) -> None:
    path = _copy(tiny_model("qwen3"), tmp_path / "tied")
    t = _tensors(path / "model.safetensors")
    t["lm_head.weight"] = t.pop("model.embed_tokens.weight")
    _save(t, path / "model.safetensors")
    both(path)


@pytest.mark.parametrize("variant", ["normal", "no_bias", "decoder_bias_only"])
def test_report_bert_tied_decoder_bias(tmp_path: Path, variant: str) -> None:
    """cls.predictions.decoder.bias is tied to cls.predictions.bias: with the source absent, transformers
    reports both missing."""
    torch.manual_seed(0)
    cfg = transformers.BertConfig(
        vocab_size=128, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64
    )
    path = tmp_path / "bert-mlm"
    transformers.BertForMaskedLM(cfg).save_pretrained(path)
    t = _tensors(path / "model.safetensors")
    if variant == "no_bias":
        del t["cls.predictions.bias"]
    elif variant == "decoder_bias_only":
        t["cls.predictions.decoder.bias"] = t.pop("cls.predictions.bias")
    _save(t, path / "model.safetensors")
    _, got = both(path, "AutoModelForMaskedLM")
    if variant == "no_bias":
        assert got.report["missing_keys"] == ["cls.predictions.bias", "cls.predictions.decoder.bias"]


@pytest.mark.gpu
def test_parity_on_gpu(tiny_model: Callable[..., Path], tmp_path: Path) -> None:
    """The CUDA fill with keywords, a mismatched and a missing tensor: same model and report on cuda:0."""
    path = _copy(tiny_model("qwen3", dtype="bfloat16"), tmp_path / "gpu")
    t = _tensors(path / "model.safetensors")
    t["model.norm.weight"] = torch.ones(5, dtype=torch.bfloat16)
    del t["model.layers.1.mlp.down_proj.weight"]
    _save(t, path / "model.safetensors")
    _, got = both(
        path,
        dtype=torch.bfloat16,
        device="cuda:0",
        ignore_mismatched_sizes=True,
        rms_norm_eps=0.5,
    )
    assert got.model.model.norm.weight.device.type == "cuda"
    assert got.report["missing_keys"] == ["model.layers.1.mlp.down_proj.weight"]


# ---- 6. architectures --------------------------------------------------------------------------------------

#: transformers' default configs, shrunk (only the attributes a default config has, passed to its __init__ so
#: derived fields follow); a model type whose model then has over 2M parameters is not swept.
_SMALL = {
    "hidden_size": 32,
    "d_model": 32,
    "n_embd": 32,
    "intermediate_size": 64,
    "ffn_dim": 64,
    "encoder_ffn_dim": 64,
    "decoder_ffn_dim": 64,
    "d_ff": 64,
    "num_hidden_layers": 2,
    "n_layer": 2,
    "num_layers": 2,
    "encoder_layers": 2,
    "decoder_layers": 2,
    "num_decoder_layers": 2,
    "num_attention_heads": 4,
    "n_head": 4,
    "encoder_attention_heads": 4,
    "decoder_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 128,
    "max_position_embeddings": 64,
    "head_dim": 8,
    "d_kv": 8,
    "moe_intermediate_size": 32,
    "num_experts": 4,
    "num_local_experts": 4,
    "num_experts_per_tok": 2,
    "n_positions": 64,
    "state_size": 8,
    "expand": 2,
    "conv_kernel": 4,
    "time_step_rank": 4,
}
_AUTOS = ("AutoModelForCausalLM", "AutoModelForMaskedLM", "AutoModelForSeq2SeqLM", "AutoModel")
_MAX_PARAMS = 2_000_000

#: the default run's sample: decoders (tied and untied, sliding window, softcapping), an SSM, encoders with
#: tied MLM heads, encoder-decoders with shared embeddings
SAMPLE = ("llama", "qwen3", "gemma2", "gpt2", "opt", "mamba", "bert", "roberta", "t5", "bart")


def _shrunk_config(cls: Any) -> Any:
    """``cls``'s default config with the sizes of :data:`_SMALL` (and its sub-configs' too, for composite
    models), passed to ``__init__`` so derived fields follow."""
    defaults = cls().to_dict()
    kw: dict[str, Any] = {k: v for k, v in _SMALL.items() if k in defaults}
    for name in getattr(cls, "sub_configs", {}) or {}:
        sub = defaults.get(name)
        if isinstance(sub, dict):
            kw[name] = {**sub, **{k: v for k, v in _SMALL.items() if k in sub}}
            kw[name].update({k: v for k, v in _SMALL_VISION.items() if k in sub})
    kw.update({k: v for k, v in _SMALL_VISION.items() if k in defaults})
    return cls(**kw)


_SMALL_VISION = {"image_size": 32, "patch_size": 8}


def _tiny_checkpoint(model_type: str, root: Path) -> tuple[Path, str] | None:
    cls = transformers.CONFIG_MAPPING[model_type]
    config = _shrunk_config(cls)
    for auto in _AUTOS:
        auto_cls = getattr(transformers, auto)
        if type(config) not in auto_cls._model_mapping:
            continue
        with torch.device("meta"):
            meta = auto_cls.from_config(config)
        if sum(p.numel() for p in meta.parameters()) > _MAX_PARAMS:
            return None
        torch.manual_seed(0)
        model = auto_cls.from_config(config)
        path = root / model_type
        model.save_pretrained(path)
        return path, auto
    return None


def _sweep_one(model_type: str, root: Path, *, required: bool) -> None:
    try:
        made = _tiny_checkpoint(model_type, root)
    except Exception as e:  # a default config the generic shrink breaks: not this loader's business
        if required:
            raise
        pytest.skip(f"{model_type}: no tiny model from the shrunken default config ({type(e).__name__})")
    if made is None:
        assert not required, f"{model_type} should build small"
        pytest.skip(f"{model_type}: no auto class or over {_MAX_PARAMS} parameters")
    path, auto = made
    ok, why = fastload.supports(path, auto_class=auto)
    if not ok:
        # stepping aside is allowed, failing is not: from_pretrained must load it, the fast path say why
        assert not required, f"{model_type}: {why}"
        reference(path, auto)
        with pytest.raises(StepAside):
            fastload.load(path, auto_class=auto, device="cpu", dtype=torch.float32)
        return
    both(path, auto)


@pytest.mark.parametrize(
    ("kind", "saved", "loaded", "shard"),
    [
        ("llama", "bfloat16", "float32", None),
        ("gemma2", "float32", "bfloat16", "40KB"),
        ("qwen3", "float16", "bfloat16", "40KB"),
    ],
)
def test_dtype_and_shard_variants(
    tiny_model: Callable[..., Path], kind: str, saved: str, loaded: str, shard: str | None
) -> None:
    both(tiny_model(kind, dtype=saved, max_shard_size=shard), dtype=getattr(torch, loaded))


def test_keep_in_fp32_modules(tmp_path: Path) -> None:
    """T5 keeps its ``wo`` projections in float32 when loaded in float16 (``_keep_in_fp32_modules``)."""
    made = _tiny_checkpoint("t5", tmp_path)
    assert made is not None
    _, got = both(made[0], made[1], dtype=torch.float16)
    dtypes = {n: p.dtype for n, p in got.model.named_parameters()}
    assert dtypes["encoder.block.0.layer.1.DenseReluDense.wo.weight"] == torch.float32
    assert dtypes["encoder.block.0.layer.1.DenseReluDense.wi.weight"] == torch.float16


@pytest.mark.parametrize("model_type", SAMPLE)
def test_architecture_sample(model_type: str, tmp_path: Path) -> None:
    _sweep_one(model_type, tmp_path, required=True)


def _all_model_types() -> list[str]:
    return sorted(transformers.CONFIG_MAPPING.keys())


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """The sweep's ~800 model types are collected only when asked for (``-m slow`` or
    CUDALOAD_PARITY_SWEEP=1), so a default run neither runs nor lists them."""
    if metafunc.function.__name__ == "test_architecture_sweep":
        asked = "slow" in (metafunc.config.option.markexpr or "") or os.environ.get("CUDALOAD_PARITY_SWEEP")
        metafunc.parametrize("model_type", _all_model_types() if asked else [])


@pytest.mark.slow
def test_architecture_sweep(model_type: str, tmp_path: Path) -> None:
    """Every transformers model type that builds small: parity, or a clean step aside (minutes on 2 cores)."""
    _sweep_one(model_type, tmp_path, required=False)
