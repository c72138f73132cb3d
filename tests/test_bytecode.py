"""Cached bytecode: detection says when every new process compiles the packages a load imports from source,
and ``cudaload precompile`` writes the caches (issue 14: on the H200 machine this was 5.3 s of a fresh 8B load).

Real files, real ``py_compile``/``compileall``, real child interpreters; a small package made in tmp_path stands
for torch (the probe looks at a package the same way whatever its name)."""

from __future__ import annotations

import importlib.util
import json
import os
import py_compile
import subprocess
import sys
from pathlib import Path

import pytest

from cudaload.capabilities import Capabilities
from cudaload.commands.bytecache import precompile
from cudaload.commands.doctor import diagnose
from cudaload.detection import assemble
from cudaload.detection import bytecode as bc
from cudaload.errors import ConfigurationError

SRC = str(Path(__file__).resolve().parents[1] / "src")


@pytest.fixture
def pkg(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An importable package ``clpkg`` (two modules) on sys.path, with no cached bytecode."""
    root = tmp_path / "site"
    (root / "clpkg").mkdir(parents=True)
    (root / "clpkg" / "__init__.py").write_text("X = 1\n")
    (root / "clpkg" / "core.py").write_text("def f():\n    return 2\n")
    monkeypatch.syspath_prepend(str(root))
    # precompile finds packages in the interpreter that will import them (a child): on its path too
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(root), SRC]))
    monkeypatch.setattr(sys, "pycache_prefix", None)
    return root / "clpkg"


SAMPLE = {"clpkg": ("__init__.py", "core.py", "absent.py")}


def test_cache_matches_follows_the_source(pkg: Path) -> None:
    src = pkg / "core.py"
    assert not bc.cache_matches(src)
    py_compile.compile(str(src), cfile=importlib.util.cache_from_source(str(src)), doraise=True)
    assert bc.cache_matches(src)
    src.write_text("def f():\n    return 3  # a different size\n")  # the cache no longer matches
    assert not bc.cache_matches(src)


def test_cache_matches_rejects_another_interpreters_magic(pkg: Path) -> None:
    src = pkg / "core.py"
    cache = Path(importlib.util.cache_from_source(str(src)))
    py_compile.compile(str(src), cfile=str(cache), doraise=True)
    data = bytearray(cache.read_bytes())
    data[0] ^= 0xFF
    cache.write_bytes(bytes(data))
    assert not bc.cache_matches(src)


def test_hash_based_cache_counts_as_cached(pkg: Path) -> None:
    src = pkg / "core.py"
    py_compile.compile(
        str(src),
        cfile=importlib.util.cache_from_source(str(src)),
        invalidation_mode=py_compile.PycInvalidationMode.CHECKED_HASH,
        doraise=True,
    )
    assert bc.cache_matches(src)


def test_probe_without_writes_finds_packages_compiled_every_process(
    pkg: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    state = bc.probe(SAMPLE)
    (p,) = state.packages
    assert (p.name, p.sampled, p.cached, p.writable) == ("clpkg", 2, 0, False)  # absent.py is skipped
    assert state.uncached == (p,)
    message, fix = bc.finding_text(state) or ("", "")
    assert "clpkg has no up-to-date cached bytecode" in message
    assert "PYTHONDONTWRITEBYTECODE" in message
    assert "cudaload precompile" in fix


def test_probe_where_python_will_write_the_cache_is_no_finding(
    pkg: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the first process pays once and writes the caches; later ones read them
    monkeypatch.setattr(sys, "dont_write_bytecode", False)
    state = bc.probe(SAMPLE)
    assert state.packages[0].writable and state.packages[0].cached == 0
    assert bc.finding_text(state) is None


def test_probe_with_every_cache_present_is_no_finding(pkg: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    for f in pkg.glob("*.py"):
        py_compile.compile(str(f), cfile=importlib.util.cache_from_source(str(f)), doraise=True)
    state = bc.probe(SAMPLE)
    assert state.packages[0].cached == 2
    assert bc.finding_text(state) is None


def test_probe_does_not_import_the_packages(pkg: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    bc.probe(SAMPLE)
    assert "clpkg" not in sys.modules
    assert bc.probe({"no_such_package_here": ("__init__.py",)}).packages == ()


def test_the_finding_reaches_the_snapshot_and_doctor(pkg: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    caps = assemble((), {}, bytecode=bc.probe(SAMPLE))
    (f,) = [f for f in caps.findings if f.code == "bytecode-uncached"]
    assert f.severity == "warning" and "cudaload precompile" in f.fix
    assert Capabilities.from_json(caps.to_json()).findings == caps.findings  # a recorded machine keeps it
    verdicts = [v for v in diagnose(caps).verdicts if v.code == "bytecode-uncached"]
    assert verdicts and verdicts[0].status == "warn"
    assert not [f for f in assemble((), {}).findings if f.code == "bytecode-uncached"]  # unknown: no finding


def test_precompile_writes_caches_a_new_process_reads(pkg: Path, tmp_path: Path) -> None:
    prefix = tmp_path / "pyc"
    report = precompile(["clpkg"], prefix=prefix, stdlib=False, workers=1)
    assert report.ok and report.returncode == 0 and report.errors == []
    assert report.packages == {"clpkg": str(pkg)} and report.prefix == str(prefix)
    assert list(prefix.rglob("core.*.pyc"))
    # a new interpreter with the prefix, writing nothing, finds every sampled module cached
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(pkg.parent), SRC]), PYTHONPYCACHEPREFIX=str(prefix)
    )
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    code = (
        "import json; from cudaload.detection.bytecode import probe; "
        "s = probe({'clpkg': ('__init__.py', 'core.py')}); print(json.dumps([s.packages[0].cached, s.dont_write]))"
    )
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == [2, True]


def test_precompile_names_a_file_that_does_not_compile(pkg: Path, tmp_path: Path) -> None:
    (pkg / "broken.py").write_text("def (:\n")
    report = precompile(["clpkg"], prefix=tmp_path / "pyc", stdlib=False, workers=1)
    assert report.returncode != 0 and report.ok  # named: the rest was compiled, as pip leaves such files
    assert any(e.endswith("broken.py") for e in report.errors)
    assert list((tmp_path / "pyc").rglob("core.*.pyc"))
    assert "1 files did not compile" in report.summary()


def test_precompile_refuses_before_compiling(
    pkg: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(ConfigurationError, match=r"not installed for .*: no_such_pkg_xyz"):
        precompile(["no_such_pkg_xyz"], stdlib=False)
    # root may write anywhere, so a read-only installation is stood for by os.access's answer
    import cudaload.commands.bytecache as pc

    monkeypatch.setattr(pc.os, "access", lambda path, mode, **kw: False)
    with pytest.raises(ConfigurationError, match="read-only") as e:
        precompile(["clpkg"], stdlib=False)
    assert "--prefix" in (e.value.fix or "")
    assert not list(pkg.glob("__pycache__/*.pyc"))


def test_cli_check_exits_1_where_each_process_compiles(tmp_path: Path) -> None:
    env = dict(os.environ, PYTHONPATH=SRC, PYTHONPYCACHEPREFIX=str(tmp_path / "empty"))
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    out = subprocess.run(
        [sys.executable, "-m", "cudaload", "precompile", "--check"], env=env, capture_output=True, text=True
    )
    assert out.returncode == 1, out.stderr
    assert "torch: 0 of 5 sampled modules have cached bytecode" in out.stdout


def test_check_reads_the_prefix_it_is_given(pkg: Path, tmp_path: Path) -> None:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(pkg.parent), SRC]))
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env.pop("PYTHONPYCACHEPREFIX", None)
    args = [sys.executable, "-m", "cudaload", "precompile", "--check", "--prefix", str(tmp_path / "empty")]
    out = subprocess.run(args, env=env, capture_output=True, text=True)
    assert out.returncode == 1 and "under PYTHONPYCACHEPREFIX=" in out.stdout, out.stdout + out.stderr


def test_a_cache_that_cannot_be_written_is_not_a_success(pkg: Path, tmp_path: Path) -> None:
    # a file where the prefix's folder for clpkg would go: compileall cannot write there (as on a full or
    # read-only disk), which must not read as "compiled"
    prefix = tmp_path / "pyc"
    blocker = prefix / str(pkg).lstrip(os.sep)
    blocker.parent.mkdir(parents=True)
    blocker.write_text("not a folder")
    report = precompile(["clpkg"], prefix=prefix, stdlib=False, workers=1)
    assert not report.ok and report.write_errors and report.errors == []
    assert "caches could not be written" in report.summary()


def test_a_relative_prefix_is_made_absolute(
    pkg: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    report = precompile(["clpkg"], prefix="rel", stdlib=False, workers=1)
    assert report.prefix == str(tmp_path / "rel") and list((tmp_path / "rel").rglob("core.*.pyc"))


def test_reserved_flags_and_a_stale_checked_hash_are_not_cached(pkg: Path) -> None:
    src = pkg / "core.py"
    cache = Path(importlib.util.cache_from_source(str(src)))
    py_compile.compile(
        str(src),
        cfile=str(cache),
        invalidation_mode=py_compile.PycInvalidationMode.CHECKED_HASH,
        doraise=True,
    )
    assert bc.cache_matches(src)
    src.write_text("def f():\n    return 4\n")  # same size and maybe mtime: only the hash tells
    assert not bc.cache_matches(src)
    py_compile.compile(str(src), cfile=str(cache), doraise=True)
    data = bytearray(cache.read_bytes())
    data[4] |= 0b100  # a reserved flag bit
    cache.write_bytes(bytes(data))
    assert not bc.cache_matches(src)


def test_the_function_stays_callable_after_its_module_is_imported() -> None:
    import cudaload
    import cudaload.commands.bytecache

    assert callable(cudaload.precompile) and cudaload.precompile is precompile


def test_a_one_file_module_is_compiled_too(pkg: Path, tmp_path: Path) -> None:
    single = pkg.parent / "clmod.py"
    single.write_text("Y = 3\n")
    report = precompile(["clmod"], prefix=tmp_path / "pyc", stdlib=False, workers=1)
    assert report.ok and report.packages == {"clmod": str(single)}
    assert list((tmp_path / "pyc").rglob("clmod.*.pyc"))


def test_the_plan_warns_where_this_load_will_compile_its_imports(
    pkg: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from cudaload import plan
    from cudaload.testing import full_config

    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    caps = assemble((), {}, bytecode=bc.probe(SAMPLE))
    p = plan(full_config("Qwen3-0.6B"), hardware=caps)
    (w,) = [w for w in p.warnings if w.startswith("bytecode-uncached:")]
    assert "cudaload precompile" in w and "bytecode-uncached" in p.explain()
    assert not [
        w for w in plan(full_config("Qwen3-0.6B"), hardware=assemble((), {})).warnings if "bytecode" in w
    ]


def test_root_writing_into_another_users_install_is_noted(pkg: Path) -> None:
    import cudaload.commands.bytecache as pc

    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        assert pc._owner_notes([str(pkg)]) == []
        return
    assert pc._owner_notes([str(pkg)]) == []  # root's own folder
    os.chown(pkg, 12345, -1)
    (note,) = pc._owner_notes([str(pkg)])
    assert "uid 12345" in note


def test_the_default_search_leaves_the_standard_library_out(pkg: Path) -> None:
    # what precompile() does after its child has imported what a load imports: the same locating code, run
    # here after importing a stdlib package and the test package instead of torch and transformers
    import cudaload.commands.bytecache as pc

    head = "import json, sys, email, clpkg\nnames, outside_stdlib = sorted(sys.modules), True\n"
    seen = pc._child_json(sys.executable, ["-c", head + pc._LOCATE], None, "locate")
    assert seen["packages"]["clpkg"] == str(pkg)
    assert "email" not in seen["packages"] and "json" not in seen["packages"]
    assert "sys" not in seen["packages"]  # built in: no file to compile
    assert seen["stdlib"] and all(Path(s).is_dir() for s in seen["stdlib"])
    # named explicitly, a stdlib package is located like any other
    assert "email" in pc._locate(sys.executable, ["email"], None)["packages"]
