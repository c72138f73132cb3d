"""``cudaload precompile``: byte-compile the packages a load imports, once, as pip does when it installs.

Where they have no cached bytecode and Python may not write it (``PYTHONDONTWRITEBYTECODE=1``, a read-only
install; typical of uv-built container images), every new process compiles torch's and transformers' modules
from source again before anything loads (:mod:`cudaload.detection.bytecode`, finding ``bytecode-uncached``).
Compiling them once removes that from every later process. Nothing here runs unless asked: ``load_model``
never writes into an installation.

Which packages: the top-level packages a fresh interpreter has imported after importing what every
``load_model`` imports (torch, transformers' model base and auto classes, generation, accelerate, peft and
cudaload itself where installed), found in a child process so the caller imports none of them; then every
module of those packages is compiled (a model's own module, ``modeling_qwen3``, is in transformers' folder),
by ``python -m compileall`` in a child process, in parallel. The standard library is left alone: the
interpreter's installer compiles it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .errors import ConfigurationError, LoadError

#: What the child imports: what ``load_model`` imports on every load (execute.load_model's
#: ``from transformers import AutoConfig, PreTrainedModel``, the auto class, generate()), and the optional
#: packages a plan may import, where installed.
_IMPORTS = r"""
import importlib, json, sys, sysconfig
import torch
import transformers
from transformers import AutoConfig, PreTrainedModel, AutoModelForCausalLM, GenerationMixin
for optional in ("accelerate", "peft", "cudaload.execute", "cudaload.planner"):
    try:
        importlib.import_module(optional)
    except Exception:
        pass
std = {sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib")}
out = {}
for name, mod in list(sys.modules.items()):
    top = name.partition(".")[0]
    if top in out or name != top:
        continue
    locations = list(getattr(getattr(mod, "__spec__", None), "submodule_search_locations", None) or [])
    if not locations:
        continue
    folder = str(locations[0])
    if any(folder == s or folder.startswith(s.rstrip("/") + "/") for s in std) and "-packages" not in folder:
        continue
    out[top] = folder
print(json.dumps(out))
"""


@dataclass(frozen=True)
class PrecompileReport:
    """What ``precompile`` did: the package folders it compiled, where the caches went, how long it took."""

    packages: dict[str, str]  # top-level package -> folder
    prefix: str | None  # PYTHONPYCACHEPREFIX the caches were written under (None: next to the sources)
    seconds: float
    returncode: int
    errors: list[str] = field(
        default_factory=list
    )  # files that did not compile (left to be compiled on import)

    @property
    def ok(self) -> bool:
        """compileall finished, and any failure was a file it named (compileall exits 1 for those too)."""
        return self.returncode == 0 or bool(self.errors)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def summary(self) -> str:
        where = f"under {self.prefix}" if self.prefix else "next to the sources (__pycache__)"
        lines = [
            f"byte-compiled {len(self.packages)} packages in {self.seconds:.1f} s, caches {where}: "
            + ", ".join(sorted(self.packages))
        ]
        if self.errors:
            lines.append(
                f"{len(self.errors)} files did not compile (Python compiles them if they are imported):"
            )
            lines.extend(f"  {e}" for e in self.errors[:10])
        if self.prefix:
            lines.append(f"new processes read these caches with PYTHONPYCACHEPREFIX={self.prefix} set")
        return "\n".join(lines)


def _child_env(prefix: str | None) -> dict[str, str]:
    env = dict(os.environ)
    if prefix:
        env["PYTHONPYCACHEPREFIX"] = prefix
    return env


def load_packages(python: str = sys.executable, env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The top-level packages (name -> folder) a load imports, outside the standard library."""
    proc = subprocess.run(
        [python, "-c", _IMPORTS],
        env=dict(os.environ if env is None else env),
        capture_output=True,
        text=True,
        timeout=600,
    )
    if proc.returncode != 0:
        raise LoadError(
            "could not import what a load imports, to find the packages to compile: "
            + (proc.stderr.strip().splitlines() or ["(no output)"])[-1],
            fix="check that torch and transformers import in this environment (`cudaload doctor`)",
        )
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def _check_writable(folders: Sequence[str], prefix: str | None) -> None:
    if prefix:
        target = Path(prefix)
        while not target.exists() and target.parent != target:
            target = target.parent
        if not os.access(target, os.W_OK):
            raise ConfigurationError(
                f"cannot write bytecode caches under {prefix}", fix="pass a writable folder as --prefix"
            )
        return
    readonly = [f for f in folders if not os.access(f, os.W_OK)]
    if readonly:
        raise ConfigurationError(
            f"cannot write bytecode caches next to the sources of {len(readonly)} package folders "
            f"(read-only: {', '.join(readonly[:3])})",
            fix="pass --prefix DIR (a writable folder) and set PYTHONPYCACHEPREFIX=DIR for the processes "
            "that load, or run precompile as the user that installed the packages",
        )


def precompile(
    packages: Sequence[str] | None = None,
    *,
    prefix: str | os.PathLike[str] | None = None,
    workers: int = 0,
    python: str = sys.executable,
) -> PrecompileReport:
    """Byte-compile ``packages`` (top-level names; default: those a load imports, :func:`load_packages`).

    ``prefix``: write the caches under this folder (a ``PYTHONPYCACHEPREFIX`` tree) instead of next to the
    sources, for a read-only installation; processes then need ``PYTHONPYCACHEPREFIX`` set to it. Default:
    the ``PYTHONPYCACHEPREFIX`` of this environment if set, else next to the sources. ``workers``: compile
    processes (0: one per CPU). Raises :class:`~cudaload.errors.ConfigurationError` before compiling anything
    when the caches cannot be written, or a named package is not installed."""
    pre = os.fspath(prefix) if prefix is not None else (sys.pycache_prefix or None)
    env = _child_env(pre)
    t0 = time.perf_counter()
    if packages is None:
        found = load_packages(python, env)
    else:
        from .detection.bytecode import package_folder

        found = {}
        missing = []
        for name in packages:
            folder = package_folder(name)
            if folder is None:
                missing.append(name)
            else:
                found[name] = str(folder)
        if missing:
            raise ConfigurationError(
                f"not installed as packages here: {', '.join(missing)}",
                fix="name installed top-level packages (torch, transformers, ...), or leave --packages out",
            )
    folders = sorted(set(found.values()))
    _check_writable(folders, pre)
    # -q: errors only; -j: parallel; compileall skips what is already up to date
    proc = subprocess.run(
        [python, "-m", "compileall", "-q", "-j", str(max(0, workers)), *folders],
        env=env,
        capture_output=True,
        text=True,
    )
    # "*** Error compiling 'PATH'..." then the SyntaxError: a file written for another Python version (torch
    # ships py312_intrinsics.py, which 3.11 cannot parse) is skipped as pip skips it at install
    errors = [
        line.strip().removeprefix("*** Error compiling ").rstrip(".").strip("'")
        for line in (proc.stdout + proc.stderr).splitlines()
        if line.startswith("*** Error compiling")
    ]
    return PrecompileReport(
        packages=found,
        prefix=pre,
        seconds=round(time.perf_counter() - t0, 3),
        returncode=proc.returncode,
        errors=errors,
    )
