"""Machine detection: ``detect()`` builds a :class:`~cudaload.capabilities.Capabilities` snapshot.

``detect()`` is the thin impure shell (NVML, installed packages, the Hub probe, the environment);
:func:`assemble` is the pure part that turns those facts into GPUs in torch's numbering plus findings, so
tests drive it with fake NVML device lists. Detection never initialises CUDA: no ``torch.cuda`` call is
made unless CUDA was already initialised by someone else.
"""

from __future__ import annotations

import logging
import os
import platform
import sys
from collections.abc import Mapping
from dataclasses import replace

from .. import _env
from ..capabilities import GPU, CachedKernel, Capabilities, Distributed, Finding, HubState, PackageInfo
from . import bytecode as _bytecode
from . import hub as _hub
from . import nvml as _nvml
from . import packages as _packages
from . import versions as _versions
from .visible import NvmlDevice, Selected, Visibility, resolve

log = logging.getLogger(__name__)

__all__ = [
    "GPU_SELECTION",
    "assemble",
    "clear_cache",
    "detect",
    "hub_probe",
    "process_device",
    "render",
    "with_hub_answer",
]

#: findings about which GPU a process uses: nothing a CPU-only run (``cudaload demo --cpu``) depends on
GPU_SELECTION = frozenset(
    {
        "cvd-unmatched",
        "cvd-duplicate",
        "cvd-malformed",
        "cvd-hides-all",
        "cvd-no-gpu",
        "cvd-after-init",
        "device-order",
        "device-order-invalid",
        "local-rank",
        "mig-multiple",
    }
)

#: one probe per process and (endpoint, timeout): a second detect() reuses the answer, or the running request
_hub_probes: dict[tuple[str, float], _hub.Probe] = {}


def clear_cache() -> None:
    """Forget cached package probes and Hub answers (``detect(refresh=True)`` does this)."""
    _packages.clear_cache()
    _hub_probes.clear()


def hub_probe(env: Mapping[str, str] | None = None) -> _hub.Probe | None:
    """The Hub reachability probe, started on a thread if this process has none for this endpoint yet, without
    waiting for it; None where detection may not probe (``HF_HUB_OFFLINE``, ``CUDALOAD_HUB_TIMEOUT=0``).

    ``load_model()`` starts it only when a decision needs the answer and collects it after transformers has
    imported (:func:`with_hub_answer`), so the request costs the load nothing it would wait for."""
    e: Mapping[str, str] = os.environ if env is None else env
    if not _env.hub_probe_enabled(e):
        return None
    key = (_env.hf_endpoint(e), _env.hub_probe_timeout(e))
    probe = _hub_probes.get(key)
    if probe is None:
        probe = _hub_probes[key] = _hub.Probe(*key)
    return probe


def with_hub_answer(caps: Capabilities, probe: _hub.Probe | None) -> Capabilities:
    """``caps`` with the probe's answer as ``hub.reachable`` (waits for it, within its timeout) and the finding
    :func:`detect` would have made of it; ``caps`` itself when there is no probe."""
    if probe is None:
        return caps
    hub = replace(caps.hub, reachable=probe.answer())
    unreachable = _hub_finding(hub)
    findings = caps.findings if unreachable is None else (*caps.findings, unreachable)
    return replace(caps, hub=hub, findings=findings)


def _hub_finding(hub: HubState) -> Finding | None:
    if hub.reachable is not False:
        return None
    return Finding(
        "hub-unreachable",
        f"the Hub ({hub.endpoint}) did not answer within the probe bound",
        "set HF_HUB_OFFLINE=1 to work from the local cache without waiting on the network",
    )


def _host_memory() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return None


def _cuda_state() -> tuple[bool, int | None]:
    """(CUDA initialised in this process, torch's device count if so). Never initialises anything."""
    torch = sys.modules.get("torch")
    if torch is None:
        return False, None
    try:
        if not torch.cuda.is_initialized():
            return False, None
        return True, int(torch.cuda.device_count())  # already initialised: this call is free
    except Exception:
        return False, None


def _cached_kernels(cache_dir: str) -> tuple[CachedKernel, ...]:
    from ..hub_kernels import scan_cache

    try:
        return tuple(scan_cache(cache_dir))
    except Exception:
        # scan_cache skips unreadable entries itself, so this is a bug in it: detection carries on without
        # cached kernels, but says so rather than reporting an empty cache as if it were true.
        log.warning(
            "scanning the kernel cache %s failed; no cached kernels are counted", cache_dir, exc_info=True
        )
        return ()


def _gpu(index: int, s: Selected) -> GPU:
    d, m = s.device, s.mig
    return GPU(
        index=index,
        name=m.name if m and m.name else d.name,
        compute_capability=d.compute_capability,
        total_memory=m.total_memory if m else d.total_memory,
        free_memory=m.free_memory if m else d.free_memory,
        nvml_index=d.nvml_index,
        pci_bus_id=d.pci_bus_id,
        uuid=m.uuid if m else d.uuid,
        unified_memory=d.unified_memory,
        mig=m is not None,
        mig_parent_uuid=d.uuid if m else None,
    )


def _findings(
    devices: tuple[NvmlDevice, ...],
    vis: Visibility,
    env: Mapping[str, str],
    *,
    nvml_error: str | None,
    torch_cuda: str | None,
    packages: tuple[PackageInfo, ...],
    cuda_initialized: bool,
    torch_device_count: int | None,
    launch: _env.LaunchEnv,
    hub: HubState,
    bytecode: _bytecode.BytecodeState | None = None,
) -> list[Finding]:
    """What a person should know about this machine's GPU setup, in order: NVML, the device order and
    CUDA_VISIBLE_DEVICES, CUDA started already, the launch, the packages, the Hub, the bytecode cache."""
    out: list[Finding] = []
    cvd = _env.cuda_visible_devices(env)
    if nvml_error and torch_cuda:
        out.append(
            Finding(
                "nvml-unavailable",
                f"torch is a CUDA {torch_cuda} build but {nvml_error}",
                "install the NVIDIA driver (nvidia-smi must work) and `pip install nvidia-ml-py`",
            )
        )
    out += _order_findings(devices, vis, env)
    out += _cvd_findings(devices, vis, cvd, nvml_error)
    out += _started_findings(devices, vis, cuda_initialized, torch_device_count, launch)
    out += _package_findings(packages, devices, torch_cuda)
    unreachable = _hub_finding(hub)
    if unreachable is not None:
        out.append(unreachable)
    slow_imports = _bytecode.finding_text(bytecode) if bytecode is not None else None
    if slow_imports:
        out.append(Finding("bytecode-uncached", *slow_imports))
    return out


def _order_findings(
    devices: tuple[NvmlDevice, ...], vis: Visibility, env: Mapping[str, str]
) -> list[Finding]:
    """CUDA_DEVICE_ORDER that CUDA ignores, or mixed GPUs numbered fastest first."""
    out: list[Finding] = []
    order = _env.cuda_device_order(env)
    if order and order not in _env.DEVICE_ORDERS:
        out.append(
            Finding(
                "device-order-invalid",
                f"CUDA_DEVICE_ORDER={order!r} is neither FASTEST_FIRST nor PCI_BUS_ID: CUDA ignores it and "
                "numbers the GPUs fastest first",
                "export CUDA_DEVICE_ORDER=PCI_BUS_ID (nvidia-smi's order), or unset it",
            )
        )
    if vis.order_guessed and len(devices) > 1:
        models = sorted({d.name for d in devices})
        out.append(
            Finding(
                "device-order",
                f"mixed GPUs ({', '.join(models)}) without CUDA_DEVICE_ORDER=PCI_BUS_ID: CUDA numbers "
                "them fastest first, so cuda:N and nvidia-smi's GPU N may be different cards",
                "export CUDA_DEVICE_ORDER=PCI_BUS_ID",
            )
        )
    return out


def _cvd_findings(
    devices: tuple[NvmlDevice, ...], vis: Visibility, cvd: str | None, nvml_error: str | None
) -> list[Finding]:
    """What CUDA_VISIBLE_DEVICES selects wrongly: nothing to match, an entry that matches no GPU, one named
    twice, entries read leniently, every GPU hidden, more than one MIG instance."""
    out: list[Finding] = []
    if vis.unmatched and not devices:
        # nothing can match on a machine without an NVIDIA GPU: CUDA sees none with or without the variable, so
        # a load runs on the CPU as it would unset (load_model does not stop on this code); nvidia-smi -L has
        # nothing to list here, so the fix is the variable itself
        out.append(
            Finding(
                "cvd-no-gpu",
                f"CUDA_VISIBLE_DEVICES={cvd!r} selects GPUs, but this machine has no NVIDIA GPU that NVML can "
                f"see ({nvml_error or 'none found'}): models load on the CPU",
                "unset CUDA_VISIBLE_DEVICES (or set it empty: no GPU) to run on the CPU without this error"
                + (
                    "; this machine has no NVIDIA driver (NVML's library is missing): a GPU needs one"
                    if nvml_error and "Library Not Found" in nvml_error
                    else ""
                ),
                severity="error",
            )
        )
    elif vis.unmatched:
        out.append(
            Finding(
                "cvd-unmatched",
                f"CUDA_VISIBLE_DEVICES={cvd!r}: {vis.unmatched[0]!r} matches no GPU"
                + (" (ambiguous UUID prefix)" if vis.ambiguous else "")
                + f"; CUDA ignores it and everything after it, leaving {len(vis.selected)} GPU(s)",
                "use indices or UUIDs from `nvidia-smi -L` (GPU-... or MIG-...)",
                severity="error",
            )
        )
    if vis.duplicate:
        out.append(
            Finding(
                "cvd-duplicate",
                f"CUDA_VISIBLE_DEVICES={cvd!r} names {vis.duplicate!r} twice; CUDA then sees no GPU",
                "list each GPU once",
                severity="error",
            )
        )
    if vis.lenient:
        out.append(
            Finding(
                "cvd-malformed",
                f"CUDA_VISIBLE_DEVICES entries {list(vis.lenient)} are read as their leading digits",
                "use plain integers or GPU-/MIG- UUIDs",
            )
        )
    if vis.hidden_all and devices:
        out.append(
            Finding(
                "cvd-hides-all",
                f"CUDA_VISIBLE_DEVICES={cvd!r} hides all {len(devices)} GPU(s); models load on the CPU",
                "unset CUDA_VISIBLE_DEVICES to use the GPUs",
            )
        )
    if sum(1 for s in vis.selected if s.mig) > 1:
        out.append(
            Finding(
                "mig-multiple",
                "more than one MIG instance is visible; one CUDA process can use only one MIG device "
                "(no multi-GPU placement across MIG instances)",
                "give each process one MIG device: CUDA_VISIBLE_DEVICES=MIG-<uuid>",
            )
        )
    return out


def _started_findings(
    devices: tuple[NvmlDevice, ...],
    vis: Visibility,
    cuda_initialized: bool,
    torch_device_count: int | None,
    launch: _env.LaunchEnv,
) -> list[Finding]:
    """CUDA already started in this process (the device variables changed too late, or can no longer
    change), and a LOCAL_RANK beyond the visible GPUs."""
    out: list[Finding] = []
    if cuda_initialized:
        if torch_device_count is not None and devices and torch_device_count != len(vis.selected):
            out.append(
                Finding(
                    "cvd-after-init",
                    f"CUDA was initialised with {torch_device_count} GPU(s) but CUDA_VISIBLE_DEVICES "
                    f"now selects {len(vis.selected)}: it was changed after CUDA started and has no effect",
                    "set CUDA_VISIBLE_DEVICES before the first torch.cuda call in the process",
                    severity="error",
                )
            )
        else:
            out.append(
                Finding(
                    "cuda-initialized",
                    "CUDA was already initialised when cudaload looked; CUDA_VISIBLE_DEVICES and "
                    "CUDA_DEVICE_ORDER can no longer change in this process",
                    "set device variables before any torch.cuda call",
                )
            )
    if launch.local_rank is not None and vis.selected and launch.local_rank >= len(vis.selected):
        out.append(
            Finding(
                "local-rank",
                f"LOCAL_RANK={launch.local_rank} but only {len(vis.selected)} GPU(s) are visible",
                "launch at most one process per visible GPU (torchrun --nproc-per-node)",
                severity="error",
            )
        )
    return out


def _package_findings(
    packages: tuple[PackageInfo, ...], devices: tuple[NvmlDevice, ...], torch_cuda: str | None
) -> list[Finding]:
    """Installed packages that cannot run here: kernels out of transformers' range, a broken flash-attn build,
    bitsandbytes without its native library."""
    out: list[Finding] = []
    for p in packages:
        if p.name == "kernels" and p.installed and p.in_range is False:
            out.append(
                Finding(
                    "kernels-out-of-range",
                    f"kernels {p.version} is installed but this transformers accepts {p.accepted}; "
                    "transformers reports kernels as unavailable (use_kernels does nothing)",
                    _packages.kernels_fix(p.accepted, p.version),
                )
            )
        elif (
            p.installed
            and not p.usable
            and p.name in ("flash-attn", "flash-attn-3", "flash-attn-4")
            and devices
        ):
            out.append(
                Finding(
                    f"{p.name}-broken",
                    f"{p.name} {p.version} is installed but unusable: {p.reason}",
                    f"reinstall {p.name} for this torch/CUDA, or uninstall it",
                    severity="error",
                )
            )
        elif p.name == "bitsandbytes" and p.installed and not p.usable and devices and torch_cuda:
            out.append(
                Finding(
                    "bitsandbytes-native",
                    f"bitsandbytes {p.version}: {p.reason}",
                    "pip install -U bitsandbytes (a build for this CUDA), or set BNB_CUDA_VERSION",
                    severity="error",
                )
            )
    return out


def assemble(
    devices: tuple[NvmlDevice, ...] | list[NvmlDevice],
    env: Mapping[str, str],
    *,
    nvml_error: str | None = None,
    driver_version: str | None = None,
    cuda_driver_version: str | None = None,
    packages: tuple[PackageInfo, ...] = (),
    hub: HubState | None = None,
    torch_version: str | None = None,
    torch_cuda_version: str | None = None,
    cudnn_version: str | None = None,
    torch_varlen: str | None = None,
    transformers_version: str | None = None,
    accelerate_version: str | None = None,
    python_version: str | None = None,
    cpu_arch: str | None = None,
    host_memory: int | None = None,
    cuda_initialized: bool = False,
    torch_device_count: int | None = None,
    source: str = "detected",
    bytecode: _bytecode.BytecodeState | None = None,
) -> Capabilities:
    """Pure: NVML's devices + the environment -> a snapshot with GPUs in torch's order and findings.
    ``bytecode``: whether the packages a load imports have cached bytecode (:mod:`.bytecode`; None: unknown)."""
    devices = tuple(devices)
    vis = resolve(devices, _env.cuda_visible_devices(env), _env.cuda_device_order(env))
    launch = _env.launch(env)
    hub = hub or HubState(
        offline=_env.hub_offline(env), cache_dir=_env.hub_cache(env), endpoint=_env.hf_endpoint(env)
    )
    findings = _findings(
        devices,
        vis,
        env,
        nvml_error=nvml_error,
        torch_cuda=torch_cuda_version,
        packages=packages,
        cuda_initialized=cuda_initialized,
        torch_device_count=torch_device_count,
        launch=launch,
        hub=hub,
        bytecode=bytecode,
    )
    return Capabilities(
        source=source,
        gpus=tuple(_gpu(i, s) for i, s in enumerate(vis.selected)),
        packages=tuple(sorted(packages, key=lambda p: p.name)),
        distributed=Distributed(launch.local_rank, launch.rank, launch.world_size, launch.local_world_size),
        hub=hub,
        findings=tuple(findings),
        env=tuple(sorted(_env.snapshot(env).items())),
        driver_version=driver_version,
        cuda_driver_version=cuda_driver_version,
        torch_version=torch_version,
        torch_cuda_version=torch_cuda_version,
        cudnn_version=cudnn_version,
        torch_varlen=torch_varlen,
        transformers_version=transformers_version,
        accelerate_version=accelerate_version,
        python_version=python_version,
        cpu_arch=cpu_arch,
        host_memory=host_memory,
        cuda_initialized=cuda_initialized,
    )


def detect(
    *, env: Mapping[str, str] | None = None, probe_hub: bool | None = None, refresh: bool = False
) -> Capabilities:
    """The machine this process runs on, as a :class:`Capabilities` snapshot (what ``cudaload env`` prints).

    Reads NVML, the installed packages and the environment; never initialises CUDA, and is bounded in time
    (the Hub probe takes at most ``CUDALOAD_HUB_TIMEOUT`` seconds, default 2, and runs once per process).
    Problems found (a ``CUDA_VISIBLE_DEVICES`` entry matching no GPU, a broken flash-attn...) are recorded
    in ``findings``, not raised.

    Args:
        env: the environment variables to read (default ``os.environ``); a mapping replays a recorded
            environment, and CUDA's state in this process is then not read.
        probe_hub: whether to ask the Hub if it is reachable: None (default) probes unless offline or
            ``CUDALOAD_HUB_TIMEOUT=0``; False leaves ``hub.reachable`` None.
        refresh: forget cached package probes and Hub answers first.

    Returns:
        The snapshot: GPUs, CUDA/torch/transformers versions, packages, launch and Hub state, findings.
        ``to_json()`` makes it a profile for :func:`cudaload.plan`'s ``hardware``.

    Raises:
        ConfigurationError: a variable cudaload reads is set to a value it cannot use (``LOCAL_RANK=x``,
            ``CUDALOAD_HUB_TIMEOUT=-1``).
    """
    if refresh:
        clear_cache()
    e: Mapping[str, str] = os.environ if env is None else env
    host_mem = _host_memory()
    report = _nvml.read(host_mem)
    torch_cuda = _versions.torch_cuda_version()
    transformers_version = _versions.dist_version("transformers")
    pkgs = _packages.probe_all(
        transformers_version=transformers_version,
        torch_cuda=torch_cuda,
        has_gpu=bool(report.devices),
        bnb_override=_env.bnb_cuda_version(e),
    )
    offline = _env.hub_offline(e)
    endpoint = _env.hf_endpoint(e)
    timeout = _env.hub_probe_timeout(e)
    do_probe = _env.hub_probe_enabled(e) if probe_hub is None else (probe_hub and not offline and timeout > 0)
    probe = hub_probe(e) if do_probe else None
    cache_dir = _env.hub_cache(e)
    hub = HubState(
        offline=offline,
        reachable=None if probe is None else probe.answer(),
        cache_dir=cache_dir,
        endpoint=endpoint,
        # kernels downloads into KERNELS_CACHE when set, else the Hub cache: look where it will
        cached_kernels=_cached_kernels(_env.kernels_cache(e)),
    )
    initialized, torch_count = _cuda_state() if env is None else (False, None)
    return assemble(
        report.devices,
        e,
        nvml_error=report.error,
        driver_version=report.driver_version,
        cuda_driver_version=report.cuda_driver_version,
        packages=pkgs,
        hub=hub,
        torch_version=_versions.dist_version("torch"),
        torch_cuda_version=torch_cuda,
        # torch's CUDA wheels load cuDNN from this distribution (its version decides SDPA's dispatch)
        cudnn_version=_versions.dist_version("nvidia-cudnn-cu13", "nvidia-cudnn-cu12", "nvidia-cudnn-cu11"),
        # torch's own varlen flash attention (cudaload_varlen), read from its files: torch is not imported
        torch_varlen=_versions.torch_varlen(),
        transformers_version=transformers_version,
        accelerate_version=_versions.dist_version("accelerate"),
        python_version=platform.python_version(),
        cpu_arch=platform.machine() or None,
        host_memory=host_mem,
        cuda_initialized=initialized,
        torch_device_count=torch_count,
        # this process's interpreter and files, like the CUDA state: not read for an explicit environment
        bytecode=_bytecode.probe() if env is None else None,
    )


def process_device(caps: Capabilities) -> int | None:
    """The GPU this process should use: ``LOCAL_RANK`` under a launcher, else 0; None without GPUs."""
    if not caps.gpus:
        return None
    lr = caps.distributed.local_rank
    if lr is not None and lr < len(caps.gpus):
        return lr
    return 0


def _gib(n: int | None) -> str:
    return "?" if n is None else f"{n / 2**30:.1f} GiB"


def render(caps: Capabilities) -> str:
    """Human text for ``cudaload env``."""
    lines = [f"cudaload env ({caps.source})"]
    lines.append(
        f"  python {caps.python_version or '?'} on {caps.cpu_arch or '?'}, "
        f"host memory {_gib(caps.host_memory)}"
    )
    torch_line = caps.torch_version or "?"
    if caps.torch_version:
        torch_line += f" (CUDA {caps.torch_cuda_version})" if caps.torch_cuda_version else " (CPU build)"
        if caps.cudnn_version:
            torch_line += f", cuDNN {caps.cudnn_version}"
    lines.append(
        f"  torch {torch_line}, transformers {caps.transformers_version or '?'}, "
        f"accelerate {caps.accelerate_version or '?'}"
    )
    if caps.driver_version:
        lines.append(
            f"  NVIDIA driver {caps.driver_version} (supports CUDA {caps.cuda_driver_version or '?'})"
        )
    lines.append(f"GPUs ({len(caps.gpus)}):" if caps.gpus else "GPUs: none visible (models load on the CPU)")
    for g in caps.gpus:
        extra = []
        if g.nvml_index is not None and g.nvml_index != g.index:
            extra.append(f"nvidia-smi GPU {g.nvml_index}")
        if g.mig:
            extra.append("MIG instance")
        if g.unified_memory:
            extra.append("unified memory")
        extra.append("bf16" if g.bf16_native else "no native bf16")
        if g.fp8:
            extra.append("fp8")
        free = f", {_gib(g.free_memory)} free" if g.free_memory is not None else ""
        lines.append(
            f"  cuda:{g.index}  {g.name}  sm{g.sm} {g.architecture}  {_gib(g.total_memory)}{free}  "
            f"[{', '.join(extra)}]"
        )
        if g.uuid or g.pci_bus_id:
            lines.append(f"          {g.uuid or ''} {g.pci_bus_id or ''}".rstrip())
    lines.append("Packages:")
    for p in caps.packages:
        state = "usable" if p.usable else ("installed, NOT usable" if p.installed else "not installed")
        ver = f" {p.version}" if p.version else ""
        why = f" - {p.reason}" if p.reason and p.installed else ""
        assumed = " (assumed)" if p.assumed else ""
        lines.append(f"  {p.name}{ver}: {state}{assumed}{why}")
    h = caps.hub
    reach = "not probed" if h.reachable is None else ("reachable" if h.reachable else "UNREACHABLE")
    lines.append(
        f"Hub: {'offline' if h.offline else 'online'}, {reach}; cache {h.cache_dir or '?'}; "
        f"{len(h.cached_kernels)} cached kernel repo(s)"
    )
    d = caps.distributed
    if d.world_size is not None or d.local_rank is not None:
        lines.append(
            f"Launcher: rank {d.rank}, local rank {d.local_rank}, world size {d.world_size}, "
            f"local world size {d.local_world_size}; this process uses cuda:{process_device(caps)}"
        )
    if caps.env:
        lines.append("Environment: " + ", ".join(f"{k}={v!r}" for k, v in caps.env))
    if caps.findings:
        lines.append("Findings:")
        for f in caps.findings:
            lines.append(f"  [{f.severity}] {f.code}: {f.message}")
            lines.append(f"      fix: {f.fix}")
    return "\n".join(lines)
