"""``hardware=``, and whether the machine planned for has a GPU, where that is cheap to know."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from .. import _env
from ..errors import ConfigurationError

if TYPE_CHECKING:
    from ..capabilities import Capabilities


def this_machine_has_no_gpu(env: Mapping[str, str] | None) -> bool:
    """No NVIDIA driver here (two stats): :func:`has_no_gpu` for this machine, whatever CUDA_VISIBLE_DEVICES says."""
    from ..detection.nvml import driver_absent

    return driver_absent()


def has_no_gpu(hardware: Capabilities | None, env: Mapping[str, str] | None) -> bool:
    """Whether the machine planned for certainly has no GPU, where that is cheap to know."""
    if hardware is not None:
        return not hardware.gpus
    cvd = _env.cuda_visible_devices(env)
    if cvd is not None and (cvd.strip() == "" or cvd.strip().startswith("-")):
        return True
    from ..detection.nvml import driver_absent

    return driver_absent()


def check_hardware(value: Any, entry: str) -> Capabilities | None:
    """The snapshot ``hardware`` names (None: this machine, detected when planning)."""
    from ..capabilities import Capabilities

    if value is None:
        return None
    # _snapshot refuses what is neither a name nor a path, with the form that was meant
    caps = value if isinstance(value, Capabilities) else _snapshot(value)
    if entry != "plan" and caps.source.startswith("profile:"):
        raise ConfigurationError(
            f"{entry}() runs on this machine, not on {caps.source}",
            fix="use cudaload.plan(..., hardware=...) to plan for other hardware, or leave hardware= out",
        )
    return caps


def _snapshot(spec: str | os.PathLike[str]) -> Capabilities:
    """A profile name or a ``cudaload env --json`` file, as ``cudaload.hardware`` reads and checks it."""
    from ..profiles import hardware

    return hardware(spec)
