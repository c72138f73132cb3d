"""cudaload: device-aware Hugging Face model loading for NVIDIA GPUs.

    import cudaload
    model = cudaload.load_model("path/or/hub-id")   # detect -> plan -> load -> verify
    print(model.cudaload_plan.explain())

Importing this package is cheap and has no side effects: it does not import torch or transformers,
initialise CUDA, touch the network, print, or configure logging. Everything is loaded on first use.

Every name exported here (and the ``cudaload`` command, the environment variables, ``plan.verified``) is
documented once, in docs/api.md.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0.dev0"

# public name -> module that defines it (imported lazily, on first attribute access)
_LAZY = {
    "detect": "cudaload.detection",
    "Capabilities": "cudaload.capabilities",
    "GPU": "cudaload.capabilities",
    "PackageInfo": "cudaload.capabilities",
    "Decision": "cudaload.plans",
    "Candidate": "cudaload.plans",
    "Plan": "cudaload.plans",
    "plan": "cudaload.planner",
    "load_model": "cudaload.execute",
    "training_arguments": "cudaload.train",
    "training_setup": "cudaload.train",
    "sft_config_arguments": "cudaload.train",
    "hardware": "cudaload.profiles",
    "diagnose": "cudaload.commands.doctor",
    "precompile": "cudaload.commands.bytecache",
    "CudaloadError": "cudaload.errors",
    "ConfigurationError": "cudaload.errors",
    "InvalidChoiceError": "cudaload.errors",
    "DeviceSelectionError": "cudaload.errors",
    "ModelNotFoundError": "cudaload.errors",
    "CheckpointError": "cudaload.errors",
    "DependencyError": "cudaload.errors",
    "DoesNotFitError": "cudaload.errors",
    "LoadError": "cudaload.errors",
    "VerificationError": "cudaload.errors",
}

__all__ = [
    "GPU",
    "Candidate",
    "Capabilities",
    "CheckpointError",
    "ConfigurationError",
    "CudaloadError",
    "Decision",
    "DependencyError",
    "DeviceSelectionError",
    "DoesNotFitError",
    "InvalidChoiceError",
    "LoadError",
    "ModelNotFoundError",
    "PackageInfo",
    "Plan",
    "VerificationError",
    "__version__",
    "detect",
    "diagnose",
    "hardware",
    "load_model",
    "plan",
    "precompile",
    "sft_config_arguments",
    "training_arguments",
    "training_setup",
]

if TYPE_CHECKING:
    from .capabilities import GPU, Capabilities, PackageInfo
    from .commands.bytecache import precompile
    from .commands.doctor import diagnose
    from .detection import detect
    from .errors import (
        CheckpointError,
        ConfigurationError,
        CudaloadError,
        DependencyError,
        DeviceSelectionError,
        DoesNotFitError,
        InvalidChoiceError,
        LoadError,
        ModelNotFoundError,
        VerificationError,
    )
    from .execute import load_model
    from .planner import plan
    from .plans import Candidate, Decision, Plan
    from .profiles import hardware
    from .train import sft_config_arguments, training_arguments, training_setup


def __getattr__(name: str) -> Any:
    mod = _LAZY.get(name)
    if mod is None:
        raise AttributeError(f"module 'cudaload' has no attribute {name!r}")
    value = getattr(import_module(mod), name)
    globals()[name] = value  # cache: later lookups are plain attribute reads
    return value


def __dir__() -> list[str]:
    return __all__
