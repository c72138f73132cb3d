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
by ``python -m compileall`` in a child process, in parallel. The standard library is left alone in place (the
interpreter's installer compiles it), but compiled into a prefix: Python then reads every module's cache,
the standard library's included, from the prefix only. (The module is ``bytecache`` so that
``cudaload.precompile`` stays the function.)
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from ..errors import ConfigurationError, LoadError

#: What the child imports: what ``load_model`` imports on every load (execute.load_model's
#: ``from transformers import AutoConfig, PreTrainedModel``, the auto class, generate()), and the optional
#: packages a plan may import, where installed.
_IMPORTS = r"""
import importlib, sys
import torch
import transformers
from transformers import AutoConfig, PreTrainedModel, AutoModelForCausalLM, GenerationMixin
for optional in ("accelerate", "peft", "cudaload.execute", "cudaload.planner"):
    try:
        importlib.import_module(optional)
    except Exception:
        pass
names, outside_stdlib = sorted({n.partition(".")[0] for n in sys.modules}), True
"""


@dataclass(frozen=True)
class PrecompileReport:
    """What ``precompile`` did: the package folders it compiled, where the caches went, how long it took."""

    packages: dict[str, str]  # top-level package -> folder (or file, for a one-file module)
    prefix: str | None  # PYTHONPYCACHEPREFIX the caches were written under (None: next to the sources)
    seconds: float
    returncode: int
    stdlib: list[str] = field(default_factory=list)  # standard-library folders compiled too (under a prefix)
    # files that did not compile (Python compiles them if they are imported)
    errors: list[str] = field(default_factory=list)
    write_errors: list[str] = field(default_factory=list)  # caches that could not be written, with the cause
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """Every cache was written, except for files this Python cannot parse (compileall exits 1 for those)."""
        return not self.write_errors and (self.returncode == 0 or bool(self.errors))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def summary(self) -> str:
        where = f"under {self.prefix}" if self.prefix else "next to the sources (__pycache__)"
        lines = [
            f"byte-compiled {len(self.packages)} packages in {self.seconds:.1f} s, caches {where}: "
            + ", ".join(sorted(self.packages))
            + (f"; and the standard library ({', '.join(self.stdlib)})" if self.stdlib else "")
        ]
        if self.errors:
            lines.append(
                f"{len(self.errors)} files did not compile (Python compiles them if they are imported):"
            )
            lines.extend(f"  {e}" for e in self.errors[:10])
        if self.write_errors:
            lines.append(f"{len(self.write_errors)} caches could not be written:")
            lines.extend(f"  {e}" for e in self.write_errors[:10])
        lines.extend(self.notes)
        if self.prefix:
            lines.append(f"new processes read these caches with PYTHONPYCACHEPREFIX={self.prefix} set")
        return "\n".join(lines)


def _usable_cpus() -> int:
    """The CPUs this process may run on: compileall's ``-j 0`` is ``os.cpu_count()``, every CPU of the host,
    also inside a container limited to a few."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _child_env(prefix: str | None) -> dict[str, str]:
    env = dict(os.environ)
    if prefix:
        env["PYTHONPYCACHEPREFIX"] = prefix
    return env


#: Where top-level modules are (``names``), in the interpreter that will import them, without importing them
#: (find_spec of a top-level name runs no package code): a package's folder, or a one-file module's file;
#: with ``outside_stdlib`` the standard library's are left out (a venv's site-packages lies inside platstdlib).
_LOCATE = r"""
import importlib.util, json, sys, sysconfig
std = sorted({sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib")})
def in_std(path):
    return "-packages" not in path and any(path == s or path.startswith(s.rstrip("/") + "/") for s in std)
out = {}
for name in names:
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        spec = None
    if spec is None:
        continue
    if spec.submodule_search_locations:
        where = str(list(spec.submodule_search_locations)[0])
    elif spec.origin and spec.origin.endswith(".py"):
        where = spec.origin
    else:
        continue
    if not (outside_stdlib and in_std(where)):
        out[name] = where
print(json.dumps({"packages": out, "stdlib": std}))
"""


def _child_json(python: str, args: Sequence[str], env: Mapping[str, str] | None, what: str) -> dict[str, Any]:
    """Run ``python`` with ``args``; its last output line as JSON, or a LoadError that says what failed."""
    try:
        proc = subprocess.run(
            [python, *args],
            env=dict(os.environ if env is None else env),
            capture_output=True,
            text=True,
            timeout=600,
        )
        last = (proc.stdout.strip().splitlines() or [""])[-1]
        if proc.returncode == 0:
            return dict(json.loads(last))
        why = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
    except (OSError, subprocess.SubprocessError, ValueError) as e:
        why = f"{type(e).__name__}: {e}"
    raise LoadError(
        f"could not {what} with {python}: {why}",
        fix="check that torch and transformers import in this environment (`cudaload doctor`)",
    )


def _inspect(python: str, env: Mapping[str, str] | None) -> dict[str, Any]:
    """The packages a load imports, outside the standard library, and the standard library's folders."""
    return _child_json(
        python, ["-c", _IMPORTS + _LOCATE], env, "import what a load imports, to find the packages"
    )


def _locate(python: str, names: Sequence[str], env: Mapping[str, str] | None) -> dict[str, Any]:
    head = "import json, sys\nnames, outside_stdlib = json.loads(sys.argv[1]), False\n"
    return _child_json(python, ["-c", head + _LOCATE, json.dumps(list(names))], env, "locate the packages")


def _owner_notes(paths: Sequence[str]) -> list[str]:
    """In place as root into an installation another user owns (``sudo cudaload precompile`` on a user's venv):
    the caches belong to root, and that user's later ``pip install -U`` cannot replace them."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return []
    owners = set()
    for p in paths:
        try:
            owners.add(os.stat(p).st_uid)
        except OSError:
            continue
    others = sorted(u for u in owners if u != 0)
    if not others:
        return []
    return [
        f"note: the caches were written as root into folders owned by uid {', '.join(map(str, others))}; "
        "that user cannot replace them on a later upgrade (run precompile as that user instead)"
    ]


def _check_prefix(prefix: str) -> None:
    """Write a file under ``prefix`` before anything else (finding the packages imports torch in a child, and
    compiling takes a minute): ``os.access`` answers yes to root for folders no one can create files in
    (``/proc/nope``), so only a write says whether compileall's will work. A folder made for the check alone is
    removed again."""
    made = not os.path.exists(prefix)
    try:
        os.makedirs(prefix, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=prefix, prefix=".cudaload-write-check-")
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise ConfigurationError(
            f"cannot write bytecode caches under {prefix}: {e.strerror or e}",
            fix="pass a writable folder as --prefix (it is created if missing)",
        ) from None
    if made:
        with contextlib.suppress(OSError):
            os.rmdir(prefix)


def _check_writable(folders: Sequence[str], prefix: str | None) -> None:
    if prefix:
        _check_prefix(prefix)
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
    stdlib: bool | None = None,
) -> PrecompileReport:
    """Byte-compile the packages a load imports, so new processes stop compiling them (``cudaload precompile``).

    Run once per installation where Python has no cached bytecode for them and may not write it
    (``PYTHONDONTWRITEBYTECODE=1``, uv without ``--compile-bytecode``, a read-only install).

    Args:
        packages: top-level package names to compile (default: those a load imports, found by importing
            them in a child process).
        prefix: write the caches under this folder (a ``PYTHONPYCACHEPREFIX`` tree) instead of next to the
            sources, for a read-only installation; processes then need ``PYTHONPYCACHEPREFIX`` set to it.
            Default: the ``PYTHONPYCACHEPREFIX`` of this environment if set, else next to the sources.
        workers: compile processes (0: one per CPU).
        python: the interpreter whose packages are compiled (default: this one).
        stdlib: also compile the standard library into the prefix (default: when there is a prefix, which
            Python then reads for the standard library too).

    Returns:
        A :class:`PrecompileReport`: the folders compiled, the prefix, seconds, files that did not compile,
        caches that could not be written; ``ok`` is False when a cache could not be written, and
        ``summary()`` is the text the command prints.

    Raises:
        ConfigurationError: before compiling anything, when the caches cannot be written there or a named
            package is not installed.
        LoadError: the child process that finds the packages failed.
    """
    # absolute: Python resolves a relative PYTHONPYCACHEPREFIX against each process's working directory
    raw = os.fspath(prefix) if prefix is not None else (sys.pycache_prefix or None)
    pre = os.path.abspath(raw) if raw else None
    env = _child_env(pre)
    t0 = time.perf_counter()
    if pre:
        _check_prefix(pre)
    with_stdlib = bool(pre) if stdlib is None else stdlib
    if packages is None:
        seen = _inspect(python, env)
        found = dict(seen["packages"])
    else:
        seen = _locate(python, packages, env)
        found = {n: seen["packages"][n] for n in packages if n in seen["packages"]}
        missing = [n for n in packages if n not in found]
        if missing:
            raise ConfigurationError(
                f"not installed for {python}: {', '.join(missing)}",
                fix="name installed top-level packages (torch, transformers, ...), or leave --packages out",
            )
    folders = sorted(set(found.values()))
    _check_writable(folders, pre)
    notes = [] if pre else _owner_notes(folders)
    std_folders = list(seen["stdlib"]) if with_stdlib else []
    # -q: errors only; -j: parallel; compileall skips what is already up to date
    jobs = str(workers if workers > 0 else _usable_cpus())
    runs = [[python, "-m", "compileall", "-q", "-j", jobs, *folders]]
    if std_folders:
        # under a prefix Python looks for every module's cache there, the standard library's too (its own
        # __pycache__ is no longer read): without these, each process would compile the stdlib modules it
        # imports instead. Its test suites are left out (never imported by a load; some files are invalid
        # on purpose), and so is a venv's site-packages under it (the packages above)
        runs.append(
            [
                python,
                "-m",
                "compileall",
                "-q",
                "-j",
                jobs,
                "-x",
                # anchored to each root: a venv under a folder named tests must not lose its whole stdlib
                "|".join(
                    rf"^{re.escape(root.rstrip(os.sep))}[/\\](.*[/\\])?(test|tests|idle_test|site-packages|dist-packages)[/\\]"
                    for root in std_folders
                ),
                *std_folders,
            ]
        )
    out_text, code = "", 0
    for cmd in runs:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
        out_text += proc.stdout + proc.stderr
        code = code or proc.returncode
    # "*** Error compiling 'PATH'..." then the exception. A file written for another Python version (torch
    # ships py312_intrinsics.py, which 3.11 cannot parse) is skipped as pip skips it at install; an OSError
    # (a full disk, a read-only __pycache__) means the caches were not written: not a success
    errors: list[str] = []
    write_errors: list[str] = []
    lines = out_text.splitlines()
    starts = [k for k, line in enumerate(lines) if line.startswith("*** Error compiling")]
    for n, k in enumerate(starts):
        path = lines[k].strip().removeprefix("*** Error compiling ").rstrip(".").strip("'")
        block = lines[k + 1 : starts[n + 1] if n + 1 < len(starts) else len(lines)]
        # compileall prints an OSError as "PermissionError: [Errno 13] ..." (Lib/compileall.py compile_file);
        # a source it cannot parse as py_compile's formatted SyntaxError
        oserror = next((x.strip() for x in block if "[Errno" in x), None)
        if oserror:
            write_errors.append(f"{path}: {oserror}")
        else:
            errors.append(path)
    errors, write_errors = list(dict.fromkeys(errors)), list(dict.fromkeys(write_errors))
    return PrecompileReport(
        packages=found,
        stdlib=list(std_folders),
        prefix=pre,
        seconds=round(time.perf_counter() - t0, 3),
        returncode=code,
        errors=errors,
        write_errors=write_errors,
        notes=notes,
    )
