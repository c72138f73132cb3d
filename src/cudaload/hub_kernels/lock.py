"""A kernel lock: ``{repo: commit}`` of a plan's pinned Hub kernels, so a cluster loads exactly what was
tested."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .preflight import _HEX40

# ----------------------------------------------------------------------------------------------------
# Lock: repo -> commit, so a cluster loads exactly what was tested
# ----------------------------------------------------------------------------------------------------


def write_lock(plan_or_kernels_plan: Any, path: str | os.PathLike[str]) -> dict[str, str]:
    """Write ``{repo: commit}`` of the plan's pinned Hub kernels to ``path`` (JSON). Returns the lock."""
    from ..errors import ConfigurationError

    kp = getattr(plan_or_kernels_plan, "kernels", plan_or_kernels_plan)
    if not isinstance(kp, Mapping):
        raise ConfigurationError(
            "write_lock needs a Plan or a plan.kernels dict", fix="pass cudaload.plan(...) or its .kernels"
        )
    lock = {str(k): str(v) for k, v in sorted(dict(kp.get("lock") or {}).items())}
    unpinned = [
        e["repo"] for e in kp.get("entries", ()) if e.get("ok") and not e.get("local") and not e.get("pinned")
    ]
    if unpinned:
        raise ConfigurationError(
            f"cannot lock kernels that are not cached yet: {', '.join(sorted(set(unpinned)))}",
            fix="load once online (the kernels are downloaded then), plan again, and write the lock",
        )
    doc = {"cudaload_kernels_lock": 1, "kernels": lock}
    Path(path).write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return lock


def read_lock(path: str | os.PathLike[str]) -> dict[str, str]:
    """Read a lock written by :func:`write_lock`: ``{repo: commit}``."""
    from ..errors import ConfigurationError

    fix = "write it again with cudaload.hub_kernels.write_lock(plan, path)"
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        from ..errors import ModelNotFoundError

        raise ModelNotFoundError(f"kernel lock {path} does not exist", fix=fix) from None
    except (OSError, ValueError) as e:
        raise ConfigurationError(f"kernel lock {path} is unreadable: {e}", fix=fix) from None
    kernels = doc.get("kernels") if isinstance(doc, dict) else None
    if not isinstance(kernels, dict) or not all(
        isinstance(k, str) and isinstance(v, str) and _HEX40.match(v) for k, v in kernels.items()
    ):
        raise ConfigurationError(f"kernel lock {path} is not a cudaload kernel lock", fix=fix)
    return dict(kernels)
