"""Execute a Plan: the only package that asks transformers to load weights.

``load_model()`` = detect -> plan -> load (cudaload's fast path or ``from_pretrained``) -> probe the attention
backend -> verify -> (PEFT-wrap) -> hand back the model with ``model.cudaload_plan`` attached.
Failures are translated into cudaload's error tree *after* the failed attempt's tensors are released, so a
failed load leaves GPU memory where it was.

One module per step:

- :mod:`.load` - ``load_model`` itself: the request checked once, detection, the ranks' agreement, the steps
  below in order, and what ``plan.verified`` records
- :mod:`.start` - the threads started ahead of the load (prefetch, the GPU's CUDA context), stopped on a refusal
- :mod:`.planning` - the plan the load follows (after transformers imports; again for ``tune=True``; compared
  across torchrun ranks) and what must happen before the model is built
- :mod:`.from_pretrained` - the auto class, the plan's ``from_pretrained`` keywords, the build lock
- :mod:`.load_path` - the planned load path (fast, quantized fast, sharded FSDP2) and its step-aside to
  ``from_pretrained``
- :mod:`.sharded` - an FSDP rank's load (weights on its CPU, or only its own shards)
- :mod:`.attention_probe` - the one-step forward, the runtime attention fallback along the plan's
  ``attention_fallbacks``, the sdpa-variant check, and the new plan a different backend needs
- :mod:`.verification` - ``verify``: the loaded model against the plan
- :mod:`.serving` - the serving section settled and attached after loading
- :mod:`.decode` - the decode section: the static cache and compile settings on the generation config, the
  compile warm-up, the compile artifacts loaded and saved
- :mod:`.tune_on_load` - ``tune=True``: the plan again with measured timings
- :mod:`.ranks` - torchrun ranks exchanging GPU facts and errors
- :mod:`.adapters` - the LoRA config and the peft wrap
- :mod:`.failures` - memory released after a failed attempt, exceptions translated
- :mod:`.phases` - seconds per step

Nothing here imports torch or transformers at import time.
"""

from __future__ import annotations

from ..auto_classes import AUTO_CLASSES
from ..auto_classes import DECIDED_KWARGS as _DECIDED
from .adapters import _lora_config, _wrap_peft
from .attention_probe import _confirm_sdpa_variant, _next_attention, _probe_and_fallback, replanned
from .failures import _gpu_memory_snapshot, _release_memory, _translate
from .from_pretrained import (
    _BUILD_LOCK,
    _from_pretrained,
    _load_kwargs,
    _torch_dtype,
    resolve_auto_class,
)
from .load import _DEVICE_FINDINGS, load_model, load_request
from .load_path import _load_once
from .phases import _Phases
from .ranks import _agree_on_gpus, _rank_error, _tell_ranks_before_planning
from .serving import _attach_serving
from .sharded import _STAGED_NOTE, _fsdp_sharded, _fsdp_weights_on_cpu, _load_fsdp2_for_plan, _load_sharded
from .tune_on_load import _tuned_plan
from .verification import _module_devices, verify

__all__ = [
    "AUTO_CLASSES",
    "load_model",
    "load_request",
    "replanned",
    "resolve_auto_class",
    "verify",
]
# The private names stay importable from here as before the split (tests import them). load_model looks
# _attach_serving up on cudaload.execute.serving at call time, so a test replaces it there.
__all__ += [
    "_BUILD_LOCK",
    "_DECIDED",
    "_DEVICE_FINDINGS",
    "_STAGED_NOTE",
    "_Phases",
    "_agree_on_gpus",
    "_attach_serving",
    "_confirm_sdpa_variant",
    "_from_pretrained",
    "_fsdp_sharded",
    "_fsdp_weights_on_cpu",
    "_gpu_memory_snapshot",
    "_load_fsdp2_for_plan",
    "_load_kwargs",
    "_load_once",
    "_load_sharded",
    "_lora_config",
    "_module_devices",
    "_next_attention",
    "_probe_and_fallback",
    "_rank_error",
    "_release_memory",
    "_tell_ranks_before_planning",
    "_torch_dtype",
    "_translate",
    "_tuned_plan",
    "_wrap_peft",
]
