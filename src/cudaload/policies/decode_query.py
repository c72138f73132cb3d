"""What the decode decision (:func:`cudaload.policies.decode.select_decode`) is asked, as five small frozen values:
the question (:class:`DecodeQuery`), the model as it will run (:class:`DecodeModel`), where it runs
(:class:`Placement`), the static cache a compiled plan would use (:class:`StaticCache`) and the measured costs
(:class:`DecodeCosts`). The planner builds them (``cudaload.planner.decode``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from ..plans.decode import DecodeWork, PerCallDecode
from .decode_facts import Scaled

#: ``decode=`` as the request hands it on (cudaload.request: case and spaces dropped, None read as "auto"):
#: "auto" (decided from the declared work) or one of :data:`cudaload.plans.decode.DECODE_MODES`
RequestedDecode = Literal["auto", "dynamic", "compiled"]


@dataclass(frozen=True)
class DecodeQuery:
    """The question: ``intent`` and whether the model generates (``can_generate``; None is decided for other
    intents and for models that do not), the declared ``work`` (``work.new_tokens``: the decode steps of the whole
    job, None: not declared; ``work.longest`` the plan's seq_len; ``work.batch`` the sequences a call),
    ``decode=`` as ``requested``, whether ``seq_len`` was declared (``length_declared``: the static cache's
    length), and what the planner ``assumed``."""

    intent: str
    can_generate: bool
    work: DecodeWork
    requested: RequestedDecode = "auto"
    length_declared: bool = True
    assumed: tuple[str, ...] = ()


@dataclass(frozen=True)
class DecodeModel:
    """The model as it will run: its ``quantization`` (None, "int8", "nf4"), whether it keeps an attention KV
    cache (``kv_cache``; not a state-space model), and the plan's ``attention`` (the facts were measured on
    cudaload's sdpa variants; None: not checked)."""

    quantization: str | None = None
    kv_cache: bool = True
    attention: str | None = None


@dataclass(frozen=True)
class Placement:
    """Where the model runs, as the compiled path's checks need it."""

    has_gpu: bool  # the machine has a CUDA GPU
    on_gpu: bool  # the placement puts the weights on one
    offload: bool
    gpu_devices: int


@dataclass(frozen=True)
class StaticCache:
    """The static cache a compiled plan would use: ``max_cache_len`` (None: none fits, ``length_reasons`` say
    why), the ``buckets`` up to the model's context, whether the compile artifact of ``key`` is on disk
    (``warm``)."""

    max_cache_len: int | None
    buckets: tuple[int, ...] = ()
    length_reasons: tuple[str, ...] = ()
    warm: bool = False
    key: str | None = None


@dataclass(frozen=True)
class DecodeCosts:
    """What was measured: the ``facts`` for this GPU scaled to the model (None: none speaks for it), the memory
    ``bound`` in ms a step (shown beside the costs), and ``per_call``: what each generate() call's own decision
    needs (kept on the plan only where each call may decide: no work declared, ``decode='auto'``, no blocker)."""

    facts: Scaled | None = None
    bound: float | None = None
    per_call: PerCallDecode | None = None
