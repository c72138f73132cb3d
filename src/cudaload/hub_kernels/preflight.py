"""Pure preflight of a Hub kernel from a :class:`~cudaload.capabilities.Capabilities` alone: trust, the
``kernels`` package, the cache when offline, build variants and declared archs. What ``kernels`` would reject
at load time is rejected here with its reason. No network, no torch."""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ..capabilities import CachedKernel, Capabilities

_HEX40 = re.compile(r"^[0-9a-f]{40}$")

# ----------------------------------------------------------------------------------------------------
# Pure helpers: trust, versions, variants, archs
# ----------------------------------------------------------------------------------------------------


def is_local_kernel(repo: str) -> bool:
    """A local kernel is named by a path (absolute, ``./``, ``../`` or ``~``), never ``org/name``."""
    return repo.startswith(("/", "./", "../", "~")) or os.path.isabs(repo)


def trusted(repo_id: str, trust: Iterable[str]) -> str | None:
    """The allow-list entry that trusts ``repo_id`` (``org/name``, ``org/*`` or ``*``), or None."""
    org = repo_id.split("/", 1)[0]
    for t in trust:
        t = t.strip()
        if t == repo_id or t == "*" or (t.endswith("/*") and t[:-2] == org):
            return t
    return None


def _version_tuple(v: str | None) -> tuple[int, ...] | None:
    if not v:
        return None
    m = re.match(r"^(\d+)\.(\d+)(?:\.(\d+))?", v)
    if not m:
        return None
    return tuple(int(x) for x in m.groups() if x is not None)


#: transformers' FLASH_ATTN_KERNEL_VERSIONS (modeling_flash_attention_utils.py) per release: the ``v<N>`` branch of
#: each Hub attention kernel it loads when ``attn_implementation`` names no revision. From the released wheels:
#: 5.18.0 :74-81, 5.19.0 :73-80, 5.20.2/5.21.1 :75-82 (flash-attn2 v3); 5.22.0-5.24.0 :76-84 (flash-attn2 v4 on
#: torch >= 2.10, "v4 was only tested on 2.10 and upwards", else v3); 5.25.0 :75-82 (flash-attn2 v4 always,
#: flash-attn3 v2, flash-attn4 v1). An unlisted repo gets v1 (``get_attn_kernel_version``'s default, 5.25.0
#: integrations/hub_kernels.py:351-353). tests/test_versions_table.py checks the installed release against it.
#: A row's value for flash-attn2 is (torch >= 2.10, older torch).
_ATTN_KERNEL_VERSIONS: tuple[tuple[tuple[int, int], dict[str, tuple[int, int]]], ...] = (
    (
        (5, 25),
        {
            "kernels-community/flash-attn2": (4, 4),
            "kernels-community/flash-attn3": (2, 2),
            "kernels-community/vllm-flash-attn3": (1, 1),
            "kernels-community/aiter-flash-attn": (2, 2),
            "kernels-community/flash-attn4": (1, 1),
            "kernels-community/metal-flash-sdpa": (2, 2),
        },
    ),
    (
        (5, 22),
        {
            "kernels-community/flash-attn2": (4, 3),
            "kernels-community/flash-attn3": (1, 1),
            "kernels-community/vllm-flash-attn3": (1, 1),
            "kernels-community/aiter-flash-attn": (2, 2),
            "kernels-community/flash-attn4": (0, 0),
            "kernels-community/metal-flash-sdpa": (2, 2),
        },
    ),
    (
        (5, 18),
        {
            "kernels-community/flash-attn2": (3, 3),
            "kernels-community/flash-attn3": (1, 1),
            "kernels-community/vllm-flash-attn3": (1, 1),
            "kernels-community/aiter-flash-attn": (2, 2),
            "kernels-community/flash-attn4": (0, 0),
            "kernels-community/metal-flash-sdpa": (2, 2),
        },
    ),
)


def attention_kernel_version(
    repo_id: str, transformers_version: str | None, torch_version: str | None
) -> int:
    """The major version (``v<N>`` branch) transformers asks for when ``attn_implementation=repo_id`` names
    no revision: ``transformers.integrations.hub_kernels.get_attn_kernel_version`` of that release, from
    :data:`_ATTN_KERNEL_VERSIONS` (5.18 and newer) or 5.17's rule by name."""
    tv = _version_tuple(transformers_version) or (0,)
    torch_v = _version_tuple(torch_version) or (0,)
    name = repo_id.split("@", 1)[0]
    for lower, table in _ATTN_KERNEL_VERSIONS:
        if tv >= lower:
            new_torch, old_torch = table.get(name, (1, 1))
            return new_torch if torch_v >= (2, 10) else old_torch
    # 5.17 matches by flash version in the name (integrations/hub_kernels.py:652-657 and its
    # _FLASH_ATTN_KERNEL_VERSION_MAPPING): "...flash-attn2" -> 3, "...flash-attn4" -> 0, else 1
    if re.search(r"flash[-_]?attn[-_]?2$|flash[-_]attention[-_]2$", name):
        return 3
    if re.search(r"flash[-_]?attn[-_]?4$|flash[-_]attention[-_]4$", name):
        return 0
    return 1


@dataclass(frozen=True)
class _Target:
    """What a build variant is matched against, taken from Capabilities."""

    backend: str  # "cuda" or "cpu"
    cuda: tuple[int, int] | None
    torch: tuple[int, int] | None
    cpu_arch: str | None
    os: str = "linux"
    python: tuple[int, int] | None = None  # None: not recorded (a profile), not held against a build


def kernels_device(caps: Capabilities) -> str:
    """The device kernels are planned for: the GPUs of ``caps`` when it has any, unless ``caps`` records a
    torch without CUDA (a CPU build on a GPU machine runs nothing on the GPU). A profile records no torch at
    all: it is planned for its GPUs, never for the CPU of the machine doing the planning."""
    if not caps.has_gpu:
        return "cpu"
    if caps.torch_version is not None and caps.torch_cuda_version is None:
        return "cpu"
    return "cuda"


def _target(caps: Capabilities, device: str | None = None) -> _Target:
    cuda_v = _version_tuple(caps.torch_cuda_version)
    backend = device or kernels_device(caps)
    tv = _version_tuple(caps.torch_version)
    py = _version_tuple(caps.python_version)
    return _Target(
        backend=backend,
        cuda=(cuda_v[0], cuda_v[1] if len(cuda_v) > 1 else 0) if cuda_v else None,
        torch=(tv[0], tv[1] if len(tv) > 1 else 0) if tv else None,
        cpu_arch=caps.cpu_arch,
        python=(py[0], py[1]) if py and len(py) > 1 else None,
    )


_ARCH_VARIANT = re.compile(
    r"^torch(?P<tmaj>\d)(?P<tmin>\d+)(?:-(?P<abi>cxx11|cxx98))?-(?P<backend>[a-z]+[0-9]*)-(?P<cpu>[a-z0-9_]+)-(?P<os>[a-z]+)$"
)
_STABLE_VARIANT = re.compile(
    r"^torch-stable-abi(?P<tmaj>\d)(?P<tmin>\d+)-(?P<backend>[a-z]+[0-9]*)-(?P<cpu>[a-z0-9_]+)-(?P<os>[a-z]+)$"
)
#: kernels 0.19's new variant names (kernels 0.19.1 _internals/variants.py:424-433, parse at :439-480): dotted
#: versions, the backend spelt out with its version apart, and the minimum Python with its ABI, e.g.
#: ``torch-2.10-cxx11-cuda-12.8-cpython-3.9-abi3-x86_64-linux`` or ``torch-stable-abi-2.11-cpu-cpython-3.12-abi3-...``.
_NEW_VARIANT = re.compile(
    r"^torch-(?P<stable>stable-abi-)?(?P<tmaj>\d+)\.(?P<tmin>\d+)(?:-(?P<abi>cxx11|cxx98))?"
    r"-(?P<bname>[a-z]+)(?:-(?P<bmaj>\d+)\.(?P<bmin>\d+))?"
    r"-cpython-(?P<pymaj>\d+)\.(?P<pymin>\d+)-(?P<pyabi>abi3t?)-(?P<cpu>[a-z0-9_]+)-(?P<os>[a-z]+)$"
)


def _backend_version(backend: str) -> tuple[str, tuple[int, int] | None]:
    """ "cu130" -> ("cuda", (13, 0)); "cu128" -> ("cuda", (12, 8)); "cpu" -> ("cpu", None)."""
    m = re.fullmatch(r"cu(\d+)(\d)", backend)
    if m:
        return "cuda", (int(m.group(1)), int(m.group(2)))
    m = re.fullmatch(r"(rocm|xpu|cann)(\d+)(\d)", backend)
    if m:
        return m.group(1), (int(m.group(2)), int(m.group(3)))
    return backend, None


@dataclass(frozen=True)
class _Variant:
    """One arch build variant's name, in either naming (legacy ``torch210-cxx11-cu128-x86_64-linux`` or
    kernels 0.19's ``torch-2.10-cxx11-cuda-12.8-cpython-3.9-abi3-x86_64-linux``)."""

    stable: bool
    torch: tuple[int, int]
    abi: str | None
    backend: str  # "cuda", "cpu", "rocm", ...
    backend_version: tuple[int, int] | None
    backend_text: str  # as written, for the reasons
    cpu: str
    os: str
    python: tuple[int, int] | None  # the minimum Python; None in legacy names (always 3.9, abi3)
    python_abi: str = "abi3"


def _parse_variant(variant: str) -> _Variant | None:
    m = _NEW_VARIANT.match(variant)
    if m:
        bver = (int(m["bmaj"]), int(m["bmin"])) if m["bmaj"] else None
        return _Variant(
            stable=bool(m["stable"]),
            torch=(int(m["tmaj"]), int(m["tmin"])),
            abi=m["abi"],
            backend=m["bname"],
            backend_version=bver,
            backend_text=m["bname"] + (f"-{bver[0]}.{bver[1]}" if bver else ""),
            cpu=m["cpu"],
            os=m["os"],
            python=(int(m["pymaj"]), int(m["pymin"])),
            python_abi=m["pyabi"],
        )
    m = _ARCH_VARIANT.match(variant) or _STABLE_VARIANT.match(variant)
    if not m:
        return None
    kind, bver = _backend_version(m["backend"])
    return _Variant(
        stable=variant.startswith("torch-stable-abi"),
        torch=(int(m["tmaj"]), int(m["tmin"])),
        abi=m.groupdict().get("abi"),
        backend=kind,
        backend_version=bver,
        backend_text=m["backend"],
        cpu=m["cpu"],
        os=m["os"],
        python=None,
    )


def _noarch(variant: str) -> str | None:
    """The backend of a noarch variant (``torch-universal``, ``torch-cuda``), None for an arch variant."""
    if not variant.startswith("torch-") or variant.startswith("torch-stable-abi"):
        return None
    rest = variant[len("torch-") :]
    return rest if re.fullmatch(r"[a-z]+", rest) else None


def check_variant(variant: str, target: _Target) -> tuple[bool, str]:
    """Whether one build variant directory name runs on ``target``, mirroring kernels' resolver
    (kernels 0.19.1 ``_internals/variants.py`` ``_check_variants`` :696-788; 0.16-0.18 ``kernels/variants.py``):
    noarch ``torch-universal`` / ``torch-<backend>``; arch builds need the same CPU, OS, torch minor, cxx11 ABI,
    a CUDA of the same major with a minor not above the system's, and (new names) a Python at least the one
    named, with the GIL's ``abi3``."""
    noarch = _noarch(variant)
    if noarch is not None:
        if noarch in ("universal", target.backend):
            return True, f"{variant}: noarch build for {noarch}"
        return False, f"{variant}: noarch build for {noarch}, this machine runs {target.backend}"
    v = _parse_variant(variant)
    if v is None:
        return False, f"{variant}: not a build variant name kernels understands"
    if v.python_abi != "abi3":
        return False, f"{variant}: built for a free-threaded Python ({v.python_abi})"
    if v.python is not None and target.python is not None and target.python < v.python:
        return False, (
            f"{variant}: needs Python >= {v.python[0]}.{v.python[1]}, this machine has "
            f"{target.python[0]}.{target.python[1]}"
        )
    if target.cpu_arch and v.cpu != target.cpu_arch:
        return False, f"{variant}: built for CPU {v.cpu}, this machine is {target.cpu_arch}"
    if v.os != target.os:
        return False, f"{variant}: built for {v.os}, this machine runs {target.os}"
    tver = v.torch
    if target.torch is None:
        return (
            False,
            f"{variant}: the torch version is unknown (a profile records none), so no build can be matched",
        )
    if v.stable and tver > target.torch:
        return False, f"{variant}: stable-ABI build needs torch >= {tver[0]}.{tver[1]}"
    if not v.stable and tver != target.torch:
        return False, (
            f"{variant}: built for torch {tver[0]}.{tver[1]}, "
            f"this machine has torch {target.torch[0]}.{target.torch[1]}"
        )
    if not v.stable and v.abi == "cxx98":
        return False, f"{variant}: pre-C++11 ABI build; torch wheels use the C++11 ABI"
    if v.backend != target.backend:
        return False, f"{variant}: built for {v.backend_text}, this machine runs {target.backend}"
    bver = v.backend_version
    if v.backend == "cuda":
        if target.cuda is None or bver is None:
            return False, f"{variant}: CUDA build, torch here has no CUDA"
        if bver[0] != target.cuda[0] or bver[1] > target.cuda[1]:
            return False, (
                f"{variant}: built for CUDA {bver[0]}.{bver[1]}, torch here uses CUDA "
                f"{target.cuda[0]}.{target.cuda[1]}"
            )
    return True, f"{variant}: matches torch {tver[0]}.{tver[1]} / {v.backend_text} / {v.cpu}"


def _cuda_arch_supports(arch: str, cc: tuple[int, int]) -> bool | None:
    """kernels' ``archs._cuda_arch_supports``: "9.0a" exact, "10.0f" family, "8.0+PTX" and newer, "8.0" same
    major with minor >=. None when the string is not an arch."""
    ptx = arch.endswith("+PTX")
    a = arch[: -len("+PTX")] if ptx else arch
    suffix = a[-1] if a.endswith(("a", "f")) else ""
    a = a[:-1] if suffix else a
    major, sep, minor = a.partition(".")
    if not sep or not major.isdigit() or not minor.isdigit():
        return None
    am, an = int(major), int(minor)
    if suffix == "a":
        return cc == (am, an)
    if ptx:
        return cc >= (am, an)
    return cc[0] == am and cc[1] >= an


def archs_cover(archs: Sequence[str], cc: tuple[int, int]) -> bool:
    """Whether declared archs cover compute capability ``cc``; unknown formats are not held against it."""
    if not archs:
        return True
    verdicts = [_cuda_arch_supports(a, cc) for a in archs]
    if all(v is None for v in verdicts):
        return True
    return any(bool(v) for v in verdicts)


# ----------------------------------------------------------------------------------------------------
# Preflight
# ----------------------------------------------------------------------------------------------------


def kernels_package_reasons(caps: Capabilities) -> list[str]:
    """Why the ``kernels`` package cannot serve transformers on ``caps`` (empty when it can)."""
    p = caps.package("kernels")
    tv = caps.transformers_version or "?"
    if not p.installed:
        if p.assumed:
            return ["kernels is not installed (assumed missing)"]
        if caps.source.startswith("profile:"):
            # a profile describes hardware: what is installed here says nothing about it
            return ["kernels is not assumed on a profile (--assume-installed kernels to plan with it)"]
        return ["kernels is not installed (pip install 'cudaload[kernels]')"]
    if p.in_range is False:
        rng = p.accepted or "a different range"
        return [
            f"kernels {p.version} is outside the range transformers {tv} accepts ({rng}), "
            "so transformers treats kernels as unavailable"
        ]
    if not p.usable:
        return [f"kernels {p.version or '?'} is installed but not usable: {p.reason or 'import failed'}"]
    return []


def needs_hub_answer(caps: Capabilities) -> bool:
    """Whether a decision on ``caps`` can turn on the Hub's reachability, still unknown (``hub.reachable`` None).

    Only one does: whether ``kernels`` can download a Hub kernel that is not cached (:func:`_offline` below).
    Where ``kernels`` cannot serve transformers (not installed, out of range, not loadable) every Hub kernel is
    rejected for that reason first, whatever the network says, so the probe is not worth its round trip."""
    return not caps.hub.offline and caps.hub.reachable is None and not kernels_package_reasons(caps)


def _offline(caps: Capabilities) -> bool:
    return caps.hub.offline or caps.hub.reachable is False


def _cached_entry(
    caps: Capabilities,
    repo_id: str,
    revision: str | None,
    version: int | None,
) -> tuple[CachedKernel | None, str]:
    """The cached snapshot a load would use: by commit (or a unique prefix), ref name, or ``v<version>``."""
    entries = [k for k in caps.hub.cached_kernels if k.repo_id == repo_id]
    if revision is not None:
        for k in entries:
            if k.revision == revision or revision in k.refs:
                return k, revision
        if len(revision) >= 7:
            matches = [k for k in entries if k.revision.startswith(revision)]
            if len(matches) == 1:
                return matches[0], revision
        return None, revision
    want = f"v{version if version is not None else 1}"
    for k in entries:
        if want in k.refs:
            return k, want
    return None, want


def _variant_verdict(entry: CachedKernel, caps: Capabilities, device: str | None) -> tuple[bool, list[str]]:
    target = _target(caps, device)
    verdicts = [check_variant(v, target) for v in entry.variants]
    if not verdicts:
        return False, [f"{entry.repo_id}@{entry.revision[:12]} has no build variants in the cache"]
    chosen = [why for ok, why in verdicts if ok]
    if chosen:
        return True, [f"build variant {chosen[0].split(':', 1)[0]} fits this machine"]
    return False, [
        f"no build variant of {entry.repo_id} fits this machine: " + "; ".join(why for _, why in verdicts)
    ]


def _arch_reasons(archs: Sequence[str], caps: Capabilities, device: str | None) -> list[str]:
    if (device or kernels_device(caps)) != "cuda" or not archs:
        return []
    bad = [g for g in caps.gpus if not archs_cover(archs, g.compute_capability)]
    return [
        f"declared CUDA archs ({', '.join(archs)}) do not cover {g.name} (compute capability "
        f"{g.compute_capability[0]}.{g.compute_capability[1]})"
        for g in bad
    ]


def preflight_hub_kernel(
    repo_id: str,
    caps: Capabilities,
    *,
    trust: Sequence[str],
    revision: str | None = None,
    version: int | None = None,
    device: str | None = None,
) -> tuple[bool, tuple[str, ...]]:
    """Preflight of any Hub kernel repo (layer or attention) from ``caps`` alone: package, trust, cache when
    offline, build variant, declared archs. Returns (ok, reasons); reasons explain either verdict."""
    reasons: list[str] = []
    ok = True
    pkg = kernels_package_reasons(caps)
    if pkg:
        ok = False
        reasons.extend(pkg)
    who = trusted(repo_id, trust)
    if who is None:
        ok = False
        reasons.append(
            f"{repo_id} is not trusted: Hub kernels run code, so cudaload runs none unless "
            f"allowed (CUDALOAD_TRUST_KERNELS={repo_id} or {repo_id.split('/', 1)[0]}/*)"
        )
    else:
        reasons.append(f"{repo_id} trusted by the allow-list entry {who!r}")
    entry, wanted = _cached_entry(caps, repo_id, revision, version)
    if entry is None:
        if _offline(caps):
            ok = False
            why = "HF_HUB_OFFLINE is set" if caps.hub.offline else "the Hub is unreachable"
            reasons.append(
                f"{why} and {repo_id} ({wanted}) is not in the local cache "
                f"({caps.hub.cache_dir or 'HF_HUB_CACHE'})"
            )
        else:
            reasons.append(
                f"{repo_id} ({wanted}) is not cached; kernels downloads it at load time "
                "(build variant and archs checked then)"
            )
        return ok, tuple(reasons)
    reasons.append(f"{repo_id} {wanted} is cached (commit {entry.revision[:12]})")
    v_ok, v_reasons = _variant_verdict(entry, caps, device)
    reasons.extend(v_reasons)
    ok = ok and v_ok
    arch = _arch_reasons(entry.cuda_capabilities, caps, device)
    if arch:
        ok = False
        reasons.extend(arch)
    return ok, tuple(reasons)


def check_attention_kernel(
    repo_id: str,
    caps: Capabilities,
    *,
    trust: Sequence[str],
    revision: str | None = None,
) -> tuple[bool, tuple[str, ...]]:
    """Pure preflight of a Hub attention kernel such as ``kernels-community/flash-attn2``.

    ``repo_id`` may carry a revision the way transformers accepts it (``org/name@rev``). Without a revision,
    the version transformers would request (``v<N>``) is the one checked. Never touches the network.
    """
    name, _, rev_in_id = repo_id.partition("@")
    name = name.split(":", 1)[0].strip()
    rev = revision or (rev_in_id.strip() or None)
    version = None if rev else attention_kernel_version(name, caps.transformers_version, caps.torch_version)
    device = kernels_device(caps)
    return preflight_hub_kernel(name, caps, trust=trust, revision=rev, version=version, device=device)
