"""The machine a plan is for: a snapshot as given, a profile or recorded machine, or this one (detected), with the
packages assumed installed or missing and, for this machine, the Hub's answer where a decision needs it; the
plan's summary of it; the one-time attention costs this process has already paid."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from .. import _env
from ..capabilities import Capabilities

if TYPE_CHECKING:
    from ..detection.hub import Probe
    from ..request import Request


def machine_for(req: Request) -> Capabilities:
    """The snapshot ``req`` is planned against (``req.hardware`` is already resolved by the request)."""
    caps = resolve_hardware(req.hardware)
    if req.assume_installed or req.assume_missing:
        caps = caps.with_packages(req.assume_installed, req.assume_missing)
    if req.hardware is None:
        from ..detection import with_hub_answer
        from ..request import check_devices

        caps = with_hub_answer(caps, hub_probe_for(caps))
        check_devices(
            req, caps
        )  # the request checked a snapshot it was given; this machine is known only now
    _one_gpu_parallelism(req, caps)
    return caps


#: the strategies that share a model or a step among several GPUs (policies.parallelism.REQUESTS less "auto" and
#: "single")
_SEVERAL_GPUS = ("tp", "ddp", "fsdp2", "deepspeed", "layer_split")


def _one_gpu_parallelism(req: Request, caps: Capabilities) -> None:
    """``parallelism=`` naming a strategy over several GPUs, on a machine (or a world of ranks) of one GPU: the plan
    would read "tensor parallel over 1 GPUs", one GPU doing all of it under another name."""
    from ..policies.parallelism.topology import world

    if req.parallelism not in _SEVERAL_GPUS or len(caps.gpus) != 1 or world(caps)[0] > 1:
        return  # no GPU: the parallelism decision refuses it itself ("needs GPUs and none is visible")
    from ..errors import InvalidChoiceError

    g = caps.gpus[0]
    several = (
        f"hardware='2x{caps.source.removeprefix('profile:')}'"
        if caps.source.startswith("profile:")
        else "a machine with several GPUs (or torchrun ranks)"
    )
    raise InvalidChoiceError(
        f"parallelism={req.parallelism!r} shares the work among several GPUs, and this plan has one ({g.name})",
        fix=f"drop parallelism= (one GPU runs it whole), or plan for several: {several}",
    )


def resolve_hardware(hardware: Capabilities | str | os.PathLike[str] | None) -> Capabilities:
    """A snapshot as given, a profile or recorded machine by name or path, or this machine (None).

    This machine is detected without asking the Hub (``hub.reachable`` None): the answer is asked for only
    where a decision needs it, through :func:`hub_probe_for` and ``detection.with_hub_answer``."""
    if isinstance(hardware, Capabilities):
        return hardware
    if hardware is None:
        from ..detection import detect

        return detect(probe_hub=False)
    from ..profiles import hardware as profile

    return profile(os.fspath(hardware))


def hub_probe_for(caps: Capabilities) -> Probe | None:
    """The Hub reachability probe, started on a thread, when a decision on this detected machine needs its answer
    (``hub_kernels.needs_hub_answer``: a Hub kernel ``kernels`` might download); None otherwise. Before this, every
    ``load_model()`` waited for a HEAD request to the Hub before importing anything: a round trip online, and the
    whole ``CUDALOAD_HUB_TIMEOUT`` (2 s) behind a firewall that drops packets, for a local model whose plan no
    answer could change."""
    from ..hub_kernels import needs_hub_answer

    if not needs_hub_answer(caps):
        return None
    from ..detection import hub_probe

    return hub_probe()


def hardware_summary(caps: Capabilities) -> dict[str, Any]:
    return {
        "source": caps.source,
        "gpus": [
            {
                "index": g.index,
                "name": g.name,
                "compute_capability": list(g.compute_capability),
                "architecture": g.architecture,
                "total_memory": g.total_memory,
                "free_memory": g.free_memory,
            }
            for g in caps.gpus
        ],
        "distributed": caps.distributed.to_dict() if caps.distributed.active else None,
        "torch": caps.torch_version,
        "torch_cuda": caps.torch_cuda_version,
        "transformers": caps.transformers_version,
        "host_memory": caps.host_memory,
        "packages": {p.name: (p.version or True) if p.usable else False for p in caps.packages},
    }


def _first_use_here(caps: Capabilities) -> dict[str, float] | None:
    """One-time attention costs this process has already paid (None: the shipped table applies as is).

    Only for the machine this process runs on: a profile or a recorded machine is planned as a fresh process.
    FA4 imported already: only its JIT is left; its persistent compile cache holding kernels (cudaload turns
    it on under its cache directory): the JIT costs what a cache hit costs."""
    import sys

    from ..policies.attention.first_use import FA4_IMPORT_WARM_S, FA4_JIT_CACHED_S, FA4_JIT_S
    from ..policies.attention.names import HUB_KERNEL

    if caps.source != "detected":
        return None
    from pathlib import Path

    enabled, directory = _env.fa4_compile_cache()
    d = Path(directory or Path(_env.cache_dir()) / "fa4")
    # a user's FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=0 stands (cudaload never overrides it): no cache hits then
    cached = enabled != "0" and d.is_dir() and any(d.iterdir())
    jit = FA4_JIT_CACHED_S if cached else FA4_JIT_S
    imported = "flash_attn.cute" in sys.modules
    if not imported and not cached:
        return None
    fa4 = jit + (0.0 if imported else FA4_IMPORT_WARM_S)
    return {"flash_attention_4": fa4, HUB_KERNEL["flash_attention_4"]: fa4}
