"""The Hub kernel repos in the local cache, their build variants and declared CUDA archs (filesystem
only: no kernels, torch or network). ``detect()`` records them in ``Capabilities.hub.cached_kernels``."""

from __future__ import annotations

import importlib
import json
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..capabilities import CachedKernel

logger = logging.getLogger(__name__)

# ----------------------------------------------------------------------------------------------------
# Cache scan (filesystem only)
# ----------------------------------------------------------------------------------------------------

#: Cache folder prefixes: huggingface_hub >= 1.x stores kernel repos as repo_type "kernel" ("kernels--");
#: older caches (and kernels 0.16) used the model layout ("models--"). kernels 0.17 reads both.
_CACHE_PREFIXES = ("kernels--", "models--")


def _read_refs(refs_dir: Path) -> dict[str, list[str]]:
    """commit -> ref names ("main", "v1", "pr/3"...), from the cache's refs/ files."""
    out: dict[str, list[str]] = {}
    if not refs_dir.is_dir():
        return out
    for root, _dirs, files in os.walk(refs_dir):
        for f in files:
            p = Path(root) / f
            try:
                commit = p.read_text(encoding="utf-8").strip()
            except (OSError, UnicodeDecodeError):
                continue
            if commit:
                out.setdefault(commit, []).append(p.relative_to(refs_dir).as_posix())
    return out


def _variant_archs(variant_dir: Path) -> tuple[str, ...]:
    """CUDA archs a build variant declares: metadata.json ``backend.archs`` when its backend is CUDA."""
    try:
        meta = json.loads((variant_dir / "metadata.json").read_text(encoding="utf-8"))
    except (OSError, ValueError, UnicodeDecodeError):
        return ()
    backend = meta.get("backend") if isinstance(meta, dict) else None
    if not isinstance(backend, dict) or backend.get("type") != "cuda":
        return ()
    archs = backend.get("archs")
    if not isinstance(archs, list):
        return ()
    return tuple(str(a) for a in archs)


def _build_toml_archs(snapshot: Path) -> tuple[str, ...]:
    """Older builds carry no metadata archs; kernel-builder's build.toml lists ``cuda-capabilities``."""
    path = snapshot / "build.toml"
    if not path.is_file():
        return ()
    try:
        tomllib: Any = importlib.import_module("tomllib")
    except ImportError:  # Python 3.10: no TOML reader in the standard library; archs stay unknown
        return ()
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, UnicodeDecodeError):
        return ()
    found: list[str] = []
    for section in data.values():
        if not isinstance(section, dict):
            continue
        for entry in section.values():
            caps = entry.get("cuda-capabilities") if isinstance(entry, dict) else None
            if isinstance(caps, list):
                found.extend(str(c) for c in caps)
    return tuple(dict.fromkeys(found))


def _scan_snapshot(repo_id: str, snapshot: Path, refs: Mapping[str, list[str]]) -> CachedKernel | None:
    build = snapshot / "build"
    if not build.is_dir():
        return None  # a model (or dataset) snapshot, not a kernel
    variants: list[str] = []
    archs: list[str] = []
    for entry in sorted(os.scandir(build), key=lambda e: e.name):
        if not entry.is_dir():
            continue
        variants.append(entry.name)
        archs.extend(_variant_archs(Path(entry.path)))
    if not archs:
        archs.extend(_build_toml_archs(snapshot))
    return CachedKernel(
        repo_id=repo_id,
        revision=snapshot.name,
        refs=tuple(sorted(refs.get(snapshot.name, ()))),
        variants=tuple(variants),
        cuda_capabilities=tuple(dict.fromkeys(archs)),
        path=str(snapshot),
    )


def scan_cache(cache_dir: str) -> tuple[CachedKernel, ...]:
    """Hub kernel repos present in the local HF cache at ``cache_dir``: one entry per cached revision.

    Filesystem only (no kernels, torch or network); odd cache contents are skipped, never raised.
    """
    root = Path(cache_dir)
    found: dict[tuple[str, str], CachedKernel] = {}
    try:
        entries = sorted(os.scandir(root), key=lambda e: e.name)
    except OSError:
        return ()
    for entry in entries:
        prefix = next((p for p in _CACHE_PREFIXES if entry.name.startswith(p)), None)
        if prefix is None:
            continue
        try:
            if not entry.is_dir():
                continue
            org, sep, name = entry.name[len(prefix) :].partition("--")
            if not sep or not org or not name:
                continue
            repo_id = f"{org}/{name}"
            repo_dir = Path(entry.path)
            snapshots = repo_dir / "snapshots"
            if not snapshots.is_dir():
                continue
            refs = _read_refs(repo_dir / "refs")
            for snap in sorted(os.scandir(snapshots), key=lambda e: e.name):
                if not snap.is_dir():
                    continue
                ck = _scan_snapshot(repo_id, Path(snap.path), refs)
                # the "kernels--" layout wins over a legacy "models--" copy of the same revision
                if ck is not None and (repo_id, ck.revision) not in found:
                    found[(repo_id, ck.revision)] = ck
        except OSError as e:  # permissions, races with a concurrent download: skip that repo
            logger.debug("skipping %s in the Hub cache: %s", entry.name, e)
    return tuple(sorted(found.values(), key=lambda k: (k.repo_id, k.revision)))
