"""Hub kernels: what is cached, whether a kernel can run here, and the KernelConfig plan.

Three layers, in the architecture's order:

* :func:`scan_cache` (filesystem only, used by ``detect()``): the Hub kernel repos in the local cache, their
  build variants and declared CUDA archs.
* Pure preflight from a :class:`~cudaload.capabilities.Capabilities`: :func:`check_attention_kernel` (the
  attention policy's Hub-kernel candidates) and :func:`plan_kernels` (the ``use_kernels`` mapping that goes
  into ``Plan.kernels``). No network, no torch: what ``kernels`` would reject at load time (no build variant,
  an arch the GPU is not, a revision absent while offline, kernels out of transformers' range, an untrusted
  repo) is rejected here with its reason instead.
* :func:`build_kernel_config` / :func:`kernel_mapping` / :func:`apply_kernels`: turn the plan into live
  ``transformers.KernelConfig`` / ``kernels`` objects, fresh each call.

Trust: no Hub code runs unless the user allowed the repo (``org/name``) or its publisher (``org/*``), through
``trust=`` or ``CUDALOAD_TRUST_KERNELS``. Local kernels (a directory the user names) are the user's own code.
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .capabilities import CachedKernel, Capabilities

logger = logging.getLogger(__name__)

#: Plan.kernels schema version (docs/kernels.md).
KERNELS_PLAN_VERSION = 1

_HEX40 = re.compile(r"^[0-9a-f]{40}$")

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
            org, sep, name = entry.name[len(prefix):].partition("--")
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


def attention_kernel_version(repo_id: str, transformers_version: str | None,
                             torch_version: str | None) -> int:
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


def _target(caps: Capabilities, device: str | None = None) -> _Target:
    cuda_v = _version_tuple(caps.torch_cuda_version)
    backend = device or ("cuda" if caps.has_gpu and cuda_v is not None else "cpu")
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
    """"cu130" -> ("cuda", (13, 0)); "cu128" -> ("cuda", (12, 8)); "cpu" -> ("cpu", None)."""
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
        backend = variant[len("torch-"):]
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
        return False, f"{variant}: torch version of this machine unknown"
    if stable and tver > target.torch:
        return False, f"{variant}: stable-ABI build needs torch >= {tver[0]}.{tver[1]}"
    if not stable and tver != target.torch:
        return False, (f"{variant}: built for torch {tver[0]}.{tver[1]}, "
                       f"this machine has torch {target.torch[0]}.{target.torch[1]}")
    if not stable and m["abi"] == "cxx98":
        return False, f"{variant}: pre-C++11 ABI build; torch wheels use the C++11 ABI"
    kind, bver = _backend_version(m["backend"])
    if kind != target.backend:
        return False, f"{variant}: built for {m['backend']}, this machine runs {target.backend}"
    if kind == "cuda":
        if target.cuda is None or bver is None:
            return False, f"{variant}: CUDA build, torch here has no CUDA"
        if bver[0] != target.cuda[0] or bver[1] > target.cuda[1]:
            return False, (f"{variant}: built for CUDA {bver[0]}.{bver[1]}, torch here uses CUDA "
                           f"{target.cuda[0]}.{target.cuda[1]}")
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
        return ["kernels is not installed (pip install 'cudaload[kernels]')"]
    if p.in_range is False:
        rng = p.accepted or "a different range"
        return [f"kernels {p.version} is outside the range transformers {tv} accepts ({rng}), "
                "so transformers treats kernels as unavailable"]
    if not p.usable:
        return [f"kernels {p.version or '?'} is installed but not usable: {p.reason or 'import failed'}"]
    return []


def _offline(caps: Capabilities) -> bool:
    return caps.hub.offline or caps.hub.reachable is False


def _cached_entry(caps: Capabilities, repo_id: str, revision: str | None, version: int | None,
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
    return False, [f"no build variant of {entry.repo_id} fits this machine: "
                   + "; ".join(why for _, why in verdicts)]


def _arch_reasons(archs: Sequence[str], caps: Capabilities, device: str | None) -> list[str]:
    if (device or ("cuda" if caps.has_gpu else "cpu")) != "cuda" or not archs:
        return []
    bad = [g for g in caps.gpus if not archs_cover(archs, g.compute_capability)]
    return [f"declared CUDA archs ({', '.join(archs)}) do not cover {g.name} (compute capability "
            f"{g.compute_capability[0]}.{g.compute_capability[1]})" for g in bad]


def preflight_hub_kernel(
    repo_id: str, caps: Capabilities, *, trust: Sequence[str], revision: str | None = None,
    version: int | None = None, device: str | None = None,
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
        reasons.append(f"{repo_id} is not trusted: Hub kernels run code, so cudaload runs none unless "
                       f"allowed (CUDALOAD_TRUST_KERNELS={repo_id} or {repo_id.split('/', 1)[0]}/*)")
    else:
        reasons.append(f"{repo_id} trusted by the allow-list entry {who!r}")
    entry, wanted = _cached_entry(caps, repo_id, revision, version)
    if entry is None:
        if _offline(caps):
            ok = False
            why = "HF_HUB_OFFLINE is set" if caps.hub.offline else "the Hub is unreachable"
            reasons.append(f"{why} and {repo_id} ({wanted}) is not in the local cache "
                           f"({caps.hub.cache_dir or 'HF_HUB_CACHE'})")
        else:
            reasons.append(f"{repo_id} ({wanted}) is not cached; kernels downloads it at load time "
                           "(build variant and archs checked then)")
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
    repo_id: str, caps: Capabilities, *, trust: Sequence[str], revision: str | None = None,
) -> tuple[bool, tuple[str, ...]]:
    """Pure preflight of a Hub attention kernel such as ``kernels-community/flash-attn2``.

    ``repo_id`` may carry a revision the way transformers accepts it (``org/name@rev``). Without a revision,
    the version transformers would request (``v<N>``) is the one checked. Never touches the network.
    """
    name, _, rev_in_id = repo_id.partition("@")
    name = name.split(":", 1)[0].strip()
    rev = revision or (rev_in_id.strip() or None)
    version = None if rev else attention_kernel_version(name, caps.transformers_version, caps.torch_version)
    device = "cuda" if caps.has_gpu and caps.torch_cuda_version else "cpu"
    return preflight_hub_kernel(name, caps, trust=trust, revision=rev, version=version, device=device)


# ----------------------------------------------------------------------------------------------------
# Which layers a model class registers for replacement
# ----------------------------------------------------------------------------------------------------

_DECORATOR = re.compile(
    r"@use_kernel_forward_from_hub\(\s*[\"']([^\"']+)[\"']\s*\)"
    r"|use_kernel_func_from_hub(?:_with_fallback)?\(\s*[\"']([^\"']+)[\"']"
)


def registered_layers(model_class: type) -> tuple[str, ...]:
    """Kernel layer names (``RMSNorm``, ``rotary_pos_emb``, ``MegaBlocksMoeMLP``...) that ``model_class``'s
    modeling module marks for replacement, without instantiating anything.

    Two sources, because each misses a case: the decorators in the module's source (present even when
    transformers disabled them because kernels is missing or out of range), and the ``kernel_layer_name``
    attribute kernels stamps on decorated classes (present for layers defined in another module).
    """
    import inspect
    import sys

    names: list[str] = []
    module = sys.modules.get(model_class.__module__)
    if module is None:
        return ()
    try:
        source = inspect.getsource(module)
    except (OSError, TypeError):
        source = ""
    for m in _DECORATOR.finditer(source):
        names.append(m.group(1) or m.group(2))
    for obj in vars(module).values():
        name = getattr(obj, "kernel_layer_name", None) if isinstance(obj, type) else None
        if isinstance(name, str):
            names.append(name)
    return tuple(sorted(dict.fromkeys(names)))


def _resolve_model_class(name: str | None) -> tuple[type | None, str | None]:
    if not name:
        return None, "no model class named (the config lists no architectures)"
    try:
        import transformers

        cls = getattr(transformers, name)
    except (ImportError, AttributeError) as e:
        return None, f"transformers has no model class {name!r} ({e.__class__.__name__})"
    return (cls, None) if isinstance(cls, type) else (None, f"{name} is not a class")


# ----------------------------------------------------------------------------------------------------
# The plan
# ----------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class KernelSpec:
    """One candidate kernel for a layer: ``repo`` is ``org/name`` or a local directory."""

    repo: str
    layer_name: str
    version: int | None = 1
    revision: str | None = None
    modes: tuple[str, ...] = ("inference", "training")

    @property
    def local(self) -> bool:
        return is_local_kernel(self.repo)

    @classmethod
    def parse(cls, value: str | Mapping[str, Any]) -> KernelSpec:
        """``"org/name:Layer"``, ``"org/name@rev:Layer"``, ``"/abs/dir:Layer"`` or a dict with
        ``repo``, ``layer_name``, ``version``, ``revision``, ``modes``."""
        if isinstance(value, Mapping):
            return cls(
                repo=str(value["repo"]), layer_name=str(value["layer_name"]),
                version=value.get("version", None if value.get("revision") else 1),
                revision=value.get("revision"),
                modes=tuple(value.get("modes", ("inference", "training"))),
            )
        repo, sep, layer = str(value).rpartition(":")
        if not sep or not repo or not layer:
            from .errors import ConfigurationError

            raise ConfigurationError(f"kernel {value!r} names no layer",
                                     fix="write it as 'org/repo:LayerName' or '/abs/dir:LayerName'")
        repo, _, rev = repo.partition("@") if not is_local_kernel(repo) else (repo, "", "")
        return cls(repo=repo, layer_name=layer, version=None if rev else 1, revision=rev or None)


#: cudaload's defaults for the ``cuda`` device: the subset of transformers' own default mapping whose
#: kernels are maintained for it (kernels-community), with the modes transformers registers them for.
DEFAULT_CUDA_KERNELS: dict[str, KernelSpec] = {
    "RMSNorm": KernelSpec("kernels-community/liger-kernels", "LigerRMSNorm", version=3),
    "SiLU": KernelSpec("kernels-community/activation", "Silu", version=1, modes=("inference",)),
    "GeLU": KernelSpec("kernels-community/activation", "Gelu", version=1, modes=("inference",)),
    "rotary_pos_emb": KernelSpec("kernels-community/rotary", "apply_rotary_transformers", version=2,
                                 modes=("inference",)),
    "MegaBlocksMoeMLP": KernelSpec("kernels-community/megablocks", "MegaBlocksMoeMLP", version=1),
}


def _mode(intent: str) -> str:
    return "inference" if intent == "inference" else "training"


def _local_preflight(spec: KernelSpec, caps: Capabilities, device: str) -> tuple[bool, list[str]]:
    """A local kernel directory: it exists and holds a build variant for this machine (filesystem only)."""
    path = Path(os.path.expanduser(spec.repo))
    if not path.is_dir():
        return False, [f"local kernel directory {spec.repo} does not exist"]
    target = _target(caps, device)
    for base in (path, path / "build"):
        try:
            variants = sorted(e.name for e in os.scandir(base) if e.is_dir())
        except OSError:
            continue
        fitting = [v for v in variants if check_variant(v, target)[0]]
        if fitting:
            archs = _variant_archs(base / fitting[0])
            bad = _arch_reasons(archs, caps, device)
            return not bad, [f"local kernel {spec.repo}: build variant {fitting[0]} fits this machine", *bad]
    if (path / "metadata.json").is_file():
        return True, [f"local kernel {spec.repo} points at a build variant directly"]
    return False, [f"local kernel {spec.repo} has no build variant for this machine"]


def _entry(layer: str, spec: KernelSpec, caps: Capabilities, *, mode: str, device: str, trust: Sequence[str],
           lock: Mapping[str, str] | None) -> dict[str, Any]:
    e: dict[str, Any] = {"layer": layer, "repo": spec.repo, "layer_name": spec.layer_name,
                         "local": spec.local, "version": spec.version, "revision": spec.revision,
                         "pinned": None, "trusted": False, "ok": False, "reasons": []}
    reasons: list[str] = []
    if mode not in spec.modes:
        e["reasons"] = [f"{spec.repo}:{spec.layer_name} has no {mode} kernel "
                        f"(modes: {', '.join(spec.modes)})"]
        return e
    if spec.local:
        pkg = kernels_package_reasons(caps)
        ok, why = _local_preflight(spec, caps, device)
        e.update(trusted=True, ok=ok and not pkg,
                 reasons=[*pkg, "local directory named by the user (its own code)", *why])
        return e
    revision, version = spec.revision, spec.version
    if lock is not None and spec.repo in lock:
        revision, version = lock[spec.repo], None
        reasons.append(f"revision {revision[:12]} from the lock")
    ok, hub_why = preflight_hub_kernel(spec.repo, caps, trust=trust, revision=revision, version=version,
                                       device=device)
    reasons.extend(hub_why)
    cached, _ = _cached_entry(caps, spec.repo, revision, version)
    # Pin to the commit the preflight looked at: the load then needs no ref lookup (works offline) and a
    # lock written from this plan names exactly what was checked.
    pinned = cached.revision if cached is not None else None
    if pinned is None and revision and _HEX40.match(revision):
        pinned = revision
    e.update(trusted=trusted(spec.repo, trust) is not None, ok=ok, pinned=pinned, reasons=reasons)
    if revision is not None:
        e.update(revision=revision, version=None)
    return e


def plan_kernels(
    summary: Any,
    caps: Capabilities,
    *,
    intent: str,
    request: bool | None,
    trust: Sequence[str],
    model_class_name: str | None,
    lock: Mapping[str, str] | None = None,
    mapping: Mapping[str, str | Mapping[str, Any]] | None = None,
) -> dict[str, Any]:
    """The KernelConfig plan for ``Plan.kernels`` (JSON-able; schema in docs/kernels.md).

    ``request``: None (auto) enables kernels only when every needed kernel passes preflight and is trusted,
    so it is off by default; True keeps the kernels that pass and leaves the others out with their reason;
    False is off. ``mapping`` (layer -> ``"org/repo:Layer"``, ``"/dir:Layer"`` or a spec dict) overrides
    cudaload's defaults (:data:`DEFAULT_CUDA_KERNELS`). ``lock`` (repo -> commit) pins revisions.
    """
    mode = _mode(intent)
    device = "cuda" if caps.has_gpu and caps.torch_cuda_version else "cpu"
    class_name = model_class_name or getattr(summary, "architecture", None)
    plan: dict[str, Any] = {
        "version": KERNELS_PLAN_VERSION, "use_kernels": False, "requested": request, "device": device,
        "mode": mode, "model_class": class_name, "registered_layers": [], "use_local_kernel": False,
        # Applied by kernels' own kernelize after loading, on every device: transformers' use_kernels=True path
        # also fetches its default function kernels (rotary v2) from the Hub, which raises offline even with
        # inherit_mapping=False (measured on the H200 with transformers 5.17), and its KernelConfig knows no cpu.
        "inherit_mapping": False, "apply": "kernelize",
        "entries": [], "mapping": {}, "lock": {}, "reasons": [],
    }
    reasons: list[str] = plan["reasons"]
    if request is False:
        reasons.append("kernels off (requested)")
        return plan
    cls, why = _resolve_model_class(class_name)
    layers = registered_layers(cls) if cls is not None else ()
    plan["registered_layers"] = list(layers)
    if why:
        reasons.append(why)
    if not layers:
        reasons.append(f"{class_name or 'the model'} registers no layers for kernel replacement")
        return plan
    specs: dict[str, KernelSpec] = dict(DEFAULT_CUDA_KERNELS) if device == "cuda" else {}
    for layer, value in (mapping or {}).items():
        specs[layer] = KernelSpec.parse(value)
    for layer in sorted(set(specs) - set(layers)):
        if mapping and layer in mapping:
            reasons.append(f"{layer} is not a kernel layer of {class_name} "
                           f"(it registers: {', '.join(layers)})")
    entries = [_entry(layer, specs[layer], caps, mode=mode, device=device, trust=trust, lock=lock)
               for layer in layers if layer in specs]
    unmapped = [layer for layer in layers if layer not in specs]
    if unmapped:
        reasons.append(f"no {device} kernel known for: {', '.join(unmapped)} (they keep their torch forward)")
    # transformers' use_local_kernel is all-or-nothing for one KernelConfig: local kernels win, Hub ones
    # are left out rather than loaded as paths (or paths as repos).
    if any(e["local"] and e["ok"] for e in entries):
        for e in entries:
            if not e["local"] and e["ok"]:
                e["ok"] = False
                e["reasons"].append("left out: a KernelConfig holds local or Hub kernels, not both, and "
                                    "this plan uses local ones")
        plan["use_local_kernel"] = True
    plan["entries"] = entries
    accepted = [e for e in entries if e["ok"]]
    if not entries:
        return plan
    if request is None and len(accepted) < len(entries):
        failed = [e["layer"] for e in entries if not e["ok"]]
        reasons.append(f"auto: kernels left off because {', '.join(failed)} did not pass preflight "
                       "(untrusted, uncached offline, or no build for this machine); pass kernels=True "
                       "to use the ones that pass")
        return plan
    if not accepted:
        reasons.append("no kernel passed preflight; loading without kernels")
        return plan
    plan["use_kernels"] = True
    for e in accepted:
        plan["mapping"][e["layer"]] = _mapping_value(e)
        if not e["local"] and e["pinned"]:
            plan["lock"][e["repo"]] = e["pinned"]
    reasons.append(f"kernels for {', '.join(e['layer'] for e in accepted)} ({mode}, {device})")
    reasons.extend(f"{e['layer']} left out: {e['reasons'][0] if e['reasons'] else 'failed preflight'}"
                   for e in entries if not e["ok"])
    return plan


def _mapping_value(e: Mapping[str, Any]) -> str | list[Any]:
    """The KernelConfig value for one accepted entry, in JSON form (a list stands for transformers' tuple)."""
    ref = f"{e['repo']}:{e['layer_name']}"
    if e["local"]:
        return str(Path(os.path.expanduser(e["repo"])).resolve()) + f":{e['layer_name']}"
    meta: dict[str, Any] = {"trust_remote_code": bool(e["trusted"])}
    if e.get("pinned"):
        meta["revision"] = e["pinned"]
    elif e.get("revision"):
        meta["revision"] = e["revision"]
    else:
        meta["version"] = int(e["version"] if e.get("version") is not None else 1)
    return [ref, meta]


# ----------------------------------------------------------------------------------------------------
# From plan to live objects
# ----------------------------------------------------------------------------------------------------


def _validate(kernels_plan: Mapping[str, Any]) -> dict[str, Any]:
    """Check the mapping the way ``KernelConfig.sanitize_kernel_mapping`` will, before any load."""
    from .errors import ConfigurationError

    fix = "rebuild the plan with cudaload.plan(...) instead of editing plan.kernels by hand"
    mapping = kernels_plan.get("mapping")
    if not isinstance(mapping, Mapping):
        raise ConfigurationError("plan.kernels['mapping'] is not a mapping", fix=fix)
    registered = set(kernels_plan.get("registered_layers") or ())
    local = bool(kernels_plan.get("use_local_kernel"))
    out: dict[str, Any] = {}
    for layer, value in mapping.items():
        if registered and layer not in registered:
            raise ConfigurationError(f"kernel layer {layer!r} is not registered by the model", fix=fix,
                                     reasons=[f"registered: {', '.join(sorted(registered))}"])
        if isinstance(value, str):
            ref, meta = value, None
        elif isinstance(value, (list, tuple)) and len(value) == 2 and isinstance(value[1], Mapping):
            ref, meta = value[0], dict(value[1])
        else:
            raise ConfigurationError(f"kernel mapping for {layer!r} is malformed: {value!r}", fix=fix)
        if not isinstance(ref, str) or "/" not in ref or ":" not in ref:
            raise ConfigurationError(f"kernel {ref!r} for {layer!r} is not 'org/repo:Layer' or '/dir:Layer'",
                                     fix=fix)
        if local:
            if meta is not None or not os.path.isabs(ref.rpartition(":")[0]):
                raise ConfigurationError(f"local kernel {ref!r} must be an absolute '/dir:Layer' string",
                                         fix=fix)
            out[layer] = ref
            continue
        if meta is None or (("revision" in meta) == ("version" in meta)):
            raise ConfigurationError(f"Hub kernel {ref!r} needs exactly one of revision or version", fix=fix)
        if not isinstance(meta.get("trust_remote_code", False), bool):
            raise ConfigurationError(f"trust_remote_code for {ref!r} must be a bool", fix=fix)
        out[layer] = (ref, meta)
    return out


def build_kernel_config(kernels_plan: Mapping[str, Any]) -> Any:
    """A fresh ``transformers.KernelConfig`` for the plan (from_pretrained consumes it), for callers who load
    with ``from_pretrained(use_kernels=True, kernel_config=...)`` themselves; None when the plan uses no kernels
    or is for the CPU (transformers' KernelConfig knows no cpu device). Validated here, not inside
    ``from_pretrained``. ``load_model`` itself applies plans with :func:`apply_kernels`."""
    if not kernels_plan or not kernels_plan.get("use_kernels"):
        return None
    if kernels_plan.get("device") != "cuda":  # transformers' KernelConfig knows no cpu device
        return None
    mapping = _validate(kernels_plan)
    if not mapping:
        return None
    from transformers import KernelConfig

    device = str(kernels_plan.get("device", "cuda"))
    return KernelConfig(  # type: ignore[no-untyped-call]
        kernel_mapping={layer: {device: value} for layer, value in mapping.items()},
        use_local_kernel=bool(kernels_plan.get("use_local_kernel")),
        # Only what cudaload preflighted: transformers' defaults would pull unchecked, untrusted kernels.
        inherit_mapping=False,
    )


def kernel_mapping(kernels_plan: Mapping[str, Any], *, device: str | None = None) -> dict[str, Any]:
    """The plan as a ``kernels.use_kernel_mapping`` mapping (LayerRepository / LocalLayerRepository objects)
    for ``device`` (default: the plan's), with the plan's mode."""
    from kernels import LayerRepository, LocalLayerRepository, Mode

    mode = Mode.TRAINING if kernels_plan.get("mode") == "training" else Mode.INFERENCE
    dev = device or str(kernels_plan.get("device", "cuda"))
    out: dict[str, Any] = {}
    for layer, value in _validate(kernels_plan).items():
        if isinstance(value, str):
            path, _, name = value.rpartition(":")
            repo: Any = LocalLayerRepository(repo_path=Path(path), layer_name=name)
        else:
            ref, meta = value
            repo_id, _, name = ref.rpartition(":")
            repo = LayerRepository(repo_id=repo_id, layer_name=name, revision=meta.get("revision"),
                                   version=meta.get("version"),
                                   trust_remote_code=bool(meta.get("trust_remote_code", False)))
        out[layer] = {dev: {mode: repo}}
    return out


def apply_kernels(model: Any, kernels_plan: Mapping[str, Any], *, device: str | None = None) -> Any:
    """Kernelize an already loaded model with exactly the plan's kernels (no transformers defaults).

    The route for plans whose ``apply`` is ``"kernelize"`` (CPU); also usable on CUDA. Returns the model.
    """
    if not kernels_plan.get("use_kernels"):
        return model
    from kernels import Mode, kernelize, use_kernel_mapping

    mode = Mode.TRAINING if kernels_plan.get("mode") == "training" else Mode.INFERENCE
    dev = device or str(kernels_plan.get("device", "cuda"))
    mapping = kernel_mapping(kernels_plan, device=dev)
    try:
        with use_kernel_mapping(mapping, inherit_mapping=False):
            # use_fallback=True: layers the plan maps nothing to keep their forward; a planned kernel that
            # fails to load is an error (preflight passed it), not a silent fallback.
            kernelize(model, mode=mode, device=dev, use_fallback=True)
    except Exception as e:
        from .errors import LoadError

        raise LoadError(f"kernelize failed for the planned kernels ({', '.join(mapping)}): {e}",
                        fix="plan with kernels=False, or fix the kernel named above") from e
    return model


# ----------------------------------------------------------------------------------------------------
# Lock: repo -> commit, so a cluster loads exactly what was tested
# ----------------------------------------------------------------------------------------------------


def write_lock(plan_or_kernels_plan: Any, path: str | os.PathLike[str]) -> dict[str, str]:
    """Write ``{repo: commit}`` of the plan's pinned Hub kernels to ``path`` (JSON). Returns the lock."""
    from .errors import ConfigurationError

    kp = getattr(plan_or_kernels_plan, "kernels", plan_or_kernels_plan)
    if not isinstance(kp, Mapping):
        raise ConfigurationError("write_lock needs a Plan or a plan.kernels dict",
                                 fix="pass cudaload.plan(...) or its .kernels")
    lock = {str(k): str(v) for k, v in sorted(dict(kp.get("lock") or {}).items())}
    unpinned = [e["repo"] for e in kp.get("entries", ()) if e.get("ok") and not e.get("local")
                and not e.get("pinned")]
    if unpinned:
        raise ConfigurationError(
            f"cannot lock kernels that are not cached yet: {', '.join(sorted(set(unpinned)))}",
            fix="load once online (the kernels are downloaded then), plan again, and write the lock",
        )
    doc = {"cudaload_kernels_lock": 1, "kernels": lock}
    Path(path).write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return lock


def read_lock(path: str | os.PathLike[str]) -> dict[str, str]:
    """Read a lock written by :func:`write_lock`: ``{repo: commit}``."""
    from .errors import ConfigurationError

    fix = "write it again with cudaload.hub_kernels.write_lock(plan, path)"
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        from .errors import ModelNotFoundError

        raise ModelNotFoundError(f"kernel lock {path} does not exist", fix=fix) from None
    except (OSError, ValueError) as e:
        raise ConfigurationError(f"kernel lock {path} is unreadable: {e}", fix=fix) from None
    kernels = doc.get("kernels") if isinstance(doc, dict) else None
    if not isinstance(kernels, dict) or not all(
        isinstance(k, str) and isinstance(v, str) and _HEX40.match(v) for k, v in kernels.items()
    ):
        raise ConfigurationError(f"kernel lock {path} is not a cudaload kernel lock", fix=fix)
    return dict(kernels)
