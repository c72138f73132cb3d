"""One-step attention probes, cached per GPU and package versions.

transformers does not check a flash package against the GPU it runs on (FA2 on a T4 fails at the first
forward), and a compiled package can import yet fail when called. After loading, cudaload runs one tiny
forward with the chosen backend. Verdicts are cached on disk per (GPU, backend, versions) so the probe costs
one forward per machine and upgrade, not one per load; sdpa and eager are part of torch and never probed.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import threading
from typing import TYPE_CHECKING, Any

from ... import _env
from ...capabilities import Capabilities

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)

#: torch's own kernels: nothing to probe (cudaload's sdpa variants are sdpa with one backend switched off)
_NEVER_PROBED = {"sdpa", "eager", "cudaload_sdpa", "cudaload_sdpa_nocudnn"}
_LOCK = threading.Lock()
_CACHE_FILE = "attention-probes.json"


def probe_key(backend: str, caps: Capabilities, device: str) -> str:
    gpu = None
    if device.startswith("cuda"):
        index = int(device.split(":")[1]) if ":" in device else 0
        gpu = next((g for g in caps.gpus if g.index == index), None)
    pkgs = ",".join(f"{p.name}={p.version}" for p in caps.packages if p.installed)
    where = f"{gpu.name}/sm{gpu.sm}" if gpu else device
    return f"{backend}|{where}|torch={caps.torch_version}|transformers={caps.transformers_version}|{pkgs}"


def _cache_path() -> str:
    return os.path.join(_env.cache_dir(), _CACHE_FILE)


def _read_cache() -> dict[str, Any]:
    try:
        with open(_cache_path(), encoding="utf-8") as f:
            data = json.load(f)
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def _write_cache(key: str, verdict: dict[str, Any]) -> None:
    """Atomic: a crash mid-write never leaves a half-written cache behind."""
    path = _cache_path()
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        data = _read_cache()
        data[key] = verdict
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".probe-", suffix=".json")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(data, f, indent=1, sort_keys=True)
            os.replace(tmp, path)
        except BaseException:
            os.unlink(tmp)
            raise
    except OSError as e:  # a read-only home must not break loading
        logger.debug("could not write the probe cache %s: %s", path, e)


def _first_device(model: Any) -> torch.device:
    for p in model.parameters():
        if p.device.type != "meta":
            device: torch.device = p.device
            return device
    import torch

    return torch.device("cpu")


def run_forward(model: Any) -> None:
    """A tiny forward (batch 1, 8 tokens) that exercises the attention path."""
    import torch

    device = _first_device(model)
    vocab = int(getattr(model.config, "vocab_size", 8) or 8)
    ids = torch.arange(8, device=device).remainder(max(vocab, 1)).unsqueeze(0)
    with torch.no_grad():
        model(input_ids=ids, attention_mask=torch.ones_like(ids))
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def attention_works(model: Any, backend: str, caps: Capabilities, *, force: bool = False) -> tuple[bool, str]:
    """(works, reason). ``force`` runs the forward even when a cached verdict exists (a warm-up)."""
    if backend in _NEVER_PROBED and not force:
        return True, f"{backend} is part of torch"
    device = str(_first_device(model))
    key = probe_key(backend, caps, device)
    with _LOCK:
        cached = _read_cache().get(key)
    if cached is not None and not force:
        ok = bool(cached.get("ok"))
        return ok, "cached verdict: passed" if ok else f"cached verdict: {cached.get('reason')}"
    try:
        run_forward(model)
    except Exception as e:  # any failure of the backend counts: the next candidate is tried
        reason = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]
        verdict = {"ok": False, "reason": reason}
        with _LOCK:
            _write_cache(key, verdict)
        return False, reason
    with _LOCK:
        _write_cache(key, {"ok": True})
    return True, "one-step forward passed"
