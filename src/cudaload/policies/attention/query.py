"""What the attention decision is asked, as small frozen values (in the spirit of vLLM's attention selector
config): the question (:class:`AttentionQuery`: the dtype, the intent, the backend asked for, the trusted Hub
kernels and the declared work) and the measured facts it weighs (:class:`AttentionFacts`: generate() timings of
the declared work, first-use seconds, SDPA's cuDNN dispatch and training throughput), passed in, never read
from globals."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from ..sdpa_dispatch import SdpaFacts
from ..training_facts import LayerCompileFacts, TrainingFacts


@dataclass(frozen=True)
class AttentionQuery:
    """The question. ``requested``: "auto" or a name from :data:`~cudaload.policies.attention.ALL_NAMES`;
    ``trust``: Hub kernel repos / publishers whose code may run; ``revision``: the model's revision;
    ``work``: the (batch_size, seq_len) the caller declared, None when it did not. ``batch_layout``: training's
    requested layout (``auto``, ``packed``, ``padded``): a backend is ranked at its compiled-layers rate only
    where the steps may be packed."""

    dtype: str
    intent: str = "inference"
    requested: str = "auto"
    trust: Sequence[str] = ()
    revision: str | None = None
    work: tuple[int, int] | None = None
    batch_layout: str = "auto"


@dataclass(frozen=True)
class AttentionTimings:
    """Backend -> steady-state seconds of the declared work on this GPU on lengths a new process has not met
    (lower is better; names not valid here are ignored, and said so), where they come from (shown in the
    reasons, e.g. "measured on this GPU on 2026-12-01"), and the same work on lengths already met
    (``repeated``: shown beside them, not weighed)."""

    seconds: Mapping[str, float] | None = None
    source: str | None = None
    repeated: Mapping[str, float] | None = None


@dataclass(frozen=True)
class AttentionFacts:
    """What was measured, passed in. ``first_use``: backend -> one-time seconds this process would still pay
    (import, JIT), over the shipped :data:`~cudaload.policies.attention.FIRST_USE` per name (0.0 for a backend
    already imported and compiled here); ``sdpa``: SDPA's cuDNN dispatch measured
    (:mod:`cudaload.policies.sdpa_dispatch`); ``training``: training throughput per backend
    (:mod:`cudaload.policies.training_facts`); ``layer_compile``: what compiled decoder layers did to a training
    step per attention (:class:`~cudaload.policies.training_facts.LayerCompileFacts`): a backend whose layers
    were measured faster compiled is ranked at its compiled throughput."""

    timings: AttentionTimings = field(default_factory=AttentionTimings)
    first_use: Mapping[str, float] | None = None
    sdpa: Sequence[SdpaFacts] = ()
    training: Sequence[TrainingFacts] = ()
    layer_compile: Sequence[LayerCompileFacts] = ()
