"""cudaload.fastload.quantized on the CPU: a bitsandbytes int8 / nf4 / fp4 load through the fast path must give
what ``from_pretrained(..., quantization_config=...)`` gives, bit for bit (packed weights and quant state),
with the same modules, flags, config and logits.

bitsandbytes 0.50.2 has a CPU backend for ``int8_vectorwise_quant`` and ``quantize_4bit``, so both paths run
here with ``device_map="cpu"``; the GPU twin is tests/test_quantized_fastload_gpu.py."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("bitsandbytes")

from cudaload.errors import InvalidChoiceError  # noqa: E402
from cudaload.fastload import quantized  # noqa: E402
from cudaload.fastload.quantized import fill  # noqa: E402

KINDS = ("qwen3", "llama", "gpt2", "bert")


def _auto(kind: str) -> str:
    return "AutoModel" if kind == "bert" else "AutoModelForCausalLM"


def bnb_config(method: str, **kw: Any) -> Any:
    """A fresh config each call: from_pretrained and the fast path each get their own object."""
    if method == "int8":
        return transformers.BitsAndBytesConfig(load_in_8bit=True, **kw)
    return transformers.BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type=method,
        bnb_4bit_use_double_quant=kw.pop("double", method == "nf4"),
        bnb_4bit_compute_dtype=torch.bfloat16,
        **kw,
    )


def _reference(path: Path, auto_class: str, dtype: Any, cfg: Any, device: str = "cpu") -> Any:
    # use_kernels=False, as cudaload asks: transformers 5.25 kernelizes with its default Hub kernels otherwise
    return getattr(transformers, auto_class).from_pretrained(
        path, dtype=dtype, device_map=device, quantization_config=cfg, use_kernels=False
    )


def same_bits(a: Any, b: Any) -> bool:
    """Bit equality (4-bit data stored as bfloat16 holds NaN patterns, which ``torch.equal`` calls unequal)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    return bool(torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8)))


def assert_same_quantized(ref: Any, got: Any, *, logits: bool = True) -> None:
    """Same modules, same state_dict bit for bit (CB/SCB, packed 4-bit data and quant state), same flags and
    config, same logits."""
    import bitsandbytes as bnb

    assert [(n, type(m)) for n, m in ref.named_modules()] == [(n, type(m)) for n, m in got.named_modules()]
    a, b = ref.state_dict(), got.state_dict()  # before any forward: bnb's CPU forward repacks 4-bit data
    assert list(a) == list(b)
    for k in a:
        assert a[k].dtype == b[k].dtype, k
        assert a[k].shape == b[k].shape, k
        assert a[k].device == b[k].device, k
        assert same_bits(a[k], b[k]), f"{k} differs"
    pa, pb = dict(ref.named_parameters()), dict(got.named_parameters())
    assert list(pa) == list(pb)
    for k in pa:
        assert type(pa[k]) is type(pb[k]), k
        assert pa[k].dtype == pb[k].dtype and pa[k].requires_grad == pb[k].requires_grad, k
        if isinstance(pa[k], bnb.nn.Int8Params):
            assert same_bits(pa[k].SCB, pb[k].SCB) and same_bits(pa[k].CB, pb[k].CB), k
            assert pa[k].has_fp16_weights == pb[k].has_fp16_weights
        if isinstance(pa[k], bnb.nn.Params4bit):
            qa, qb = pa[k].quant_state, pb[k].quant_state
            assert (qa.blocksize, qa.quant_type, qa.dtype, tuple(qa.shape), qa.nested) == (
                qb.blocksize,
                qb.quant_type,
                qb.dtype,
                tuple(qb.shape),
                qb.nested,
            ), k
            assert pa[k].quant_storage == pb[k].quant_storage and pa[k].bnb_quantized and pb[k].bnb_quantized
            assert pb[k].module is not None and pb[k].module.quant_state is qb
    ba, bb = dict(ref.named_buffers()), dict(got.named_buffers())
    assert ba.keys() == bb.keys()
    for k in ba:
        assert ba[k].dtype == bb[k].dtype and same_bits(ba[k], bb[k]), f"buffer {k} differs"
    assert got.config.quantization_config.to_dict() == ref.config.quantization_config.to_dict()
    assert type(got.hf_quantizer) is type(ref.hf_quantizer)
    assert got.hf_quantizer.pre_quantized is False
    assert sorted(got.hf_quantizer.modules_to_not_convert) == sorted(ref.hf_quantizer.modules_to_not_convert)
    for flag in ("is_loaded_in_8bit", "is_loaded_in_4bit", "is_quantized", "quantization_method"):
        assert getattr(got, flag, None) == getattr(ref, flag, None), flag
    assert getattr(got.config, "_is_quantized", None) == getattr(ref.config, "_is_quantized", None)
    assert got.config.dtype == ref.config.dtype
    assert got.training is False and ref.training is False
    # what save_pretrained undoes, and the kernels switch, as from_pretrained leaves them
    assert _conversions(got) == _conversions(ref)
    assert getattr(got, "_use_kernels", None) == getattr(ref, "_use_kernels", None)
    if ref.can_generate():
        assert got.generation_config.to_dict() == ref.generation_config.to_dict()
    if logits:
        dev = next(ref.parameters()).device
        ids = torch.randint(0, ref.config.vocab_size, (2, 9), generator=torch.Generator().manual_seed(3))
        with torch.no_grad():
            oa, ob = ref(ids.to(dev)), got(ids.to(dev))
        key = "logits" if hasattr(oa, "logits") else "last_hidden_state"
        assert torch.equal(getattr(oa, key), getattr(ob, key))


def _conversions(model: Any) -> list[tuple[str, list[str], list[str]]]:
    return [
        (type(c).__name__, list(c.source_patterns), list(c.target_patterns))
        for c in getattr(model, "_weight_conversions", None) or []
    ]


@pytest.mark.parametrize("method", ["int8", "nf4"])
@pytest.mark.parametrize("kind", KINDS)
def test_same_as_from_pretrained(tiny_model: Callable[..., Path], kind: str, method: str) -> None:
    # float32 checkpoint loaded as bfloat16: the weights are cast before quantizing, as transformers does
    path = tiny_model(kind)
    ref = _reference(path, _auto(kind), torch.bfloat16, bnb_config(method))
    got = quantized.load_quantized(
        path,
        quantization_config=bnb_config(method),
        auto_class=_auto(kind),
        device="cpu",
        dtype=torch.bfloat16,
    )
    assert_same_quantized(ref, got)
    info = got.cudaload_fastload
    assert info["quantization"] == method and info["quantized_weights"] > 0
    assert info["missing_keys"] == [] and info["unexpected_keys"] == []


@pytest.mark.parametrize(
    ("method", "ckpt_dtype", "dtype", "extra"),
    [
        ("fp4", "float32", "float32", {}),  # fp4 without double quant, float32 weights
        (
            "nf4",
            "bfloat16",
            "bfloat16",
            {"bnb_4bit_quant_storage": "bfloat16"},
        ),  # quant_storage other than uint8
        ("int8", "bfloat16", "float16", {}),
        ("int8", "bfloat16", "bfloat16", {"llm_int8_skip_modules": ["down_proj", "lm_head"]}),
        (
            "nf4",
            "bfloat16",
            "bfloat16",
            {"llm_int8_skip_modules": []},
        ),  # no skips at all: lm_head quantized too
    ],
)
def test_options_same_as_from_pretrained(
    tiny_model: Callable[..., Path], method: str, ckpt_dtype: str, dtype: str, extra: dict[str, Any]
) -> None:
    path = tiny_model("llama", ckpt_dtype)
    dt = getattr(torch, dtype)
    ref = _reference(path, "AutoModelForCausalLM", dt, bnb_config(method, **extra))
    got = quantized.load_quantized(
        path, quantization_config=bnb_config(method, **extra), device="cpu", dtype=dt
    )
    assert_same_quantized(ref, got)


def test_skip_modules_leave_linears_unquantized(tiny_model: Callable[..., Path]) -> None:
    import bitsandbytes as bnb

    path = tiny_model("llama", "bfloat16")
    cfg = bnb_config("int8", llm_int8_skip_modules=["down_proj", "lm_head"])
    got = quantized.load_quantized(path, quantization_config=cfg, device="cpu", dtype=torch.bfloat16)
    down = got.model.layers[0].mlp.down_proj
    assert type(down) is torch.nn.Linear and down.weight.dtype == torch.bfloat16
    assert isinstance(got.model.layers[0].mlp.up_proj, bnb.nn.Linear8bitLt)


def test_dict_config_same_as_object(tiny_model: Callable[..., Path]) -> None:
    path = tiny_model("qwen3", "bfloat16")
    as_dict = {"quant_method": "bitsandbytes", "load_in_4bit": True, "bnb_4bit_quant_type": "nf4"}
    ref = _reference(path, "AutoModelForCausalLM", torch.bfloat16, dict(as_dict))
    got = quantized.load_quantized(
        path, quantization_config=dict(as_dict), device="cpu", dtype=torch.bfloat16
    )
    assert_same_quantized(ref, got)


def test_sharded_checkpoint(tiny_model: Callable[..., Path]) -> None:
    path = tiny_model("qwen3", "bfloat16", max_shard_size="60KB")
    assert (path / "model.safetensors.index.json").exists()
    ref = _reference(path, "AutoModelForCausalLM", torch.bfloat16, bnb_config("int8"))
    got = quantized.load_quantized(
        path, quantization_config=bnb_config("int8"), device="cpu", dtype=torch.bfloat16
    )
    assert_same_quantized(ref, got)


def _tensors(file: Path) -> dict[str, Any]:
    from safetensors.torch import load_file

    return dict(load_file(str(file)))


def _save(tensors: dict[str, Any], file: Path) -> None:
    from safetensors.torch import save_file

    save_file(tensors, str(file), metadata={"format": "pt"})


def test_variant_file_is_resolved_as_from_pretrained(tiny_model: Callable[..., Path], tmp_path: Path) -> None:
    # files come from transformers' _get_resolved_checkpoint_files, as in the unquantized fast path
    path = tmp_path / "v"
    shutil.copytree(tiny_model("llama", "bfloat16"), path)
    t = _tensors(path / "model.safetensors")
    _save({k: v * 2 for k, v in t.items()}, path / "model.v1.safetensors")
    ref = transformers.AutoModelForCausalLM.from_pretrained(
        path,
        dtype=torch.bfloat16,
        device_map="cpu",
        quantization_config=bnb_config("int8"),
        variant="v1",
        use_kernels=False,
    )
    got = quantized.load_quantized(
        path, quantization_config=bnb_config("int8"), device="cpu", dtype=torch.bfloat16, variant="v1"
    )
    assert got.cudaload_fastload["files"] == ["model.v1.safetensors"]
    assert torch.equal(got.model.norm.weight, t["model.norm.weight"] * 2)
    assert_same_quantized(ref, got)


def test_subfolder(tiny_model: Callable[..., Path], tmp_path: Path) -> None:
    root = tmp_path / "repo"
    shutil.copytree(tiny_model("qwen3", "bfloat16"), root / "sub")
    ref = transformers.AutoModelForCausalLM.from_pretrained(
        root,
        dtype=torch.bfloat16,
        device_map="cpu",
        quantization_config=bnb_config("nf4"),
        subfolder="sub",
        use_kernels=False,
    )
    got = quantized.load_quantized(
        root, quantization_config=bnb_config("nf4"), device="cpu", dtype=torch.bfloat16, subfolder="sub"
    )
    assert_same_quantized(ref, got)


def test_legacy_gamma_renaming_is_remembered(tiny_model: Callable[..., Path], tmp_path: Path) -> None:
    path = tmp_path / "g"
    shutil.copytree(tiny_model("bert"), path)
    t = _tensors(path / "model.safetensors")
    key = next(k for k in t if k.endswith("LayerNorm.weight"))
    t[key.replace(".weight", ".gamma")] = t.pop(key) * 9
    _save(t, path / "model.safetensors")
    ref = _reference(path, "AutoModel", torch.bfloat16, bnb_config("int8"))
    got = quantized.load_quantized(
        path,
        quantization_config=bnb_config("int8"),
        auto_class="AutoModel",
        device="cpu",
        dtype=torch.bfloat16,
    )
    assert _conversions(got)  # the legacy gamma/beta renaming was used, and is kept for save_pretrained
    assert_same_quantized(ref, got)


def test_missing_key_initialised_and_reported_as_from_pretrained(
    tiny_model: Callable[..., Path], tmp_path: Path
) -> None:
    # finish hands the quantizer to _finalize_model_loading, as from_pretrained does: a missing (unquantized)
    # tensor leaves meta, is initialised (norms: ones, deterministic) and reported the same way
    path = tmp_path / "m"
    shutil.copytree(tiny_model("qwen3", "bfloat16"), path)
    t = _tensors(path / "model.safetensors")
    del t["model.norm.weight"]
    _save(t, path / "model.safetensors")
    ref, ref_info = transformers.AutoModelForCausalLM.from_pretrained(
        path,
        dtype=torch.bfloat16,
        device_map="cpu",
        quantization_config=bnb_config("nf4"),
        output_loading_info=True,
        use_kernels=False,
    )
    got = quantized.load_quantized(
        path, quantization_config=bnb_config("nf4"), device="cpu", dtype=torch.bfloat16
    )
    assert got.cudaload_fastload["missing_keys"] == sorted(ref_info["missing_keys"]) == ["model.norm.weight"]
    assert got.cudaload_fastload["unexpected_keys"] == sorted(ref_info["unexpected_keys"])
    assert_same_quantized(ref, got)


def test_mismatched_shapes_fail_as_from_pretrained_fails(
    tiny_model: Callable[..., Path], tmp_path: Path
) -> None:
    from cudaload import fastload
    from cudaload.errors import LoadError

    path = tmp_path / "mm"
    shutil.copytree(tiny_model("qwen3", "bfloat16"), path)
    t = _tensors(path / "model.safetensors")
    t["model.norm.weight"] = torch.ones(5, dtype=torch.bfloat16)
    _save(t, path / "model.safetensors")
    with pytest.raises(RuntimeError, match=r"mismatched|size"):
        _reference(path, "AutoModelForCausalLM", torch.bfloat16, bnb_config("int8"))
    with pytest.raises(LoadError, match="another shape"):
        quantized.load_quantized(
            path, quantization_config=bnb_config("int8"), device="cpu", dtype=torch.bfloat16
        )
    with pytest.raises(fastload.StepAside, match="ignore_mismatched_sizes"):
        quantized.load_quantized(
            path,
            quantization_config=bnb_config("int8"),
            device="cpu",
            dtype=torch.bfloat16,
            ignore_mismatched_sizes=True,
        )


def test_bin_checkpoint_steps_aside(tiny_model: Callable[..., Path], tmp_path: Path) -> None:
    from cudaload import fastload

    path = tmp_path / "bin"
    shutil.copytree(tiny_model("qwen3", "bfloat16"), path)
    torch.save(_tensors(path / "model.safetensors"), path / "pytorch_model.bin")
    (path / "model.safetensors").unlink()
    ok, why = quantized.supports_quantized(path, bnb_config("int8"), device="cpu")
    assert not ok and "not safetensors" in why, why
    with pytest.raises(fastload.StepAside, match="not safetensors"):
        quantized.load_quantized(
            path, quantization_config=bnb_config("int8"), device="cpu", dtype=torch.bfloat16
        )


def test_quantized_step_aside_is_the_fast_paths_step_aside() -> None:
    from cudaload import fastload

    assert issubclass(quantized.StepAside, fastload.StepAside)
    assert fastload.load_quantized is quantized.load_quantized
    assert fastload.supports_quantized is quantized.supports_quantized


def test_scratch_is_one_layer(tiny_model: Callable[..., Path]) -> None:
    path = tiny_model("llama", "bfloat16")
    got = quantized.load_quantized(
        path, quantization_config=bnb_config("nf4"), device="cpu", dtype=torch.bfloat16
    )
    info = got.cudaload_fastload
    cfg = got.config
    h, i, kv = cfg.hidden_size, cfg.intermediate_size, cfg.num_key_value_heads * cfg.head_dim
    one_layer = 2 * (2 * h * h + 2 * h * kv + 3 * h * i)  # q, o, k, v, gate, up, down in bf16
    assert info["layers"] == cfg.num_hidden_layers
    assert one_layer <= info["scratch_bytes"] < one_layer + 7 * 256


def test_layer_chunk_spreads_a_layer_over_the_readers() -> None:
    mib = 1 << 20
    assert fill._layer_chunk(31 * mib, 8, 16 * mib) == 1984 << 10  # 0.6B layer: ~16 chunks, not 2
    assert fill._layer_chunk(386 * mib, 8, 16 * mib) == 16 * mib  # 8B layer: full staging buffers
    assert fill._layer_chunk(mib, 8, 16 * mib) == mib  # never below 1 MiB
    assert fill._layer_chunk(386 * mib, 8, 256 << 10) == 256 << 10  # never above the buffers


def test_small_buffers_same_as_from_pretrained(tiny_model: Callable[..., Path]) -> None:
    path = tiny_model("llama", "bfloat16")
    ref = _reference(path, "AutoModelForCausalLM", torch.bfloat16, bnb_config("nf4"))
    got = quantized.load_quantized(
        path,
        quantization_config=bnb_config("nf4"),
        device="cpu",
        dtype=torch.bfloat16,
        threads=3,
        buffer_bytes=64 << 10,
    )
    assert_same_quantized(ref, got)


def test_supports_says_yes_with_detail(tiny_model: Callable[..., Path]) -> None:
    ok, why = quantized.supports_quantized(tiny_model("qwen3"), bnb_config("int8"), device="cpu")
    assert ok, why
    assert why.startswith("int8: 14 weights") and "2 layers" in why


def _saved_quantized(tmp_path: Path, tiny_model: Callable[..., Path]) -> Path:
    model = _reference(
        tiny_model("qwen3", "bfloat16"), "AutoModelForCausalLM", torch.bfloat16, bnb_config("nf4")
    )
    out = tmp_path / "prequant"
    model.save_pretrained(out)
    return out


def test_prequantized_checkpoint_steps_aside(tmp_path: Path, tiny_model: Callable[..., Path]) -> None:
    path = _saved_quantized(tmp_path, tiny_model)
    ok, why = quantized.supports_quantized(path, bnb_config("nf4"), device="cpu")
    assert not ok and "pre-quantized" in why
    with pytest.raises(InvalidChoiceError, match="pre-quantized") as e:
        quantized.load_quantized(
            path, quantization_config=bnb_config("nf4"), device="cpu", dtype=torch.bfloat16
        )
    assert "from_pretrained" in str(e.value)


@pytest.mark.parametrize(
    ("cfg", "kw", "needle"),
    [
        (lambda: bnb_config("int8", llm_int8_enable_fp32_cpu_offload=True), {}, "fp32_cpu_offload"),
        (lambda: bnb_config("int8", llm_int8_has_fp16_weight=True), {}, "has_fp16_weight"),
        (
            lambda: bnb_config("nf4"),
            {"device_map": {"model.embed_tokens": 0, "model.layers": 1}},
            "2 devices",
        ),
        (lambda: bnb_config("nf4"), {"device_map": "auto"}, "split"),
        (lambda: {"quant_method": "awq", "bits": 4}, {}, "not bitsandbytes"),
        (lambda: object(), {}, "not a BitsAndBytesConfig"),
    ],
)
def test_step_aside_reasons(
    tiny_model: Callable[..., Path], cfg: Callable[[], Any], kw: dict[str, Any], needle: str
) -> None:
    ok, why = quantized.supports_quantized(tiny_model("qwen3"), cfg(), device="cpu", **kw)
    assert not ok and needle in why, why


def test_tied_weight_to_quantize_steps_aside(tiny_model: Callable[..., Path]) -> None:
    # no skips at all on a tied model: lm_head would be quantized but it is the embedding
    cfg = bnb_config("nf4", llm_int8_skip_modules=[])
    ok, why = quantized.supports_quantized(tiny_model("qwen3"), cfg, device="cpu")
    assert not ok and "'lm_head.weight' is tied" in why, why


def test_attn_implementation_passes_through(tiny_model: Callable[..., Path]) -> None:
    path = tiny_model("llama", "bfloat16")
    ref = transformers.AutoModelForCausalLM.from_pretrained(
        path,
        dtype=torch.bfloat16,
        device_map="cpu",
        quantization_config=bnb_config("int8"),
        attn_implementation="eager",
        use_kernels=False,
    )
    got = quantized.load_quantized(
        path,
        quantization_config=bnb_config("int8"),
        device="cpu",
        dtype=torch.bfloat16,
        attn_implementation="eager",
    )
    assert got.config._attn_implementation == ref.config._attn_implementation == "eager"
    assert_same_quantized(ref, got)


def test_fused_moe_experts_step_aside(tiny_model: Callable[..., Path]) -> None:
    path = tiny_model("qwen3_moe")
    ok, why = quantized.supports_quantized(path, bnb_config("int8"), device="cpu")
    if ok:  # a transformers that keeps experts as separate Linear modules: then it must load exactly
        ref = _reference(path, "AutoModelForCausalLM", torch.bfloat16, bnb_config("int8"))
        got = quantized.load_quantized(
            path, quantization_config=bnb_config("int8"), device="cpu", dtype=torch.bfloat16
        )
        assert_same_quantized(ref, got)
    else:
        assert "conversion" in why or "quantiz" in why, why
        with pytest.raises(InvalidChoiceError):
            quantized.load_quantized(
                path, quantization_config=bnb_config("int8"), device="cpu", dtype=torch.bfloat16
            )


@pytest.mark.parametrize("device_map", ["cpu", {"": "cpu"}])
def test_single_device_map_is_the_device(tiny_model: Callable[..., Path], device_map: Any) -> None:
    path = tiny_model("qwen3", "bfloat16")
    ok, why = quantized.supports_quantized(path, bnb_config("int8"), device_map=device_map)
    assert ok, why
    ref = _reference(path, "AutoModelForCausalLM", torch.bfloat16, bnb_config("int8"))
    got = quantized.load_quantized(
        path, quantization_config=bnb_config("int8"), device_map=device_map, dtype=torch.bfloat16
    )
    assert_same_quantized(ref, got)


def test_split_device_map_raises_step_aside(tiny_model: Callable[..., Path]) -> None:
    with pytest.raises(quantized.StepAside, match="2 devices") as e:
        quantized.load_quantized(
            tiny_model("qwen3"),
            quantization_config=bnb_config("nf4"),
            device_map={"model": "cpu", "lm_head": "disk"},
            dtype=torch.bfloat16,
        )
    assert isinstance(e.value, InvalidChoiceError) and "from_pretrained" in str(e.value)


def test_unsupported_device_steps_aside(tiny_model: Callable[..., Path]) -> None:
    ok, why = quantized.supports_quantized(tiny_model("qwen3"), bnb_config("int8"), device="meta")
    assert not ok and "meta" in why


def test_import_is_cheap() -> None:
    import subprocess
    import sys

    code = (
        "import sys, cudaload.fastload, cudaload.fastload.quantized as q; "
        "print(','.join(m for m in ('torch', 'transformers', 'bitsandbytes') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_compare_benchmark_smoke(tmp_path: Path) -> None:
    """benchmarks/profile_quant_load.py --smoke: both sides load, are compared bit for bit, JSON is written."""
    import json
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    out = tmp_path / "out"
    r = subprocess.run(
        [
            sys.executable,
            str(root / "benchmarks" / "profile_quant_load.py"),
            "--smoke",
            "--reps",
            "2",
            "--out",
            str(out),
            "--work",
            str(tmp_path / "work"),
        ],
        capture_output=True,
        text=True,
        env={
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(root / "src"), os.environ.get("PYTHONPATH", "")]),
        },
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    result = json.loads((out / "compare.json").read_text())
    assert {q: v["identical"] for q, v in result["identical"].items()} == {"int8": True, "nf4": True}
    assert {(x["quant"], x["side"]) for x in result["runs"]} == {
        (q, s) for q in ("int8", "nf4") for s in ("from_pretrained", "fast")
    }
    assert result["summary"]["int8"]["fast"]["n"] == 2
    assert (out / "compare.md").read_text().startswith("# Quantized loads")


@pytest.mark.parametrize("method", ["int8", "nf4"])
def test_load_model_quantized_fast_branch_verifies(tiny_model: Callable[..., Path], method: str) -> None:
    """execute's fast branch for a quantized plan (forced here on the CPU; the planner quantizes on GPUs):
    the BitsAndBytesConfig load_model builds from the plan reaches load_quantized, and the result passes
    load_model's own verification (quantization flags, dtype, devices) like from_pretrained's."""
    import dataclasses

    import cudaload
    from cudaload import execute
    from cudaload.execute.load_path import _load_once
    from cudaload.plans.decision import Candidate, Decision

    path = tiny_model("qwen3")
    plan = cudaload.plan(str(path), hardware=cudaload.detect())
    qcfg: dict[str, Any] = (
        {"load_in_8bit": True}
        if method == "int8"
        else {
            "load_in_4bit": True,
            "bnb_4bit_quant_type": "nf4",
            "bnb_4bit_use_double_quant": True,
            "bnb_4bit_compute_dtype": "bfloat16",
        }
    )
    plan = dataclasses.replace(
        plan,
        load_path=Decision("fast", candidates=(Candidate("fast", True), Candidate("from_pretrained", True))),
        quantization=Decision(method, candidates=(Candidate(method, True),)),
        quantization_config=qcfg,
    )
    model, taken, notes = _load_once(plan, "AutoModelForCausalLM", {})
    assert taken == "fast" and notes == [], notes
    verified = execute.verify(model, plan, allow_offload=False)
    assert verified["quantization"] == method
    ref, ref_taken, _ = _load_once(
        dataclasses.replace(plan, load_path=Decision("from_pretrained")), "AutoModelForCausalLM", {}
    )
    assert ref_taken == "from_pretrained"
    assert (
        execute.verify(ref, plan, allow_offload=False)["parameters_by_dtype"]
        == verified["parameters_by_dtype"]
    )
