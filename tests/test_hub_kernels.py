"""Pure parts of cudaload.hub_kernels: cache scan, variant / arch / trust rules, preflight, plan, lock.

No kernels code runs here (that is tests/test_hub_kernels_e2e.py); caps are built by hand, the way a
recorded machine or a profile is.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest

from cudaload.capabilities import GPU, CachedKernel, Capabilities, HubState, PackageInfo
from cudaload.errors import ConfigurationError, ModelNotFoundError
from cudaload.hub_kernels import (
    _target,
    archs_cover,
    attention_kernel_version,
    build_kernel_config,
    check_attention_kernel,
    check_variant,
    needs_hub_answer,
    plan_kernels,
    read_lock,
    registered_layers,
    scan_cache,
    trusted,
    write_lock,
)
from fixtures.kernels.make import cache_entry, local_kernel

H200 = GPU(0, "NVIDIA H200", (9, 0), 141 << 30)
T4 = GPU(0, "Tesla T4", (7, 5), 15 << 30)
FA2 = "kernels-community/flash-attn2"
SHA = "0123456789abcdef0123456789abcdef01234567"


def kernels_pkg(
    version: str = "0.16.2",
    in_range: bool | None = True,
    accepted: str = ">=0.16,<0.17",
) -> PackageInfo:
    return PackageInfo(
        "kernels",
        True,
        version,
        usable=in_range is not False,
        accepted=accepted,
        in_range=in_range,
        reason=None if in_range is not False else "out of range",
    )


def gpu_caps(
    *cached: CachedKernel,
    offline: bool = True,
    gpu: GPU = H200,
    tv: str = "5.17.0",
    pkg: PackageInfo | None = None,
) -> Capabilities:
    return Capabilities(
        gpus=(gpu,),
        packages=(pkg or kernels_pkg(),),
        hub=HubState(
            offline=offline, reachable=None if offline else True, cache_dir="/c", cached_kernels=cached
        ),
        torch_version="2.11.0+cu130",
        torch_cuda_version="13.0",
        transformers_version=tv,
        cpu_arch="x86_64",
    )


def fa2(
    refs: tuple[str, ...] = ("v3",),
    variants: tuple[str, ...] = ("torch211-cxx11-cu130-x86_64-linux",),
    archs: tuple[str, ...] = ("8.0", "9.0"),
) -> CachedKernel:
    return CachedKernel(FA2, SHA, refs=refs, variants=variants, cuda_capabilities=archs)


# -- scan_cache ------------------------------------------------------------------------------------------


def test_scan_cache_finds_kernel_repos_with_refs_variants_and_archs(tmp_path: Path) -> None:
    commit = cache_entry(
        tmp_path,
        "org/norm",
        refs=("main", "v1"),
        backend="cuda",
        archs=["8.0", "9.0a"],
        variant="torch211-cxx11-cu130-x86_64-linux",
    )
    (tmp_path / "kernels--org--norm" / "refs" / "pr").mkdir()
    (tmp_path / "kernels--org--norm" / "refs" / "pr" / "3").write_text(commit)
    legacy = cache_entry(tmp_path, "org/old", layout="models", refs=("v2",))
    # a model snapshot (no build/) and junk must be ignored, not raised on
    (tmp_path / "models--org--llm" / "snapshots" / "abc").mkdir(parents=True)
    (tmp_path / "models--noseparator").mkdir()
    (tmp_path / "kernels--org--empty").mkdir()
    (tmp_path / "stray-file").write_text("x")
    (tmp_path / ".locks").mkdir()
    found = {k.repo_id: k for k in scan_cache(str(tmp_path))}
    assert set(found) == {"org/norm", "org/old"}
    norm = found["org/norm"]
    assert norm.revision == commit and norm.refs == ("main", "pr/3", "v1")
    assert norm.variants == ("torch211-cxx11-cu130-x86_64-linux",)
    assert norm.cuda_capabilities == ("8.0", "9.0a")
    assert found["org/old"].revision == legacy and found["org/old"].cuda_capabilities == ()


def test_scan_cache_reads_build_toml_archs_and_survives_bad_metadata(tmp_path: Path) -> None:
    cache_entry(tmp_path, "org/k", refs=("v1",))
    snap = next((tmp_path / "kernels--org--k" / "snapshots").iterdir())
    (snap / "build" / "torch-universal" / "metadata.json").write_text("{not json")
    (snap / "build.toml").write_text('[kernel.k]\ncuda-capabilities = ["7.5", "8.0"]\n')
    (k,) = scan_cache(str(tmp_path))
    import sys

    assert k.cuda_capabilities == (("7.5", "8.0") if sys.version_info >= (3, 11) else ())


def test_scan_cache_missing_dir_is_empty() -> None:
    assert scan_cache("/nonexistent/cudaload/cache") == ()


def test_scan_cache_is_json_round_trip_safe(tmp_path: Path) -> None:
    cache_entry(tmp_path, "org/k")
    caps = Capabilities(hub=HubState(cached_kernels=scan_cache(str(tmp_path))))
    assert Capabilities.from_json(caps.to_json()) == caps


# -- rules -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("variant", "ok", "why"),
    [
        ("torch-universal", True, "noarch"),
        ("torch-cuda", True, "noarch"),
        ("torch-cpu", False, "this machine runs cuda"),
        ("torch211-cxx11-cu130-x86_64-linux", True, "matches"),
        ("torch211-cxx11-cu128-x86_64-linux", False, "CUDA 12.8"),  # other major
        ("torch211-cxx11-cu131-x86_64-linux", False, "CUDA 13.1"),  # newer minor than the system's
        ("torch210-cxx11-cu130-x86_64-linux", False, "torch 2.10"),
        ("torch211-cxx98-cu130-x86_64-linux", False, "C++11 ABI"),
        ("torch211-cxx11-cu130-aarch64-linux", False, "CPU aarch64"),
        ("torch211-cu130-x86_64-linux", True, "matches"),  # tagless
        ("torch-stable-abi29-cu130-x86_64-linux", True, "matches"),
        ("torch-stable-abi212-cu130-x86_64-linux", False, "needs torch >= 2.12"),
        ("torch211-cxx11-rocm64-x86_64-linux", False, "rocm64"),
        ("garbage", False, "not a build variant"),
        # kernels 0.19's names (_internals/variants.py:424-433): dotted versions, backend apart, minimum Python
        ("torch-2.11-cxx11-cuda-13.0-cpython-3.9-abi3-x86_64-linux", True, "matches"),
        ("torch-2.11-cuda-12.8-cpython-3.9-abi3-x86_64-linux", False, "CUDA 12.8"),
        ("torch-2.10-cxx11-cuda-13.0-cpython-3.9-abi3-x86_64-linux", False, "torch 2.10"),
        ("torch-stable-abi-2.9-cuda-13.0-cpython-3.9-abi3-x86_64-linux", True, "matches"),
        ("torch-stable-abi-2.12-cuda-13.0-cpython-3.9-abi3-x86_64-linux", False, "needs torch >= 2.12"),
        ("torch-2.11-cxx11-cuda-13.0-cpython-3.15-abi3t-x86_64-linux", False, "free-threaded"),
        ("torch-2.11-cxx11-rocm-6.4-cpython-3.9-abi3-x86_64-linux", False, "rocm-6.4"),
    ],
)
def test_check_variant_mirrors_kernels_resolver(variant: str, ok: bool, why: str) -> None:
    got_ok, got_why = check_variant(variant, _target(gpu_caps()))
    assert got_ok is ok and why in got_why


def test_check_variant_cpu_machine() -> None:
    caps = Capabilities(torch_version="2.13.0+cpu", cpu_arch="x86_64")
    assert check_variant("torch-cpu", _target(caps))[0]
    assert check_variant("torch213-cxx11-cpu-x86_64-linux", _target(caps))[0]
    assert not check_variant("torch-cuda", _target(caps))[0]
    assert check_variant("torch-2.13-cxx11-cpu-cpython-3.9-abi3-x86_64-linux", _target(caps))[0]


def test_check_variant_new_names_need_the_python_they_name() -> None:
    caps = Capabilities(torch_version="2.13.0+cpu", cpu_arch="x86_64", python_version="3.11.7")
    ok, why = check_variant("torch-2.13-cxx11-cpu-cpython-3.12-abi3-x86_64-linux", _target(caps))
    assert not ok and "needs Python >= 3.12" in why
    assert check_variant("torch-2.13-cxx11-cpu-cpython-3.11-abi3-x86_64-linux", _target(caps))[0]


@pytest.mark.parametrize(
    ("archs", "cc", "ok"),
    [
        (["8.0", "9.0"], (9, 0), True),
        (["8.0"], (8, 9), True),  # same major, newer minor
        (["8.0"], (9, 0), False),
        (["8.0+PTX"], (9, 0), True),
        (["9.0a"], (9, 0), True),
        (["9.0a"], (10, 0), False),
        (["10.0f"], (10, 3), True),
        (["8.0", "9.0"], (7, 5), False),
        (["sm_weird"], (7, 5), True),  # unknown format is not held against the GPU (kernels does the same)
        ([], (7, 5), True),
    ],
)
def test_archs_cover(archs: list[str], cc: tuple[int, int], ok: bool) -> None:
    assert archs_cover(archs, cc) is ok


def test_trust_is_explicit_repo_publisher_or_star() -> None:
    assert trusted("org/a", ["org/a"]) == "org/a"
    assert trusted("org/a", ["org/*"]) == "org/*"
    assert trusted("org/a", ["*"]) == "*"
    assert trusted("org/a", []) is None
    assert trusted("org/a", ["org/b", "other/*", "org"]) is None
    assert trusted("org2/a", ["org/*"]) is None


def test_attention_kernel_version_follows_each_transformers_table() -> None:
    assert attention_kernel_version(FA2, "5.17.0", "2.11.0") == 3
    assert attention_kernel_version("kernels-community/flash-attn4", "5.17.0", "2.11.0") == 0
    assert attention_kernel_version("kernels-community/vllm-flash-attn3", "5.17.0", "2.11.0") == 1
    assert attention_kernel_version(FA2, "5.22.2", "2.13.0") == 4
    assert attention_kernel_version(FA2, "5.22.2", "2.9.1") == 3
    assert attention_kernel_version("kernels-community/aiter-flash-attn", "5.22.2", "2.13.0") == 2
    assert attention_kernel_version("someone/else", "5.22.2", "2.13.0") == 1


def test_attention_kernel_version_matches_installed_transformers() -> None:
    import torch
    import transformers
    from transformers.integrations import hub_kernels as hk

    for repo in (FA2, "kernels-community/flash-attn4", "kernels-community/vllm-flash-attn3", "x/y"):
        assert attention_kernel_version(
            repo, transformers.__version__, torch.__version__
        ) == hk.get_attn_kernel_version(repo)


# -- check_attention_kernel ------------------------------------------------------------------------------


def test_attention_kernel_ok_when_trusted_cached_and_fitting() -> None:
    ok, reasons = check_attention_kernel(FA2, gpu_caps(fa2()), trust=["kernels-community/*"])
    assert ok, reasons
    assert any("torch211-cxx11-cu130-x86_64-linux fits" in r for r in reasons)


def test_attention_kernel_untrusted_by_default() -> None:
    ok, reasons = check_attention_kernel(FA2, gpu_caps(fa2()), trust=[])
    assert not ok and any("not trusted" in r and "CUDALOAD_TRUST_KERNELS" in r for r in reasons)


def test_attention_kernel_offline_needs_the_version_transformers_asks_for() -> None:
    # 5.22 on torch 2.11 asks for v4; only v3 is cached
    ok, reasons = check_attention_kernel(FA2, gpu_caps(fa2(), tv="5.22.2"), trust=["*"])
    assert not ok and any("HF_HUB_OFFLINE" in r and "(v4)" in r for r in reasons)
    unreachable = replace(gpu_caps(fa2(), tv="5.22.2"), hub=HubState(offline=False, reachable=False))
    ok, reasons = check_attention_kernel(FA2, unreachable, trust=["*"])
    assert not ok and any("unreachable" in r for r in reasons)


def test_attention_kernel_online_uncached_is_left_to_load_time() -> None:
    ok, reasons = check_attention_kernel(FA2, gpu_caps(offline=False), trust=["*"])
    assert ok and any("downloads it at load time" in r for r in reasons)


def test_attention_kernel_revision_pinned_by_commit_ref_or_suffix() -> None:
    caps = gpu_caps(fa2(refs=("main",)))
    assert check_attention_kernel(FA2, caps, trust=["*"], revision=SHA)[0]
    assert check_attention_kernel(FA2, caps, trust=["*"], revision="main")[0]
    assert check_attention_kernel(f"{FA2}@{SHA[:10]}", caps, trust=["*"])[0]
    assert not check_attention_kernel(FA2, caps, trust=["*"], revision="f" * 40)[0]


def test_attention_kernel_no_fitting_variant() -> None:
    ok, reasons = check_attention_kernel(
        FA2, gpu_caps(fa2(variants=("torch210-cxx11-cu128-x86_64-linux",))), trust=["*"]
    )
    assert not ok and any("no build variant" in r and "torch 2.10" in r for r in reasons)


def test_attention_kernel_archs_must_cover_the_gpu() -> None:
    ok, reasons = check_attention_kernel(FA2, gpu_caps(fa2(), gpu=T4), trust=["*"])
    assert not ok and any("do not cover Tesla T4" in r and "7.5" in r for r in reasons)


def test_attention_kernel_package_states() -> None:
    missing = replace(gpu_caps(fa2()), packages=())
    ok, reasons = check_attention_kernel(FA2, missing, trust=["*"])
    assert not ok and "kernels is not installed" in reasons[0]
    unpaired = gpu_caps(fa2(), tv="5.24.0", pkg=kernels_pkg("0.17.2", False, ">=0.18.2,<0.19"))
    ok, reasons = check_attention_kernel(FA2, unpaired, trust=["*"])
    assert not ok
    assert reasons[0].startswith(
        "kernels 0.17.2 is outside the range transformers 5.24.0 accepts (>=0.18.2,<0.19)"
    )


# -- plan_kernels ----------------------------------------------------------------------------------------


def liger(refs: tuple[str, ...] = ("v3",)) -> CachedKernel:
    return CachedKernel("kernels-community/liger-kernels", SHA, refs=refs, variants=("torch-universal",))


def rotary(refs: tuple[str, ...] = ("v2",)) -> CachedKernel:
    return CachedKernel(
        "kernels-community/rotary", "f" * 40, refs=refs, variants=("torch211-cxx11-cu130-x86_64-linux",)
    )


def _plan(caps: Capabilities, **kw: object) -> dict[str, object]:
    args: dict[str, object] = {
        "intent": "inference",
        "request": None,
        "trust": ["kernels-community/*"],
        "model_class_name": "LlamaForCausalLM",
    }
    args.update(kw)
    return plan_kernels(None, caps, **args)  # type: ignore[arg-type]


def test_registered_layers_read_from_the_model_class() -> None:
    import transformers

    assert registered_layers(transformers.LlamaForCausalLM) == ("RMSNorm", "rotary_pos_emb")
    assert registered_layers(transformers.GPT2LMHeadModel) == ()


def test_plan_auto_is_off_by_default_untrusted() -> None:
    p = _plan(gpu_caps(liger(), rotary()), trust=[])
    assert p["use_kernels"] is False and p["mapping"] == {}
    assert p["registered_layers"] == ["RMSNorm", "rotary_pos_emb"] and p["device"] == "cuda"
    assert any("auto: kernels left off" in r for r in p["reasons"])  # type: ignore[union-attr]
    json.dumps(p)  # JSON-able


def test_plan_auto_on_when_every_kernel_passes_and_pins_commits() -> None:
    p = _plan(gpu_caps(liger(), rotary()))
    assert p["use_kernels"] is True and p["apply"] == "kernelize" and p["inherit_mapping"] is False
    assert p["mapping"] == {
        "RMSNorm": [
            "kernels-community/liger-kernels:LigerRMSNorm",
            {"trust_remote_code": True, "revision": SHA},
        ],
        "rotary_pos_emb": [
            "kernels-community/rotary:apply_rotary_transformers",
            {"trust_remote_code": True, "revision": "f" * 40},
        ],
    }
    assert p["lock"] == {"kernels-community/liger-kernels": SHA, "kernels-community/rotary": "f" * 40}


def test_plan_auto_off_when_one_fails_but_request_true_keeps_the_rest() -> None:
    # the measured H200 failure: rotary v2 not in the cache while offline
    caps = gpu_caps(liger())
    auto = _plan(caps)
    assert auto["use_kernels"] is False
    asked = _plan(caps, request=True)
    assert asked["use_kernels"] is True and list(asked["mapping"]) == ["RMSNorm"]  # type: ignore[call-overload]
    (rot,) = [e for e in asked["entries"] if e["layer"] == "rotary_pos_emb"]  # type: ignore[union-attr]
    assert not rot["ok"] and any("not in the local cache" in r for r in rot["reasons"])


def test_plan_request_false_and_training_mode() -> None:
    assert _plan(gpu_caps(liger(), rotary()), request=False)["use_kernels"] is False
    p = _plan(gpu_caps(liger(), rotary()), intent="qlora", request=True)
    assert p["mode"] == "training" and list(p["mapping"]) == ["RMSNorm"]  # type: ignore[call-overload]
    (rot,) = [e for e in p["entries"] if e["layer"] == "rotary_pos_emb"]  # type: ignore[union-attr]
    assert "has no training kernel" in rot["reasons"][0]


def test_plan_lock_pins_revision(tmp_path: Path) -> None:
    other = CachedKernel("kernels-community/liger-kernels", "e" * 40, refs=(), variants=("torch-universal",))
    caps = gpu_caps(liger(), other, rotary())
    p = _plan(caps, lock={"kernels-community/liger-kernels": "e" * 40})
    assert p["mapping"]["RMSNorm"][1]["revision"] == "e" * 40  # type: ignore[index]
    write_lock(p, tmp_path / "kernels.lock")
    assert read_lock(tmp_path / "kernels.lock") == p["lock"]
    stale = _plan(caps, lock={"kernels-community/liger-kernels": "d" * 40})
    assert stale["use_kernels"] is False


def test_plan_user_mapping_local_kernel_and_unknown_layer(tmp_path: Path) -> None:
    kdir = local_kernel(tmp_path / "norm")
    p = _plan(gpu_caps(), mapping={"RMSNorm": f"{kdir}:TinyRMSNorm", "NotALayer": "x/y:Z"}, request=True)
    assert p["use_local_kernel"] is True and p["mapping"] == {"RMSNorm": f"{kdir.resolve()}:TinyRMSNorm"}
    assert any("NotALayer is not a kernel layer" in r for r in p["reasons"])  # type: ignore[union-attr]
    missing = _plan(gpu_caps(), mapping={"RMSNorm": f"{tmp_path}/nope:TinyRMSNorm"}, request=True)
    assert missing["use_kernels"] is False


def test_plan_on_cpu_applies_by_kernelize() -> None:
    caps = Capabilities(
        packages=(kernels_pkg(),), hub=HubState(offline=True), torch_version="2.13.0+cpu", cpu_arch="x86_64"
    )
    p = _plan(caps)
    assert p["device"] == "cpu" and p["apply"] == "kernelize" and p["use_kernels"] is False
    assert build_kernel_config(p) is None


def test_plan_model_without_kernel_layers() -> None:
    p = _plan(gpu_caps(liger()), model_class_name="GPT2LMHeadModel", request=True)
    assert p["use_kernels"] is False and p["registered_layers"] == []


# -- build_kernel_config ---------------------------------------------------------------------------------


def test_build_kernel_config_fresh_each_call_and_never_inherits() -> None:
    p = _plan(gpu_caps(liger(), rotary()))
    a, b = build_kernel_config(p), build_kernel_config(p)
    assert a is not b and a.kernel_mapping is not b.kernel_mapping
    assert a.inherit_mapping is False and a.use_local_kernel is False
    assert a.kernel_mapping["RMSNorm"] == {
        "cuda": ("kernels-community/liger-kernels:LigerRMSNorm", {"trust_remote_code": True, "revision": SHA})
    }
    assert build_kernel_config({}) is None
    assert build_kernel_config(_plan(gpu_caps(), request=False)) is None


@pytest.mark.parametrize(
    "mapping",
    [
        {"RMSNorm": "no-colon"},
        {"RMSNorm": ["org/r:L", {"trust_remote_code": True}]},  # neither version nor revision
        {"RMSNorm": ["org/r:L", {"version": 1, "revision": SHA}]},  # both
        {"RMSNorm": ["org/r:L", {"version": 1, "trust_remote_code": "yes"}]},
        {"Unregistered": ["org/r:L", {"version": 1}]},
    ],
)
def test_build_kernel_config_validates_before_loading(mapping: dict[str, object]) -> None:
    p = _plan(gpu_caps(liger(), rotary()))
    p["mapping"] = mapping
    with pytest.raises(ConfigurationError):
        build_kernel_config(p)


# -- lock ------------------------------------------------------------------------------------------------


def test_lock_errors(tmp_path: Path) -> None:
    with pytest.raises(ModelNotFoundError):
        read_lock(tmp_path / "absent.lock")
    (tmp_path / "bad.lock").write_text('{"kernels": {"org/r": "main"}}')
    with pytest.raises(ConfigurationError):
        read_lock(tmp_path / "bad.lock")
    online = _plan(gpu_caps(offline=False), request=True)  # nothing cached: nothing to pin
    with pytest.raises(ConfigurationError, match="not cached yet"):
        write_lock(online, tmp_path / "x.lock")
    assert not os.path.exists(tmp_path / "x.lock")


# -- whether the Hub's answer matters ---------------------------------------------------------------------


def test_the_hub_is_asked_only_where_kernels_could_download() -> None:
    online = replace(gpu_caps(offline=False), hub=HubState(offline=False, reachable=None, cache_dir="/c"))
    assert needs_hub_answer(online)  # kernels usable, reachability unknown: a download may depend on it
    assert not needs_hub_answer(gpu_caps(offline=True))  # offline: no download, whatever the network says
    known = replace(online, hub=replace(online.hub, reachable=False))
    assert not needs_hub_answer(known)  # already answered (a recorded machine, detect() with the probe)
    out = replace(online, packages=(kernels_pkg("0.17.2", in_range=False),))
    assert not needs_hub_answer(out)  # transformers would not use kernels: every Hub kernel is refused anyway
    missing = replace(online, packages=(PackageInfo("kernels", False),))
    assert not needs_hub_answer(missing)


def test_load_model_never_lets_transformers_apply_its_default_hub_kernels(
    tiny_model: Callable[..., Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """transformers 5.25 kernelizes every from_pretrained with its default Hub kernels unless use_kernels=False;
    cudaload runs no Hub kernel it did not plan and trust (the CPU loads through from_pretrained; the fast
    path's skeleton switches kernels off itself, fastload.materialize.skeleton)."""
    import cudaload

    monkeypatch.setenv("CUDALOAD_CACHE", str(tmp_path / "cache"))
    model = cudaload.load_model(str(tiny_model("qwen3")), dtype="float32")
    assert model.cudaload_plan.load_path.choice == "from_pretrained"
    assert not getattr(model, "_use_kernels", False)
    assert not model.cudaload_plan.kernels.get("use_kernels")
