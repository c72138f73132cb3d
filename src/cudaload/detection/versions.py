"""Versions of torch, transformers and friends without importing them.

Importing transformers costs about a second and torch more; detection reads distribution metadata and,
where a fact lives only in source (torch's CUDA build, transformers' accepted kernels range), the text of
the installed file. When the module is already imported, its live attributes are used instead.
"""

from __future__ import annotations

import importlib.metadata as md
import importlib.util
import re
import sys
from pathlib import Path

#: transformers release -> the kernels range it accepts (KERNELS_MIN_VERSION, KERNELS_MAX_VERSION in
#: utils/import_utils.py), for installs whose source cannot be read and for recorded machines and profiles. From
#: the released wheels: 5.25.0 :177-178, 5.23.0 and 5.24.0 :177-178, 5.20.0 :169-170 (5.21.1 and 5.22.2 :170-171),
#: 5.18.0 and 5.19.0 :169-170, 5.17.0 :165-166. tests/test_versions_table.py checks the installed release against it.
_KERNELS_RANGE_TABLE: tuple[tuple[tuple[int, int], tuple[str, str]], ...] = (
    ((5, 25), ("0.19.1", "0.20.0")),
    ((5, 23), ("0.18.2", "0.19.0")),
    ((5, 20), ("0.17.2", "0.18.0")),
    ((5, 18), ("0.17.0", "0.18.0")),
    ((5, 17), ("0.16.0", "0.17.0")),
)


def dist_version(*names: str) -> str | None:
    """The installed version of the first distribution found among ``names``."""
    for n in names:
        try:
            return md.version(n)
        except md.PackageNotFoundError:
            continue
    return None


def version_tuple(v: str | None) -> tuple[int, ...] | None:
    """The release numbers of a version string: ``"2.8.3.post1"`` -> (2, 8, 3), ``"5.23.0rc1"`` -> (5, 23, 0),
    ``"2.11.0+cu130"`` -> (2, 11, 0); None when it starts with no number. Pre-releases compare as their
    release (good enough for the "at least" checks it serves)."""
    out: list[int] = []
    for part in (v or "").split("."):
        m = re.match(r"\d+", part)
        if m is None:
            break
        out.append(int(m.group()))
        if m.end() != len(part):
            break
    return tuple(out) or None


def package_locations(module: str) -> list[Path]:
    """The folders of the installed top-level package ``module``, found without importing it ([]: none)."""
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return []
    if spec is None or not spec.submodule_search_locations:
        return []
    return [Path(loc) for loc in spec.submodule_search_locations]


def _module_file(module: str, relative: str) -> Path | None:
    """``relative`` inside the installed package ``module``, located without importing it."""
    for loc in package_locations(module):
        p = loc / relative
        if p.is_file():
            return p
    return None


def torch_cuda_version() -> str | None:
    """The CUDA version torch was built with (``torch.version.cuda``); None for a CPU build."""
    mod = sys.modules.get("torch.version")
    if mod is not None:
        v = getattr(mod, "cuda", None)
        return str(v) if v else None
    p = _module_file("torch", "version.py")
    if p is None:
        return None
    m = re.search(r"^cuda(?:\s*:\s*[^=]+)?\s*=\s*['\"]([^'\"]+)['\"]", p.read_text(), re.M)
    return m.group(1) if m else None


def torch_varlen() -> str | None:
    """torch's own varlen flash attention with a backward, read from the installed files (torch is not imported,
    CUDA not initialised): "varlen_attn" where ``torch/nn/attention/varlen.py``'s ``varlen_attn`` takes a scale
    and a window and registers a backward (torch 2.11+); else "aten" where ``aten._flash_attention_forward`` takes
    cum_seq and window sizes and has a derivative (torchgen's packaged native_functions.yaml and
    derivatives.yaml: torch 2.9, 2.10); else "none". None: no torch installed. The build (CPU or CUDA) is
    :func:`torch_cuda_version`'s business."""
    if not package_locations("torch"):
        return None
    varlen = _module_file("torch", "nn/attention/varlen.py")
    if varlen is not None:
        text = varlen.read_text(encoding="utf-8", errors="replace")
        sig = text[text.find("def varlen_attn(") :]
        sig = sig[: sig.find(")")]
        if "register_autograd" in text and "scale" in sig and "window_size" in sig:
            return "varlen_attn"
    native = _module_file("torch", "../torchgen/packaged/ATen/native/native_functions.yaml")
    derivs = _module_file("torch", "../torchgen/packaged/autograd/derivatives.yaml")
    if native is not None and derivs is not None:
        fwd = re.search(r"^- func: _flash_attention_forward\(.*$", native.read_text(errors="replace"), re.M)
        has_grad = "name: _flash_attention_forward(" in derivs.read_text(errors="replace")
        if fwd and "cum_seq_q" in fwd.group() and "window_size_left" in fwd.group() and has_grad:
            return "aten"
    return "none"


def _vtuple(v: str) -> tuple[int, int]:
    m = re.match(r"(\d+)\.(\d+)", v)
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)


def kernels_range(transformers_version: str | None) -> tuple[str, str] | None:
    """(min inclusive, max exclusive) kernels versions the installed transformers accepts.

    Read from ``transformers/utils/import_utils.py`` (the constants ``KERNELS_MIN_VERSION`` and
    ``KERNELS_MAX_VERSION``) without importing transformers; falls back to a table by release.
    """
    if transformers_version is None:
        return None
    tf = sys.modules.get("transformers.utils.import_utils")
    lo = getattr(tf, "KERNELS_MIN_VERSION", None) if tf else None
    hi = getattr(tf, "KERNELS_MAX_VERSION", None) if tf else None
    if isinstance(lo, str) and isinstance(hi, str):
        return lo, hi
    p = _module_file("transformers", "utils/import_utils.py")
    if p is not None:
        text = p.read_text(encoding="utf-8", errors="replace")
        lo_m = re.search(r"^KERNELS_MIN_VERSION\s*=\s*['\"]([^'\"]+)['\"]", text, re.M)
        hi_m = re.search(r"^KERNELS_MAX_VERSION\s*=\s*['\"]([^'\"]+)['\"]", text, re.M)
        if lo_m and hi_m:
            return lo_m.group(1), hi_m.group(1)
    return kernels_range_for(transformers_version)


def kernels_range_for(transformers_version: str) -> tuple[str, str] | None:
    """The table fallback of :func:`kernels_range`."""
    v = _vtuple(transformers_version)
    for lower, rng in _KERNELS_RANGE_TABLE:
        if v >= lower:
            return rng
    return None


def in_range(version: str, rng: tuple[str, str]) -> bool:
    from packaging.version import InvalidVersion, Version

    try:
        return Version(rng[0]) <= Version(version) < Version(rng[1])
    except InvalidVersion:
        return False


def range_text(rng: tuple[str, str]) -> str:
    return f">={rng[0]},<{rng[1]}"
