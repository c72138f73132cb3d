"""Reading a checkpoint while Python imports (issue 14): which files, how much, and that it never fails a load."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from cudaload.execute.runtime import prefetch


def _touch(path: Path, size: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(os.urandom(size))


def test_files_follow_transformers_names(tmp_path: Path) -> None:
    _touch(tmp_path / "model-00001-of-00002.safetensors", 300)
    _touch(tmp_path / "model-00002-of-00002.safetensors", 100)
    _touch(tmp_path / "model.fp16.safetensors", 50)  # another variant: not read by a plain load
    _touch(tmp_path / "adapter_model.safetensors", 50)  # not the model's weights
    got = [Path(f).name for f in prefetch.checkpoint_files(tmp_path)]
    assert got == ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]  # largest first
    assert [Path(f).name for f in prefetch.checkpoint_files(tmp_path, variant="fp16")] == [
        "model.fp16.safetensors"
    ]


def test_subfolder_and_hub_ids(tmp_path: Path) -> None:
    _touch(tmp_path / "text" / "model.safetensors", 10)
    assert prefetch.checkpoint_files(tmp_path) == []
    assert [Path(f).name for f in prefetch.checkpoint_files(tmp_path, "text")] == ["model.safetensors"]
    assert prefetch.start("org/some-model-id") is None  # a Hub id: nothing local to read


def test_prefetch_covers_every_byte(tmp_path: Path) -> None:
    sizes = [3 * prefetch.CHUNK_BYTES // 1024 + 7, 1000]
    for i, n in enumerate(sizes):
        _touch(tmp_path / f"model-0000{i + 1}-of-00002.safetensors", n)
    p = prefetch.start(tmp_path, threads=3)
    assert p is not None
    for t in p._workers:
        t.join(timeout=30)
    s = p.summary()
    assert s["bytes"] == sum(sizes) and s["error"] is None and s["seconds"] is not None


def test_read_mode_skips_what_the_page_cache_holds(tmp_path: Path) -> None:
    """A warm checkpoint is not copied again; an evicted one is read (where this machine can evict)."""
    f = tmp_path / "model.safetensors"
    f.write_bytes(os.urandom(3 * 4096 + 5))
    fd = os.open(f, os.O_RDONLY)
    try:
        res = prefetch._Residency(fd, os.path.getsize(f))
        if res.addr is None:
            pytest.skip("no mmap/mincore through libc here")
        with open(f, "rb") as fh:
            fh.read()  # every page cached
        assert res.resident(0, 3 * 4096 + 5) and res.resident(4096 + 7, 10)
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        evicted = res.resident(0, 3 * 4096 + 5) is False
        res.close()
    finally:
        os.close(fd)
    with open(f, "rb") as fh:
        fh.read()
    assert prefetch.resident_fraction([f]) == 1.0
    p = prefetch.Prefetch([str(f)], mode="read").start()
    for t in p._workers:
        t.join(timeout=30)
    s = p.summary()
    assert s["bytes"] == s["resident_bytes"] == 3 * 4096 + 5
    if evicted:  # fadvise(DONTNEED) worked on this file system: the read mode reads it back
        fd = os.open(f, os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)
        assert prefetch.resident_fraction([f]) == 0.0
        p = prefetch.Prefetch([str(f)], mode="read").start()
        for t in p._workers:
            t.join(timeout=30)
        assert p.summary()["resident_bytes"] == 0 and p.summary()["bytes"] == 3 * 4096 + 5


def test_residency_is_unknown_where_the_kernel_hides_the_page_cache(tmp_path: Path) -> None:
    """Linux (since 5.0, mm/mincore.c can_do_mincore) reports every page of a file mapping as resident unless the
    caller owns the file or may write it: a checkpoint in a shared read-only model folder. Trusting that, the read
    mode would skip every chunk of a cold checkpoint; the answer there is "unknown", so the chunk is read."""
    if not hasattr(os, "fork") or os.geteuid() != 0:
        pytest.skip("needs root to look at the file as another user")
    f = tmp_path / "model.safetensors"
    f.write_bytes(os.urandom(4 * 4096))
    fd = os.open(f, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        mine = prefetch._Residency(fd, 4 * 4096)
        if mine.addr is None or mine.resident(0, 4 * 4096) is not False:
            mine.close()
            pytest.skip("cannot evict or ask mincore on this file system")
        mine.close()
        pid = os.fork()
        if pid == 0:  # the child: another user, no write permission, the fd inherited
            code = 3
            try:
                os.setgid(65534)
                os.setuid(65534)
                other = prefetch._Residency(fd, 4 * 4096)
                got = other.resident(0, 4 * 4096)
                other.close()
                code = {None: 0, True: 1, False: 2}[got]
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
    finally:
        os.close(fd)
    # 1: the kernel's "all resident" was believed; 0: unknown, so the read mode reads the chunk
    assert os.waitstatus_to_exitcode(status) == 0


def test_limit_caps_what_is_asked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(prefetch, "CHUNK_BYTES", 4096)
    _touch(tmp_path / "model.safetensors", 5 * 4096)
    p = prefetch.Prefetch([str(tmp_path / "model.safetensors")], limit_bytes=2 * 4096 + 10).start()
    for t in p._workers:
        t.join(timeout=30)
    assert p.summary()["bytes"] == 2 * 4096 + 10
    # the page-cache guard: half of what the kernel says is available
    monkeypatch.setattr(prefetch, "available_bytes", lambda: 2 * 4096)
    p = prefetch.Prefetch([str(tmp_path / "model.safetensors")]).start()
    for t in p._workers:
        t.join(timeout=30)
    assert p.summary()["bytes"] == 4096


def test_errors_are_advice_not_failures(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="use one of read, off"):
        prefetch.Prefetch([], mode="fast")
    with pytest.raises(ValueError, match="measured slower"):  # a removed mode says why it went
        prefetch.Prefetch([], mode="willneed")
    p = prefetch.Prefetch([str(tmp_path / "gone.safetensors")]).start()  # vanished before reading
    for t in p._workers:
        t.join(timeout=30)
    assert p.summary()["bytes"] == 0


def test_load_model_records_phases_and_prefetch(tiny_model) -> None:  # type: ignore[no-untyped-def]
    import cudaload

    tiny_qwen3 = tiny_model("qwen3")
    model = cudaload.load_model(str(tiny_qwen3))
    v = model.cudaload_plan.verified
    phases = v["phases"]
    for key in ("detect", "import_transformers", "plan", "load", "probe", "verify", "total"):
        assert key in phases and phases[key] >= 0
    assert phases["total"] >= phases["load"]
    assert v["prefetch"]["files"] >= 1 and v["prefetch"]["error"] is None
    off = cudaload.load_model(str(tiny_qwen3), prefetch=False)
    assert off.cudaload_plan.verified["prefetch"] is None
    read = cudaload.load_model(str(tiny_qwen3), prefetch="read")
    assert read.cudaload_plan.verified["prefetch"]["mode"] == "read"


def test_load_model_refuses_an_unknown_prefetch_mode_before_reading(tiny_model) -> None:  # type: ignore[no-untyped-def]
    import threading

    import cudaload
    from cudaload.errors import ConfigurationError

    with pytest.raises(ConfigurationError, match="prefetch='fast'") as e:
        cudaload.load_model(str(tiny_model("qwen3")), prefetch="fast")
    assert "'read'" in str(e.value)
    assert not [t for t in threading.enumerate() if t.name.startswith("cudaload-prefetch")]
    # the removed readahead-advice mode: refused the same way, saying why it went
    with pytest.raises(ConfigurationError, match=r"prefetch='willneed'.*measured slower") as e:
        cudaload.load_model(str(tiny_model("qwen3")), prefetch="willneed")
    assert "prefetch=True" in str(e.value)
    assert not [t for t in threading.enumerate() if t.name.startswith("cudaload-prefetch")]


def test_a_plan_that_refuses_stops_the_prefetch(tiny_model, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    """The prefetch starts before the plan; a plan that refuses (here: the declared work does not fit the H200
    snapshot) must not leave threads reading a checkpoint nobody will load."""
    import cudaload
    from cudaload.errors import DoesNotFitError

    started: list[prefetch.Prefetch | None] = []
    real = prefetch.start

    def recorded(*args: object, **kwargs: object) -> prefetch.Prefetch | None:
        p = real(*args, **kwargs)  # type: ignore[arg-type]
        started.append(p)
        return p

    monkeypatch.setattr(prefetch, "start", recorded)
    h200 = str(Path(__file__).resolve().parent / "fixtures" / "h200.json")
    with pytest.raises(DoesNotFitError):
        cudaload.load_model(str(tiny_model("qwen3")), hardware=h200, seq_len=10**9, batch_size=1)
    assert len(started) == 1 and started[0] is not None
    assert started[0]._stop.is_set()


def test_load_model_documents_the_default_mode() -> None:
    import re

    import cudaload

    doc = cudaload.load_model.__doc__ or ""
    named = re.findall(r'``"(\w+)"`` \([^)]*\bthe default\b', doc)
    assert named == [prefetch.DEFAULT_MODE]


def test_explain_shows_where_the_seconds_went(tiny_model) -> None:  # type: ignore[no-untyped-def]
    import cudaload

    text = cudaload.load_model(str(tiny_model("qwen3"))).cudaload_plan.explain()
    assert "seconds: detect " in text and "import_transformers" in text and "; total " in text
    assert "prefetch (read):" in text
