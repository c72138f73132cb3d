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


def attention_kernel_version(
    repo_id: str, transformers_version: str | None, torch_version: str | None
) -> int:
    """The major version (``v<N>`` branch) transformers asks for when ``attn_implementation=repo_id`` names
    no revision. Mirrors ``transformers.integrations.hub_kernels.get_attn_kernel_version``: the table
    changed between releases (5.17: flash-attn2 -> 3; 5.22: flash-attn2 -> 4 on torch >= 2.10)."""
    tv = _version_tuple(transformers_version) or (0,)
    torch_v = _version_tuple(torch_version) or (0,)
    name = repo_id.split("@", 1)[0]
    if tv >= (5, 20):
        table = {
            "kernels-community/flash-attn2": 4 if torch_v >= (2, 10) else 3,
            "kernels-community/flash-attn3": 1,
            "kernels-community/vllm-flash-attn3": 1,
            "kernels-community/aiter-flash-attn": 2,
            "kernels-community/flash-attn4": 0,
            "kernels-community/metal-flash-sdpa": 2,
        }
        return table.get(name, 1)
    # 5.17-5.19 match by flash version in the name: "...flash-attn2" -> 3, "...flash-attn4" -> 0
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
    return _Target(
        backend=backend,
        cuda=(cuda_v[0], cuda_v[1] if len(cuda_v) > 1 else 0) if cuda_v else None,
        torch=(tv[0], tv[1] if len(tv) > 1 else 0) if tv else None,
        cpu_arch=caps.cpu_arch,
    )


_ARCH_VARIANT = re.compile(
    r"^torch(?P<tmaj>\d)(?P<tmin>\d+)(?:-(?P<abi>cxx11|cxx98))?-(?P<backend>[a-z]+[0-9]*)-(?P<cpu>[a-z0-9_]+)-(?P<os>[a-z]+)$"
)
_STABLE_VARIANT = re.compile(
    r"^torch-stable-abi(?P<tmaj>\d)(?P<tmin>\d+)-(?P<backend>[a-z]+[0-9]*)-(?P<cpu>[a-z0-9_]+)-(?P<os>[a-z]+)$"
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


def check_variant(variant: str, target: _Target) -> tuple[bool, str]:
    """Whether one build variant directory name runs on ``target``, mirroring kernels' resolver
    (``kernels/variants.py``): noarch ``torch-universal`` / ``torch-<backend>``; arch builds need the same
    CPU, OS, torch minor, cxx11 ABI and a CUDA of the same major with a minor not above the system's."""
    if variant.startswith("torch-") and not variant.startswith("torch-stable-abi"):
        backend = variant[len("torch-") :]
        if backend in ("universal", target.backend):
            return True, f"{variant}: noarch build for {backend}"
        return False, f"{variant}: noarch build for {backend}, this machine runs {target.backend}"
    m = _ARCH_VARIANT.match(variant) or _STABLE_VARIANT.match(variant)
    if not m:
        return False, f"{variant}: not a build variant name kernels understands"
    if target.cpu_arch and m["cpu"] != target.cpu_arch:
        return False, f"{variant}: built for CPU {m['cpu']}, this machine is {target.cpu_arch}"
    if m["os"] != target.os:
        return False, f"{variant}: built for {m['os']}, this machine runs {target.os}"
    tver = (int(m["tmaj"]), int(m["tmin"]))
    stable = variant.startswith("torch-stable-abi")
    if target.torch is None:
        return (
            False,
            f"{variant}: the torch version is unknown (a profile records none), so no build can be matched",
        )
    if stable and tver > target.torch:
        return False, f"{variant}: stable-ABI build needs torch >= {tver[0]}.{tver[1]}"
    if not stable and tver != target.torch:
        return False, (
            f"{variant}: built for torch {tver[0]}.{tver[1]}, "
            f"this machine has torch {target.torch[0]}.{target.torch[1]}"
        )
    if not stable and m["abi"] == "cxx98":
        return False, f"{variant}: pre-C++11 ABI build; torch wheels use the C++11 ABI"
    kind, bver = _backend_version(m["backend"])
    if kind != target.backend:
        return False, f"{variant}: built for {m['backend']}, this machine runs {target.backend}"
    if kind == "cuda":
        if target.cuda is None or bver is None:
            return False, f"{variant}: CUDA build, torch here has no CUDA"
        if bver[0] != target.cuda[0] or bver[1] > target.cuda[1]:
            return False, (
                f"{variant}: built for CUDA {bver[0]}.{bver[1]}, torch here uses CUDA "
                f"{target.cuda[0]}.{target.cuda[1]}"
            )
    return True, f"{variant}: matches torch {tver[0]}.{tver[1]} / {m['backend']} / {m['cpu']}"


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
