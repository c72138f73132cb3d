"""``device_map=`` and ``max_memory=``: devices and sizes as placement reads them, and the GPUs they name against the
machine planned for (:func:`check_devices`)."""

from __future__ import annotations

import numbers
import re
from collections.abc import Mapping
from typing import Any

from .. import _env
from ..errors import ConfigurationError, close_names
from .fields import RequestFields

_DEVICE = re.compile(r"^cuda(:\d+)?$")


def _size(key: Any, value: Any) -> int:
    """Bytes of a max_memory value, as policies.placement.parse_size reads them (numpy ints taken as ints)."""
    from ..policies.placement import parse_size

    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        value = int(value)
    if isinstance(value, (int, float, str)) and not isinstance(value, bool):
        try:
            return parse_size(value)
        except ConfigurationError:
            pass
    raise ConfigurationError(
        f"max_memory[{key!r}]={value!r} is not a size",
        fix=f"give bytes or a size with a unit: max_memory={{{key!r}: '20GiB'}}",
    )


def _memory_key(key: Any) -> str:
    if isinstance(key, numbers.Integral) and not isinstance(key, bool) and int(key) >= 0:
        return f"cuda:{int(key)}"
    if isinstance(key, str):
        k = key.strip()
        if k.isdigit():
            return f"cuda:{k}"
        if k in ("cpu", "disk") or re.fullmatch(r"cuda:\d+", k):
            return k
    raise ConfigurationError(
        f"max_memory key {key!r} is not a device",
        fix="key it by GPU index, 'cpu' or 'disk': max_memory={0: '20GiB', 'cpu': '64GiB'}",
    )


def check_max_memory(value: Any) -> Mapping[Any, Any] | None:
    if value is None:
        return None
    if not isinstance(value, Mapping):
        try:
            _size(0, value)
            example = f"{{0: {value!r}}}"  # a size for one GPU: keyed by its index
        except ConfigurationError:
            example = "{0: '20GiB'}"
        raise ConfigurationError(
            f"max_memory={value!r} is not a dict of device -> size",
            fix=f"pass max_memory={example} (GPU index or 'cpu' -> bytes or '20GiB')",
        )
    for k, v in value.items():
        _memory_key(k)
        _size(k, v)
    return dict(value)


def max_memory_bytes(max_memory: Mapping[Any, Any] | None) -> dict[Any, int]:
    return {k: _size(k, v) for k, v in (max_memory or {}).items()}


def _device(where: str, value: Any) -> None:
    """One device of a device_map: a GPU index, 'cuda' / 'cuda:N', 'cpu', 'disk' or a torch.device."""
    if isinstance(value, numbers.Integral) and not isinstance(value, bool) and int(value) >= 0:
        return
    text = str(value) if type(value).__name__ == "device" else value  # torch.device, without importing torch
    if isinstance(text, str) and (text in ("cpu", "disk", "meta") or _DEVICE.match(text)):
        return
    raise ConfigurationError(
        f"{where}={value!r} is not a device cudaload places on",
        fix="use a GPU index (0), 'cuda:0', 'cpu' or 'disk'",
    )


def check_device_map(value: Any) -> Any:
    if value is None:
        return None
    if isinstance(value, str):
        from ..policies.placement import SPLIT_MAPS

        if value in SPLIT_MAPS or value in ("cpu", "cuda") or _DEVICE.match(value):
            return value
        names = (*SPLIT_MAPS, "cpu", "cuda")
        index = re.search(r"\d+", value)
        # "gpu", "GPU:1", "cuda1": a GPU meant, whatever the letters' distance to "cpu"
        meant = f"cuda:{index.group()}" if index else "cuda" if re.search(r"gpu|cuda", value, re.I) else None
        close = [meant] if meant else close_names(value, names, n=1)
        raise ConfigurationError(
            f"device_map={value!r} is not a device map cudaload plans"
            + (f"; did you mean {close[0]!r}?" if close else ""),
            fix=f"use device_map={(close or ['auto'])[0]!r} (a GPU 'cuda:N', 'cpu', or one of: {', '.join(SPLIT_MAPS)})",
        )
    if isinstance(value, Mapping):
        for k, v in value.items():
            if not isinstance(k, str):
                raise ConfigurationError(
                    f"device_map key {k!r} is not a module name",
                    fix="key it by module name: device_map={'': 0}",
                )
            _device(f"device_map[{k!r}]", v)
        return dict(value)
    _device("device_map", value)
    return value


def names_cuda(device_map: Any) -> bool:
    if device_map is None:
        return False
    values = device_map.values() if isinstance(device_map, Mapping) else [device_map]
    for v in values:
        if isinstance(v, numbers.Integral) and not isinstance(v, bool):
            return True
        if str(v).startswith("cuda"):
            return True
    return False


def check_devices(req: RequestFields, caps: Any) -> None:
    """The GPUs ``req``'s device_map and max_memory name, against the machine ``caps`` it is planned for: an index
    it lacks, or a GPU on a machine with none, refused with the indices it has (the request checks a snapshot it
    was given; the planner the machine it detected)."""
    named = _gpu_indices(req.device_map) | {
        i
        for k, size in max_memory_bytes(req.max_memory).items()
        if size > 0
        for i in _gpu_indices(_memory_key(k))
    }
    if not named:
        return
    from ..errors import DeviceSelectionError

    where = "max_memory" if not _gpu_indices(req.device_map) else f"device_map={req.device_map!r}"
    machine = "this machine" if caps.source == "detected" else f"hardware={caps.source.split(':', 1)[-1]!r}"
    if caps.gpus:
        have = sorted(g.index for g in caps.gpus)
        lacking = sorted(named - set(have))
        if not lacking:
            return
        span = f"cuda:{have[0]}" if len(have) == 1 else f"cuda:{have[0]}..cuda:{have[-1]}"
        profile = caps.source.removeprefix("profile:") if caps.source.startswith("profile:") else None
        card = re.sub(r"^\d+x", "", profile) if profile else None
        cvd = _env.cuda_visible_devices(req.env) if caps.source == "detected" else None
        raise DeviceSelectionError(
            f"{where} names cuda:{lacking[0]}, and {machine} has {len(have)} GPU{'s' if len(have) > 1 else ''} "
            f"({span})",
            fix=f"use {span}"
            + (f", or plan for {lacking[-1] + 1} GPUs: hardware='{lacking[-1] + 1}x{card}'" if card else "")
            # torch numbers the GPUs CUDA_VISIBLE_DEVICES lets through from 0: the others are hidden, not absent
            + (f", or let more GPUs through CUDA_VISIBLE_DEVICES={cvd!r}" if cvd else ""),
        )
    if where == "max_memory":
        # placement refuses a GPU key here, and its "use the indices torch sees" led back to the same error; a
        # device_map naming a GPU only warns (the model loads on the CPU: suspicious.warn_suspicious)
        rest = {k: v for k, v in (req.max_memory or {}).items() if not _gpu_indices(_memory_key(k))}
        raise DeviceSelectionError(
            f"max_memory names cuda:{min(named)}, and {machine} has no GPU",
            fix=(f"drop the GPU entries: max_memory={rest!r}" if rest else "leave max_memory out")
            + " (the model loads on the CPU), or plan for a GPU: hardware='H100'",
        )


def _gpu_indices(device_map: Any) -> set[int]:
    """The GPU indices a device_map (or one max_memory key, as _memory_key spells it) names: ``cuda`` is 0."""
    if device_map is None:
        return set()
    values = device_map.values() if isinstance(device_map, Mapping) else [device_map]
    out: set[int] = set()
    for v in values:
        if isinstance(v, numbers.Integral) and not isinstance(v, bool):
            out.add(int(v))
            continue
        m = re.fullmatch(r"cuda(?::(\d+))?", str(v))
        if m:
            out.add(int(m.group(1) or 0))
    return out
