"""The machine as a frozen snapshot.

A :class:`Capabilities` is what every policy decides from. ``detect()`` builds one from the live machine;
a named profile (``cudaload.profiles``) or a recorded file (``cudaload env --json > box.json``) is the same
type, so planning for hardware you do not have is the same code path as planning for the one you do.
Everything here is plain data: no torch, no NVML, JSON round-trip exact.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

SCHEMA_VERSION = 1

#: (major, minor) lower bound of each architecture; the first match from the top wins.
_ARCHS: tuple[tuple[tuple[int, int], str], ...] = (
    ((12, 0), "Blackwell"),  # consumer Blackwell (RTX 50xx, sm_120) and GB10 (sm_121)
    ((10, 0), "Blackwell"),  # B200/GB200 (sm_100), B300 (sm_103)
    ((9, 0), "Hopper"),
    ((8, 9), "Ada"),
    ((8, 0), "Ampere"),
    ((7, 5), "Turing"),
    ((7, 0), "Volta"),
    ((6, 0), "Pascal"),
)


def architecture(cc: tuple[int, int]) -> str:
    for lower, name in _ARCHS:
        if cc >= lower:
            return name
    return "Maxwell or older"


@dataclass(frozen=True)
class GPU:
    """One GPU the process can see. ``index`` is torch's number for it (``cuda:index``)."""

    index: int
    name: str
    compute_capability: tuple[int, int]
    total_memory: int
    free_memory: int | None = None
    nvml_index: int | None = None  # the number nvidia-smi shows
    pci_bus_id: str | None = None
    uuid: str | None = None
    unified_memory: bool = False  # GH200 / GB10: CPU and GPU share one memory (coherent)
    mig: bool = False  # this entry is a MIG instance, not a whole GPU
    mig_parent_uuid: str | None = None

    @property
    def architecture(self) -> str:
        return architecture(self.compute_capability)

    @property
    def sm(self) -> int:
        """Compute capability as one number: (9, 0) -> 90."""
        return self.compute_capability[0] * 10 + self.compute_capability[1]

    @property
    def bf16_native(self) -> bool:
        # Not torch.cuda.is_bf16_supported(): that answers True on pre-Ampere GPUs that only emulate bf16.
        return self.compute_capability >= (8, 0)

    @property
    def fp8(self) -> bool:
        return self.compute_capability >= (8, 9)

    @property
    def available_memory(self) -> int:
        return self.total_memory if self.free_memory is None else self.free_memory

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["compute_capability"] = list(self.compute_capability)
        # Derived facts travel too, so a reader of the JSON does not need this code.
        d["architecture"] = self.architecture
        d["bf16_native"] = self.bf16_native
        d["fp8"] = self.fp8
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> GPU:
        known = {f.name for f in fields(cls)}
        kw = {k: v for k, v in d.items() if k in known}
        kw["compute_capability"] = tuple(d["compute_capability"])
        return cls(**kw)


@dataclass(frozen=True)
class PackageInfo:
    """An optional package in two tiers: installed (a distribution with a version) and usable (it imports
    and its compiled part loads). ``reason`` says why it is not usable. For ``kernels``, ``accepted``
    holds the version range this transformers accepts and ``in_range`` whether the installed one is in it.
    """

    name: str
    installed: bool
    version: str | None = None
    usable: bool = False
    reason: str | None = None
    accepted: str | None = None
    in_range: bool | None = None
    assumed: bool = False  # set by --assume-installed / --assume-missing, not observed

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> PackageInfo:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in known})


@dataclass(frozen=True)
class RankGPU:
    """One rank of a launch and the GPU it runs on, as that rank saw it before any rank loaded anything
    (exchanged between the ranks by :mod:`cudaload.detection.ranks`). ``name`` is None for a rank with no GPU."""

    rank: int
    local_rank: int | None
    host: str
    name: str | None = None
    compute_capability: tuple[int, int] | None = None
    total_memory: int | None = None
    free_memory: int | None = None
    uuid: str | None = None
    host_memory: int | None = None  # this rank's node's memory, as detection read it

    @property
    def model(self) -> tuple[str | None, tuple[int, int] | None, int | None]:
        """What must be equal across ranks: the GPU model, its compute capability and its memory size."""
        return (self.name, self.compute_capability, self.total_memory)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        if self.compute_capability is not None:
            d["compute_capability"] = list(self.compute_capability)
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> RankGPU:
        known = {f.name for f in fields(cls)}
        kw = {k: v for k, v in d.items() if k in known}
        if kw.get("compute_capability") is not None:
            kw["compute_capability"] = tuple(kw["compute_capability"])
        return cls(**kw)


@dataclass(frozen=True)
class Distributed:
    """The launcher's view: set under torchrun / accelerate launch, all None otherwise.

    ``ranks``: every rank's GPU as that rank saw it, when the ranks agreed before planning (load_model under
    torchrun, :func:`cudaload.policies.ranks.agree`); then every rank plans from the same facts."""

    local_rank: int | None = None
    rank: int | None = None
    world_size: int | None = None
    local_world_size: int | None = None
    ranks: tuple[RankGPU, ...] = ()

    @property
    def active(self) -> bool:
        return self.world_size is not None and self.world_size > 1

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["ranks"] = [r.to_dict() for r in self.ranks]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Distributed:
        kw = dict(d)
        kw["ranks"] = tuple(RankGPU.from_dict(r) for r in kw.get("ranks") or ())
        return cls(**kw)


@dataclass(frozen=True)
class CachedKernel:
    """A Hub kernel repo found in the local cache: what preflight needs to decide offline."""

    repo_id: str
    revision: str  # commit hash of the cached snapshot
    refs: tuple[str, ...] = ()  # branch / tag names pointing at it (e.g. "main", "v1")
    variants: tuple[str, ...] = ()  # build variant directories, e.g. "torch211-cxx11-cu130-x86_64-linux"
    cuda_capabilities: tuple[str, ...] = ()  # declared archs ("8.0", "9.0a"...) when the build says so
    path: str | None = None

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for k in ("refs", "variants", "cuda_capabilities"):
            d[k] = list(d[k])
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> CachedKernel:
        return cls(
            repo_id=d["repo_id"],
            revision=d["revision"],
            refs=tuple(d.get("refs", ())),
            variants=tuple(d.get("variants", ())),
            cuda_capabilities=tuple(d.get("cuda_capabilities", ())),
            path=d.get("path"),
        )


@dataclass(frozen=True)
class HubState:
    offline: bool = False
    # None: not probed (offline, probing disabled, or no decision needed the answer)
    reachable: bool | None = None
    cache_dir: str | None = None
    endpoint: str | None = None
    cached_kernels: tuple[CachedKernel, ...] = ()

    @property
    def usable(self) -> bool:
        """Whether cudaload may fetch from the Hub."""
        return not self.offline and self.reachable is not False

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["cached_kernels"] = [k.to_dict() for k in self.cached_kernels]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> HubState:
        d = dict(d)
        kernels = tuple(CachedKernel.from_dict(k) for k in d.pop("cached_kernels", ()))
        return cls(**d, cached_kernels=kernels)


@dataclass(frozen=True)
class Finding:
    """A problem detection noticed: ``code`` is stable (tests and doctor key on it), ``fix`` is one line."""

    code: str
    message: str
    fix: str
    severity: str = "warning"  # "warning" or "error"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Finding:
        return cls(**d)


@dataclass(frozen=True)
class Capabilities:
    """Everything cudaload decides from. Frozen; ``to_json``/``from_json`` round-trip exactly."""

    source: str = "detected"  # "detected", "profile:NAME" or "file:PATH"
    gpus: tuple[GPU, ...] = ()
    packages: tuple[PackageInfo, ...] = ()
    distributed: Distributed = field(default_factory=Distributed)
    hub: HubState = field(default_factory=HubState)
    findings: tuple[Finding, ...] = ()
    env: tuple[tuple[str, str], ...] = ()  # the recorded environment variables that were set
    driver_version: str | None = None
    cuda_driver_version: str | None = None  # the CUDA version the driver supports, e.g. "13.0"
    torch_version: str | None = None
    torch_cuda_version: str | None = None  # the CUDA torch was built with; None for a CPU build
    cudnn_version: str | None = None  # the cuDNN distribution torch loads (nvidia-cudnn-cu*), when installed
    #: torch's own varlen flash attention with a backward, read from its files (detection.versions.torch_varlen):
    #: "varlen_attn" (torch.nn.attention.varlen with scale and window, 2.11+), "aten" (the aten op only), "none";
    #: None: not recorded (a profile, or a snapshot from before this field)
    torch_varlen: str | None = None
    transformers_version: str | None = None
    accelerate_version: str | None = None
    python_version: str | None = None
    cpu_arch: str | None = None
    host_memory: int | None = None
    cuda_initialized: bool = False

    # -- lookups -------------------------------------------------------------------------------------
    def package(self, name: str) -> PackageInfo:
        """The entry for a distribution name; an uninstalled placeholder when it was not probed."""
        for p in self.packages:
            if p.name == name:
                return p
        return PackageInfo(name=name, installed=False, reason="not installed")

    def usable(self, name: str) -> bool:
        return self.package(name).usable

    def gpu(self, index: int) -> GPU:
        for g in self.gpus:
            if g.index == index:
                return g
        from .errors import DeviceSelectionError

        raise DeviceSelectionError(
            f"no GPU with index {index} is visible (visible: {[g.index for g in self.gpus]})",
            fix="pick an index from `cudaload env`, or check CUDA_VISIBLE_DEVICES",
        )

    @property
    def has_gpu(self) -> bool:
        return bool(self.gpus)

    @property
    def env_dict(self) -> dict[str, str]:
        return dict(self.env)

    # -- derivations --------------------------------------------------------------------------------
    def with_packages(self, installed: Iterable[str] = (), missing: Iterable[str] = ()) -> Capabilities:
        """A copy with packages assumed present-and-usable or absent (``--assume-installed/-missing``)."""
        pkgs = {p.name: p for p in self.packages}
        for name in installed:
            old = pkgs.get(name)
            pkgs[name] = PackageInfo(
                name=name,
                installed=True,
                version=old.version if old and old.version else None,
                usable=True,
                accepted=old.accepted if old else None,
                in_range=True if name == "kernels" else (old.in_range if old else None),
                assumed=True,
            )
        for name in missing:
            pkgs[name] = PackageInfo(
                name=name, installed=False, usable=False, reason="assumed missing", assumed=True
            )
        return replace(self, packages=tuple(sorted(pkgs.values(), key=lambda p: p.name)))

    # -- serialisation ------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA_VERSION,
            "source": self.source,
            "gpus": [g.to_dict() for g in self.gpus],
            "packages": [p.to_dict() for p in self.packages],
            "distributed": self.distributed.to_dict(),
            "hub": self.hub.to_dict(),
            "findings": [f.to_dict() for f in self.findings],
            "env": dict(self.env),
            "driver_version": self.driver_version,
            "cuda_driver_version": self.cuda_driver_version,
            "torch_version": self.torch_version,
            "torch_cuda_version": self.torch_cuda_version,
            "cudnn_version": self.cudnn_version,
            "torch_varlen": self.torch_varlen,
            "transformers_version": self.transformers_version,
            "accelerate_version": self.accelerate_version,
            "python_version": self.python_version,
            "cpu_arch": self.cpu_arch,
            "host_memory": self.host_memory,
            "cuda_initialized": self.cuda_initialized,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Capabilities:
        schema = d.get("schema", SCHEMA_VERSION)
        if schema > SCHEMA_VERSION:
            from .errors import ConfigurationError

            raise ConfigurationError(
                f"snapshot schema {schema} is newer than this cudaload understands ({SCHEMA_VERSION})",
                fix="upgrade cudaload, or record the snapshot again with this version",
            )
        return cls(
            source=d.get("source", "detected"),
            gpus=tuple(GPU.from_dict(g) for g in d.get("gpus", ())),
            packages=tuple(PackageInfo.from_dict(p) for p in d.get("packages", ())),
            distributed=Distributed.from_dict(d.get("distributed", {})),
            hub=HubState.from_dict(d.get("hub", {})),
            findings=tuple(Finding.from_dict(f) for f in d.get("findings", ())),
            env=tuple(sorted(d.get("env", {}).items())),
            driver_version=d.get("driver_version"),
            cuda_driver_version=d.get("cuda_driver_version"),
            torch_version=d.get("torch_version"),
            torch_cuda_version=d.get("torch_cuda_version"),
            cudnn_version=d.get("cudnn_version"),
            torch_varlen=d.get("torch_varlen"),
            transformers_version=d.get("transformers_version"),
            accelerate_version=d.get("accelerate_version"),
            python_version=d.get("python_version"),
            cpu_arch=d.get("cpu_arch"),
            host_memory=d.get("host_memory"),
            cuda_initialized=bool(d.get("cuda_initialized", False)),
        )

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent, sort_keys=False)

    @classmethod
    def from_json(cls, text: str) -> Capabilities:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            from .errors import ConfigurationError

            raise ConfigurationError(
                f"not a cudaload snapshot: {e}", fix="record one with `cudaload env --json > box.json`"
            ) from None
        return cls.from_dict(data)
