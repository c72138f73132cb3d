"""What the planner knows about a model, without loading its weights.

:func:`model_info` accepts a local model directory, a ``config.json`` path, a transformers config object
(or a plain dict), or a Hub id that the local cache can answer. It returns a :class:`ModelInfo`: the
public :class:`~cudaload.plans.ModelSummary` that travels in the Plan, plus the facts the policies need
(parameter counts split by what bitsandbytes would quantize, the model class's ``_supports_*`` flags,
soft-capping, sliding-window layers).

Parameter counts come from the config on the meta device (no memory, no weights), instantiated with one
and two decoder layers and extrapolated linearly: building an 80-layer 70B model on meta takes ~1.5 s on
a small CPU, the two small builds take a few ms. Tied weights count once (``parameters()`` de-duplicates
them). When the checkpoint is local safetensors, the stored bytes come from the file headers instead.

Where each part lives (``from cudaload.model_info import model_info, ModelInfo``):

* :mod:`.records`: :class:`ParamCounts`, :class:`ModelInfo` and its derived facts (flash head dim, PEFT task
  type, fp16 overflow), :func:`with_summary`;
* :mod:`.config`: which config an input names (directory, ``config.json``, config object or dict, a Hub id the
  local cache answers), and the errors for one that names none;
* :mod:`.model_class`: the model class and auto class a config loads as (an encoder's bare model, not its
  causal-LM head class);
* :mod:`.counts`: the parameter counts on the meta device, extrapolated from one and two layers, and their
  cache;
* :mod:`.safetensors_headers`: the checkpoint's safetensors files, their validated headers, stored bytes and
  dominant dtype;
* :mod:`.attention_facts`: what the attention backend rules read (q/k and v head dims, dropout, ALiBi, sinks,
  a legacy ``*_ATTENTION_CLASSES`` table);
* :mod:`.build`: :func:`model_info` and :func:`summarize`, the steps above in order and the summary made from
  them (checkpoint dtype, sliding layers, encoder or not).

The code looks its helpers up in these modules, so a test patches the module that holds the name
(``monkeypatch.setattr(cudaload.model_info.counts, "_count", ...)``), not this package, which only re-exports.
"""

from __future__ import annotations

from .build import model_info, summarize
from .counts import _count as _count  # tests compare the extrapolated counts with a full count
from .counts import _with_layers as _with_layers
from .records import FP16_OVERFLOW_TYPES, ModelInfo, ParamCounts, with_summary
from .safetensors_headers import read_header, safetensors_files
from .summary import ModelSummary

__all__ = [
    "FP16_OVERFLOW_TYPES",
    "ModelInfo",
    "ModelSummary",
    "ParamCounts",
    "model_info",
    "read_header",
    "safetensors_files",
    "summarize",
    "with_summary",
]
