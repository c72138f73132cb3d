"""The persistent cache of measured attention timings.

One JSON file, ``<cudaload cache>/attention-timings.json`` (``CUDALOAD_CACHE`` moves the directory, see
:func:`cudaload._env.cache_dir`), versioned by :data:`CACHE_VERSION`. An entry is keyed by the GPU (name
and compute capability), the package versions that decide attention speed (torch, transformers, every
installed flash-attn build), the model's attention signature and the work bucket: a torch upgrade or a
new FA4 build makes old entries unreachable instead of wrong. Writes are atomic (a temp file renamed
over the old one) and serialised by a process lock; a file that is corrupt, not ours or of another version
is ignored with a warning and replaced by the next write: a cache never makes loading fail.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import tempfile
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from .. import _env
from ..capabilities import Capabilities
from .signature import AttentionSignature, WorkBucket

logger = logging.getLogger(__name__)

#: 2: ``seconds`` are first-seen lengths (a new thread's empty plan caches), ``repeated_s`` beside them;
#: version 1 held one number per backend, measured mostly on repeated lengths
CACHE_VERSION = 2
CACHE_FILE = "attention-timings.json"
#: distributions whose version changes attention speed (besides torch and transformers)
ATTENTION_PACKAGES = ("flash-attn", "flash-attn-3", "flash-attn-4", "kernels")
_LOCK = threading.Lock()


def gpu_id(caps: Capabilities, device_index: int = 0) -> str:
    """``"NVIDIA H200/sm90"``; ``"cpu"`` on a machine without a GPU."""
    gpu = next((g for g in caps.gpus if g.index == device_index), None)
    return f"{gpu.name}/sm{gpu.sm}" if gpu else "cpu"


def package_versions(caps: Capabilities) -> dict[str, str]:
    """The versions an entry is valid for: torch, transformers and each installed attention package."""
    out = {"torch": caps.torch_version or "?", "transformers": caps.transformers_version or "?"}
    for p in caps.packages:
        if p.name in ATTENTION_PACKAGES and p.installed:
            out[p.name] = p.version or "?"
    return out


def versions_key(versions: Mapping[str, str]) -> str:
    return ",".join(f"{k}={versions[k]}" for k in sorted(versions))


def entry_key(gpu: str, versions: Mapping[str, str], sig: AttentionSignature, work: WorkBucket) -> str:
    return f"{gpu}|{versions_key(versions)}|{sig.key()}|{work.key()}"


@dataclass(frozen=True)
class Entry:
    """One measurement: backend -> median seconds of the work's generate() call on lengths the process had
    not met (what a new process meets), the same on repeated lengths, and where it came from."""

    gpu: str
    versions: Mapping[str, str]
    signature: AttentionSignature
    work: WorkBucket
    seconds: Mapping[str, float]
    date: str  # ISO date (UTC) of the measurement
    #: backend -> seconds the first call paid beyond a steady one in the measuring process (JIT, compile)
    first_call_s: Mapping[str, float] = field(default_factory=dict)
    #: the exact work timed (batch, prompt, new tokens, padding), model name, samples: for people
    detail: Mapping[str, Any] = field(default_factory=dict)
    #: backend -> median seconds on lengths the measuring thread had already run
    repeated_s: Mapping[str, float] = field(default_factory=dict)

    @property
    def key(self) -> str:
        return entry_key(self.gpu, self.versions, self.signature, self.work)

    def to_dict(self) -> dict[str, Any]:
        return {
            "gpu": self.gpu,
            "versions": dict(self.versions),
            "signature": self.signature.to_dict(),
            "work": self.work.to_dict(),
            "seconds": dict(self.seconds),
            "date": self.date,
            "first_call_s": dict(self.first_call_s),
            "detail": dict(self.detail),
            "repeated_s": dict(self.repeated_s),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Entry:
        return cls(
            gpu=str(d["gpu"]),
            versions={str(k): str(v) for k, v in d["versions"].items()},
            signature=AttentionSignature.from_dict(d["signature"]),
            work=WorkBucket.from_dict(d["work"]),
            seconds={str(k): float(v) for k, v in d["seconds"].items()},
            date=str(d["date"]),
            first_call_s={str(k): float(v) for k, v in (d.get("first_call_s") or {}).items()},
            detail=dict(d.get("detail") or {}),
            repeated_s={str(k): float(v) for k, v in (d.get("repeated_s") or {}).items()},
        )


class TimingCache:
    """The on-disk cache. ``path`` defaults to ``<cudaload cache dir>/attention-timings.json``."""

    def __init__(self, path: str | os.PathLike[str] | None = None) -> None:
        self.path = os.fspath(path) if path is not None else os.path.join(_env.cache_dir(), CACHE_FILE)

    def _read(self) -> dict[str, Any]:
        """The raw entries; {} for a missing file, and for an unusable one (with a warning)."""
        try:
            with open(self.path, encoding="utf-8") as f:
                data = json.load(f)
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as e:
            logger.warning("ignoring the attention timing cache %s: unreadable (%s)", self.path, e)
            return {}
        if not isinstance(data, dict) or not isinstance(data.get("entries"), dict):
            logger.warning("ignoring the attention timing cache %s: not a cudaload timing cache", self.path)
            return {}
        if data.get("version") != CACHE_VERSION:
            logger.warning(
                "ignoring the attention timing cache %s: version %r, this cudaload reads version %d "
                "(the next `cudaload tune` rewrites it)",
                self.path,
                data.get("version"),
                CACHE_VERSION,
            )
            return {}
        entries: dict[str, Any] = data["entries"]
        return entries

    def entries(self) -> Iterator[Entry]:
        """Every readable entry; a malformed one is skipped with a warning."""
        with _LOCK:
            raw = self._read()
        for key, d in raw.items():
            try:
                yield Entry.from_dict(d)
            except (KeyError, TypeError, ValueError, AttributeError) as e:
                logger.warning("ignoring attention timing cache entry %r: %s", key, e)

    def get(self, key: str) -> Entry | None:
        return next((e for e in self.entries() if e.key == key), None)

    @contextlib.contextmanager
    def _file_lock(self) -> Iterator[None]:
        """Another process tuning at the same time must not drop this entry (read-modify-write)."""
        try:
            import fcntl
        except ImportError:  # pragma: no cover - not POSIX: the atomic rename still prevents corruption
            yield
            return
        d = os.path.dirname(self.path) or "."
        os.makedirs(d, exist_ok=True)
        # the lock is the cache's folder itself (flock works on a directory's descriptor on Linux): a lock file
        # beside the cache would stay behind after every run, and unlinking it after use would let a waiter and
        # a newcomer hold two different files' locks at once
        fd = os.open(d, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)

    def put(self, entry: Entry) -> bool:
        """Store ``entry`` (replacing one with the same key). False when the file cannot be written: a
        read-only home must not break tuning, the measurement is still returned."""
        try:
            with _LOCK, self._file_lock():
                return self._put(entry)
        except OSError as e:
            logger.warning("could not write the attention timing cache %s: %s", self.path, e)
            return False

    def _put(self, entry: Entry) -> bool:
        raw = self._read()
        raw[entry.key] = entry.to_dict()
        d = os.path.dirname(self.path) or "."
        fd, tmp = tempfile.mkstemp(dir=d, prefix=".timings-", suffix=".json")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump({"version": CACHE_VERSION, "entries": raw}, f, indent=1, sort_keys=True)
            os.replace(tmp, self.path)
        except BaseException:
            os.unlink(tmp)
            raise
        return True
