"""A fast path for bitsandbytes int8 / nf4 / fp4 loads of an unquantized safetensors checkpoint (issue 14, item 4).

    model = load_quantized(path, quantization_config=BitsAndBytesConfig(load_in_8bit=True),
                           dtype=torch.bfloat16, device="cuda:0")
    ok, why = supports_quantized(path, BitsAndBytesConfig(load_in_4bit=True), "AutoModelForCausalLM")

The result equals ``from_pretrained(path, dtype=..., device_map=device, quantization_config=...)``: the same
modules, the same packed weights and quant state bit for bit, the same ``config.quantization_config``,
``hf_quantizer``, ``is_loaded_in_8bit``/``is_loaded_in_4bit`` flags, and so the same logits.

Why it is faster: transformers 5.17 ``integrations/bitsandbytes.py:123`` (``Bnb8bitQuantize.convert``) builds
``Int8Params(value.to("cpu"), ...).to(value_device)``: every weight already on the GPU goes back to the CPU and
up again, because ``Int8Params.to()`` quantizes only when moving *from* the CPU (bitsandbytes 0.50.2
``nn/modules.py:790-793``); on the H200 that round trip is 14.0 s of a 15.6 s 8B int8 load, the quantization
itself 0.07 s. And an on-the-fly quantized load reads tensor by tensor on one thread (transformers 5.17
``core_model_loading.py:1626-1633`` turns its reader pool off to bound memory).

Here every decision about *what* the model holds is transformers' or bitsandbytes' own, called rather than
re-derived: the quantizer, which modules are replaced and which weights are quantized are transformers'
(:mod:`.prepare`); how a weight is quantized is bitsandbytes' parameter classes (:mod:`.quantize`); keywords,
config, checkpoint files, key renames and the finishing are the unquantized fast path's
(:mod:`cudaload.fastload.materialize`, with the quantizer passed on as from_pretrained passes it). Each
module's docstring names the calls, with their file:line.

What is not covered steps aside with a reason (``supports_quantized`` says it, ``load_quantized`` raises
:class:`StepAside`, a :class:`cudaload.fastload.StepAside`), and the caller uses ``from_pretrained``:
pre-quantized checkpoints, non-bitsandbytes configs, ``llm_int8_enable_fp32_cpu_offload``,
``llm_int8_has_fp16_weight``, device maps over several devices, checkpoints that need transformers' weight
conversions (MoE experts fused into one tensor), quantized weights that are tied or missing from the
checkpoint, ``ignore_mismatched_sizes`` with mismatched tensors, and whatever the unquantized fast path steps
aside for (keywords, files, remote code). Mismatched shapes without ``ignore_mismatched_sizes`` fail with
:class:`~cudaload.errors.LoadError`, as from_pretrained fails.

Where each part lives (``from cudaload.fastload.quantized import load_quantized, supports_quantized,
StepAside``):

* :mod:`.checks`: :class:`StepAside`, and the checks on the quantization config and on the device or
  ``device_map`` made before anything is built;
* :mod:`.prepare`: everything up to storage: the quantizer, the skeleton converted to bnb modules, the key
  plan, which weights are quantized and the step-asides for them;
* :mod:`.quantize`: one weight quantized on the device;
* :mod:`.fill`: the storage: non-quantized tensors as they are, quantized weights layer by layer through one
  reused device scratch (what bounds the device peak);
* :mod:`.loading`: :func:`load_quantized`, the steps above in order and the finishing, and
  :func:`supports_quantized`.

Importing this package does not import torch, transformers or bitsandbytes.
"""

from __future__ import annotations

from .checks import StepAside
from .loading import load_quantized, supports_quantized

__all__ = ["StepAside", "load_quantized", "supports_quantized"]
