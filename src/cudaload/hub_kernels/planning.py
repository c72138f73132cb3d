"""The KernelConfig plan that goes into ``Plan.kernels``: which layers a model class registers for
replacement, which kernel serves each, and why (schema in docs/kernels.md). Pure over Capabilities."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..capabilities import Capabilities
from ..detection.versions import version_tuple
from .cache import _variant_archs
from .preflight import (
    _HEX40,
    _arch_reasons,
    _cached_entry,
    _target,
    check_variant,
    is_local_kernel,
    kernels_device,
    kernels_package_reasons,
    preflight_hub_kernel,
    trusted,
)

#: Plan.kernels schema version (docs/kernels.md).
KERNELS_PLAN_VERSION = 1

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
                repo=str(value["repo"]),
                layer_name=str(value["layer_name"]),
                version=value.get("version", None if value.get("revision") else 1),
                revision=value.get("revision"),
                modes=tuple(value.get("modes", ("inference", "training"))),
            )
        repo, sep, layer = str(value).rpartition(":")
        if not sep or not repo or not layer:
            from ..errors import ConfigurationError

            raise ConfigurationError(
                f"kernel {value!r} names no layer",
                fix="write it as 'org/repo:LayerName' or '/abs/dir:LayerName'",
            )
        repo, _, rev = repo.partition("@") if not is_local_kernel(repo) else (repo, "", "")
        return cls(repo=repo, layer_name=layer, version=None if rev else 1, revision=rev or None)


#: cudaload's defaults for the ``cuda`` device: the subset of transformers' own default mapping whose
#: kernels are maintained for it (kernels-community), with the modes transformers registers them for.
DEFAULT_CUDA_KERNELS: dict[str, KernelSpec] = {
    "RMSNorm": KernelSpec("kernels-community/liger-kernels", "LigerRMSNorm", version=3),
    "SiLU": KernelSpec("kernels-community/activation", "Silu", version=1, modes=("inference",)),
    "GeLU": KernelSpec("kernels-community/activation", "Gelu", version=1, modes=("inference",)),
    "rotary_pos_emb": KernelSpec(
        "kernels-community/rotary", "apply_rotary_transformers", version=2, modes=("inference",)
    ),
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


def _entry(
    layer: str,
    spec: KernelSpec,
    caps: Capabilities,
    *,
    mode: str,
    device: str,
    trust: Sequence[str],
    lock: Mapping[str, str] | None,
) -> dict[str, Any]:
    e: dict[str, Any] = {
        "layer": layer,
        "repo": spec.repo,
        "layer_name": spec.layer_name,
        "local": spec.local,
        "version": spec.version,
        "revision": spec.revision,
        "pinned": None,
        "trusted": False,
        "ok": False,
        "reasons": [],
    }
    reasons: list[str] = []
    if mode not in spec.modes:
        e["reasons"] = [
            f"{spec.repo}:{spec.layer_name} has no {mode} kernel (modes: {', '.join(spec.modes)})"
        ]
        return e
    if spec.local:
        pkg = kernels_package_reasons(caps)
        ok, why = _local_preflight(spec, caps, device)
        e.update(
            trusted=True,
            ok=ok and not pkg,
            reasons=[*pkg, "local directory named by the user (its own code)", *why],
        )
        return e
    revision, version = spec.revision, spec.version
    if lock is not None and spec.repo in lock:
        revision, version = lock[spec.repo], None
        reasons.append(f"revision {revision[:12]} from the lock")
    ok, hub_why = preflight_hub_kernel(
        spec.repo, caps, trust=trust, revision=revision, version=version, device=device
    )
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
    device = kernels_device(caps)
    class_name = model_class_name or getattr(summary, "architecture", None)
    plan = _off_plan(request, device, mode, class_name)
    reasons: list[str] = plan["reasons"]
    if (version_tuple(caps.transformers_version) or (0,)) >= (5, 25):
        # 5.25 turned from_pretrained's use_kernels on by default (None -> True, modeling_utils.py:4415-4423)
        reasons.append(
            f"transformers {caps.transformers_version} applies its default Hub kernels to every load unless told "
            "not to: cudaload loads with use_kernels=False and applies only the kernels planned here"
        )
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
            reasons.append(
                f"{layer} is not a kernel layer of {class_name} (it registers: {', '.join(layers)})"
            )
    entries = [
        _entry(layer, specs[layer], caps, mode=mode, device=device, trust=trust, lock=lock)
        for layer in layers
        if layer in specs
    ]
    unmapped = [layer for layer in layers if layer not in specs]
    if unmapped:
        reasons.append(f"no {device} kernel known for: {', '.join(unmapped)} (they keep their torch forward)")
    plan["use_local_kernel"] = _local_wins(entries)
    plan["entries"] = entries
    accepted = [e for e in entries if e["ok"]]
    if not entries:
        return plan
    if request is None and len(accepted) < len(entries):
        failed = [e["layer"] for e in entries if not e["ok"]]
        reasons.append(
            f"auto: kernels left off because {', '.join(failed)} did not pass preflight "
            "(untrusted, uncached offline, or no build for this machine); pass kernels=True "
            "to use the ones that pass"
        )
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
    reasons.extend(
        f"{e['layer']} left out: {e['reasons'][0] if e['reasons'] else 'failed preflight'}"
        for e in entries
        if not e["ok"]
    )
    return plan


def _off_plan(request: bool | None, device: str, mode: str, class_name: str | None) -> dict[str, Any]:
    """The plan before any kernel is chosen: kernels off, nothing registered, mapped or locked."""
    return {
        "version": KERNELS_PLAN_VERSION,
        "use_kernels": False,
        "requested": request,
        "device": device,
        "mode": mode,
        "model_class": class_name,
        "registered_layers": [],
        "use_local_kernel": False,
        # Applied by kernels' own kernelize after loading, on every device: transformers' use_kernels=True path
        # also fetches its default function kernels (rotary v2) from the Hub, which raises offline even with
        # inherit_mapping=False (measured on the H200 with transformers 5.17), and its KernelConfig knows no cpu.
        "inherit_mapping": False,
        "apply": "kernelize",
        "entries": [],
        "mapping": {},
        "lock": {},
        "reasons": [],
    }


def _local_wins(entries: Sequence[dict[str, Any]]) -> bool:
    """Whether the plan uses local kernels: transformers' use_local_kernel is all-or-nothing for one
    KernelConfig, so local kernels win and the Hub ones that passed are left out (each entry says why),
    rather than loaded as paths (or paths as repos)."""
    if not any(e["local"] and e["ok"] for e in entries):
        return False
    for e in entries:
        if not e["local"] and e["ok"]:
            e["ok"] = False
            e["reasons"].append(
                "left out: a KernelConfig holds local or Hub kernels, not both, and this plan uses local ones"
            )
    return True


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
