"""cudaload.fastload on the CPU: the fast path must give what from_pretrained gives, bit for bit."""

from __future__ import annotations

import json
import os
import shutil
import struct
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from cudaload import fastload  # noqa: E402
from cudaload.errors import (  # noqa: E402
    CheckpointError,
    ConfigurationError,
    InvalidChoiceError,
    LoadError,
    ModelNotFoundError,
)
from cudaload.fastload import staging  # noqa: E402
from cudaload.fastload.reader import TensorInfo  # noqa: E402

AUTO = {"bert": "AutoModel"}
DENSE_KINDS = ("qwen3", "llama", "mistral", "gemma2", "gpt2", "bert")


def _auto(kind: str) -> str:
    return AUTO.get(kind, "AutoModelForCausalLM")


def _reference(path: Path, auto_class: str, dtype: Any) -> Any:
    return getattr(transformers, auto_class).from_pretrained(path, dtype=dtype, device_map="cpu")


def assert_same_model(ref: Any, got: Any) -> None:
    """Same state_dict (keys, dtypes, bits), buffers, ties, mode and attention, and the same outputs."""
    a, b = ref.state_dict(), got.state_dict()
    assert list(a) == list(b)
    for k in a:
        assert a[k].dtype == b[k].dtype, k
        assert a[k].shape == b[k].shape, k
        assert torch.equal(a[k], b[k]), f"{k} differs"
    ba, bb = dict(ref.named_buffers()), dict(got.named_buffers())
    assert ba.keys() == bb.keys()
    for k in ba:
        assert ba[k].dtype == bb[k].dtype and torch.equal(ba[k], bb[k]), f"buffer {k} differs"
    names = [n for n, _ in ref.named_parameters()]
    assert names == [n for n, _ in got.named_parameters()]  # tied parameters appear once in both
    assert [p.requires_grad for p in ref.parameters()] == [p.requires_grad for p in got.parameters()]
    assert got.training is False and ref.training is False
    assert got.config._attn_implementation == ref.config._attn_implementation
    assert got.config.dtype == ref.config.dtype
    if ref.can_generate():
        assert got.generation_config.to_dict() == ref.generation_config.to_dict()
    ids = torch.randint(0, ref.config.vocab_size, (2, 11), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        oa, ob = ref(ids), got(ids)
    key = "logits" if hasattr(oa, "logits") else "last_hidden_state"
    assert torch.equal(getattr(oa, key), getattr(ob, key))


@pytest.mark.parametrize("kind", DENSE_KINDS)
def test_same_as_from_pretrained(tiny_model: Callable[..., Path], kind: str) -> None:
    path = tiny_model(kind)
    ref = _reference(path, _auto(kind), torch.float32)
    got = fastload.load(path, auto_class=_auto(kind), device="cpu", dtype=torch.float32)
    assert_same_model(ref, got)
    assert got.cudaload_fastload["unexpected_keys"] == []
    assert got.cudaload_fastload["missing_keys"] == []


def test_tied_embedding_is_one_tensor(tiny_model: Callable[..., Path]) -> None:
    got = fastload.load(tiny_model("qwen3"), device="cpu", dtype=torch.float32)
    assert got.config.tie_word_embeddings
    assert got.lm_head.weight is got.model.embed_tokens.weight


@pytest.mark.parametrize(
    ("saved", "loaded"),
    [("bfloat16", torch.float32), ("float32", torch.bfloat16), ("float32", torch.float16)],
)
def test_dtype_conversion(tiny_model: Callable[..., Path], saved: str, loaded: Any) -> None:
    path = tiny_model("qwen3", dtype=saved)
    ref = _reference(path, "AutoModelForCausalLM", loaded)
    got = fastload.load(path, device="cpu", dtype=loaded)
    assert_same_model(ref, got)
    assert got.model.layers[0].mlp.up_proj.weight.dtype == loaded


@pytest.mark.parametrize("kind", ["llama", "gpt2"])
def test_sharded_checkpoint(tiny_model: Callable[..., Path], kind: str) -> None:
    path = tiny_model(kind, max_shard_size="40KB")
    assert (path / "model.safetensors.index.json").is_file()
    header = fastload.read_header(path)
    assert len(header.files) > 2
    ref = _reference(path, _auto(kind), torch.float32)
    got = fastload.load(
        path, auto_class=_auto(kind), device="cpu", dtype=torch.bfloat16 if kind == "gpt2" else torch.float32
    )
    if kind == "gpt2":
        ref = _reference(path, _auto(kind), torch.bfloat16)
    assert_same_model(ref, got)


def test_small_buffers_and_many_threads(tiny_model: Callable[..., Path]) -> None:
    """64 KiB pieces split the embedding and the MLP weights into many reads, done by 5 threads."""
    path = tiny_model("gemma2", dtype="bfloat16")
    ref = _reference(path, "AutoModelForCausalLM", torch.float32)
    got = fastload.load(path, device="cpu", dtype=torch.float32, threads=5, buffer_bytes=64 << 10)
    assert_same_model(ref, got)


def test_base_class_from_head_checkpoint(tiny_model: Callable[..., Path]) -> None:
    """AutoModel on a ForCausalLM checkpoint: transformers strips the "model." prefix and drops lm_head."""
    path = tiny_model("llama")
    ref = _reference(path, "AutoModel", torch.float32)
    got = fastload.load(path, auto_class="AutoModel", device="cpu", dtype=torch.float32)
    assert_same_model(ref, got)
    assert got.cudaload_fastload["unexpected_keys"] == ["lm_head.weight"]


def _rewrite(src: Path, dst: Path, edit: Callable[[dict[str, Any]], None]) -> Path:
    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst)
    tensors = load_file(str(src / "model.safetensors"))
    edit(tensors)
    save_file(tensors, str(dst / "model.safetensors"), metadata={"format": "pt"})
    return dst


def test_missing_keys_initialised_like_from_pretrained(
    tiny_model: Callable[..., Path], tmp_path: Path
) -> None:
    def drop(t: dict[str, Any]) -> None:
        del t["model.norm.weight"]
        del t["model.layers.1.mlp.down_proj.weight"]

    path = _rewrite(tiny_model("llama"), tmp_path / "missing", drop)
    torch.manual_seed(123)
    ref = _reference(path, "AutoModelForCausalLM", torch.float32)
    torch.manual_seed(123)
    got = fastload.load(path, device="cpu", dtype=torch.float32)
    # same init functions in the same order from the same seed: even the random init matches
    assert_same_model(ref, got)
    assert got.cudaload_fastload["missing_keys"] == [
        "model.layers.1.mlp.down_proj.weight",
        "model.norm.weight",
    ]
    assert torch.equal(got.model.norm.weight, torch.ones_like(got.model.norm.weight))


def test_unexpected_keys_ignored(tiny_model: Callable[..., Path], tmp_path: Path) -> None:
    def add(t: dict[str, Any]) -> None:
        t["model.layers.0.extra.weight"] = torch.ones(3, 3)
        t["model.layers.0.self_attn.rotary_emb.inv_freq"] = torch.ones(8)  # legacy per-layer buffer

    path = _rewrite(tiny_model("llama"), tmp_path / "unexpected", add)
    ref = _reference(path, "AutoModelForCausalLM", torch.float32)
    got = fastload.load(path, device="cpu", dtype=torch.float32)
    assert_same_model(ref, got)
    assert "model.layers.0.extra.weight" in got.cudaload_fastload["unexpected_keys"]


def test_shape_mismatch_fails_as_from_pretrained_fails(
    tiny_model: Callable[..., Path], tmp_path: Path
) -> None:
    """from_pretrained raises RuntimeError (load_model: LoadError) unless ignore_mismatched_sizes=True."""

    def shrink(t: dict[str, Any]) -> None:
        t["model.norm.weight"] = torch.ones(5)

    path = _rewrite(tiny_model("llama"), tmp_path / "mismatch", shrink)
    with pytest.raises(RuntimeError):
        _reference(path, "AutoModelForCausalLM", torch.float32)
    with pytest.raises(LoadError, match=r"model\.norm\.weight"):
        fastload.load(path, device="cpu", dtype=torch.float32)
    ok, why = fastload.supports(path)
    assert not ok and "shape" in why


def test_moe_experts_need_conversion_or_match(tiny_model: Callable[..., Path]) -> None:
    """transformers 5 fuses per-expert checkpoint tensors into one parameter: a converter, not a rename.
    The fast path says so and refuses with a non-checkpoint error (execute falls back); if a transformers
    release ever loads these keys as they are, the fast path must then match from_pretrained."""
    path = tiny_model("qwen3_moe")
    ok, why = fastload.supports(path)
    if ok:
        assert_same_model(
            _reference(path, "AutoModelForCausalLM", torch.float32),
            fastload.load(path, device="cpu", dtype=torch.float32),
        )
        return
    assert "conversion" in why
    with pytest.raises(InvalidChoiceError, match="conversion"):
        fastload.load(path, device="cpu", dtype=torch.float32)


# ---- read_header ----------------------------------------------------------------------------------------


def test_read_header_byte_ranges(tiny_model: Callable[..., Path]) -> None:
    from safetensors import safe_open

    path = tiny_model("llama", max_shard_size="40KB")
    header = fastload.read_header(path)
    index = json.loads((path / "model.safetensors.index.json").read_text())["weight_map"]
    assert set(header.tensors) == set(index)
    for name, info in header.tensors.items():
        assert Path(info.file).name == index[name]
        with safe_open(info.file, "pt") as f:
            expected = f.get_tensor(name)
        assert info.shape == tuple(expected.shape)
        assert info.nbytes == expected.numel() * expected.element_size()
        with open(info.file, "rb") as fh:
            fh.seek(info.start)
            raw = fh.read(info.nbytes)
        assert torch.equal(
            torch.frombuffer(bytearray(raw), dtype=expected.dtype).reshape(expected.shape), expected
        )
    assert header.total_bytes == sum(header.dtypes().values())
    ordered = list(header.in_file_order())
    assert len(ordered) == len(header.tensors)


def test_read_header_single_file_path(tiny_model: Callable[..., Path]) -> None:
    path = tiny_model("qwen3")
    a = fastload.read_header(path)
    b = fastload.read_header(path / "model.safetensors")
    assert a.tensors == b.tensors and a.root == b.root


def _truncate(src: Path, dst: Path, keep: int) -> Path:
    shutil.copytree(src, dst)
    f = dst / "model.safetensors"
    data = f.read_bytes()
    f.write_bytes(data[: keep if keep >= 0 else len(data) + keep])
    return f


@pytest.mark.parametrize("keep", [-1, -5000, 4, 100])
def test_truncated_file_is_a_checkpoint_error(
    tiny_model: Callable[..., Path], tmp_path: Path, keep: int
) -> None:
    bad = _truncate(tiny_model("qwen3"), tmp_path / "trunc", keep)
    fds, threads = _open_fds(), threading.active_count()
    with pytest.raises(CheckpointError) as info:
        fastload.load(bad.parent, device="cpu", dtype=torch.float32)
    assert str(bad) in str(info.value)
    assert isinstance(info.value, ValueError)
    assert _open_fds() == fds and threading.active_count() == threads  # nothing left open or running
    ok, why = fastload.supports(bad.parent)
    assert not ok and str(bad) in why


def test_garbage_header_is_a_checkpoint_error(tiny_model: Callable[..., Path], tmp_path: Path) -> None:
    shutil.copytree(tiny_model("qwen3"), tmp_path / "g")
    f = tmp_path / "g" / "model.safetensors"
    body = b"{not json" + b" " * 7
    f.write_bytes(struct.pack("<Q", len(body)) + body + b"\0" * 64)
    with pytest.raises(CheckpointError, match="not JSON"):
        fastload.read_header(f.parent)
    hdr = json.dumps({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 8]}}).encode()
    f.write_bytes(struct.pack("<Q", len(hdr)) + hdr + b"\0" * 16)
    with pytest.raises(CheckpointError, match="need 16"):
        fastload.read_header(f.parent)


def test_incomplete_shard_set(tiny_model: Callable[..., Path], tmp_path: Path) -> None:
    src = tiny_model("llama", max_shard_size="40KB")
    shutil.copytree(src, tmp_path / "s")
    index = json.loads((tmp_path / "s" / "model.safetensors.index.json").read_text())
    victim = sorted(set(index["weight_map"].values()))[1]
    os.remove(tmp_path / "s" / victim)
    with pytest.raises(ModelNotFoundError, match=victim):
        fastload.load(tmp_path / "s", device="cpu", dtype=torch.float32)


def test_no_safetensors(tmp_path: Path, tiny_model: Callable[..., Path]) -> None:
    shutil.copytree(tiny_model("llama"), tmp_path / "bin")
    os.remove(tmp_path / "bin" / "model.safetensors")
    ok, why = fastload.supports(tmp_path / "bin")
    assert not ok and "model.safetensors" in why
    ok, why = fastload.supports(tmp_path / "nowhere")
    assert not ok and "does not exist" in why


@pytest.mark.parametrize(
    ("key", "value", "word"),
    [
        ("quantization_config", {"quant_method": "bitsandbytes", "load_in_4bit": True}, "quantization"),
        ("auto_map", {"AutoModelForCausalLM": "modeling_x.XForCausalLM"}, "remote code"),
    ],
)
def test_unsupported_configs(
    tiny_model: Callable[..., Path], tmp_path: Path, key: str, value: Any, word: str
) -> None:
    shutil.copytree(tiny_model("llama"), tmp_path / "c")
    cfg = json.loads((tmp_path / "c" / "config.json").read_text())
    cfg[key] = value
    (tmp_path / "c" / "config.json").write_text(json.dumps(cfg))
    ok, why = fastload.supports(tmp_path / "c")
    assert not ok and word in why
    with pytest.raises((InvalidChoiceError, CheckpointError)):
        fastload.load(tmp_path / "c", device="cpu", dtype=torch.float32)


def test_supports_says_what_it_will_do(tiny_model: Callable[..., Path]) -> None:
    ok, why = fastload.supports(tiny_model("llama", max_shard_size="40KB"))
    assert ok and "safetensors files" in why
    ok, why = fastload.supports(tiny_model("bert"), auto_class="AutoModelForSpeechSeq2Seq")
    assert not ok and "AutoModelForSpeechSeq2Seq" in why


def test_bad_arguments(tiny_model: Callable[..., Path]) -> None:
    path = tiny_model("llama")
    with pytest.raises(ConfigurationError):
        fastload.load(path, device="tpu:0", dtype=torch.float32)
    with pytest.raises(ConfigurationError):
        fastload.load(path, device="cpu", dtype=torch.float32, buffer_bytes=10)
    with pytest.raises(ConfigurationError):
        fastload.load(path, device="cpu", dtype=torch.float32, auto_class="NotAnAutoClass")
    if not torch.cuda.is_available():
        with pytest.raises(ConfigurationError, match="CUDA is not available"):
            fastload.load(path, device="cuda:0", dtype=torch.float32)


def test_attn_implementation_and_config_kwargs(tiny_model: Callable[..., Path]) -> None:
    path = tiny_model("llama")
    ref = transformers.AutoModelForCausalLM.from_pretrained(
        path, dtype=torch.float32, attn_implementation="eager", rms_norm_eps=1e-3
    )
    got = fastload.load(
        path, device="cpu", dtype=torch.float32, attn_implementation="eager", rms_norm_eps=1e-3
    )
    assert got.config._attn_implementation == "eager" and got.config.rms_norm_eps == 1e-3
    assert_same_model(ref, got)


# ---- staging units --------------------------------------------------------------------------------------


def _info(name: str, n: int, itemsize: int = 4, start: int = 0, file: str = "f") -> TensorInfo:
    dtype = {1: "U8", 2: "BF16", 4: "F32", 8: "F64"}[itemsize]
    return TensorInfo(name, dtype, (n,), file, start, start + n * itemsize)


def test_split_pieces_cover_whole_elements() -> None:
    info = _info("w", 1001, itemsize=4, start=24)
    pieces = staging.split_pieces(0, info, 1000)
    assert sum(p.nbytes for p in pieces) == info.nbytes
    assert all(p.nbytes % 4 == 0 and p.nbytes <= 1000 for p in pieces)
    assert [p.file_offset for p in pieces] == [24 + p.elem_start * 4 for p in pieces]
    assert staging.split_pieces(0, _info("e", 0), 1000) == []
    # a buffer smaller than one element still makes progress
    assert len(staging.split_pieces(0, _info("x", 3, itemsize=8), 5)) == 3


def test_pack_chunks_fit_and_align() -> None:
    infos = [_info(f"t{i}", n, start=s) for i, (n, s) in enumerate([(10, 0), (7, 40), (300, 68), (5, 1268)])]
    pieces = [p for i, info in enumerate(infos) for p in staging.split_pieces(i, info, 512)]
    chunks = staging.pack_chunks(pieces, 512)
    seen = [p for c in chunks for p in c.pieces]
    assert sorted(seen, key=lambda p: p.file_offset) == sorted(pieces, key=lambda p: p.file_offset)
    for c in chunks:
        assert c.used <= 512
        assert all(at % 64 == 0 for at in c.offsets)
        ends = [at + p.nbytes for p, at in zip(c.pieces, c.offsets, strict=False)]
        # no overlap inside the buffer
        assert all(e <= nxt for e, nxt in zip(ends, c.offsets[1:], strict=False))


def test_read_chunk_scatters_and_detects_short_files(tmp_path: Path) -> None:
    data = bytes(range(256)) * 4
    f = tmp_path / "blob"
    f.write_bytes(data)
    infos = [
        _info("a", 3, start=0, file=str(f)),
        _info("b", 5, start=12, file=str(f)),
        _info("c", 4, start=100, file=str(f)),
    ]
    pieces = [p for i, info in enumerate(infos) for p in staging.split_pieces(i, info, 1 << 20)]
    (chunk,) = staging.pack_chunks(pieces, 1 << 20)
    buf = bytearray(chunk.used)
    fd = os.open(f, os.O_RDONLY)
    try:
        staging.read_chunk(fd, chunk, memoryview(buf))
        for p, at in zip(chunk.pieces, chunk.offsets, strict=False):
            assert bytes(buf[at : at + p.nbytes]) == data[p.file_offset : p.file_offset + p.nbytes]
        short = staging.pack_chunks(
            staging.split_pieces(0, _info("z", 10, start=1000, file=str(f)), 1 << 20), 1 << 20
        )
        with pytest.raises(CheckpointError, match="blob"):
            staging.read_chunk(fd, short[0], memoryview(bytearray(64)))
    finally:
        os.close(fd)


class _FakePool(staging.PinnedPool):
    """The pool's hand-out logic without CUDA: 'pinning' makes plain slots, failing from the ``fail_at``-th."""

    def __init__(self, count: int, fail_at: int | None = None, delay: float = 0.0) -> None:
        self.fail_at, self.delay, self.pinned = fail_at, delay, 0
        super().__init__(count, 1024, register=False)

    def _pin_one(self) -> Any:
        import time

        time.sleep(self.delay)
        if self.fail_at is not None and self.pinned >= self.fail_at:
            raise OSError("cannot lock memory")
        self.pinned += 1
        return staging._Slot(torch.empty(1024, dtype=torch.uint8), memoryview(bytearray(1)), None)


def test_pool_hands_out_buffers_as_they_are_pinned() -> None:
    pool = _FakePool(3, delay=0.02)
    got = [pool.get() for _ in range(3)]  # blocks until the background thread has pinned each one
    assert len({id(s) for s in got}) == 3
    for s in got:
        pool.put(s)
    pool.close()
    pool.close()  # idempotent: the error path of a load may close it again
    assert pool.pinned == 3 and pool.pin_seconds > 0


def test_pool_that_cannot_pin_anything_raises_instead_of_hanging() -> None:
    pool = _FakePool(4, fail_at=0)
    with pytest.raises(LoadError, match="could not pin") as e:
        pool.get()
    assert "free host memory" in (e.value.fix or "")
    pool.close()


def test_pool_works_with_the_buffers_it_could_pin() -> None:
    pool = _FakePool(4, fail_at=2)
    a, b = pool.get(), pool.get()
    pool.put(a)
    assert pool.get() is a  # the third reader waits for a returned buffer instead of failing
    pool.put(a)
    pool.put(b)
    pool.close()
    assert pool.pinned == 2


def test_registered_pool_pins_whole_pages_and_releases_them(monkeypatch: pytest.MonkeyPatch) -> None:
    """cudaHostRegister path without a GPU: a fake cudart records what would be registered."""
    import mmap

    registered: dict[int, int] = {}

    class FakeCudart:
        def cudaHostRegister(self, ptr: int, size: int, flags: int) -> int:
            assert ptr % mmap.PAGESIZE == 0 and size % mmap.PAGESIZE == 0 and flags == 1
            assert all(ptr + size <= p or p + n <= ptr for p, n in registered.items()), (
                "pages registered twice"
            )
            registered[ptr] = size
            return 0

        def cudaHostUnregister(self, ptr: int) -> int:
            del registered[ptr]
            return 0

    monkeypatch.setattr(torch.cuda, "cudart", lambda: FakeCudart())
    monkeypatch.setattr(torch.cuda, "Event", lambda: None)
    pool = staging.PinnedPool(5, 100_000, device=None)  # not a page multiple on purpose
    slots = [pool.get() for _ in range(5)]
    assert pool.register and len(registered) == 5
    for slot in slots:
        ptr = slot.host.data_ptr()
        assert slot.host.numel() == 100_000 and len(slot.view) == 100_000
        assert any(p <= ptr and ptr + 100_000 <= p + n for p, n in registered.items())
        pool.put(slot)
    pool.close()
    assert registered == {}


def test_pool_size_follows_the_checkpoint() -> None:
    assert staging.pool_size(10 << 30, threads=16, buffer_bytes=64 << 20) == 18
    assert staging.pool_size(100 << 20, threads=16, buffer_bytes=64 << 20) == 2
    assert staging.pool_size(1, threads=16, buffer_bytes=64 << 20) == 1


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd")) if os.path.isdir("/proc/self/fd") else 0


def test_import_is_light() -> None:
    import subprocess
    import sys

    code = "import sys, cudaload.fastload; print('torch' in sys.modules, 'transformers' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]


def test_io_settings_default_and_refuse_out_of_range(tiny_model: Callable[..., Path]) -> None:
    assert staging.io_settings(None, None) == (staging.default_threads(), staging.DEFAULT_BUFFER_BYTES)
    assert staging.io_settings(3, 1 << 20) == (3, 1 << 20)
    for threads, buf in ((-1, None), (None, 1024)):
        with pytest.raises(ConfigurationError, match="out of range"):
            staging.io_settings(threads, buf)
    # a loader asks it before reading anything
    with pytest.raises(ConfigurationError, match="threads=-1"):
        fastload.load(tiny_model("qwen3"), device="cpu", dtype=torch.float32, threads=-1)
