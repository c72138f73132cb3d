"""cudaload.fastload.early: copying the checkpoint while transformers imports (issue 14).

The gate is pure (profiles); the upload and its hand-over run on the CPU here (the same reader fills CPU
tensors); tests/test_fastload_gpu.py runs it on a GPU."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from cudaload.capabilities import Distributed
from cudaload.fastload import early
from cudaload.profiles import hardware

GB = 10**9


def _one(free: int | None = None) -> Any:
    two = hardware("2xH200")
    gpu = two.gpus[0] if free is None else dataclasses.replace(two.gpus[0], free_memory=free)
    return dataclasses.replace(two, gpus=(gpu,))


def _blockers(caps: Any, device_map: Any = None, **kw: Any) -> list[str]:
    args: dict[str, Any] = {
        "dtype_bytes": {"BF16": 16 * GB, "F32": 10**6},
        "intent": "inference",
        "quantization": "auto",
        "dtype": "auto",
        "fast": None,
        "from_pretrained_kwargs": {},
    }
    args.update(kw)
    return early.upload_blockers(caps, device_map, **args)[1]


def test_uploads_a_bf16_checkpoint_to_the_one_gpu_it_will_load_onto() -> None:
    assert early.upload_blockers(
        _one(),
        None,
        dtype_bytes={"BF16": 16 * GB},
        intent="inference",
        quantization="auto",
        dtype="auto",
        fast=None,
        from_pretrained_kwargs={},
    ) == (0, [])
    assert _blockers(_one(), "cuda:0", intent="lora", quantization="none", dtype="bfloat16") == []


@pytest.mark.parametrize(
    ("case", "expect"),
    [
        ({"device_map": "cpu"}, "not certain"),
        ({"device_map": {"model.layers.0": 0, "lm_head": 1}, "caps": "two"}, "not certain"),
        ({"caps": "two"}, "not certain"),  # placement picks a GPU after planning
        ({"caps": "torchrun"}, "torchrun"),
        ({"quantization": "int8"}, "quantization int8"),
        ({"intent": "qlora"}, "quantization qlora"),
        ({"fast": False}, "fast=False"),
        ({"from_pretrained_kwargs": {"device_map": "auto"}}, "device_map"),
        ({"dtype_bytes": {"F32": 16 * GB}}, "checkpoint dtype F32"),
        ({"dtype": "float16"}, "differs from the checkpoint's bfloat16"),
        ({"caps": "t4"}, "bf16 natively"),
        ({"caps": "full"}, "more than 50%"),
        ({"dtype_bytes": {"BF16": GB // 2}}, "from_pretrained (by size)"),
    ],
)
def test_no_upload_where_the_plan_may_go_another_way(case: dict[str, Any], expect: str) -> None:
    case = dict(case)
    which = case.pop("caps", "one")
    device_map = case.pop("device_map", None)
    two = hardware("2xH200")
    caps = {
        "one": _one(),
        "two": two,
        "torchrun": dataclasses.replace(
            two, distributed=Distributed(local_rank=0, rank=0, world_size=2, local_world_size=2)
        ),
        "t4": hardware("T4"),
        "full": _one(free=20 * GB),
    }[which]
    why = _blockers(caps, device_map, **case)
    assert any(expect in w for w in why), why


def test_a_small_checkpoint_is_uploaded_when_fast_is_forced() -> None:
    assert _blockers(_one(), dtype_bytes={"BF16": GB // 2}, fast=True) == []


# ---- the upload and its hand-over, on the CPU


def _infos(path: Path) -> list[Any]:
    from cudaload.fastload.reader import read_file_header

    out = []
    for f in sorted(path.glob("*.safetensors")):
        out.extend(read_file_header(f)[0].values())
    return out


def test_the_load_uses_the_uploaded_tensors_as_its_weights(tiny_model: Callable[..., Path]) -> None:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from cudaload import fastload
    from test_fastload import assert_same_model

    path = tiny_model("qwen3", "bfloat16")
    infos = _infos(path)
    up = early.EarlyUpload(infos, "cpu")
    got = fastload.load(path, device="cpu", dtype=torch.bfloat16, early=up)
    # handed over: the parameters are the uploaded tensors themselves, nothing read twice
    report = got.cudaload_fastload
    assert report["early_upload"]["tensors"] == len(infos) and report["early_upload"]["unused_bytes"] == 0
    assert up.summary()["outcome"] == "handed to the load"
    assert report["bytes"] == sum(i.nbytes for i in infos)
    ref = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16, device_map="cpu")
    assert_same_model(ref, got)
    assert up.take() is None  # once


def test_tensors_of_another_dtype_or_a_changed_file_are_read_again(tiny_model: Callable[..., Path]) -> None:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from cudaload import fastload
    from test_fastload import assert_same_model

    path = tiny_model("qwen3", "bfloat16")
    # the plan wants float32: nothing uploaded in bf16 is used (the fast path casts from the file)
    up = early.EarlyUpload(_infos(path), "cpu")
    got = fastload.load(path, device="cpu", dtype=torch.float32, early=up)
    assert got.cudaload_fastload["early_upload"]["tensors"] == 0
    assert got.cudaload_fastload["early_upload"]["unused_bytes"] > 0
    ref = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, device_map="cpu")
    assert_same_model(ref, got)
    # a file rewritten after the upload (new mtime): its tensors are not trusted
    up = early.EarlyUpload(_infos(path), "cpu")
    up._thread.join()
    for f in path.glob("*.safetensors"):
        st = os.stat(f)
        os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    got = fastload.load(path, device="cpu", dtype=torch.bfloat16, early=up)
    assert got.cudaload_fastload["early_upload"]["tensors"] == 0
    ref = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16, device_map="cpu")
    assert_same_model(ref, got)


def test_a_discarded_upload_stops_and_holds_nothing(tiny_model: Callable[..., Path]) -> None:
    pytest.importorskip("torch")
    up = early.EarlyUpload(_infos(tiny_model("qwen3", "bfloat16")), "cpu")
    up.discard("the plan loads with from_pretrained")
    assert not up._thread.is_alive()
    assert up.take() is None
    assert up.summary()["outcome"] == "discarded: the plan loads with from_pretrained"


def test_a_failed_upload_is_reported_and_the_load_reads_the_files(tiny_model: Callable[..., Path]) -> None:
    torch = pytest.importorskip("torch")
    from cudaload import fastload

    path = tiny_model("qwen3", "bfloat16")
    infos = _infos(path)
    broken = [dataclasses.replace(infos[0], file=str(path / "missing.safetensors")), *infos[1:]]
    up = early.EarlyUpload(broken, "cpu")
    got = fastload.load(path, device="cpu", dtype=torch.bfloat16, early=up)
    assert up.summary()["outcome"] == "failed" and "missing.safetensors" in (up.summary()["error"] or "")
    assert got.cudaload_fastload["early_upload"] is None  # nothing handed over: all read by the load


def test_start_reads_the_headers_and_says_why_not(
    tiny_model: Callable[..., Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CUDALOAD_EARLY_UPLOAD", "1")
    path = tiny_model("qwen3", "bfloat16")
    files = [str(f) for f in path.glob("*.safetensors")]
    up, why = early.start(
        _one(),
        files,
        device_map=None,
        intent="inference",
        quantization="auto",
        dtype="auto",
        fast=None,
        from_pretrained_kwargs={},
    )
    assert up is None and why is not None and "from_pretrained (by size)" in why
    up, why = early.start(
        _one(),
        [str(path / "config.json")],  # not a safetensors file: the load's own check reports it
        device_map=None,
        intent="inference",
        quantization="auto",
        dtype="auto",
        fast=True,
        from_pretrained_kwargs={},
    )
    assert up is None and why is not None and why.startswith("headers not read")


def test_off_unless_the_switch_turns_it_on(monkeypatch: pytest.MonkeyPatch) -> None:
    from cudaload.errors import ConfigurationError

    args: dict[str, Any] = {
        "device_map": None,
        "intent": "inference",
        "quantization": "auto",
        "dtype": "auto",
        "fast": None,
        "from_pretrained_kwargs": {},
    }
    monkeypatch.delenv("CUDALOAD_EARLY_UPLOAD", raising=False)
    up, why = early.start(_one(), ["x.safetensors"], **args)
    assert up is None and why is not None and why.startswith("off (CUDALOAD_EARLY_UPLOAD=1 turns it on")
    monkeypatch.setenv("CUDALOAD_EARLY_UPLOAD", "0")
    assert early.start(_one(), ["x.safetensors"], **args)[1] == why
    monkeypatch.setenv("CUDALOAD_EARLY_UPLOAD", "1")
    assert early.start(_one(), [], **args) == (None, "no local safetensors files")
    monkeypatch.setenv("CUDALOAD_EARLY_UPLOAD", "maybe")
    with pytest.raises(ConfigurationError, match="CUDALOAD_EARLY_UPLOAD"):
        early.start(_one(), [], **args)


def test_load_model_on_the_cpu_says_it_did_not_upload(
    tiny_model: Callable[..., Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    import cudaload

    monkeypatch.delenv("CUDALOAD_EARLY_UPLOAD", raising=False)
    m = cudaload.load_model(tiny_model("qwen3", "bfloat16"))
    assert m.cudaload_plan.verified["early_upload"]["outcome"].startswith("not started: off")
    monkeypatch.setenv("CUDALOAD_EARLY_UPLOAD", "1")
    m = cudaload.load_model(tiny_model("qwen3", "bfloat16"))
    got = m.cudaload_plan.verified["early_upload"]
    assert got["outcome"].startswith("not started: ") and "not certain" in got["outcome"]
    assert "early upload: not started" in m.cudaload_plan.explain()
