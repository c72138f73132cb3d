"""Where the weights go: one GPU (``cuda:N``, N as torch numbers it under CUDA_VISIBLE_DEVICES), a torchrun
rank's own GPU (``cuda:LOCAL_RANK``, never the global RANK, never ``device_map="auto"``), a balanced split
over the visible GPUs with per-device budgets, CPU/disk offload only when allowed, or the CPU.

``place`` is pure: it answers with a :class:`Fit` (placement, bytes planned per device, each device's
budget) or a Fit with ``ok`` False and the reasons.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..capabilities import GPU, Capabilities
from ..errors import ConfigurationError, DeviceSelectionError
from ..plans.plan import Placement
from .memory import CUDA_CONTEXT_BYTES, Breakdown, GiB

_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 1 << 10,
    "mib": 1 << 20,
    "gib": 1 << 30,
    "tib": 1 << 40,
}
#: one number (digits with at most one point) and a unit: "1.2.3GB" is no size
_SIZE = re.compile(r"\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*([a-zA-Z]*)\s*")
SPLIT_MAPS = ("auto", "balanced", "balanced_low_0", "sequential")


@dataclass(frozen=True)
class Fit:
    ok: bool
    placement: Placement | None = None
    per_device: dict[str, int] = field(default_factory=dict)
    budget: dict[str, int] = field(default_factory=dict)
    reasons: tuple[str, ...] = ()
    shortfall: int = 0  # bytes missing on the tightest device (for "what would fit")


def parse_size(value: Any) -> int:
    """Bytes of a memory size: an int or float of 0 or more, or a string such as "20GiB" / "500MB"."""
    if isinstance(value, bool):
        raise ConfigurationError(f"bad memory size {value!r}", fix="use bytes or a string like '20GiB'")
    if isinstance(value, int):
        if value >= 0:
            return value
    elif isinstance(value, float):
        if value >= 0 and math.isfinite(value):
            return int(value)
    else:
        m = _SIZE.fullmatch(str(value))
        if m and m.group(2).lower() in _UNITS:
            return int(float(m.group(1)) * _UNITS[m.group(2).lower()])
    raise ConfigurationError(
        f"bad memory size {value!r}", fix="use bytes (0 or more) or a string like '20GiB' / '500MB'"
    )


def _key(k: Any) -> str:
    if isinstance(k, int) and not isinstance(k, bool):
        return f"cuda:{k}"
    s = str(k).strip()
    return f"cuda:{s}" if s.isdigit() else s


def budgets(caps: Capabilities, max_memory: Mapping[Any, Any] | None) -> dict[str, int]:
    """Bytes each device may hold: the GPU's free memory (total when unknown), the host's memory for "cpu";
    ``max_memory`` entries replace them."""
    out = {f"cuda:{g.index}": g.available_memory for g in caps.gpus}
    if caps.host_memory:
        out["cpu"] = caps.host_memory
    for k, v in (max_memory or {}).items():
        key = _key(k)
        if key.startswith("cuda:") and key not in out:
            raise DeviceSelectionError(
                f"max_memory names {key}, which is not visible (visible: {sorted(out)})",
                fix="use the indices torch sees (cuda:0.. under CUDA_VISIBLE_DEVICES)",
            )
        out[key] = parse_size(v)
    return out


def _gpu_line(g: GPU, caps: Capabilities) -> str:
    line = f"cuda:{g.index} = {g.name} (sm{g.sm}, {g.total_memory / GiB:.1f} GiB)"
    cvd = caps.env_dict.get("CUDA_VISIBLE_DEVICES")
    if cvd is not None and g.nvml_index is not None and g.nvml_index != g.index:
        line += f"; nvidia-smi calls it GPU {g.nvml_index} (CUDA_VISIBLE_DEVICES={cvd} renumbers from 0)"
    return line


def _one(dev: str, bd: Breakdown, budget: dict[str, int], gpu: bool) -> Fit:
    need = bd.model_bytes + bd.every_device + (CUDA_CONTEXT_BYTES if gpu else 0)
    have = budget.get(dev)
    if have is not None and need > have:
        return Fit(
            False,
            per_device={dev: need},
            budget={dev: have},
            shortfall=need - have,
            reasons=(f"{dev}: needs {need / GiB:.2f} GiB, has {have / GiB:.2f} GiB",),
        )
    return Fit(True, per_device={dev: need}, budget={dev: have if have is not None else need})


def _assign(caps_layers: list[int], total: int) -> list[int] | None:
    """Spread ``total`` layers as evenly as the capacities allow (water-filling); None if they cannot."""
    if sum(max(c, 0) for c in caps_layers) < total:
        return None
    got = [0] * len(caps_layers)
    for _ in range(total):
        open_ = [i for i, c in enumerate(caps_layers) if got[i] < c]
        i = min(open_, key=lambda j: (got[j], j))
        got[i] += 1
    return got


def _split(
    devs: list[str], bd: Breakdown, budget: dict[str, int]
) -> tuple[dict[str, int], dict[str, int]] | None:
    """(per-device bytes, per-device weight room for from_pretrained's max_memory) or None."""
    n = len(devs)
    fixed = [
        CUDA_CONTEXT_BYTES
        + bd.every_device
        + (bd.first_bytes if i == 0 else 0)
        + (bd.last_bytes if i == n - 1 else 0)
        for i in range(n)
    ]
    room = [budget[d] - f for d, f in zip(devs, fixed, strict=True)]
    if any(r < 0 for r in room):
        return None
    lb = max(bd.layer_bytes, 1)
    got = _assign([r // lb for r in room], bd.layers)
    if got is None:
        return None
    per = {d: fixed[i] + got[i] * bd.layer_bytes for i, d in enumerate(devs)}
    # from_pretrained's max_memory bounds weights only: give it each device's budget minus what is not weights
    nonweight = bd.layer_bytes - bd.layer_weight_bytes
    mm = {
        d: budget[d] - CUDA_CONTEXT_BYTES - bd.every_device - got[i] * nonweight for i, d in enumerate(devs)
    }
    return per, mm


def place(
    caps: Capabilities,
    bd: Breakdown,
    *,
    device_map: Any = None,
    max_memory: Mapping[Any, Any] | None = None,
    allow_offload: bool = False,
    split: bool = True,
) -> Fit:
    """Place ``bd`` (a memory breakdown) on ``caps``. ``split`` False: one GPU only (a rung of the ladder).

    In order: the CPU (asked for, or no GPU), a torchrun rank's own GPU, a GPU named by ``device_map``, the one
    GPU with the most room, a split over the GPUs, then (when allowed) offload to the CPU and disk."""
    budget = budgets(caps, max_memory)
    gpus = list(caps.gpus)
    if (isinstance(device_map, str) and device_map == "cpu") or not gpus:
        why = "device_map='cpu' requested" if gpus else "no GPU visible: the model runs on the CPU"
        return _on_cpu(bd, budget, why=why, allow_offload=allow_offload)
    if caps.distributed.active:
        return _on_rank(caps, bd, budget)
    named = _named_gpu(device_map, gpus)
    if named is not None:
        return _on_named(caps, bd, budget, named)
    fails: tuple[str, ...] = ()
    tight = 0
    if not isinstance(device_map, (str, dict)):
        f = _on_roomiest(caps, bd, budget)
        if f.ok:
            return f
        fails, tight = f.reasons, f.shortfall
        if not split:
            return Fit(False, reasons=fails, shortfall=tight)
    devs = [f"cuda:{g.index}" for g in gpus]
    if isinstance(device_map, dict):
        used = sorted({_key(v) for v in device_map.values()})
        devs = [d for d in devs if d in used]
    if len(devs) > 1 or isinstance(device_map, (str, dict)):
        f = _split_over(caps, bd, budget, devs, device_map)
        if f.ok:
            return f
        fails, tight = (*fails, *f.reasons), f.shortfall
    if allow_offload and "cpu" in budget:
        return _offload(bd, budget, devs, fails)
    return Fit(False, reasons=fails, shortfall=tight)


def _on_cpu(bd: Breakdown, budget: dict[str, int], *, why: str, allow_offload: bool) -> Fit:
    """The whole model in host memory, the rest on disk when it does not fit and offload is allowed."""
    f = _one("cpu", bd, budget, gpu=False)
    if f.ok:
        return Fit(True, Placement("cpu", ("cpu",), reasons=(why,)), f.per_device, f.budget)
    if not allow_offload:
        return f
    pl = Placement(
        "auto",
        ("cpu", "disk"),
        offload=True,
        max_memory={"cpu": budget["cpu"]},
        reasons=(why, "does not fit in host memory: the rest is offloaded to disk"),
    )
    need = f.per_device["cpu"]
    return Fit(
        True,
        pl,
        {"cpu": budget["cpu"], "disk": need - budget["cpu"]},
        {"cpu": budget["cpu"], "disk": need - budget["cpu"]},
    )


def _on_rank(caps: Capabilities, bd: Breakdown, budget: dict[str, int]) -> Fit:
    """A torchrun rank's own GPU, cuda:LOCAL_RANK."""
    dist = caps.distributed
    lr = dist.local_rank if dist.local_rank is not None else 0
    gpu = next((g for g in caps.gpus if g.index == lr), None)
    if gpu is None:
        raise DeviceSelectionError(
            f"LOCAL_RANK={lr} but this process sees {len(caps.gpus)} GPU(s)",
            fix="launch at most one process per visible GPU (torchrun --nproc-per-node), "
            "or widen CUDA_VISIBLE_DEVICES",
        )
    dev = f"cuda:{gpu.index}"
    f = _one(dev, bd, budget, gpu=True)
    if not f.ok:
        return f
    return Fit(
        True,
        Placement(
            dev,
            (dev,),
            reasons=(
                f"torchrun rank {dist.rank} of {dist.world_size}: each process loads onto "
                f"cuda:LOCAL_RANK ({dev}); never the global RANK, never device_map='auto' "
                "(every rank would spread over all GPUs)",
                _gpu_line(gpu, caps),
            ),
        ),
        f.per_device,
        f.budget,
    )


def _named_gpu(device_map: Any, gpus: list[GPU]) -> int | None:
    """The GPU index ``device_map`` names alone (an int, "cuda", "cuda:N"), or None."""
    if isinstance(device_map, int) and not isinstance(device_map, bool):
        return device_map
    if isinstance(device_map, str) and re.fullmatch(r"cuda(:\d+)?", device_map):
        return int(device_map.split(":")[1]) if ":" in device_map else gpus[0].index
    return None


def _on_named(caps: Capabilities, bd: Breakdown, budget: dict[str, int], index: int) -> Fit:
    gpu = caps.gpu(index)
    dev = f"cuda:{gpu.index}"
    f = _one(dev, bd, budget, gpu=True)
    if not f.ok:
        return f
    return Fit(
        True,
        Placement(dev, (dev,), reasons=("device requested explicitly", _gpu_line(gpu, caps))),
        f.per_device,
        f.budget,
    )


def _on_roomiest(caps: Capabilities, bd: Breakdown, budget: dict[str, int]) -> Fit:
    """One GPU: the one with the most memory available (ties: the lowest index)."""
    gpus = caps.gpus
    best = max(gpus, key=lambda g: (budget[f"cuda:{g.index}"], -g.index))
    dev = f"cuda:{best.index}"
    f = _one(dev, bd, budget, gpu=True)
    if not f.ok:
        return f
    one = [f"fits on one GPU: {dev}", _gpu_line(best, caps)]
    if len(gpus) > 1:
        one.append(f"{len(gpus)} GPUs visible; one is enough and avoids cross-device hops")
    return Fit(True, Placement(dev, (dev,), reasons=tuple(one)), f.per_device, f.budget)


def _split_over(
    caps: Capabilities, bd: Breakdown, budget: dict[str, int], devs: list[str], device_map: Any
) -> Fit:
    """The layers balanced over ``devs`` within each one's budget; not ok, with the shortfall, when they cannot
    hold the model."""
    sp = _split(devs, bd, budget)
    if sp is None:
        total = bd.model_bytes + len(devs) * (CUDA_CONTEXT_BYTES + bd.every_device)
        room = sum(budget[d] for d in devs)
        return Fit(
            False,
            reasons=(
                f"split over {len(devs)} GPUs: needs ~{total / GiB:.2f} GiB, they hold {room / GiB:.2f} GiB",
            ),
            shortfall=max(total - room, 1),
        )
    per, mm = sp
    dm: Any = device_map if device_map is not None else "balanced"
    pl = Placement(
        dm,
        tuple(devs),
        max_memory={d.removeprefix("cuda:"): v for d, v in mm.items()},
        reasons=(
            f"split over {len(devs)} GPUs, layers balanced within each device's budget",
            *(_gpu_line(g, caps) for g in caps.gpus if f"cuda:{g.index}" in devs),
        ),
    )
    return Fit(True, pl, per, {d: budget[d] for d in devs})


def _offload(bd: Breakdown, budget: dict[str, int], devs: list[str], fails: tuple[str, ...]) -> Fit:
    """GPUs take what fits, the CPU (then disk) the rest; accelerate moves offloaded layers in on use."""
    lb = max(bd.layer_bytes, 1)
    off: dict[str, int] = {}
    first_left = False
    left = bd.layers
    mm2: dict[str, int] = {}
    for i, d in enumerate(devs):
        fixed = CUDA_CONTEXT_BYTES + bd.every_device + (bd.first_bytes if i == 0 else 0)
        n = max(min((budget[d] - fixed) // lb, left), 0)
        if budget[d] < fixed:
            if i == 0:
                first_left = True
            continue
        off[d] = fixed + n * bd.layer_bytes
        mm2[d.removeprefix("cuda:")] = budget[d] - CUDA_CONTEXT_BYTES - bd.every_device
        left -= n
    cpu_need = left * bd.layer_bytes + bd.last_bytes + (bd.first_bytes if first_left else 0)
    bud = {d: budget[d] for d in off}
    off["cpu"] = min(cpu_need, budget["cpu"])
    bud["cpu"] = budget["cpu"]
    if cpu_need > budget["cpu"]:
        off["disk"] = bud["disk"] = cpu_need - budget["cpu"]
    mm2["cpu"] = budget["cpu"]
    pl = Placement(
        "auto",
        tuple(off),
        offload=True,
        max_memory=mm2,
        reasons=(
            *fails,
            f"offload allowed: {left} of {bd.layers} layers go to "
            f"{'CPU and disk' if 'disk' in off else 'CPU'}"
            " memory and are copied in on every forward (much slower)",
        ),
    )
    return Fit(True, pl, off, bud)
