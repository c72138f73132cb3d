"""Read the GPUs through NVML (nvidia-ml-py). NVML never creates a CUDA context or allocates GPU memory,
which is why detection uses it instead of ``torch.cuda``: even ``torch.cuda.device_count()`` calls
``cuInit`` and freezes ``CUDA_VISIBLE_DEVICES`` for the rest of the process.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from dataclasses import dataclass
from typing import Any

from .visible import MigInstance, NvmlDevice

log = logging.getLogger(__name__)

#: Grace-coupled parts whose GPU shares one coherent memory with the CPU.
_UNIFIED_NAMES = ("GH200", "GB200", "GB300", "GB10")


@dataclass(frozen=True)
class NvmlReport:
    devices: tuple[NvmlDevice, ...] = ()
    driver_version: str | None = None
    cuda_driver_version: str | None = None  # "13.0"
    error: str | None = None  # why NVML could not be read (None when it could)


def driver_absent() -> bool:
    """True only where this machine certainly has no usable NVIDIA GPU: Linux without the NVIDIA kernel
    module's ``/proc/driver/nvidia`` and without its control device ``/dev/nvidiactl`` (a container given GPUs
    gets both). Two stats, no NVML: cheap enough for checking arguments. False where unsure."""
    if not sys.platform.startswith("linux"):
        return False
    return not os.path.exists("/proc/driver/nvidia") and not os.path.exists("/dev/nvidiactl")


def _text(v: bytes | str) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def is_unified(name: str) -> bool:
    return any(tag in name for tag in _UNIFIED_NAMES)


def _mig_instances(nv: Any, handle: Any, host_memory: int | None) -> tuple[MigInstance, ...]:
    out: list[MigInstance] = []
    try:
        count = nv.nvmlDeviceGetMaxMigDeviceCount(handle)
    except Exception:
        return ()
    for i in range(count):
        try:
            mh = nv.nvmlDeviceGetMigDeviceHandleByIndex(handle, i)
        except Exception:
            continue  # empty slot
        gi = ci = None
        try:
            gi = int(nv.nvmlDeviceGetGpuInstanceId(mh))
            ci = int(nv.nvmlDeviceGetComputeInstanceId(mh))
        except Exception:
            pass
        total, free = _memory(nv, mh, host_memory)
        try:
            name: str | None = _text(nv.nvmlDeviceGetName(mh))
        except Exception:
            name = None
        out.append(
            MigInstance(
                uuid=_text(nv.nvmlDeviceGetUUID(mh)),
                gpu_instance=gi,
                compute_instance=ci,
                name=name,
                total_memory=total,
                free_memory=free,
            )
        )
    return tuple(out)


def _memory(nv: Any, handle: Any, host_memory: int | None) -> tuple[int, int | None]:
    try:
        mem = nv.nvmlDeviceGetMemoryInfo(handle)
        return int(mem.total), int(mem.free)
    except Exception:
        # GB10 (DGX Spark) answers NOT_SUPPORTED: its GPU uses the system memory.
        return (host_memory or 0), None


def read(host_memory: int | None = None) -> NvmlReport:
    """Every GPU NVML sees, in NVML (PCI) order. Never raises: a missing library or driver is reported."""
    try:
        import pynvml as nv
    except ImportError:
        return NvmlReport(error="nvidia-ml-py is not installed")
    try:
        nv.nvmlInit()
    except Exception as e:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
        return NvmlReport(error=f"NVML unavailable: {e}")
    try:
        driver = _text(nv.nvmlSystemGetDriverVersion())
        try:
            cv = int(nv.nvmlSystemGetCudaDriverVersion())
            cuda = f"{cv // 1000}.{(cv % 1000) // 10}"
        except Exception:
            cuda = None
        devices: list[NvmlDevice] = []
        for i in range(nv.nvmlDeviceGetCount()):
            h = nv.nvmlDeviceGetHandleByIndex(i)
            name = _text(nv.nvmlDeviceGetName(h))
            major, minor = nv.nvmlDeviceGetCudaComputeCapability(h)
            total, free = _memory(nv, h, host_memory)
            try:
                sms: int | None = int(nv.nvmlDeviceGetNumGpuCores(h))
            except Exception:
                sms = None
            try:
                mig_on = nv.nvmlDeviceGetMigMode(h)[0] == nv.NVML_DEVICE_MIG_ENABLE
            except Exception:
                mig_on = False
            devices.append(
                NvmlDevice(
                    nvml_index=i,
                    name=name,
                    uuid=_text(nv.nvmlDeviceGetUUID(h)),
                    pci_bus_id=_text(nv.nvmlDeviceGetPciInfo(h).busId),
                    compute_capability=(int(major), int(minor)),
                    total_memory=total,
                    free_memory=free,
                    cuda_cores=sms,
                    unified_memory=is_unified(name),
                    mig_enabled=mig_on,
                    mig_instances=_mig_instances(nv, h, host_memory) if mig_on else (),
                )
            )
        return NvmlReport(devices=tuple(devices), driver_version=driver, cuda_driver_version=cuda)
    except Exception as e:
        log.debug("NVML query failed", exc_info=True)
        return NvmlReport(error=f"NVML query failed: {e}")
    finally:
        with contextlib.suppress(Exception):
            nv.nvmlShutdown()
