"""detect() on this machine: real package probes, versions, snapshot round-trip, no CUDA initialisation."""

from __future__ import annotations

import ctypes
import importlib.metadata as md
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from cudaload.capabilities import Capabilities
from cudaload.detection import detect, packages, render, versions
from cudaload.detection.support import bitsandbytes_support, flash_support


def _installed(dist: str) -> str | None:
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return None


def test_detect_round_trips_and_reuses_its_probes() -> None:
    caps = detect(env={"HF_HUB_OFFLINE": "1"})
    assert Capabilities.from_json(caps.to_json()) == caps
    assert caps.transformers_version == md.version("transformers")
    assert caps.torch_version == md.version("torch")
    assert caps.hub.offline and caps.hub.reachable is None  # offline: never probed
    # a second call answers from the per-process probe cache (its speed is measured in benchmarks/, not here)
    assert detect(env={"HF_HUB_OFFLINE": "1"}).packages == caps.packages
    assert "Packages:" in render(caps)


def test_import_cudaload_is_light() -> None:
    code = (
        "import sys, cudaload; "
        "heavy = [m for m in ('torch', 'transformers', 'accelerate', 'pynvml', 'safetensors') if m in sys.modules]; "
        "print(heavy)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_versions_without_importing_transformers() -> None:
    code = (
        "import sys; from cudaload.detection import versions as v; "
        "print(v.kernels_range(v.dist_version('transformers'))); "
        "assert 'transformers' not in sys.modules and 'torch' not in sys.modules"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    import transformers.utils.import_utils as iu

    lo, hi = getattr(iu, "KERNELS_MIN_VERSION", None), getattr(iu, "KERNELS_MAX_VERSION", None)
    assert out.strip() == str((lo, hi))
    assert versions.kernels_range_for("5.17.0") == ("0.16.0", "0.17.0")
    assert versions.kernels_range_for("5.22.2") == ("0.17.2", "0.18.0")
    assert versions.kernels_range_for("5.24.0") == ("0.18.2", "0.19.0")


def test_kernels_probe_matches_transformers() -> None:
    from transformers.utils.import_utils import is_kernels_available

    caps = detect(env={"HF_HUB_OFFLINE": "1"})
    k = caps.package("kernels")
    if _installed("kernels") is None:
        assert not k.installed
        return
    assert k.installed and k.version == md.version("kernels")
    # the probe must agree with transformers itself about whether kernels is usable
    assert k.usable == is_kernels_available()
    assert k.in_range == is_kernels_available()
    codes = [f.code for f in caps.findings]
    assert ("kernels-out-of-range" in codes) == (not k.in_range)
    if not k.in_range:
        assert k.accepted and k.accepted.startswith(">=")


@pytest.mark.skipif(
    _installed("bitsandbytes") is None, reason="bitsandbytes is installed only in .venvs/newest"
)
def test_bitsandbytes_native_probe_real_library() -> None:
    import bitsandbytes  # noqa: F401  (location only; this CPU machine cannot initialise CUDA anyway)

    pkg_dir = Path(next(iter(sys.modules["bitsandbytes"].__path__)))
    # the CPU library loads but is not a CUDA build; a CUDA library cannot load without the CUDA runtime here
    assert packages.load_native(pkg_dir / "libbitsandbytes_cpu.so") is None
    assert "lacks get_context" in (
        packages.load_native(pkg_dir / "libbitsandbytes_cpu.so", "get_context") or ""
    )
    info = packages._bitsandbytes("x", "13.0", True, None)
    try:  # the CUDA build of the library loads exactly when the NVIDIA driver library does
        ctypes.CDLL("libcuda.so.1")
        has_driver = True
    except OSError:
        has_driver = False
    if has_driver:
        assert info.usable, info.reason
    else:
        assert not info.usable and "does not load" in (info.reason or "")
    lib = packages.bnb_library(pkg_dir, "12.9")  # no 12.9 build: highest same-major below it
    assert lib.name == "libbitsandbytes_cuda128.so"
    assert packages.bnb_library(pkg_dir, "12.4", override="121").name == "libbitsandbytes_cuda121.so"


def _fake_dist(root: Path, dist: str, version: str, modules: dict[str, str]) -> None:
    info = root / f"{dist.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
    for rel, text in modules.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)


def _probe_many(cases: list[tuple[Path, str]]) -> list[dict[str, object]]:
    """Probe each (site dir, package) in one subprocess (torch imports once), forgetting modules between."""
    code = textwrap.dedent(f"""
        import importlib, json, sys
        import torch  # noqa: F401  (what the real probes import first)
        from cudaload.detection import packages
        for root, name in {[(str(r), n) for r, n in cases]!r}:
            sys.path.insert(0, root)
            importlib.invalidate_caches()
            packages.clear_cache()
            print(json.dumps(packages.probe(name, torch_cuda="12.4", has_gpu=True).to_dict()))
            sys.path.remove(root)
            for m in [m for m in sys.modules if m.startswith(("flash_attn", "cutlass"))]:
                del sys.modules[m]
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    return [json.loads(line) for line in out.strip().splitlines()[-len(cases) :]]


def test_flash_attn_probes_with_fake_installs(tmp_path: Path) -> None:
    # flash-attn 2 whose compiled extension loads
    good = tmp_path / "good"
    _fake_dist(good, "flash-attn", "2.7.4", {"flash_attn/__init__.py": "", "flash_attn_2_cuda.py": ""})
    bad = tmp_path / "bad"  # a compiled part that fails to load (an ABI mismatch raises ImportError)
    _fake_dist(
        bad,
        "flash-attn",
        "2.7.4",
        {
            "flash_attn/__init__.py": "",
            "flash_attn_2_cuda.py": "raise ImportError('undefined symbol: _ZN3c10')",
        },
    )
    # flash-attn-4 installs a namespace flash_attn holding only .cute: that is not flash-attn 2
    fa4 = tmp_path / "fa4"
    _fake_dist(
        fa4, "flash-attn-4", "4.0.0b36", {"flash_attn/cute/__init__.py": "", "cutlass/__init__.py": ""}
    )
    nodsl = tmp_path / "nodsl"
    _fake_dist(nodsl, "flash-attn-4", "4.0.0b36", {"flash_attn/cute/__init__.py": ""})
    fa3 = tmp_path / "fa3"
    _fake_dist(fa3, "flash-attn-3", "3.0.0", {"flash_attn_interface.py": ""})
    r = _probe_many(
        [
            (good, "flash-attn"),
            (bad, "flash-attn"),
            (fa4, "flash-attn-4"),
            (fa4, "flash-attn"),
            (nodsl, "flash-attn-4"),
            (fa3, "flash-attn-3"),
        ]
    )
    assert r[0]["installed"] and r[0]["usable"] and r[0]["version"] == "2.7.4"
    assert r[1]["installed"] and not r[1]["usable"] and "undefined symbol" in str(r[1]["reason"])
    assert r[2]["usable"] and r[2]["version"] == "4.0.0b36"
    assert not r[3]["installed"]
    assert not r[4]["usable"] and "cutlass" in str(r[4]["reason"])
    assert r[5]["usable"]


def test_peft_and_accelerate_probed() -> None:
    caps = detect(env={"HF_HUB_OFFLINE": "1"})
    for name in ("peft", "accelerate"):
        assert caps.package(name).installed == (_installed(name) is not None)
        assert caps.package(name).usable == caps.package(name).installed


def test_detect_never_initialises_cuda() -> None:
    code = (
        "import torch, cudaload\n"
        "caps = cudaload.detect()\n"
        "assert not torch.cuda.is_initialized(), 'detect() initialised CUDA'\n"
        "print(len(caps.gpus))\n"
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr


@pytest.mark.gpu
def test_detect_never_initialises_cuda_on_gpu() -> None:
    """The same proof on a GPU machine, plus: detect() sees the GPUs torch will see."""
    code = (
        "import torch, cudaload\n"
        "caps = cudaload.detect()\n"
        "assert not torch.cuda.is_initialized(), 'detect() initialised CUDA'\n"
        "assert caps.gpus, 'no GPU detected'\n"
        "n = len(caps.gpus)\n"
        "assert torch.cuda.device_count() == n, (torch.cuda.device_count(), n)\n"
        "g = caps.gpus[0]\n"
        "assert torch.cuda.get_device_capability(0) == g.compute_capability\n"
        "assert abs(torch.cuda.get_device_properties(0).total_memory - g.total_memory) < 2**30\n"
        "again = cudaload.detect(refresh=True)\n"
        "assert again.cuda_initialized and not any(f.code == 'cvd-after-init' for f in again.findings)\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    assert r.returncode == 0, r.stderr


def test_hub_probe_is_bounded() -> None:
    import socket
    import threading
    from http.server import BaseHTTPRequestHandler, HTTPServer

    from cudaload.detection import hub

    # a server that accepts the connection and never answers: the probe must give up on time
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(1)
    t = time.perf_counter()
    assert hub.Probe(f"http://127.0.0.1:{silent.getsockname()[1]}", 0.3).answer() is False
    assert time.perf_counter() - t < 1.0
    silent.close()

    class NotFound(BaseHTTPRequestHandler):
        def do_HEAD(self) -> None:
            self.send_response(404)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    srv = HTTPServer(("127.0.0.1", 0), NotFound)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        assert (
            hub.Probe(f"http://127.0.0.1:{srv.server_address[1]}", 2.0).answer() is True
        )  # any answer = reachable
    finally:
        srv.shutdown()
    # offline: never probed, whatever the timeout says
    caps = detect(env={"HF_HUB_OFFLINE": "1", "CUDALOAD_HUB_TIMEOUT": "5"}, probe_hub=True)
    assert caps.hub.reachable is None


def _silent_hub(monkeypatch: pytest.MonkeyPatch, timeout: str = "0.5") -> Any:
    """An endpoint that accepts connections and never answers (a firewall that drops the packets looks the same
    to the probe: the whole timeout), with probing on and the per-process probe cache empty."""
    import socket

    from cudaload.detection import clear_cache

    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{silent.getsockname()[1]}")
    monkeypatch.setenv("CUDALOAD_HUB_TIMEOUT", timeout)
    clear_cache()
    return silent


def _connected(sock: Any) -> bool:
    import select

    return bool(select.select([sock], [], [], 0.2)[0])


def test_planning_asks_the_hub_only_when_a_decision_needs_it(
    monkeypatch: pytest.MonkeyPatch, tiny_model: Any
) -> None:
    from cudaload.detection import with_hub_answer
    from cudaload.hub_kernels import needs_hub_answer
    from cudaload.planner import hub_probe_for, plan, resolve_hardware

    silent = _silent_hub(monkeypatch)
    try:
        caps = resolve_hardware(None)
        assert caps.hub.reachable is None  # detected without the request
        assert not _connected(silent)
        needed = needs_hub_answer(caps)  # kernels usable here? (true in two of ./dev test's three sets)
        probe = hub_probe_for(caps)
        assert (probe is not None) == needed
        if needed:
            answered = with_hub_answer(caps, probe)
            assert answered.hub.reachable is False  # silent: no answer within the timeout
            assert "hub-unreachable" in {f.code for f in answered.findings}  # as detect() would say
            assert _connected(silent)
        else:
            plan(str(tiny_model("qwen3")))
            assert not _connected(silent)  # no decision could use the answer: no request at all
        # cudaload env and doctor still report reachability
        assert detect().hub.reachable is False
        assert _connected(silent)
    finally:
        silent.close()
        from cudaload.detection import clear_cache

        clear_cache()


def test_a_probe_answers_once_for_its_life() -> None:
    """A request still running at the deadline can finish later: the answer given first stays the answer."""
    import socket
    import threading

    from cudaload.detection import hub

    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)

    def slow_answer() -> None:
        conn, _ = srv.accept()
        with conn:
            conn.recv(1024)
            for piece in (b"HTTP/1.0 200 OK\r\n", b"Content-Length: 0\r\n", b"\r\n"):
                time.sleep(0.15)  # each read within the socket timeout, the whole past the probe's deadline
                conn.sendall(piece)

    t = threading.Thread(target=slow_answer, daemon=True)
    t.start()
    probe = hub.Probe(f"http://127.0.0.1:{srv.getsockname()[1]}", 0.3)
    assert probe.answer() is False
    t.join(5)
    time.sleep(0.2)  # the request has had its answer by now
    assert probe.answer() is False
    srv.close()


def test_load_model_collects_the_hub_answer_after_the_imports(
    monkeypatch: pytest.MonkeyPatch, tiny_model: Any
) -> None:
    import cudaload
    from cudaload.hub_kernels import needs_hub_answer

    silent = _silent_hub(monkeypatch)
    try:
        needed = needs_hub_answer(detect(probe_hub=False))
        model = cudaload.load_model(str(tiny_model("qwen3")), prefetch=False)
        phases = model.cudaload_plan.verified["phases"]
        # the answer is waited for after transformers is imported, as its own phase, and only when needed
        assert ("hub_probe" in phases) == needed
        assert list(phases).index("import_transformers") < list(phases).index("plan")
        if needed:
            assert list(phases).index("hub_probe") == list(phases).index("import_transformers") + 1
        assert _connected(silent) == needed
    finally:
        silent.close()
        from cudaload.detection import clear_cache

        clear_cache()


def test_support_facts() -> None:
    assert flash_support("flash-attn", (7, 5))[0] is False
    assert flash_support("flash-attn", (8, 0))[0] and flash_support("flash-attn", (8, 9))[0]
    # hopper/ builds sm_80 and sm_90a kernels; FA4 4.0.0b36 runs its forward on 8.x-12.x (interface.py:845)
    assert flash_support("flash-attn-3", (9, 0))[0] and flash_support("flash-attn-3", (8, 0))[0]
    assert not flash_support("flash-attn-3", (10, 0))[0]
    assert flash_support("flash-attn-4", (9, 0))[0] and flash_support("flash-attn-4", (10, 0))[0]
    assert flash_support("flash-attn-4", (8, 6))[0] and not flash_support("flash-attn-4", (7, 5))[0]
    # flash-attn 2.8.3 compiles sm80/90/100/120 only (setup.py:70); Blackwell builds start at 2.7.3
    assert not flash_support("flash-attn", (11, 0))[0]
    assert (
        not flash_support("flash-attn", (10, 0), "2.7.2")[0]
        and flash_support("flash-attn", (12, 0), "2.7.3")[0]
    )
    assert bitsandbytes_support((7, 0))[0] and not bitsandbytes_support((5, 2))[0]
    assert not bitsandbytes_support((7, 0), "aarch64")[0]
    with pytest.raises(ValueError):
        flash_support("xformers", (9, 0))
