"""Named hardware profiles: plan for a machine you do not have.

A profile is a :class:`~cudaload.capabilities.Capabilities` like the one ``detect()`` returns, so planning
for an H100 from a laptop is the same code path as planning on one. ``hardware("8xH100-80GB")`` composes
identical GPUs; a path to a snapshot recorded with ``cudaload env --json`` is a profile too.

Memory totals are what nvidia-smi / NVML report for the card (MiB), not the marketing figure. Free
memory is the total minus a reserve for the CUDA context and library workspaces. Profiles list no optional
packages: assume them with ``Capabilities.with_packages`` or ``--assume-installed``. See docs/profiles.md.
"""

from __future__ import annotations

import difflib
import json
import os
import re
from dataclasses import dataclass, replace
from pathlib import Path

from .capabilities import GPU, Capabilities, PackageInfo
from .errors import ConfigurationError

MiB = 2**20


@dataclass(frozen=True)
class _Card:
    name: str  # the device name NVML reports
    cc: tuple[int, int]
    mib: int  # total memory as nvidia-smi shows it
    unified: bool = False
    cpu_arch: str = "x86_64"
    host_gib: int | None = None  # host memory of the typical machine, when it is part of the product


#: profile name -> card. Names are matched case-insensitively; see _ALIASES for other spellings.
_CARDS: dict[str, _Card] = {
    "T4": _Card("Tesla T4", (7, 5), 15360),
    "V100-16GB": _Card("Tesla V100-SXM2-16GB", (7, 0), 16160),
    "V100-32GB": _Card("Tesla V100-SXM2-32GB", (7, 0), 32510),
    "A10G": _Card("NVIDIA A10G", (8, 6), 23028),
    "L4": _Card("NVIDIA L4", (8, 9), 23034),
    "A100-40GB": _Card("NVIDIA A100-SXM4-40GB", (8, 0), 40960),
    "A100-80GB": _Card("NVIDIA A100-SXM4-80GB", (8, 0), 81920),
    "RTX-3090": _Card("NVIDIA GeForce RTX 3090", (8, 6), 24576),
    "RTX-4090": _Card("NVIDIA GeForce RTX 4090", (8, 9), 24564),
    "RTX-5090": _Card("NVIDIA GeForce RTX 5090", (12, 0), 32607),
    "L40S": _Card("NVIDIA L40S", (8, 9), 46068),
    "H100-PCIe": _Card("NVIDIA H100 PCIe", (9, 0), 81559),
    "H100-SXM": _Card("NVIDIA H100 80GB HBM3", (9, 0), 81559),
    "H200": _Card("NVIDIA H200", (9, 0), 143771),
    "B200": _Card("NVIDIA B200", (10, 0), 183359),
    # Grace Hopper: 96 GB HBM3 GPU + 480 GB LPDDR5X CPU memory, one coherent address space
    "GH200": _Card("NVIDIA GH200 480GB", (9, 0), 97871, unified=True, cpu_arch="aarch64", host_gib=480),
    # DGX Spark: one 128 GB LPDDR5X pool shared by CPU and GPU; NVML reports no separate GPU memory,
    # torch reports about 119.7 GiB (what the OS leaves)
    "GB10": _Card("NVIDIA GB10", (12, 1), 122572, unified=True, cpu_arch="aarch64", host_gib=128),
}

_ALIASES: dict[str, str] = {
    "V100": "V100-16GB",
    "H100": "H100-SXM",
    "H100-80GB": "H100-SXM",
    "H100-SXM-80GB": "H100-SXM",
    "H100-PCIE-80GB": "H100-PCIe",
    "H200-141GB": "H200",
    "3090": "RTX-3090",
    "4090": "RTX-4090",
    "5090": "RTX-5090",
    "DGX-SPARK": "GB10",
    "GRACE-HOPPER": "GH200",
}

_COMPOSE = re.compile(r"^\s*(\d+)\s*[x×*]\s*(.+?)\s*$", re.I)


def _key(s: str) -> str:
    s = s.strip().upper().replace("_", "-").replace(" ", "-")
    return s[len("NVIDIA-") :] if s.startswith("NVIDIA-") else s


_BY_KEY = {_key(n): n for n in _CARDS}


def reserve(total: int) -> int:
    """Memory a process cannot use: the CUDA context (~0.5 GiB with torch) plus cuBLAS/NCCL workspaces,
    growing with the card. 2% of the total, at least 512 MiB."""
    return max(512 * MiB, total // 50)


def names() -> list[str]:
    """Canonical profile names, in the order of the table."""
    return list(_CARDS)


def _resolve(name: str) -> str:
    k = _key(name)
    if k in _BY_KEY:
        return _BY_KEY[k]
    alias = {_key(a): t for a, t in _ALIASES.items()}.get(k)
    if alias:
        return alias
    candidates = [*_CARDS, *_ALIASES]
    close = difflib.get_close_matches(k, [_key(c) for c in candidates], n=4, cutoff=0.5)
    shown = [c for c in candidates if _key(c) in close] or names()
    raise ConfigurationError(
        f"unknown hardware profile {name!r}; close names: {', '.join(shown)}",
        fix="run `cudaload profiles` for the list (several GPUs: NxNAME, e.g. '8xH100'), or pass a snapshot file "
        "from `cudaload env --json`",
    )


def _profile(canonical: str, count: int) -> Capabilities:
    card = _CARDS[canonical]
    total = card.mib * MiB
    gpus = tuple(
        GPU(
            index=i,
            name=card.name,
            compute_capability=card.cc,
            total_memory=total,
            free_memory=total - reserve(total),
            nvml_index=i,
            unified_memory=card.unified,
        )
        for i in range(count)
    )
    label = canonical if count == 1 else f"{count}x{canonical}"
    return Capabilities(
        source=f"profile:{label}",
        gpus=gpus,
        # accelerate is a core dependency of cudaload; optional packages are never assumed
        packages=(
            PackageInfo("accelerate", installed=True, usable=True, reason="core dependency", assumed=True),
        ),
        cpu_arch=card.cpu_arch,
        host_memory=card.host_gib * 2**30 * count if card.host_gib else None,
    )


def hardware(spec: str | os.PathLike[str]) -> Capabilities:
    """A machine you do not have, as the :class:`Capabilities` snapshot :func:`cudaload.plan` plans against.

    Args:
        spec: a profile name (``"H100-SXM"``, ``"t4"``: case-insensitive, aliases accepted; ``cudaload
            profiles`` lists them), ``NxNAME`` for N identical GPUs (``"8xH100-80GB"``, N from 1 to 64), or
            the path of a snapshot recorded with ``cudaload env --json`` (a ``.json`` name, a path with a
            separator, or an ``os.PathLike``).

    Returns:
        The snapshot, with ``source`` ``"profile:NAME"`` (or ``"file:PATH"`` for a recorded machine). A
        profile lists no optional packages: add them with ``Capabilities.with_packages``.

    Raises:
        ConfigurationError: an unknown profile name (the message lists close ones), a GPU count outside
            1-64, or a snapshot file that does not exist, is not a ``cudaload env --json`` snapshot (a model's
            config.json) or is damaged.
    """
    if not isinstance(spec, (str, os.PathLike)):
        # os.fspath would raise a bare TypeError: hardware=8 (a GPU count), hardware=["H100"] (a list)
        raise ConfigurationError(
            f"hardware={spec!r} ({type(spec).__name__}) is not a profile name or a snapshot file",
            fix=_not_a_name_fix(spec),
        )
    text = os.fspath(spec)
    if not isinstance(text, str):  # a bytes path
        raise ConfigurationError(
            f"hardware={spec!r} is a bytes path", fix=f"pass it as text: hardware={os.fsdecode(text)!r}"
        )
    path = Path(text)
    if isinstance(spec, os.PathLike) or text.endswith(".json") or os.sep in text:
        if not path.is_file():
            raise ConfigurationError(
                f"hardware snapshot {text!r} does not exist",
                fix="record one with `cudaload env --json > box.json`, or see `cudaload profiles`",
            )
        caps = _snapshot(path, text)
        return caps if caps.source.startswith("profile:") else replace(caps, source=f"file:{text}")
    m = _COMPOSE.match(text)
    if m:
        count, name = int(m.group(1)), m.group(2)
    else:
        # "H100x8" (the count after the name, as cloud instance names write it): the same machine as 8xH100
        m = _COMPOSE_AFTER.match(text)
        if m and _known(m.group(1)):
            count, name = int(m.group(2)), m.group(1)
        else:
            count, name = 1, text
    if not 1 <= count <= 64:
        raise ConfigurationError(
            f"{text!r}: GPU count must be 1-64", fix=f"e.g. hardware='{min(max(count, 1), 64)}x{name}'"
        )
    return _profile(_resolve(name), count)


#: NAMExN / NAME*N: the count after the name
_COMPOSE_AFTER = re.compile(r"^\s*(.+?)\s*[x×*]\s*(\d+)\s*$", re.I)


def _known(name: str) -> bool:
    try:
        _resolve(name)
    except ConfigurationError:
        return False
    return True


def _not_a_name_fix(spec: object) -> str:
    """The fix for a ``hardware=`` that is neither text nor a path: the form that says what was meant."""
    if isinstance(spec, int) and not isinstance(spec, bool) and spec >= 1:
        return (
            f"name the GPUs with their count: hardware='{spec}xH100' (one GPU: hardware='H100'; `cudaload profiles` "
            "lists the names)"
        )
    if isinstance(spec, (list, tuple)) and spec and all(isinstance(s, str) for s in spec):
        if len(spec) == 1:
            return f"pass the name itself: hardware={spec[0]!r}"
        if len(set(spec)) == 1:
            return f"pass one name with the count: hardware='{len(spec)}x{spec[0]}'"
        return (
            "a machine of different GPUs is a snapshot: record it with `cudaload env --json > box.json` and "
            "pass hardware='box.json'"
        )
    return "pass a profile name (hardware='H100', '8xH100'), or a snapshot file from `cudaload env --json`"


def _snapshot(path: Path, text: str) -> Capabilities:
    """A file from ``cudaload env --json``; any other JSON (a model's config.json) or a damaged one refused."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as e:  # ValueError: not JSON, or not UTF-8 text
        raise ConfigurationError(
            f"hardware snapshot {text!r} cannot be read: {e}",
            fix="record one with `cudaload env --json > box.json`",
        ) from None
    if not isinstance(data, dict) or "gpus" not in data or "source" not in data:
        what = "a model's config.json" if isinstance(data, dict) and "model_type" in data else "JSON"
        raise ConfigurationError(
            f"hardware={text!r} is {what}, not a machine snapshot (it has no 'source' and 'gpus')",
            fix="record the machine with `cudaload env --json > box.json` and pass hardware='box.json'",
        )
    try:
        return Capabilities.from_dict(data)
    except ConfigurationError:
        raise
    except (KeyError, TypeError, AttributeError, ValueError) as e:
        raise ConfigurationError(
            f"hardware snapshot {text!r} is damaged ({type(e).__name__}: {e})",
            fix="record it again with `cudaload env --json > box.json`",
        ) from None


def describe() -> str:
    """The table ``cudaload profiles`` prints."""
    rows = [("profile", "device", "sm", "arch", "memory", "bf16", "fp8", "unified")]
    for n, c in _CARDS.items():
        g = GPU(0, c.name, c.cc, c.mib * MiB)
        rows.append(
            (
                n,
                c.name,
                f"{c.cc[0]}.{c.cc[1]}",
                g.architecture,
                f"{c.mib} MiB",
                "yes" if g.bf16_native else "no",
                "yes" if g.fp8 else "no",
                "yes" if c.unified else "no",
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    out = ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    out.append("")
    out.append(
        "Compose with NxNAME (e.g. 8xH100-80GB); aliases: "
        + ", ".join(f"{a}={t}" for a, t in _ALIASES.items())
    )
    out.append("A snapshot from `cudaload env --json > box.json` is a profile too: --hardware box.json")
    return "\n".join(out)
