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
re-derived:

- the quantizer: ``transformers.quantizers.auto.get_hf_quantizer`` (what ``from_pretrained`` calls: it sets
  ``config.quantization_config``, builds the quantizer with ``AutoHfQuantizer.from_config``, validates the
  environment and the device map);
- which modules are replaced: ``hf_quantizer.preprocess_model`` on the meta skeleton, inside the model's init
  context as ``from_pretrained`` does (so the skip list is transformers' ``get_modules_to_not_convert``:
  ``llm_int8_skip_modules``, tied and output embeddings, ``_keep_in_fp32_modules``), and
  ``replace_with_bnb_linear`` makes the bnb modules;
- which weights are quantized: ``hf_quantizer.param_needs_quantization``;
- how: bitsandbytes' own parameter classes. int8: ``Int8Params._quantize`` (``nn/modules.py:737-748``:
  ``int8_vectorwise_quant`` on the fp16 weight, CB/SCB), called on the device directly instead of through
  ``.to()``; 4-bit: ``Params4bit(value, requires_grad=False, **meta.__dict__).to(device)`` exactly as
  transformers ``integrations/bitsandbytes.py:58-59`` does, which runs ``Params4bit._quantize``
  (``nn/modules.py:381-395``: ``quantize_4bit`` with the module's blocksize, ``compress_statistics`` = double
  quant, ``quant_type``, ``quant_storage``). GPT-2's ``Conv1D`` weights are transposed first, as
  ``integrations/bitsandbytes.py:54-55`` and ``:118-119`` do;
- keywords, config, checkpoint files and headers: ``materialize.prepare``, shared with the unquantized fast
  path (files from transformers' ``_get_resolved_checkpoint_files``: ``variant``, ``subfolder``, single file
  before index; the same step-asides for keywords only from_pretrained honours, ``.bin`` files, adapters);
  key renames and their checks: ``materialize.plan_keys`` / ``check_keys``;
- finishing: ``materialize.finish`` with the quantizer, i.e. transformers' ``_finalize_model_loading`` with
  ``hf_quantizer`` in its ``LoadStateDictConfig`` as from_pretrained passes it (initialise missing, tie, the
  load report), eval, ``set_use_kernels(False)``, generation config; ``_weight_conversions`` as
  ``convert_and_load_state_dict_in_model`` leaves it; then ``model.hf_quantizer = hf_quantizer`` and
  ``hf_quantizer.postprocess_model(model)`` as ``from_pretrained`` ends (transformers 5.17
  ``modeling_utils.py:4335-4339``).

Memory: non-quantized tensors (embeddings, norms, an unconverted ``lm_head``) are read straight into their
storage (``materialize.allocate(..., skip=quantized)``); quantized weights are read layer by layer (grouped by
the first numbered module in their name, e.g. ``model.layers.7``) into one reused device scratch, quantized
there and the scratch refilled, so the device peak is the quantized model plus one layer's unquantized weights
(and bitsandbytes' temporaries for one weight), never the whole bf16 model. Host memory is the staging pool.

What is not covered steps aside with a reason (``supports_quantized`` says it, ``load_quantized`` raises
:class:`StepAside`, a :class:`cudaload.fastload.StepAside`), and the caller uses ``from_pretrained``:
pre-quantized checkpoints, non-bitsandbytes configs, ``llm_int8_enable_fp32_cpu_offload``,
``llm_int8_has_fp16_weight``, device maps over several devices, checkpoints that need transformers' weight
conversions (MoE experts fused into one tensor), quantized weights that are tied or missing from the
checkpoint, ``ignore_mismatched_sizes`` with mismatched tensors, and whatever the unquantized fast path steps
aside for (keywords, files, remote code). Mismatched shapes without ``ignore_mismatched_sizes`` fail with
:class:`~cudaload.errors.LoadError`, as from_pretrained fails.

Importing this module does not import torch, transformers or bitsandbytes.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..errors import ConfigurationError, CudaloadError
from . import materialize
from .materialize import (
    allocate,
    build_skeleton,
    check_keys,
    clear_tracebacks,
    finish,
    load_report,
    model_class,
    plan_keys,
    prepare,
    resolve_device,
    torch_dtype,
)
from .reader import CheckpointHeader, TensorInfo

if TYPE_CHECKING:
    import torch

    from .materialize import KeyPlan, Prepared

logger = logging.getLogger(__name__)

#: offsets of weights inside the layer scratch are rounded up to this (any dtype view, coalesced copies)
_SCRATCH_ALIGN = 256
#: a numbered module in a parameter name ("model.layers.7."): the unit quantized together
_LAYER_RE = re.compile(r"^(.*?\.\d+)\.")


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


@dataclass
class _Prepared:
    """A quantized skeleton on the meta device and the plan to fill it."""

    model: Any
    header: CheckpointHeader
    keys: KeyPlan
    base: Prepared  # what materialize.prepare decided: keywords, config, files, headers
    hf_quantizer: Any
    dtype: Any
    #: the weights to quantize: model key -> checkpoint key
    quantized: dict[str, str] = field(default_factory=dict)
    method: str = ""  # "int8" | "nf4" | "fp4"
    model_kwargs: dict[str, Any] = field(default_factory=dict)  # what the config left for the model


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


def _device_map_for(dev: Any) -> Any:
    """The device map ``from_pretrained(device_map=str(dev))`` works with."""
    import transformers.modeling_utils as mu

    check = getattr(mu, "check_and_set_device_map", None)
    # without it (older layout) the quantizer only looks at the values of a dict
    return check(str(dev)) if check is not None else {"": str(dev)}


def _prepare(
    path: str | os.PathLike[str],
    quantization_config: Any,
    auto_class: str,
    dev: Any,
    dtype: Any,
    attn_implementation: str | None,
    from_config_kwargs: Mapping[str, Any],
) -> _Prepared:
    """Everything up to (not including) storage: checks, quantizer, skeleton, key plan. Raises StepAside."""
    try:
        import bitsandbytes  # noqa: F401
    except ImportError as e:
        raise StepAside(f"bitsandbytes is not importable ({e})") from None
    try:
        from transformers.quantizers.auto import get_hf_quantizer
        from transformers.utils.generic import ContextManagers
    except ImportError as e:
        raise StepAside(
            f"this transformers lacks the quantizer entry point from_pretrained uses ({e})"
        ) from None

    _bnb_config(quantization_config)
    # keywords, config (with overrides), checkpoint files found by transformers' _get_resolved_checkpoint_files,
    # validated headers: exactly what the unquantized fast path reads (it steps aside for a quantization_config
    # or an auto_map in config.json, .bin checkpoints, adapters, keywords only from_pretrained honours)
    base = prepare(path, from_config_kwargs)
    header, config, model_kwargs = base.header, base.config, base.model_kwargs
    if getattr(config.get_text_config(decoder=True), "quantization_config", None):
        raise StepAside("the text config has a quantization_config (a pre-quantized checkpoint)")
    config.name_or_path = base.options.path  # as from_pretrained sets it
    if attn_implementation is not None:
        config._attn_implementation = attn_implementation  # before the quantizer sees the config, as in 5.24
    device_map = _device_map_for(dev)
    try:
        # what from_pretrained calls (transformers 5.17 modeling_utils.py:4208): sets config.quantization_config,
        # AutoHfQuantizer.from_config, validate_environment, update_device_map
        hf_quantizer, config, device_map = get_hf_quantizer(config, quantization_config, device_map, True, {})
    except (ImportError, ValueError, RuntimeError, TypeError) as e:
        raise StepAside(f"transformers refuses this quantization config ({type(e).__name__}: {e})") from None
    if hf_quantizer is None or hf_quantizer.pre_quantized:
        raise StepAside("transformers treats this checkpoint as pre-quantized")
    qcfg = hf_quantizer.quantization_config
    if (
        getattr(qcfg, "quant_method", None) != "bitsandbytes"
        and str(getattr(qcfg.quant_method, "value", "")) != "bitsandbytes"
    ):
        raise StepAside(f"quant_method {qcfg.quant_method!r} is not bitsandbytes")
    method = _method(qcfg)
    _check_quant_options(qcfg, device_map)
    dtype = hf_quantizer.update_dtype(dtype)  # what _get_dtype does with a quantizer (modeling_utils.py:889)

    cls = model_class(config, auto_class)
    model = build_skeleton(config, cls, dtype, model_kwargs)
    # The key plan is made on the unconverted skeleton: bnb modules keep the names (weight, bias) but store
    # Conv1D weights transposed, so only the original modules give the checkpoint's shapes.
    keys = plan_keys(model, header)
    if keys.needs_conversion:
        raise StepAside(
            f"{len(keys.needs_conversion)} tensors need transformers' weight conversion "
            f"(e.g. {keys.needs_conversion[0]!r}: fused MoE experts or similar)"
        )
    # the bf16 path's checks: step aside for extra state and dtypes it does not copy, fail (LoadError) on
    # mismatched shapes as from_pretrained fails unless ignore_mismatched_sizes
    check_keys(keys, base)
    if keys.mismatched:
        raise StepAside(
            f"ignore_mismatched_sizes with {len(keys.mismatched)} mismatched tensors "
            f"(e.g. {keys.mismatched[0]})"
        )
    # from_pretrained converts the skeleton inside its init context (modeling_utils.py:4266-4278): the bnb
    # modules are then made in the load dtype, which is the dtype their weights are cast to before quantizing
    with ContextManagers(cls.get_init_context(dtype, True, False, None)):
        hf_quantizer.preprocess_model(
            model=model,
            dtype=dtype,
            device_map=device_map,
            checkpoint_files=list(header.files),
            use_kernels=False,
        )
    want = [
        n
        for n, _ in model.named_parameters(remove_duplicate=False)
        if hf_quantizer.param_needs_quantization(model, n)
    ]
    tied = getattr(model, "all_tied_weights_keys", {}) or {}
    tied_names = set(tied) | {str(v) for v in tied.values()}
    shared = [n for n in want if n in tied_names]
    if shared:
        # from_pretrained leaves such a module a bnb Linear around an unquantized tied tensor
        raise StepAside(f"weight to quantize {shared[0]!r} is tied to another tensor")
    quantized = {n: keys.load[n] for n in want if n in keys.load}
    unloaded = [n for n in want if n not in quantized]
    if unloaded:
        raise StepAside(
            f"{len(unloaded)} weights to quantize are not in the checkpoint (e.g. {unloaded[0]!r})"
        )
    packed = sorted(
        k for k, src in quantized.items() if not header.tensors[src].dtype.startswith(("F", "BF"))
    )
    if packed:
        raise StepAside(
            f"{packed[0]!r} is stored as {header.tensors[quantized[packed[0]]].dtype}, not as floats "
            "(a pre-quantized checkpoint without its quantization_config?)"
        )
    plan = model._get_dtype_plan(dtype) if hasattr(model, "_get_dtype_plan") else {}
    if plan:
        pattern = re.compile("|".join(f"({k.replace('*', '.*')})" for k in plan))
        forced = sorted(k for k in quantized if pattern.search(k))
        if forced:
            raise StepAside(f"{forced[0]!r} is both quantized and kept in float32 by the model")
    if not quantized:
        raise StepAside("no weight of this model is quantized by bitsandbytes")
    return _Prepared(model, header, keys, base, hf_quantizer, dtype, quantized, method, dict(model_kwargs))


def supports_quantized(
    path: str | os.PathLike[str],
    quantization_config: Any,
    auto_class: str = "AutoModelForCausalLM",
    *,
    device: str | None = None,
    device_map: Any = None,
) -> tuple[bool, str]:
    """Whether ``from_pretrained(path, quantization_config=...)`` can take the quantized fast path, and why
    (or why not). Reads headers and config and converts the skeleton on the meta device; no tensor storage.

    ``device_map``: what the caller would pass to from_pretrained; anything over more than one device steps
    aside. ``device`` (default: the CUDA device when one is visible, else the CPU) is where it would load."""
    import torch

    try:
        if device_map is not None:
            _check_quant_options(_bnb_config_or_none(quantization_config), device_map)
        device = _pick_device(device, device_map)
        dev = torch.device(device) if device else torch.device("cuda" if torch.cuda.is_available() else "cpu")
        if dev.type not in ("cuda", "cpu"):
            raise StepAside(f"device type {dev.type!r} (the fast path loads onto cuda or cpu)")
        dev = resolve_device(dev)
        prep = _prepare(path, quantization_config, auto_class, dev, torch.bfloat16, None, {})
    except StepAside as e:
        return False, e.reason
    except CudaloadError as e:
        return False, e.message
    except Exception as e:  # a model transformers itself cannot build: from_pretrained will say why
        return False, f"transformers cannot build {auto_class} for this config ({type(e).__name__}: {e})"
    q_bytes = sum(prep.header.tensors[src].nbytes for src in prep.quantized.values())
    groups = _layer_groups(prep)
    largest = max(sum(prep.header.tensors[prep.quantized[k]].nbytes for k in g) for g in groups)
    return True, (
        f"{prep.method}: {len(prep.quantized)} weights ({q_bytes / 1e9:.2f} GB) quantized on the device in "
        f"{len(groups)} layers (the largest {largest / 2**20:.0f} MiB in the checkpoint); "
        f"{len(prep.keys.load) - len(prep.quantized)} other tensors loaded as they are"
    )


def _bnb_config_or_none(quantization_config: Any) -> Any:
    cfg = _bnb_config(quantization_config)
    if isinstance(cfg, Mapping):
        from transformers import BitsAndBytesConfig

        cfg = BitsAndBytesConfig.from_dict(dict(cfg))
    return cfg


def _layer_groups(prep: _Prepared) -> list[list[str]]:
    """Quantized weights grouped by layer (the first numbered module of the name), in model order."""
    groups: dict[str, list[str]] = {}
    for name in prep.quantized:
        m = _LAYER_RE.match(name)
        groups.setdefault(m.group(1) if m else name, []).append(name)
    order = {n: i for i, (n, _) in enumerate(prep.model.named_parameters(remove_duplicate=False))}
    out = [sorted(g, key=lambda n: order.get(n, 0)) for g in groups.values()]
    out.sort(key=lambda g: order.get(g[0], 0))
    return out


class _KeepOpen:
    """A staging pool lent to several ``fill_cuda`` calls: their ``close()`` is a no-op, the load closes the
    real pool once after its last fill (pinning again for every layer would cost ~60 ms each)."""

    def __init__(self, pool: Any) -> None:
        self._pool = pool
        self.nbytes = pool.nbytes
        self.count = pool.count

    @property
    def pin_seconds(self) -> float:
        return float(self._pool.pin_seconds)

    def get(self) -> Any:
        return self._pool.get()

    def put(self, slot: Any) -> None:
        self._pool.put(slot)

    def close(self) -> None:
        pass

    def __getattr__(self, name: str) -> Any:  # anything else fill_cuda may come to use: the real pool's
        return getattr(self._pool, name)


def _fill(
    targets: list[Any], infos: list[TensorInfo], dev: Any, threads: int, buffer_bytes: int, pool: Any
) -> None:
    from . import staging

    if dev.type == "cuda":
        staging.fill_cuda(targets, infos, device=dev, threads=threads, buffer_bytes=buffer_bytes, pool=pool)
    else:
        staging.fill_cpu(targets, infos, threads=threads, buffer_bytes=buffer_bytes)


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


def load_quantized(
    path: str | os.PathLike[str],
    *,
    quantization_config: Any,
    auto_class: str = "AutoModelForCausalLM",
    device: str | torch.device | None = None,
    device_map: Any = None,
    dtype: torch.dtype,
    attn_implementation: str | None = None,
    threads: int | None = None,
    buffer_bytes: int | None = None,
    **from_config_kwargs: Any,
) -> Any:
    """Load an unquantized safetensors checkpoint and quantize it with bitsandbytes on ``device``, layer by
    layer; the result equals ``from_pretrained(path, dtype=dtype, device_map=device,
    quantization_config=quantization_config)``. Raises :class:`StepAside` (an InvalidChoiceError) for what
    the fast path does not cover.

    ``device`` (default ``cuda:0``) or a ``device_map`` naming one device (``"cuda:1"``, ``{"": 0}``) says
    where; a device_map over several devices steps aside."""
    import torch

    from . import staging

    t0 = time.perf_counter()
    dev = resolve_device(_pick_device(device, device_map) or "cuda:0")
    threads = threads or staging.default_threads()
    buffer_bytes = buffer_bytes or staging.DEFAULT_BUFFER_BYTES
    if threads < 1 or buffer_bytes < 1 << 16:
        raise ConfigurationError(
            f"threads={threads}, buffer_bytes={buffer_bytes} out of range",
            fix="use threads >= 1 and buffer_bytes >= 64 KiB",
        )
    prep: Any = _prepare(
        path, quantization_config, auto_class, dev, dtype, attn_implementation, from_config_kwargs
    )
    model, header, keys = prep.model, prep.header, prep.keys
    t_build = time.perf_counter()
    try:
        # what from_pretrained keeps for save_pretrained to undo (5.17 core_model_loading.py:1795-1798, end of
        # convert_and_load_state_dict_in_model): the renamings that matched a checkpoint key. The quantizer's
        # update_weight_conversions (quantizers/base.py:297-308) appends get_weight_conversions(), which for
        # bitsandbytes is non-empty only for a pre-quantized checkpoint (quantizer_bnb_4bit.py:168-171,
        # quantizer_bnb_8bit.py:167-170); those step aside here.
        model._weight_conversions = [c for c in keys.conversions if c.was_used()]
        times = _fill_and_quantize(prep, dev, threads, buffer_bytes)
        t_quant = time.perf_counter()
        info = finish(
            model,
            keys,
            prep.base.options,
            prep.model_kwargs,
            dev,
            prep.dtype,
            hf_quantizer=prep.hf_quantizer,
        )
        # from_pretrained's last steps (transformers 5.17 modeling_utils.py:4335-4339)
        model.hf_quantizer = prep.hf_quantizer
        prep.hf_quantizer.postprocess_model(model)
    except BaseException as e:
        # Leave nothing behind: the traceback's frames hold the half-built model and its tensors; this frame
        # is still running, so its own references are dropped by hand.
        model = prep = None
        clear_tracebacks(e)
        if dev.type == "cuda":
            torch.cuda.empty_cache()
        raise
    t_end = time.perf_counter()
    model.cudaload_fastload = {
        "seconds": round(t_end - t0, 4),
        "build_s": round(t_build - t0, 4),
        **times,
        "finish_s": round(t_end - t_quant, 4),
        "quantization": prep.method,
        "quantized_weights": len(prep.quantized),
        "bytes": sum(header.tensors[src].nbytes for src in keys.load.values()),
        **load_report(header, info, threads, buffer_bytes, dev),
    }
    logger.info("fast-loaded %s with %s quantization in %.2f s", header.root, prep.method, t_end - t0)
    return model


def _fill_and_quantize(prep: _Prepared, dev: torch.device, threads: int, buffer_bytes: int) -> dict[str, Any]:
    """Give the skeleton its storage: non-quantized tensors as they are, quantized weights layer by layer."""
    import torch

    from . import staging

    model, header, keys = prep.model, prep.header, prep.keys
    groups = _layer_groups(prep)
    layout = [_scratch_layout(prep, g) for g in groups]
    scratch_bytes = max(size for _, size in layout)
    t0 = time.perf_counter()
    pool: Any = None
    if dev.type == "cuda":
        # started now, the pool pins while the non-quantized tensors are allocated
        pool = staging.PinnedPool(
            staging.pool_size(header.total_bytes, threads, buffer_bytes), buffer_bytes, device=dev
        )
    try:
        lent = _KeepOpen(pool) if pool is not None else None
        # 1. everything that is not quantized, straight into its storage (the quantized weights are skipped:
        #    they get no full-size storage)
        fills = allocate(model, keys, header, dev, prep.dtype, skip=prep.quantized)
        _fill(
            [staging.Target(n, t.detach(), torch_dtype(i.dtype)) for n, t, i in fills],
            [i for _, _, i in fills],
            dev,
            threads,
            buffer_bytes,
            lent,
        )
        del fills
        t_plain = time.perf_counter()
        # 2. quantized weights, one layer at a time through one reused scratch
        scratch = torch.empty(scratch_bytes, dtype=torch.uint8, device=dev)
        done = torch.cuda.Event() if dev.type == "cuda" else None  # type: ignore[no-untyped-call]
        # bitsandbytes launches on the current device and the event records on its current stream
        on_dev = torch.cuda.device(dev) if dev.type == "cuda" else contextlib.nullcontext()
        with torch.no_grad(), on_dev:
            for group, (offsets, size) in zip(groups, layout, strict=True):
                if done is not None:
                    done.synchronize()  # the previous layer's quantization has finished reading the scratch
                infos = [header.tensors[prep.quantized[n]] for n in group]
                views = [
                    scratch[off : off + info.numel * _itemsize(model.get_parameter(n))]
                    .view(model.get_parameter(n).dtype)
                    .view(info.shape)
                    for n, off, info in zip(group, offsets, infos, strict=True)
                ]
                _fill(
                    [
                        staging.Target(n, v, torch_dtype(i.dtype))
                        for n, v, i in zip(group, views, infos, strict=True)
                    ],
                    infos,
                    dev,
                    threads,
                    _layer_chunk(size, threads, buffer_bytes),
                    lent,
                )
                for name, value in zip(group, views, strict=True):
                    _quantize_one(prep, name, value, dev)
                del views
                if done is not None:
                    done.record()
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        del scratch
    finally:
        if pool is not None:
            pool.close()  # every copy out of it has finished: fill_cuda synchronises its stream
    t_quant = time.perf_counter()
    return {
        "plain_s": round(t_plain - t0, 4),
        "quantize_s": round(t_quant - t_plain, 4),
        "layers": len(groups),
        "scratch_bytes": scratch_bytes,
    }


def _layer_chunk(layer_bytes: int, threads: int, buffer_bytes: int) -> int:
    """Read size for one layer's fill: small enough that every reader gets about two chunks (a 0.6B layer is
    31 MB, two 16 MiB chunks, which would leave six of eight readers idle), never above the staging buffer."""
    want = layer_bytes // (2 * threads) // (64 << 10) * (64 << 10)
    return min(buffer_bytes, max(1 << 20, want))


def _itemsize(t: Any) -> int:
    return int(t.element_size())


def _scratch_layout(prep: _Prepared, group: list[str]) -> tuple[list[int], int]:
    """Byte offset of each weight of a layer in the scratch (in the dtype it is quantized from), and the size."""
    offsets, at = [], 0
    for name in group:
        meta = prep.model.get_parameter(name)
        offsets.append(at)
        at += -(-meta.numel() * meta.element_size() // _SCRATCH_ALIGN) * _SCRATCH_ALIGN
    return offsets, max(at, 1)
