"""Fast weights-to-device loading for safetensors checkpoints (issue 7).

    model = cudaload.fastload.load(path, dtype=torch.bfloat16, device="cuda:0")
    ok, why = cudaload.fastload.supports(path, auto_class="AutoModelForCausalLM")
    header = cudaload.fastload.read_header(path)   # names, dtypes, shapes, byte ranges
    model = cudaload.fastload.load_quantized(path, quantization_config=BitsAndBytesConfig(load_in_8bit=True),
                                             dtype=torch.bfloat16, device="cuda:0")   # int8 / nf4 / fp4

The result equals ``from_pretrained(path, dtype=..., device_map=device, **kwargs)`` for the same keywords:
same state_dict bit for bit, same config, same outputs, the same load report (missing/unexpected/mismatched
keys). Peak device memory is the model's size; host memory is bounded by the staging buffers. What the fast
path cannot do exactly (quantized or remote-code checkpoints, .bin files, weights needing transformers'
fuse/split conversions, keywords such as ``key_mapping`` or ``state_dict``) raises :class:`StepAside` before
anything is allocated, is reported by :func:`supports`, and goes through ``from_pretrained``.

``load_quantized`` / ``supports_quantized`` (:mod:`cudaload.fastload.quantized`) do the same for a bitsandbytes
``quantization_config`` on an unquantized checkpoint: the result equals ``from_pretrained(...,
quantization_config=...)`` bit for bit, quantized on the device layer by layer. Their step-asides are
:class:`StepAside` too.

Importing this package does not import torch, transformers or bitsandbytes (nor does ``quantized``).
"""

from __future__ import annotations

from .materialize import StepAside, load, supports
from .quantized import load_quantized, supports_quantized
from .reader import CheckpointHeader, TensorInfo, read_header

__all__ = [
    "CheckpointHeader",
    "StepAside",
    "TensorInfo",
    "load",
    "load_quantized",
    "read_header",
    "supports",
    "supports_quantized",
]
