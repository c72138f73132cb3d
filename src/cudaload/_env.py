"""The one place cudaload reads environment variables.

Every variable cudaload honours is read here and documented in docs/environment.md; other modules call
these functions instead of touching ``os.environ``. Functions take an optional mapping so policies and
tests can pass an explicit environment (a recorded machine) instead of the live one.

A variable set to something cudaload cannot use raises :class:`~cudaload.errors.ConfigurationError` through
:func:`_invalid` (docs/errors.md), never a silent default: a typo in a setting must not look like a choice.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass

_TRUE = {"1", "true", "yes", "on"}

#: Variables that describe the machine and are recorded in a Capabilities snapshot.
RECORDED = (
    "CUDA_VISIBLE_DEVICES",
    "CUDA_DEVICE_ORDER",
    "LOCAL_RANK",
    "RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "HF_HUB_OFFLINE",
    "TRANSFORMERS_OFFLINE",
    "BNB_CUDA_VERSION",
    "KERNELS_CACHE",
    # torch's switches for cuDNN's place in SDPA's dispatch (cudaload.policies.sdpa_dispatch)
    "TORCH_CUDNN_SDPA_PREFERRED",
    "TORCH_CUDNN_SDPA_DEPRIORITIZED",
)


def _environ(env: Mapping[str, str] | None) -> Mapping[str, str]:
    return os.environ if env is None else env


def flag(value: str | None) -> bool:
    return value is not None and value.strip().lower() in _TRUE


def cuda_visible_devices(env: Mapping[str, str] | None = None) -> str | None:
    """Raw ``CUDA_VISIBLE_DEVICES``; None when unset (all GPUs), "" when set empty (no GPU)."""
    return _environ(env).get("CUDA_VISIBLE_DEVICES")


def cuda_device_order(env: Mapping[str, str] | None = None) -> str | None:
    """``CUDA_DEVICE_ORDER``; CUDA's default when unset is FASTEST_FIRST."""
    return _environ(env).get("CUDA_DEVICE_ORDER")


@dataclass(frozen=True)
class LaunchEnv:
    """What a launcher (torchrun, accelerate launch, deepspeed, SLURM through them) told this process."""

    local_rank: int | None
    rank: int | None
    world_size: int | None
    local_world_size: int | None


def _invalid(name: str, raw: str, expected: str, example: str) -> Exception:
    """The one error for a variable set to a value cudaload cannot use."""
    from .errors import ConfigurationError

    return ConfigurationError(
        f"{name}={raw!r} is not {expected}",
        fix=f"unset {name} or set it to {expected} (e.g. {name}={example})",
    )


def _int(env: Mapping[str, str], name: str) -> int | None:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return None
    try:
        return int(raw)
    except ValueError:
        raise _invalid(name, raw, "an integer", "0") from None


def launch(env: Mapping[str, str] | None = None) -> LaunchEnv:
    e = _environ(env)
    return LaunchEnv(
        local_rank=_int(e, "LOCAL_RANK"),
        rank=_int(e, "RANK"),
        world_size=_int(e, "WORLD_SIZE"),
        local_world_size=_int(e, "LOCAL_WORLD_SIZE"),
    )


def hub_offline(env: Mapping[str, str] | None = None) -> bool:
    """``HF_HUB_OFFLINE`` (or the older ``TRANSFORMERS_OFFLINE``) as huggingface_hub reads it."""
    e = _environ(env)
    return flag(e.get("HF_HUB_OFFLINE")) or flag(e.get("TRANSFORMERS_OFFLINE"))


def hf_endpoint(env: Mapping[str, str] | None = None) -> str:
    return _environ(env).get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")


def hub_cache(env: Mapping[str, str] | None = None) -> str:
    """The Hub cache directory, resolved the way huggingface_hub resolves it."""
    e = _environ(env)
    if e.get("HF_HUB_CACHE"):
        return e["HF_HUB_CACHE"]
    home = e.get("HF_HOME") or os.path.join(
        e.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "huggingface"
    )
    return os.path.join(home, "hub")


def kernels_cache(env: Mapping[str, str] | None = None) -> str:
    """Where the ``kernels`` package keeps Hub kernels: ``KERNELS_CACHE``, else the Hub cache."""
    return _environ(env).get("KERNELS_CACHE") or hub_cache(env)


def hub_probe_timeout(env: Mapping[str, str] | None = None) -> float:
    """``CUDALOAD_HUB_TIMEOUT``: seconds the Hub reachability probe may take (default 2, 0 = never probe)."""
    raw = _environ(env).get("CUDALOAD_HUB_TIMEOUT")
    if raw is None or raw.strip() == "":
        return 2.0
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0.0 <= value < float("inf"):  # also rejects nan
        raise _invalid("CUDALOAD_HUB_TIMEOUT", raw, "a number of seconds >= 0", "2")
    return value


def ranks_timeout(env: Mapping[str, str] | None = None) -> float:
    """``CUDALOAD_RANKS_TIMEOUT``: seconds a torchrun rank's load_model waits for the other ranks to publish
    their GPUs (and later their plans) before it plans alone (default 300; 0 = never wait, plan alone)."""
    raw = _environ(env).get("CUDALOAD_RANKS_TIMEOUT")
    if raw is None or raw.strip() == "":
        return 300.0
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0.0 <= value < float("inf"):
        raise _invalid("CUDALOAD_RANKS_TIMEOUT", raw, "a number of seconds >= 0", "300")
    return value


def torchelastic(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """What torchrun tells its workers about the store its agent hosts (torch 2.13
    distributed/elastic/agent/server/local_elastic_agent.py:415-431): MASTER_ADDR, MASTER_PORT,
    TORCHELASTIC_USE_AGENT_STORE, TORCHELASTIC_RUN_ID, TORCHELASTIC_RESTART_COUNT (those that are set)."""
    e = _environ(env)
    names = (
        "MASTER_ADDR",
        "MASTER_PORT",
        "TORCHELASTIC_USE_AGENT_STORE",
        "TORCHELASTIC_RUN_ID",
        "TORCHELASTIC_RESTART_COUNT",
    )
    return {k: e[k] for k in names if e.get(k)}


def _switch(env: Mapping[str, str] | None, name: str, default: bool) -> bool:
    """An on/off variable: unset or empty gives ``default``; ``1 true yes on`` / ``0 false no off``; anything
    else is an error (a typo must not look like a choice)."""
    raw = _environ(env).get(name)
    if raw is None or raw.strip() == "":
        return default
    v = raw.strip().lower()
    if v in _TRUE:
        return True
    if v in {"0", "false", "no", "off"}:
        return False
    raise _invalid(name, raw, "1 or 0", "0" if default else "1")


def gpu_start_enabled(env: Mapping[str, str] | None = None) -> bool:
    """``CUDALOAD_GPU_START``: whether load_model creates the CUDA context on a thread while transformers
    imports (default on; ``0`` / ``false`` / ``no`` / ``off`` turn it off)."""
    return _switch(env, "CUDALOAD_GPU_START", True)


def trusted_kernel_repos(env: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """``CUDALOAD_TRUST_KERNELS``: comma-separated Hub kernel repos or publishers (``org/*``) to run."""
    raw = _environ(env).get("CUDALOAD_TRUST_KERNELS", "")
    entries = tuple(p.strip() for p in raw.split(",") if p.strip())
    for entry in entries:
        # an entry that is not a repo, a publisher or "*" would trust nothing, silently
        if not _TRUST_ENTRY.match(entry):
            raise _invalid(
                "CUDALOAD_TRUST_KERNELS",
                raw,
                "a comma-separated list of org/name, org/* or *",
                "kernels-community/*",
            )
    return entries


_TRUST_ENTRY = re.compile(r"^(\*|[\w.-]+/(\*|[\w.-]+))$")


def cache_dir(env: Mapping[str, str] | None = None) -> str:
    """``CUDALOAD_CACHE``: where cudaload keeps its own small caches (attention probe verdicts)."""
    e = _environ(env)
    if e.get("CUDALOAD_CACHE"):
        return e["CUDALOAD_CACHE"]
    return os.path.join(e.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "cudaload")


def snapshot(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The recorded variables that are set, for a Capabilities snapshot."""
    e = _environ(env)
    return {k: e[k] for k in RECORDED if k in e}


def bnb_cuda_version(env: Mapping[str, str] | None = None) -> str | None:
    """``BNB_CUDA_VERSION``: bitsandbytes' override of which CUDA library it loads ("124" = 12.4).
    Read (never set) so detection probes the same library bitsandbytes will load."""
    raw = _environ(env).get("BNB_CUDA_VERSION")
    return raw if raw and raw.isdigit() else None


def hub_probe_enabled(env: Mapping[str, str] | None = None) -> bool:
    """Whether detection may probe the Hub: not when offline, not when ``CUDALOAD_HUB_TIMEOUT=0``."""
    return not hub_offline(env) and hub_probe_timeout(env) > 0


#: FlashAttention-4's persistent JIT cache switches, read by flash-attn-4 once, when
#: ``flash_attn.cute.cache_utils`` is imported (4.0.0b36 flash_attn/cute/cache_utils.py:34 and :39).
FA4_CACHE_ENABLED = "FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED"
FA4_CACHE_DIR = "FLASH_ATTENTION_CUTE_DSL_CACHE_DIR"


def fa4_compile_cache(env: Mapping[str, str] | None = None) -> tuple[str | None, str | None]:
    """The user's own (``FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED``, ``..._DIR``); None where unset."""
    e = _environ(env)
    return e.get(FA4_CACHE_ENABLED), e.get(FA4_CACHE_DIR)
