"""Optional packages in two tiers: installed (a distribution and its version) and usable (its compiled
part loads). Probes never initialise CUDA: several packages do at import time (``import bitsandbytes``
calls ``torch.cuda.get_device_capability``), so those are checked by loading their native library the
way the package would, without running the package's own import-time code.

Results are cached per process (``clear_cache()`` forgets them); a package's state rarely changes while a
process runs, and ``detect()`` must stay fast when called repeatedly.
"""

from __future__ import annotations

import ctypes
import importlib
import importlib.util
import logging
import re
from collections.abc import Callable, Iterable
from pathlib import Path

from ..capabilities import PackageInfo
from .versions import dist_version, in_range, kernels_range, range_text

log = logging.getLogger(__name__)

#: cudaload's name for each optional package -> distribution names to look for (first found wins)
DISTRIBUTIONS: dict[str, tuple[str, ...]] = {
    "accelerate": ("accelerate",),
    "bitsandbytes": ("bitsandbytes",),
    "flash-attn": ("flash-attn",),
    "flash-attn-3": ("flash-attn-3", "flash_attn_3"),
    "flash-attn-4": ("flash-attn-4", "flash-attn4", "fa4"),
    "kernels": ("kernels",),
    "liger-kernel": ("liger-kernel",),
    "peft": ("peft",),
    "torchao": ("torchao",),
}
PROBED = tuple(sorted(DISTRIBUTIONS))


def _norm(name: str) -> str:
    return name.strip().lower().replace("_", "-")


#: every spelling a user may give (cudaload's name or a distribution name, ``_`` or ``-``) -> cudaload's name
_SPELLINGS: dict[str, str] = {
    _norm(alias): name for name, dists in DISTRIBUTIONS.items() for alias in (name, *dists)
}


def check_names(names: Iterable[str]) -> list[str]:
    """cudaload's names for the packages ``names`` (``--assume-installed`` / ``--assume-missing``).

    A name cudaload does not probe would be recorded and never read, so a typo (``flash-atn``) would change
    nothing without a word: it raises :class:`~cudaload.errors.ConfigurationError` naming the close ones.
    """
    out: list[str] = []
    for raw in names:
        key = _norm(raw)
        if key in _SPELLINGS:
            out.append(_SPELLINGS[key])
            continue
        from ..errors import ConfigurationError, close_names

        close = close_names(key, sorted(DISTRIBUTIONS))
        raise ConfigurationError(
            f"unknown package {raw!r}" + (f"; did you mean {' or '.join(close)}?" if close else ""),
            fix=f"use one of {', '.join(sorted(DISTRIBUTIONS))}",
        )
    return list(dict.fromkeys(out))


def kernels_fix(accepted: str | None, installed: str | None = None) -> str:
    """The command that puts a kernels this transformers accepts (``accepted``, e.g. ``">=0.19.1,<0.20.0"``)
    beside it, given the ``installed`` kernels version (None: not installed).

    Each transformers release accepts one kernels window (:data:`~cudaload.detection.versions._KERNELS_RANGE_TABLE`).
    A kernels older than the window is upgraded into it. A kernels newer than the window means transformers is
    the old one: the fix upgrades transformers to the releases whose window holds it (with its own ``kernels``
    extra, so pip keeps them paired), and names the downgrade only as the other way out. Without a window
    (transformers not installed) ``cudaload[kernels]`` installs transformers' own pair."""
    from packaging.version import InvalidVersion, Version

    if not accepted:
        return "pip install 'cudaload[kernels]' (transformers with the kernels release it pairs with)"
    if installed is None:
        return f"pip install 'kernels{accepted}'"
    try:
        lo, hi = (Version(s.strip().lstrip("<>=")) for s in accepted.split(","))
        have = Version(installed)
    except (InvalidVersion, ValueError):
        return f"pip install 'kernels{accepted}'"
    if have < lo:
        return f"pip install -U 'kernels{accepted}'"
    releases = transformers_accepting(installed)
    if releases is None:
        # no transformers release known to this cudaload accepts it (a kernels newer than all of them)
        return f"pip install 'kernels{accepted}' (no transformers release known to cudaload accepts kernels {have})"
    if have >= hi:
        return (
            f"pip install -U 'transformers[kernels]{releases}' (the transformers releases that accept kernels "
            f"{installed}); or keep this transformers with pip install 'kernels{accepted}'"
        )
    return f"pip install 'kernels{accepted}'"


def transformers_accepting(kernels_version: str) -> str | None:
    """The transformers releases (a pip specifier) whose kernels window holds ``kernels_version``, from the
    newest window down; None when no release in the table accepts it."""
    from .versions import _KERNELS_RANGE_TABLE

    upper: tuple[int, int] | None = None  # the first minor of the next newer window
    for lower, rng in _KERNELS_RANGE_TABLE:
        if in_range(kernels_version, rng):
            top = f",<{upper[0]}.{upper[1]}" if upper else ",<6"
            return f">={lower[0]}.{lower[1]}{top}"
        upper = lower
    return None


_cache: dict[tuple[object, ...], PackageInfo] = {}


def clear_cache() -> None:
    _cache.clear()


def _has_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def _import(name: str) -> str | None:
    """Import ``name``; None on success, else the error as one line."""
    try:
        importlib.import_module(name)
        return None
    except BaseException as e:  # a broken extension can raise anything, even SystemExit
        if isinstance(e, KeyboardInterrupt):
            raise
        return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}".rstrip(": ")


# -- bitsandbytes: emulate cextension.get_cuda_bnb_library_path, then dlopen ----------------------------


def bnb_library(package_dir: Path, torch_cuda: str, override: str | None = None) -> Path:
    """The CUDA library bitsandbytes would load for a torch built with CUDA ``torch_cuda`` ("13.0").

    Same choice as bitsandbytes 0.45+: ``BNB_CUDA_VERSION`` wins; else the exact version, else the highest
    packaged one below it with the same major, else the lowest above it with the same major.
    """
    if override:
        return package_dir / f"libbitsandbytes_cuda{override}.so"
    major, minor = (int(x) for x in torch_cuda.split(".")[:2])
    found: dict[tuple[int, int], Path] = {}
    for p in package_dir.glob("libbitsandbytes_cuda*.so"):
        m = re.fullmatch(r"libbitsandbytes_cuda(\d+)(\d)\.so", p.name)
        if m:
            found[(int(m.group(1)), int(m.group(2)))] = p
    want = (major, minor)
    exact = package_dir / f"libbitsandbytes_cuda{major}{minor}.so"
    if want in found:
        return found[want]
    lower = [v for v in found if v[0] == major and v < want]
    if lower:
        return found[max(lower)]
    higher = [v for v in found if v[0] == major and v > want]
    return found[min(higher)] if higher else exact


def load_native(path: Path, symbol: str | None = None) -> str | None:
    """dlopen ``path`` (and look up ``symbol``); None when it loads, else why not."""
    if not path.is_file():
        return f"{path.name} is not in the package"
    try:
        lib = ctypes.CDLL(str(path))
    except OSError as e:
        return f"{path.name} does not load: {e}"
    if symbol and not hasattr(lib, symbol):
        return f"{path.name} loads but lacks {symbol} (not a CUDA build)"
    return None


def _bitsandbytes(version: str, torch_cuda: str | None, has_gpu: bool, override: str | None) -> PackageInfo:
    if torch_cuda is None:
        return PackageInfo(
            "bitsandbytes", True, version, False, "torch is a CPU build: no CUDA library to load"
        )
    spec = importlib.util.find_spec("bitsandbytes")
    if spec is None or not spec.submodule_search_locations:
        return PackageInfo("bitsandbytes", True, version, False, "distribution installed but module missing")
    pkg_dir = Path(next(iter(spec.submodule_search_locations)))
    lib = bnb_library(pkg_dir, torch_cuda, override)
    # torch loads the CUDA runtime bitsandbytes links against (from the nvidia-* wheels); importing torch
    # does not initialise CUDA.
    err = _import("torch") or load_native(lib, "get_context")
    if err:
        return PackageInfo("bitsandbytes", True, version, False, f"CUDA native library unusable: {err}")
    note = "" if has_gpu else " (no GPU visible)"
    return PackageInfo("bitsandbytes", True, version, True, f"{lib.name} loads{note}")


# -- the others --------------------------------------------------------------------------------------


def _flash_attn(version: str) -> PackageInfo:
    # the compiled part of flash-attn 2 is the torch extension flash_attn_2_cuda
    err = _import("torch") or _import("flash_attn_2_cuda")
    if err:
        return PackageInfo("flash-attn", True, version, False, f"compiled part does not load: {err}")
    return PackageInfo("flash-attn", True, version, True, "flash_attn_2_cuda loads")


def _flash_attn_3(version: str) -> PackageInfo:
    err = _import("torch") or _import("flash_attn_interface")
    if err:
        return PackageInfo("flash-attn-3", True, version, False, f"flash_attn_interface does not load: {err}")
    return PackageInfo("flash-attn-3", True, version, True, "flash_attn_interface loads")


def _flash_attn_4(version: str) -> PackageInfo:
    # FA4 is JIT-compiled through the CuTe DSL; importing flash_attn.cute pulls in cutlass (seconds), so
    # check that both are there without importing them.
    if not _has_module("flash_attn.cute"):
        return PackageInfo("flash-attn-4", True, version, False, "flash_attn.cute is missing")
    if not _has_module("cutlass"):
        return PackageInfo(
            "flash-attn-4",
            True,
            version,
            False,
            "the CuTe DSL (nvidia-cutlass-dsl, module cutlass) is missing",
        )
    return PackageInfo("flash-attn-4", True, version, True, "flash_attn.cute and the CuTe DSL are present")


def _kernels(version: str, transformers_version: str | None) -> PackageInfo:
    rng = kernels_range(transformers_version)
    if rng is not None and not in_range(version, rng):
        accepted = range_text(rng)
        return PackageInfo(
            "kernels",
            True,
            version,
            False,
            f"transformers {transformers_version} accepts kernels {accepted}; "
            f"it treats {version} as unavailable",
            accepted=accepted,
            in_range=False,
        )
    err = _import("kernels")
    accepted_text = range_text(rng) if rng else None
    if err:
        return PackageInfo(
            "kernels",
            True,
            version,
            False,
            f"does not import: {err}",
            accepted=accepted_text,
            in_range=True if rng else None,
        )
    return PackageInfo(
        "kernels",
        True,
        version,
        True,
        "imports; version in the accepted range" if rng else "imports",
        accepted=accepted_text,
        in_range=True if rng else None,
    )


def _pure(name: str, module: str, version: str, needs: tuple[str, ...] = ()) -> PackageInfo:
    # pure-Python packages: present is usable; importing them (peft imports transformers) costs seconds
    for m in (module, *needs):
        if not _has_module(m):
            return PackageInfo(name, True, version, False, f"module {m} is missing")
    return PackageInfo(name, True, version, True, "found (pure Python, not imported)")


def probe(
    name: str,
    *,
    transformers_version: str | None = None,
    torch_cuda: str | None = None,
    has_gpu: bool = False,
    bnb_override: str | None = None,
) -> PackageInfo:
    """Probe one package (cached per process for the same inputs)."""
    key = (name, transformers_version, torch_cuda, has_gpu, bnb_override)
    if key in _cache:
        return _cache[key]
    version = dist_version(*DISTRIBUTIONS[name])
    info: PackageInfo
    if version is None:
        info = PackageInfo(name, False, reason="not installed")
        if name == "kernels":
            rng = kernels_range(transformers_version)
            info = PackageInfo(name, False, reason="not installed", accepted=range_text(rng) if rng else None)
    else:
        probes: dict[str, Callable[[], PackageInfo]] = {
            "bitsandbytes": lambda: _bitsandbytes(version, torch_cuda, has_gpu, bnb_override),
            "flash-attn": lambda: _flash_attn(version),
            "flash-attn-3": lambda: _flash_attn_3(version),
            "flash-attn-4": lambda: _flash_attn_4(version),
            "kernels": lambda: _kernels(version, transformers_version),
            "accelerate": lambda: _pure(name, "accelerate", version),
            "peft": lambda: _pure(name, "peft", version),
            "liger-kernel": lambda: _pure(name, "liger_kernel", version, ("triton",)),
            "torchao": lambda: _pure(name, "torchao", version),
        }
        try:
            info = probes[name]()
        except Exception as e:  # a probe must never take detection down
            log.debug("probe of %s failed", name, exc_info=True)
            info = PackageInfo(name, True, version, False, f"probe failed: {type(e).__name__}: {e}")
    _cache[key] = info
    return info


def probe_all(
    *,
    transformers_version: str | None,
    torch_cuda: str | None,
    has_gpu: bool,
    bnb_override: str | None = None,
) -> tuple[PackageInfo, ...]:
    return tuple(
        probe(
            n,
            transformers_version=transformers_version,
            torch_cuda=torch_cuda,
            has_gpu=has_gpu,
            bnb_override=bnb_override,
        )
        for n in PROBED
    )
