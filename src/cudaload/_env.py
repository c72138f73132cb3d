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


def trust_entry_ok(entry: str) -> bool:
    """Whether ``entry`` names a Hub kernel repo (``org/name``), a publisher (``org/*``) or every one (``*``)."""
    return bool(_TRUST_ENTRY.match(entry))


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


def _checked_bnb_cuda_version(env: Mapping[str, str]) -> str | None:
    """:func:`bnb_cuda_version`, refusing a value bitsandbytes cannot use: set at all, it must be digits
    (bitsandbytes 0.50.2 cextension.py:42-43 raises RuntimeError otherwise, an empty value included, when the
    quantized load imports it; it then loads ``libbitsandbytes_cuda{BNB_CUDA_VERSION}.so``)."""
    raw = env.get("BNB_CUDA_VERSION")
    if raw is None or raw.isdigit():
        return bnb_cuda_version(env)
    dotted = re.fullmatch(r"\s*(\d+)\.(\d)\s*", raw)  # "12.4": the version as CUDA writes it
    raise _invalid(
        "BNB_CUDA_VERSION",
        raw,
        "CUDA's version as digits",
        dotted.group(1) + dotted.group(2) if dotted else "124",
    )


#: how huggingface_hub reads HF_HUB_OFFLINE (constants.py ``_is_true``: ``value.upper() in {"1", "ON", "YES",
#: "TRUE"}``): anything else is online, a typo included
_FALSE = {"0", "false", "no", "off"}


def _checked_offline(env: Mapping[str, str]) -> bool:
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        raw = env.get(name)
        if raw is not None and raw.strip() and raw.strip().lower() not in _TRUE | _FALSE:
            # huggingface_hub would go online on "ture" or "offline": a typo must not look like a choice
            raise _invalid(name, raw, "1 (offline) or 0 (online)", "1")
    return hub_offline(env)


#: torch's switches for cuDNN's place in SDPA's dispatch, read with ``c10::utils::check_env`` (c10/util/env.cpp):
#: exactly "0" or "1"; any other value (``true``, ``off``) is ignored with a C++ warning, as if unset
CUDNN_SDPA_SWITCHES = ("TORCH_CUDNN_SDPA_PREFERRED", "TORCH_CUDNN_SDPA_DEPRIORITIZED")


def _checked_cudnn_switches(env: Mapping[str, str]) -> dict[str, str]:
    out = {}
    for name in CUDNN_SDPA_SWITCHES:
        raw = env.get(name)
        if raw is None or raw == "":
            continue
        if raw not in ("0", "1"):
            from .errors import ConfigurationError

            meant = "0" if raw.strip().lower() in _FALSE else "1" if raw.strip().lower() in _TRUE else "0"
            raise ConfigurationError(
                f"{name}={raw!r} is not 0 or 1: torch reads exactly those and ignores anything else, as if unset",
                fix=f"set {name}={meant}, or unset it",
            )
        out[name] = raw
    return out


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


# -- every variable checked at once ---------------------------------------------------------------------------

#: the ``CUDALOAD_*`` variables the library reads, each through one function above
LIBRARY_VARIABLES = (
    "CUDALOAD_CACHE",
    "CUDALOAD_GPU_START",
    "CUDALOAD_HUB_TIMEOUT",
    "CUDALOAD_RANKS_TIMEOUT",
    "CUDALOAD_TRUST_KERNELS",
)
#: ``CUDALOAD_*`` variables read by cudaload's own tools, never by the library: ./dev (the torch version it
#: installs) and tests/test_fastload_parity.py (the slow sweep)
TOOL_VARIABLES = ("CUDALOAD_TORCH", "CUDALOAD_PARITY_SWEEP")
#: variables that did something once and now do nothing, and why (CHANGELOG.md says when)
REMOVED_VARIABLES = {
    "CUDALOAD_EARLY_UPLOAD": "the early upload was removed: it did not pay end to end (CHANGELOG.md)",
}
#: the values CUDA reads; anything else leaves CUDA on FASTEST_FIRST while it looks like a choice
DEVICE_ORDERS = ("FASTEST_FIRST", "PCI_BUS_ID")


@dataclass(frozen=True)
class Settings:
    """Every variable cudaload reads, read and checked at once (:func:`check_all`). ``notes``: ``CUDALOAD_*``
    variables that are set but read by nothing (a typo, a removed variable), each with what to do."""

    hub_timeout: float
    ranks_timeout: float
    gpu_start: bool
    trusted_kernels: tuple[str, ...]
    cache_dir: str
    launch: LaunchEnv
    device_order: str | None
    notes: tuple[str, ...] = ()


def _device_order(env: Mapping[str, str]) -> str | None:
    raw = env.get("CUDA_DEVICE_ORDER")
    if raw is None or raw == "":
        return None
    if raw not in DEVICE_ORDERS:
        # CUDA compares the exact spelling: "pci_bus_id" or "PCI" would be ignored by it, silently
        raise _invalid("CUDA_DEVICE_ORDER", raw, "FASTEST_FIRST or PCI_BUS_ID", "PCI_BUS_ID")
    return raw


def _checked_launch(env: Mapping[str, str]) -> LaunchEnv:
    """:func:`launch`, with the ranges a launcher keeps: no negative rank, a rank inside its world."""
    got = launch(env)
    for name, value, least in (
        ("LOCAL_RANK", got.local_rank, 0),
        ("RANK", got.rank, 0),
        ("WORLD_SIZE", got.world_size, 1),
        ("LOCAL_WORLD_SIZE", got.local_world_size, 1),
    ):
        if value is not None and value < least:
            raise _invalid(name, env[name], f"an integer >= {least}", str(least))
    for rank, world in (("RANK", "WORLD_SIZE"), ("LOCAL_RANK", "LOCAL_WORLD_SIZE")):
        r, w = _int(env, rank), _int(env, world)
        if r is not None and w is not None and r >= w:
            from .errors import ConfigurationError

            raise ConfigurationError(
                f"{rank}={r} is not below {world}={w}",
                fix=f"let the launcher set them (torchrun sets {rank} from 0 to {world} - 1), or unset both",
            )
    return got


def _checked_cache_dir(env: Mapping[str, str]) -> str:
    path = cache_dir(env)
    if os.path.exists(path) and not os.path.isdir(path):
        from .errors import ConfigurationError

        raise ConfigurationError(
            f"CUDALOAD_CACHE={path!r} is a file, not a folder",
            fix="set CUDALOAD_CACHE to a folder (it is created when needed), or unset it",
        )
    return path


def cache_unwritable(env: Mapping[str, str] | None = None) -> str | None:
    """Why this user cannot keep files in ``CUDALOAD_CACHE`` (the folder, or the nearest folder above it that
    exists, when it is still to be created); None where it can, or where the variable is unset (the default
    folder is not second-guessed)."""
    e = _environ(env)
    if not e.get("CUDALOAD_CACHE"):
        return None
    path = os.path.abspath(os.path.expanduser(cache_dir(e)))
    probe = path
    while not os.path.exists(probe):
        parent = os.path.dirname(probe)
        if parent == probe:
            break
        probe = parent
    if os.path.isdir(probe) and os.access(probe, os.W_OK | os.X_OK):
        return None
    return (
        f"{probe!r} is not writable by this user"
        if probe != path
        else "the folder is not writable by this user"
    )


def _launcher(env: Mapping[str, str]) -> bool:
    """Whether a launcher started this process: every one sets MASTER_ADDR for torch's ``env://`` rendezvous
    (torchrun, accelerate launch and deepspeed; SLURM and MPI users export it for the same reason), torchrun also
    TORCHELASTIC_RUN_ID; or a process group is initialised already (its store is what the ranks use)."""
    if env.get("MASTER_ADDR") or env.get("TORCHELASTIC_RUN_ID"):
        return True
    import sys

    dist = sys.modules.get("torch.distributed")
    try:
        return bool(dist is not None and dist.is_available() and dist.is_initialized())
    except Exception:  # a torch without distributed support
        return False


def _launch_notes(env: Mapping[str, str], got: LaunchEnv) -> tuple[str, ...]:
    """LOCAL_RANK / WORLD_SIZE set by hand, with no launcher: a world of several ranks cannot form (an error); a
    lone LOCAL_RANK picks cuda:LOCAL_RANK as if this were a rank (a note, warned)."""
    if _launcher(env):
        return ()
    if got.world_size is not None and got.world_size > 1:
        from .errors import ConfigurationError

        raise ConfigurationError(
            f"WORLD_SIZE={got.world_size} says this process is one of {got.world_size} ranks, and no launcher "
            "started it (MASTER_ADDR is not set; torchrun, accelerate launch and deepspeed set it): the plan would "
            "be one rank's share of a world that never forms",
            fix=f"launch it: torchrun --nproc_per_node {got.world_size} your_script.py; or unset WORLD_SIZE (and "
            "RANK, LOCAL_RANK) to run one process",
        )
    if got.local_rank is not None or got.rank is not None:
        name = "LOCAL_RANK" if got.local_rank is not None else "RANK"
        return (
            f"{name}={env[name]} is set and no launcher started this process (MASTER_ADDR is not set): cudaload "
            f"plans it as that rank (cuda:{got.local_rank or 0} where GPUs are visible); unset {name} to run one "
            "process as one, or launch with torchrun",
        )
    return ()


def _unread(env: Mapping[str, str]) -> tuple[str, ...]:
    """What to say about each ``CUDALOAD_*`` variable that is set and read by nothing."""
    from .errors import close_names

    known = (*LIBRARY_VARIABLES, *TOOL_VARIABLES)
    notes = []
    for name in sorted(k for k in env if k.startswith("CUDALOAD_") and k not in known):
        if name in REMOVED_VARIABLES:
            notes.append(f"{name} is set but does nothing: {REMOVED_VARIABLES[name]}; unset it")
            continue
        close = close_names(name, LIBRARY_VARIABLES, n=1)
        hint = f"; did you mean {close[0]}?" if close else ""
        notes.append(
            f"{name} is set but cudaload reads no such variable{hint} (docs/api.md lists them); "
            + (f"rename it to {close[0]}" if close else "unset it")
        )
    return tuple(notes)


def check_all(env: Mapping[str, str] | None = None) -> Settings:
    """Read and check every variable cudaload reads, whether or not this call would read it: a bad value
    (``CUDALOAD_HUB_TIMEOUT=abc``, ``CUDA_DEVICE_ORDER=bogus``, ``LOCAL_RANK=x``) raises
    :class:`~cudaload.errors.ConfigurationError` now, not on the one path that happens to read it.
    ``cudaload.request.Request.build`` calls it."""
    e = _environ(env)
    launched = _checked_launch(e)
    _checked_offline(e)
    _checked_cudnn_switches(e)
    _checked_bnb_cuda_version(e)
    cache = _checked_cache_dir(e)
    unwritable = cache_unwritable(e)
    cache_note = (
        (
            f"CUDALOAD_CACHE={e['CUDALOAD_CACHE']!r} cannot be written ({unwritable}): cudaload keeps no attention "
            "probe verdicts, tune timings or compile artifacts there, and measures or compiles again in every "
            "process; set CUDALOAD_CACHE to a folder you can write, or unset it",
        )
        if unwritable
        else ()
    )
    return Settings(
        hub_timeout=hub_probe_timeout(e),
        ranks_timeout=ranks_timeout(e),
        gpu_start=gpu_start_enabled(e),
        trusted_kernels=trusted_kernel_repos(e),
        cache_dir=cache,
        launch=launched,
        device_order=_device_order(e),
        notes=_unread(e) + cache_note + _launch_notes(e, launched),
    )
