"""Whether the packages a load imports have cached bytecode, so that a new process does not compile them.

Python imports a module from its cached bytecode (``__pycache__/NAME.cpython-XY.pyc``, or under
``PYTHONPYCACHEPREFIX``) when the cache matches the source, and otherwise compiles the source and, unless
``PYTHONDONTWRITEBYTECODE`` is set or the folder is read-only, writes the cache for the next process. pip
compiles a wheel's modules when it installs them; ``uv pip install`` does not unless asked
(``--compile-bytecode``), and container images often set ``PYTHONDONTWRITEBYTECODE=1``. With both, every new
process compiles torch's and transformers' modules from source again: on the H200 machine (uv-built, torch
without caches, the variable set) a fresh process compiles 1,717 modules, and a fresh 8B ``load_model()`` takes
14.84 s, 9.07 s with the caches ``cudaload precompile`` writes; plain ``from_pretrained`` 16.48 / 11.17 s (n=4
interleaved; measured: benchmarks/results/2026-12-01-h200/README.md).

:func:`probe` looks, with a few ``stat`` calls and 16-byte reads and without importing anything, at a fixed
sample of modules every load imports; :func:`finding_text` turns the result into a detection finding.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from dataclasses import dataclass
from pathlib import Path

#: Modules every ``load_model`` imports (transformers' model base, the config and generation machinery, torch's
#: core), relative to their package folder: a sample, not a census (listing torch's 2,000+ files would cost
#: more than the probe is worth). A file missing in some version is skipped.
SAMPLE: dict[str, tuple[str, ...]] = {
    "torch": ("__init__.py", "_tensor.py", "functional.py", "nn/modules/module.py", "_dynamo/__init__.py"),
    "transformers": (
        "__init__.py",
        "modeling_utils.py",
        "configuration_utils.py",
        "generation/utils.py",
        "utils/import_utils.py",
    ),
    "huggingface_hub": ("__init__.py", "file_download.py"),
    "accelerate": ("__init__.py", "big_modeling.py"),
}


@dataclass(frozen=True)
class PackageBytecode:
    """One package's sample: how many modules were looked at, how many have a cache that matches the source,
    and whether this process could write the missing ones (the next process then reads them)."""

    name: str
    sampled: int
    cached: int
    writable: bool

    @property
    def recompiled_every_process(self) -> bool:
        return self.cached < self.sampled and not self.writable


@dataclass(frozen=True)
class BytecodeState:
    dont_write: bool  # sys.dont_write_bytecode (PYTHONDONTWRITEBYTECODE or -B)
    prefix: str | None  # sys.pycache_prefix (PYTHONPYCACHEPREFIX or -X pycache_prefix)
    packages: tuple[PackageBytecode, ...]

    @property
    def uncached(self) -> tuple[PackageBytecode, ...]:
        """The packages whose sampled modules a new process compiles from source, every time."""
        return tuple(p for p in self.packages if p.recompiled_every_process)


def cache_matches(source: str | os.PathLike[str]) -> bool:
    """Whether the bytecode cache Python would read for ``source`` exists and matches it.

    The header is what importlib checks (CPython Lib/importlib/_bootstrap_external.py ``_classify_pyc`` and
    ``_validate_timestamp_pyc``): the magic number of this interpreter, then flags; a timestamp cache (flags 0)
    holds the source's mtime and size, each mod 2**32. A hash-based cache (flags bit 0) holds the source's hash,
    compared when its check_source bit (1) is set, as importlib compares it; an unchecked one is read as is."""
    try:
        cache = importlib.util.cache_from_source(os.fspath(source))
        with open(cache, "rb") as fh:
            head = fh.read(16)
        st = os.stat(source)
    except (OSError, NotImplementedError, ValueError):
        return False
    if len(head) < 16 or head[:4] != importlib.util.MAGIC_NUMBER:
        return False
    flags = int.from_bytes(head[4:8], "little")
    if flags & ~0b11:  # reserved bits: importlib rejects the file
        return False
    if flags & 0b1:  # hash-based: unchecked is read as it is; checked is compared with the source's hash
        if not flags & 0b10:
            return True
        try:
            return head[8:16] == importlib.util.source_hash(Path(source).read_bytes())
        except OSError:
            return False
    mtime = int.from_bytes(head[8:12], "little")
    size = int.from_bytes(head[12:16], "little")
    return mtime == (int(st.st_mtime) & 0xFFFFFFFF) and size == (st.st_size & 0xFFFFFFFF)


def _writable(source: Path) -> bool:
    """Whether Python could write the cache of ``source`` where it would look for it (its ``__pycache__``, or
    the mirror of its folder under the prefix)."""
    if sys.dont_write_bytecode:
        return False
    try:
        target = Path(importlib.util.cache_from_source(str(source))).parent
    except (NotImplementedError, ValueError):
        return False
    return can_create(target)


def can_create(folder: Path) -> bool:
    """Whether ``folder`` can be written, or created: Python (and compileall) make the missing folders, so
    what matters is the first one that exists."""
    while not folder.exists():
        if folder.parent == folder:
            return False
        folder = folder.parent
    return os.access(folder, os.W_OK)


def package_folder(name: str) -> Path | None:
    """The folder of an installed top-level package, found without importing it (None: not installed)."""
    from .versions import package_locations

    locations = package_locations(name)
    return locations[0] if locations else None


def probe(sample: dict[str, tuple[str, ...]] | None = None) -> BytecodeState:
    """The bytecode state of the sampled packages that are installed (impure: the file system)."""
    out: list[PackageBytecode] = []
    for name, files in (SAMPLE if sample is None else sample).items():
        folder = package_folder(name)
        if folder is None:
            continue
        present = [folder / f for f in files if (folder / f).is_file()]
        if not present:
            continue
        missing = [f for f in present if not cache_matches(f)]
        # a package is as writable as the least writable folder a missing cache would go to
        writable = all(_writable(f) for f in missing)
        out.append(PackageBytecode(name, len(present), len(present) - len(missing), writable))
    return BytecodeState(bool(sys.dont_write_bytecode), sys.pycache_prefix, tuple(out))


def finding_text(state: BytecodeState) -> tuple[str, str] | None:
    """(message, fix) when a new process compiles the sampled packages from source; None otherwise."""
    bad = state.uncached
    if not bad:
        return None
    names = ", ".join(p.name for p in bad)
    counts = "; ".join(f"{p.name} {p.sampled - p.cached} of {p.sampled}" for p in bad)
    why = (
        "PYTHONDONTWRITEBYTECODE (or -B) keeps Python from writing it"
        if state.dont_write
        else "their cache folders are not writable"
    )
    where = f" under PYTHONPYCACHEPREFIX={state.prefix}" if state.prefix else ""
    return (
        f"{names} {'has' if len(bad) == 1 else 'have'} no up-to-date cached bytecode{where} (sampled modules "
        f"without it: {counts}) and {why}: every new process compiles {'its' if len(bad) == 1 else 'their'} "
        "modules from source again (on the H200 machine, torch without caches: a fresh 8B load_model() took "
        "14.8 s, 9.1 s after `cudaload precompile`)",
        (
            "run `cudaload precompile` once (it byte-compiles the packages a load imports, as pip does at "
            "install); with uv, install with --compile-bytecode (or UV_COMPILE_BYTECODE=1)"
            if state.dont_write
            else "run `cudaload precompile --prefix DIR` once (DIR writable, absolute) and set "
            "PYTHONPYCACHEPREFIX=DIR for the processes that load, or precompile as the installation's owner"
        ),
    )
