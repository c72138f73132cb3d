"""Properties: a plan never puts more bytes on a device than its budget; auto never raises for attention;
every plan round-trips through JSON."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cudaload.capabilities import Distributed
from cudaload.errors import DoesNotFitError
from cudaload.model_info import model_info
from cudaload.planner import plan
from cudaload.plans.plan import Plan
from cudaload.policies.attention import choose_attention
from cudaload.policies.attention.names import VARLEN
from cudaload.profiles import hardware
from cudaload.testing import FULL_SHAPES, full_config

PROFILES = [
    "T4",
    "V100-16GB",
    "A10G",
    "L4",
    "A100-40GB",
    "RTX-4090",
    "RTX-5090",
    "H100-SXM",
    "H200",
    "B200",
    "GB10",
    "2xA100-80GB",
    "4xL4",
    "8xH100-SXM",
]
PACKAGES = ["flash-attn", "flash-attn-3", "flash-attn-4", "bitsandbytes", "kernels"]
_INFO = {name: model_info(full_config(name)) for name in FULL_SHAPES}

cases = st.fixed_dictionaries(
    {
        "profile": st.sampled_from(PROFILES),
        "shape": st.sampled_from(sorted(FULL_SHAPES)),
        "intent": st.sampled_from(["inference", "training", "lora", "qlora"]),
        "seq_len": st.integers(1, 32768),
        "batch_size": st.integers(1, 16),
        "installed": st.lists(st.sampled_from(PACKAGES), unique=True),
        "offload": st.booleans(),
        "torchrun": st.booleans(),
    }
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases)
def test_never_over_budget(case: dict) -> None:  # type: ignore[type-arg]
    caps = hardware(case["profile"])
    missing = [p for p in PACKAGES if p not in case["installed"]]
    caps = caps.with_packages(case["installed"], missing)
    if case["torchrun"] and len(caps.gpus) > 1:
        caps = replace(caps, distributed=Distributed(local_rank=len(caps.gpus) - 1, rank=1, world_size=2))
    if case["offload"]:
        caps = replace(caps, host_memory=256 << 30)
    try:
        p = plan(
            _INFO[case["shape"]].config,
            hardware=caps,
            intent=case["intent"],
            seq_len=case["seq_len"],
            batch_size=case["batch_size"],
            allow_offload=case["offload"],
        )
    except DoesNotFitError as e:
        assert e.fix and e.reasons
        return
    for dev, used in p.memory.per_device.items():
        assert used <= p.memory.budget[dev], (dev, used, p.memory.budget[dev])
    assert p.memory.total == sum(p.memory.per_device.values())
    assert Plan.from_json(p.to_json()) == p
    # FSDP with weights that fit no GPU whole: each rank loads on its CPU and the Trainer shards onto the GPUs
    staged = bool(p.parallelism and p.parallelism.launched and p.parallelism.config.get("weights_on_cpu"))
    if staged:
        assert p.placement.device_map == "cpu" and p.load_path.choice == "from_pretrained"
    elif caps.distributed.active:
        assert p.placement.device_map == f"cuda:{caps.distributed.local_rank}"
    if p.quantization.choice is not None:
        assert caps.usable("bitsandbytes")
    if not p.placement.offload and not staged:
        assert not {"cpu", "disk"} & set(p.placement.devices) or not caps.gpus


@settings(max_examples=200, deadline=None)
@given(
    profile=st.sampled_from([*PROFILES, None]),
    shape=st.sampled_from(sorted(FULL_SHAPES)),
    dtype=st.sampled_from(["bfloat16", "float16", "float32"]),
    intent=st.sampled_from(["inference", "training", "lora", "qlora"]),
    installed=st.lists(st.sampled_from(PACKAGES), unique=True),
    head_dim=st.sampled_from([None, 64, 200, 512]),
)
def test_auto_attention_never_raises(
    profile: str | None, shape: str, dtype: str, intent: str, installed: list[str], head_dim: int | None
) -> None:
    from cudaload.capabilities import Capabilities
    from cudaload.model_info import with_summary

    caps = hardware(profile) if profile else Capabilities(source="cpu")
    caps = caps.with_packages(installed)
    info = _INFO[shape] if head_dim is None else with_summary(_INFO[shape], head_dim=head_dim)
    d = choose_attention(info, caps, dtype=dtype, intent=intent, trust=("kernels-community/*",))
    assert d.choice is not None
    chosen = d.candidate(d.choice)
    assert chosen is not None and chosen.ok
    # every rejected candidate says why
    assert all(c.reasons for c in d.candidates)
    # training: a valid flash kernel with a varlen forward and backward first (packed steps; measured on the
    # H200), else sdpa where valid
    sdpa = d.candidate("sdpa")
    assert sdpa is not None
    flash = [c.name for c in d.candidates if c.ok and c.name in VARLEN]
    if intent != "inference":
        assert d.choice in flash if flash else (d.choice == "sdpa" or not sdpa.ok)
    # inference without timings: nothing beats a valid sdpa (no first-use cost; measured fastest on the H200)
    elif sdpa.ok:
        assert d.choice == "sdpa"
    else:
        # inference without timings pays no one-time seconds
        assert not any(r.startswith("first use: +") for r in chosen.reasons)


@pytest.mark.parametrize("shape", sorted(FULL_SHAPES))
def test_bytes_per_term_are_consistent(shape: str) -> None:
    p = plan(full_config(shape), hardware=hardware("8xH100-SXM"), intent="lora")
    t = p.memory.terms
    assert t["weights"] > 0 and t["gradients"] > 0 and t["optimizer"] == 2 * t["gradients"]
    assert t["kv_cache"] == 0  # training: no cache
