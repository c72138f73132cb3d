"""What steps aside before anything is built: :class:`StepAside`, and the checks on the quantization config
(bitsandbytes, int8 / nf4 / fp4, neither fp32 CPU offload nor fp16 weights) and on the device or
``device_map`` (one device, never a map that may split the model).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .. import materialize
from ..materialize import resolve_device


class StepAside(materialize.StepAside):
    """This quantized load is outside the fast path; ``from_pretrained`` does it (``reason`` says why).

    A :class:`cudaload.fastload.StepAside`, so one ``except`` takes both paths' step-asides; the checks the
    quantized path shares with the bf16 path (keywords, files, config, keys) raise that class directly."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(
            f"the quantized fast path cannot take this load: {reason}",
            fix="load it with from_pretrained(..., quantization_config=...)",
        )


def _bnb_config(quantization_config: Any) -> Any:
    """The user's quantization config as transformers will see it; steps aside unless it is bitsandbytes."""
    try:
        from transformers import BitsAndBytesConfig
    except ImportError as e:  # pragma: no cover - transformers without bitsandbytes support
        raise StepAside(f"this transformers has no BitsAndBytesConfig ({e})") from None
    if isinstance(quantization_config, Mapping):
        if str(quantization_config.get("quant_method", "bitsandbytes")) != "bitsandbytes":
            raise StepAside(f"quant_method {quantization_config.get('quant_method')!r} is not bitsandbytes")
        return quantization_config  # from_pretrained passes a dict on to AutoHfQuantizer.from_config as is
    if not isinstance(quantization_config, BitsAndBytesConfig):
        raise StepAside(f"{type(quantization_config).__name__} is not a BitsAndBytesConfig")
    return quantization_config


def _bnb_config_or_none(quantization_config: Any) -> Any:
    cfg = _bnb_config(quantization_config)
    if isinstance(cfg, Mapping):
        from transformers import BitsAndBytesConfig

        cfg = BitsAndBytesConfig.from_dict(dict(cfg))
    return cfg


def _method(cfg: Any) -> str:
    if cfg.load_in_8bit:
        return "int8"
    if cfg.load_in_4bit:
        return str(cfg.bnb_4bit_quant_type)
    raise StepAside("the BitsAndBytesConfig asks for neither load_in_8bit nor load_in_4bit")


def _check_quant_options(cfg: Any, device_map: Any) -> None:
    if cfg.llm_int8_enable_fp32_cpu_offload:
        raise StepAside("llm_int8_enable_fp32_cpu_offload splits the model between devices")
    if cfg.load_in_8bit and cfg.llm_int8_has_fp16_weight:
        raise StepAside("llm_int8_has_fp16_weight keeps fp16 weights (a training set-up)")
    _device_of_map(device_map)


def _device_of_map(device_map: Any) -> str | None:
    """The one device a from_pretrained ``device_map`` names, or StepAside when it may split the model."""
    if device_map is None:
        return None
    if isinstance(device_map, Mapping):
        values = {str(v) for v in device_map.values()}
        if len(values) > 1:
            raise StepAside(f"device_map places modules on {len(values)} devices")
        if not values:
            return None
        device_map = next(iter(device_map.values()))
    if isinstance(device_map, str) and device_map in ("auto", "balanced", "balanced_low_0", "sequential"):
        raise StepAside(f"device_map={device_map!r} may split the model; pass one device")
    one = f"cuda:{device_map}" if isinstance(device_map, int) else str(device_map)
    if one in ("disk", "meta"):
        raise StepAside(f"device_map puts the model on {one!r}")
    return one


def _pick_device(device: Any, device_map: Any) -> Any:
    """``device``, or the single device of ``device_map``; StepAside when they disagree."""
    from_map = _device_of_map(device_map)
    if from_map is None:
        return device
    if device is not None and resolve_device(device) != resolve_device(from_map):
        raise StepAside(f"device {str(device)!r} and device_map {from_map!r} disagree")
    return from_map
