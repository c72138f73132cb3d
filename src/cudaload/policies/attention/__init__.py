"""Attention backend: every candidate checked against rules taken from the released sources, then the valid one
that costs least: measured seconds when the caller has them, else the cheapest safe default.

Candidates: each flash version twice, the pip package (``flash_attention_N``) and its Hub-kernel form (the
repo id transformers itself falls back to, ``FLASH_ATTN_KERNEL_FALLBACK``), plus sdpa, flex_attention and
eager. A rule that rejects a candidate cites the file and line it comes from; the model facts it needs come
from :class:`cudaload.model_info.ModelInfo` (q/k and v head dims, sinks, ALiBi, dropout, soft-capping, sliding
window, the model class's own attention tables). Architecture facts are in :mod:`cudaload.detection.support`.

Where each part lives:

* :mod:`.names`: the backend names and their tables (the pip distribution and Hub-kernel form of each flash
  version, the flash-attn versions transformers accepts, the intents that train, the short-decode limit).
* :mod:`.candidates`: one candidate per name, valid or rejected with every reason, and the order they are
  listed in. A flash candidate's rules: :mod:`.flash_rules` applies them in order, from
  :mod:`.transformers_rules` (what transformers does with the request), :mod:`.fa2_fa3_rules` and
  :mod:`.fa4_rules` (the kernel packages).
* :mod:`.first_use`: the one-time seconds a backend costs per process (FA4's import and JIT, flex_attention's
  compile), and where each number is from.
* :mod:`.query`: what the decision is asked, as small frozen values: :class:`AttentionQuery` (dtype, intent,
  the backend asked for, trusted Hub kernels, revision, the declared work) and :class:`AttentionFacts` (the
  declared work's timings as :class:`AttentionTimings`, first-use seconds, SDPA's cuDNN dispatch, training
  throughput).
* :mod:`.choice`: ``select_attention(info, caps, query, facts)`` (``choose_attention`` is its keyword form), the choice among the valid candidates: measured timings plus first-use
  seconds when the caller has them; without, sdpa where valid, else an ahead-of-time compiled flash build or
  eager, backends with a first-use cost only for training, and eager for one short declared sequence unless
  cudaload_sdpa is the default (the measurements behind each default are in its docstring).
"""

from __future__ import annotations

from .candidates import priority
from .choice import choose_attention, select_attention
from .first_use import (
    FA4_IMPORT_COLD_S,
    FA4_IMPORT_WARM_S,
    FA4_JIT_CACHED_S,
    FA4_JIT_S,
    FIRST_USE,
    FLEX_COMPILE_S,
    FirstUse,
    first_use_costs,
)
from .flash_rules import _flash_checks as _flash_checks  # tests check the source rules alone
from .names import _KERNEL_TO_IMPL as _KERNEL_TO_IMPL  # Hub-kernel repo -> the attn_implementation it serves
from .names import ALL_NAMES, FLASH_PACKAGE, HUB_KERNEL, SHORT_DECODE_MAX_TOKENS
from .query import AttentionFacts, AttentionQuery, AttentionTimings

__all__ = [
    "ALL_NAMES",
    "FA4_IMPORT_COLD_S",
    "FA4_IMPORT_WARM_S",
    "FA4_JIT_CACHED_S",
    "FA4_JIT_S",
    "FIRST_USE",
    "FLASH_PACKAGE",
    "FLEX_COMPILE_S",
    "HUB_KERNEL",
    "SHORT_DECODE_MAX_TOKENS",
    "AttentionFacts",
    "AttentionQuery",
    "AttentionTimings",
    "FirstUse",
    "choose_attention",
    "first_use_costs",
    "priority",
    "select_attention",
]
