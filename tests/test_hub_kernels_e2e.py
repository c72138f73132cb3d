"""Hub kernels end to end, offline: kernel repos the tests make, planned by cudaload, loaded by kernels.

Each run is a fresh interpreter (tests/fixtures/kernels/e2e_driver.py): kernels and huggingface_hub read
HF_HUB_CACHE / HF_HUB_OFFLINE when imported, and loaded kernels stay in sys.modules.
Covers every transformers/kernels pair the test sets install (5.17 + 0.16.2, 5.22 + 0.17.2, 5.24 + 0.18.x,
5.25 + 0.19.x); in the unpaired set (5.24 + 0.17.2) kernels is out of range, those tests skip with that reason
and the unpaired state is asserted instead.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

DRIVER = Path(__file__).parent / "fixtures" / "kernels" / "e2e_driver.py"
FA2 = "kernels-community/flash-attn2"


def _pairing() -> tuple[bool, str]:
    """Whether this transformers accepts the installed kernels, and the reason when not."""
    import importlib.metadata as md

    import transformers
    from transformers.utils import import_utils as iu

    try:
        kv = md.version("kernels")
    except md.PackageNotFoundError:
        return False, "kernels is not installed"
    if iu.is_kernels_available():
        return True, ""
    lo, hi = getattr(iu, "KERNELS_MIN_VERSION", "?"), getattr(iu, "KERNELS_MAX_VERSION", "?")
    return False, (
        f"kernels {kv} is outside the range transformers {transformers.__version__} accepts "
        f"(>={lo},<{hi}): transformers disables its kernel hooks"
    )


PAIRED, UNPAIRED_REASON = _pairing()
needs_pair = pytest.mark.skipif(not PAIRED, reason=UNPAIRED_REASON)


def run_driver(tmp: Path, device: str) -> dict[str, Any]:
    cache = tmp / "hub-cache"
    cache.mkdir(parents=True)
    env = {k: v for k, v in os.environ.items() if k not in ("KERNELS_CACHE", "LOCAL_KERNELS")}
    env.update(
        HF_HUB_OFFLINE="1",
        HF_HUB_CACHE=str(cache),
        CUDALOAD_HUB_TIMEOUT="0",
        PYTHONWARNINGS="ignore",
        TOKENIZERS_PARALLELISM="false",
    )
    proc = subprocess.run(
        [sys.executable, str(DRIVER), str(tmp), device], env=env, capture_output=True, text=True, timeout=300
    )
    line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
    assert proc.returncode == 0 and line, f"driver failed (rc {proc.returncode}):\n{proc.stderr[-4000:]}"
    return dict(json.loads(line[len("RESULT ") :]))


@pytest.fixture(scope="module")
def cpu_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return run_driver(tmp_path_factory.mktemp("kernels-e2e"), "cpu")


@needs_pair
def test_hub_cache_kernel_kernelizes_on_cpu(cpu_run: dict[str, Any]) -> None:
    plan = cpu_run["hub_plan"]
    assert cpu_run["offline"] and "tiny-org/tiny-norm" in cpu_run["cached"]
    assert plan["use_kernels"] and plan["apply"] == "kernelize" and plan["device"] == "cpu"
    # pinned to the cached commit, and that commit is what the lock records
    assert plan["mapping"]["RMSNorm"][1]["revision"] == cpu_run["hub_commit"]
    assert plan["lock"] == {"tiny-org/tiny-norm": cpu_run["hub_commit"]}
    assert cpu_run["hub_calls"] == 9  # 2 layers x (input, post-attention, q_norm, k_norm) + final norm
    assert cpu_run["hub_equal"]


@needs_pair
def test_local_directory_kernel_kernelizes_on_cpu(cpu_run: dict[str, Any]) -> None:
    plan = cpu_run["local_plan"]
    assert plan["use_kernels"] and plan["use_local_kernel"]
    assert plan["mapping"]["RMSNorm"].endswith("local-norm:TinyRMSNorm")
    assert cpu_run["local_calls"] == 9 and cpu_run["local_equal"]


@needs_pair
def test_built_kernel_config_passes_transformers_validation(cpu_run: dict[str, Any]) -> None:
    if "kernel_config_accepted" not in cpu_run:
        pytest.skip("a GPU is present: transformers rejects a KernelConfig for a model on the cpu")
    assert cpu_run["kernel_config_accepted"]


@needs_pair
def test_attention_fallback_hub_kernel_matches_sdpa(cpu_run: dict[str, Any]) -> None:
    ok, reasons = cpu_run["attn_preflight"]
    assert ok, reasons
    assert cpu_run["attn_impl"] == FA2
    assert cpu_run["attn_calls"] > 0  # the kernel ran (once per layer)
    assert cpu_run["attn_equal"]


@pytest.mark.skipif(PAIRED, reason="kernels is within the range this transformers accepts (paired venv)")
def test_unpaired_state_is_reported_with_the_accepted_range() -> None:
    import transformers
    from transformers.utils import import_utils as iu

    from cudaload.detection import detect
    from cudaload.hub_kernels import check_attention_kernel, plan_kernels

    caps = detect(probe_hub=False)
    pkg = caps.package("kernels")
    assert pkg.installed and pkg.in_range is False and not pkg.usable
    assert pkg.accepted is not None and str(iu.KERNELS_MIN_VERSION) in pkg.accepted
    ok, reasons = check_attention_kernel(FA2, caps, trust=["*"])
    assert not ok
    assert reasons[0].startswith(
        f"kernels {pkg.version} is outside the range transformers "
        f"{transformers.__version__} accepts ({pkg.accepted})"
    )
    plan = plan_kernels(
        None,
        caps,
        intent="inference",
        request=True,
        trust=["*"],
        model_class_name="Qwen3ForCausalLM",
        mapping={"RMSNorm": "org/r:L"},
    )
    assert plan["use_kernels"] is False
    # registered layers are still known (read from the source, not from disabled decorators)
    assert plan["registered_layers"] == ["RMSNorm", "rotary_pos_emb"]
    assert all("outside the range" in e["reasons"][0] for e in plan["entries"])


@pytest.mark.gpu
@needs_pair
def test_cuda_kernel_config_mapping_end_to_end(tmp_path: Path) -> None:
    """On the GPU: plan -> build_kernel_config -> from_pretrained(use_kernels=True) with the "cuda" key,
    Hub-cache and local kernels, and the Hub attention kernel, all with logits equal to sdpa."""
    run = run_driver(tmp_path, "cuda")
    assert run["hub_plan"]["apply"] == "kernelize" and run["hub_plan"]["device"] == "cuda", run
    assert list(run["hub_plan"]["mapping"]) == ["RMSNorm"], run
    # the default rotary kernel is neither trusted nor cached here: left out, with its reason
    assert "rotary_pos_emb" in run["hub_left_out"], run
    assert run["auto_plan"]["use_kernels"] is False and "rotary_pos_emb" in run["auto_plan"]["reasons"][-1], (
        run
    )
    assert run["hub_calls"] > 0 and run["hub_equal"], run
    assert run["local_calls"] > 0 and run["local_equal"], run
    assert run["attn_calls"] > 0 and run["attn_equal"], run
