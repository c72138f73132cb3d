"""Build the model skeleton on the meta device, give each tensor real storage on the target device, fill
it from the checkpoint, and finish the way ``from_pretrained`` finishes.

Every step that decides *what* the model holds is transformers' own, called rather than re-implemented, so the
result matches ``from_pretrained(path, dtype=..., device_map=device)`` bit for bit:

- construction: ``cls.get_init_context(dtype, ...)`` (meta device, default dtype, no tying in ``__init__``)
  and ``cls(config)``, as ``from_pretrained`` does;
- checkpoint key renames: ``get_model_conversion_mapping`` + ``rename_source_key`` (prefixes for base vs head
  classes, legacy ``gamma``/``beta``, per-model renames). A key that needs a *converter* (tensors fused or
  split, e.g. MoE experts stacked into one parameter) is out of scope: :func:`plan_keys` reports it;
- dtypes: the skeleton's dtype, or float32 where ``_get_dtype_plan`` keeps a module in float32;
- keywords: from_pretrained's, sorted as it sorts them (config overrides through ``AutoConfig``, files through
  ``_get_resolved_checkpoint_files``), or the load steps aside (:class:`StepAside`) before allocating;
- checkpoint files: transformers' ``_get_resolved_checkpoint_files``; headers validated as the safetensors
  library validates them; shards merged in from_pretrained's order (a later shard's copy wins);
- finishing: loaded tensors are set as ``set_param_for_module`` sets them, then transformers'
  ``_finalize_model_loading`` does the rest (move missing keys and non-persistent buffers off meta,
  ``initialize_weights``, ``tie_weights``, ``_adjust_missing_and_unexpected_keys``, the load report).

Nothing of transformers is patched: these are the methods ``from_pretrained`` itself calls.

Where each part lives (``from cudaload.fastload.materialize import X`` finds every one of them; the quantized
and sharded loaders build on the same steps):

* :mod:`.checkpoint`: keywords, config, checkpoint files and headers, the device (:func:`prepare`), and
  :class:`StepAside`;
* :mod:`.keys`: checkpoint keys onto the model's (:func:`plan_keys`, :func:`check_keys`) and the dtypes read;
* :mod:`.skeleton`: the meta model, its storage and transformers' finishing (:func:`build_skeleton`,
  :func:`allocate`, :func:`finish`);
* :mod:`.loading`: :func:`load`, :func:`supports`, and :func:`clear_tracebacks` for a failed load's memory.
"""

from __future__ import annotations

from .checkpoint import (
    LoadOptions,
    Prepared,
    StepAside,
    load_options,
    prepare,
    read_config,
    resolve_device,
    resolve_files,
    unsupported_config,
)
from .checkpoint import step_aside as step_aside  # the sharded loader steps aside with the same message
from .keys import KeyPlan, check_keys, plan_keys, torch_dtype
from .loading import clear_tracebacks, load, supports
from .skeleton import allocate, build_skeleton, finish, load_report, model_class

__all__ = [
    "KeyPlan",
    "LoadOptions",
    "Prepared",
    "StepAside",
    "allocate",
    "build_skeleton",
    "check_keys",
    "clear_tracebacks",
    "finish",
    "load",
    "load_options",
    "load_report",
    "model_class",
    "plan_keys",
    "prepare",
    "read_config",
    "resolve_device",
    "resolve_files",
    "supports",
    "torch_dtype",
    "unsupported_config",
]
