"""One weight quantized on the device (:func:`_quantize_one`), by bitsandbytes' own parameter classes.

int8: ``Int8Params._quantize`` (``nn/modules.py:737-748``: ``int8_vectorwise_quant`` on the fp16 weight,
CB/SCB), called on the device directly instead of through ``.to()``, which quantizes only when moving *from*
the CPU (``nn/modules.py:790-793``); 4-bit:
``Params4bit(value, requires_grad=False, **meta.__dict__).to(device)`` exactly as transformers
``integrations/bitsandbytes.py:58-59`` does, which runs ``Params4bit._quantize``
(``nn/modules.py:381-395``: ``quantize_4bit`` with the module's blocksize, ``compress_statistics`` = double
quant, ``quant_type``, ``quant_storage``). GPT-2's ``Conv1D`` weights are transposed first, as
``integrations/bitsandbytes.py:54-55`` and ``:118-119`` do. (The versions, as in the package's docstring:
bitsandbytes 0.50.2, transformers 5.17.)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .prepare import _Prepared

if TYPE_CHECKING:
    import torch


def _quantize_one(prep: _Prepared, name: str, value: torch.Tensor, dev: torch.device) -> Any:
    """The quantized parameter transformers' quantize op makes from ``value`` (already on ``dev``)."""
    import bitsandbytes
    from transformers.pytorch_utils import Conv1D

    bnb: Any = bitsandbytes  # partial annotations: its parameter classes' to() overloads confuse mypy
    param: Any
    parent, _, leaf = name.rpartition(".")
    module = prep.model.get_submodule(parent)
    meta = getattr(module, leaf)
    source_cls = getattr(module, "source_cls", None)
    if source_cls is not None and issubclass(source_cls, Conv1D):
        value = value.T  # integrations/bitsandbytes.py:54-55 and :118-119 (Conv1D stores weights transposed)
    if prep.method == "int8":
        kwargs = dict(meta.__dict__)
        kwargs.pop("SCB", None)  # integrations/bitsandbytes.py:121-122
        param = bnb.nn.Int8Params(value, requires_grad=False, **kwargs)
        # Int8Params._quantize (nn/modules.py:737-748): B = data.contiguous().to(device, float16);
        # CB, SCB = int8_vectorwise_quant(B). Called directly because .to() quantizes only from the CPU
        # (nn/modules.py:790-793), which is why transformers moves every weight to the CPU first.
        param = param._quantize(dev)
    else:
        # integrations/bitsandbytes.py:58-59, verbatim: .to() runs Params4bit._quantize (nn/modules.py:381-395)
        param = bnb.nn.Params4bit(value, requires_grad=False, **meta.__dict__).to(value.device)
        module._is_hf_initialized = True
    param._is_hf_initialized = True  # core_model_loading.set_param_for_module marks it so init skips it
    setattr(module, leaf, param)
    return param
