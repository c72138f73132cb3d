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
from .attention_probe import replanned
from .from_pretrained import resolve_auto_class
from .load import load_model, load_request
from .verification import verify

__all__ = [
    "AUTO_CLASSES",
    "load_model",
    "load_request",
    "replanned",
    "resolve_auto_class",
    "verify",
]
