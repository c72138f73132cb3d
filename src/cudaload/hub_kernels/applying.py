"""From a kernels plan to live objects: a fresh ``transformers.KernelConfig``, a ``kernels`` mapping, or
``kernelize`` on a loaded model. The only part of cudaload.hub_kernels that imports transformers or kernels."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

# ----------------------------------------------------------------------------------------------------
# From plan to live objects
# ----------------------------------------------------------------------------------------------------


def _validate(kernels_plan: Mapping[str, Any]) -> dict[str, Any]:
    """Check the mapping the way ``KernelConfig.sanitize_kernel_mapping`` will, before any load."""
    from ..errors import ConfigurationError

    fix = "rebuild the plan with cudaload.plan(...) instead of editing plan.kernels by hand"
    mapping = kernels_plan.get("mapping")
    if not isinstance(mapping, Mapping):
        raise ConfigurationError("plan.kernels['mapping'] is not a mapping", fix=fix)
    registered = set(kernels_plan.get("registered_layers") or ())
    local = bool(kernels_plan.get("use_local_kernel"))
    out: dict[str, Any] = {}
    for layer, value in mapping.items():
        if registered and layer not in registered:
            raise ConfigurationError(
                f"kernel layer {layer!r} is not registered by the model",
                fix=fix,
                reasons=[f"registered: {', '.join(sorted(registered))}"],
            )
        if isinstance(value, str):
            ref, meta = value, None
        elif isinstance(value, (list, tuple)) and len(value) == 2 and isinstance(value[1], Mapping):
            ref, meta = value[0], dict(value[1])
        else:
            raise ConfigurationError(f"kernel mapping for {layer!r} is malformed: {value!r}", fix=fix)
        if not isinstance(ref, str) or "/" not in ref or ":" not in ref:
            raise ConfigurationError(
                f"kernel {ref!r} for {layer!r} is not 'org/repo:Layer' or '/dir:Layer'", fix=fix
            )
        if local:
            if meta is not None or not os.path.isabs(ref.rpartition(":")[0]):
                raise ConfigurationError(
                    f"local kernel {ref!r} must be an absolute '/dir:Layer' string", fix=fix
                )
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
            repo = LayerRepository(
                repo_id=repo_id,
                layer_name=name,
                revision=meta.get("revision"),
                version=meta.get("version"),
                trust_remote_code=bool(meta.get("trust_remote_code", False)),
            )
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
        from ..errors import LoadError

        raise LoadError(
            f"kernelize failed for the planned kernels ({', '.join(mapping)}): {e}",
            fix="plan with kernels=False, or fix the kernel named above",
        ) from e
    return model
