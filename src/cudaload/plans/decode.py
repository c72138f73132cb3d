"""The decode section of a Plan: how ``generate()`` runs its decode steps, pure data (issue 35).

It sits beside :mod:`cudaload.plans.plan` and below every policy, as :mod:`cudaload.plans.serving` and
:mod:`cudaload.plans.training` do: :mod:`cudaload.policies.decode` decides the values, ``Plan`` holds and
(de)serialises them, and :mod:`cudaload.execute.decode` applies them to a loaded model (its generation config,
the compile caches).

``mode``: ``dynamic`` (transformers' default DynamicCache, nothing compiled) or ``compiled`` (a StaticCache of
``max_cache_len`` slots and the decode step compiled by transformers' own ``generate()`` path, CUDA graphs
through torch.compile's ``reduce-overhead`` mode).

With no work declared (issue 43) a dynamic plan may carry ``per_call`` (:class:`PerCallDecode`): what each
``generate()`` call needs to decide its own decode (:mod:`cudaload.policies.decode_call`), so load_model()
compiles nothing and a long call may still run compiled.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .decision import Decision

#: the decode modes cudaload plans
DECODE_MODES = ("dynamic", "compiled")


@dataclass(frozen=True)
class DecodeWork:
    """The generation work a caller declared (or the plan assumed): ``new_tokens``: decode steps per sequence over
    every call (the request's ``new_tokens``, one call's, times ``generate_calls``); ``batch``: sequences per
    ``generate()`` call; ``calls``: how many calls (None: not said); ``longest``: the longest prompt + new tokens
    of one sequence (the plan's ``seq_len``, the static cache's length before its bucket)."""

    new_tokens: int | None = None
    batch: int = 1
    calls: int | None = None
    longest: int | None = None

    @property
    def declared(self) -> bool:
        return self.new_tokens is not None

    def to_dict(self) -> dict[str, Any]:
        return {
            "new_tokens": self.new_tokens,
            "batch": self.batch,
            "calls": self.calls,
            "longest": self.longest,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> DecodeWork:
        return cls(
            new_tokens=None if d.get("new_tokens") is None else int(d["new_tokens"]),
            batch=int(d.get("batch", 1)),
            calls=None if d.get("calls") is None else int(d["calls"]),
            longest=None if d.get("longest") is None else int(d["longest"]),
        )


@dataclass(frozen=True)
class PerCallDecode:
    """What a ``generate()`` call's own decode decision needs beside the call (plain, serialisable data; the
    policy is :func:`cudaload.policies.decode_call.choose_call_decode`, applied by :mod:`cudaload.execute.decode`).

    ``facts``: the decode record that speaks for this GPU (``DecodeFacts.to_dict()``), ``weight_scale`` and
    ``layer_scale`` its scales to this model and ``facts_text`` where it was measured; ``buckets``: the static
    cache lengths a call may compile (:func:`cudaload.policies.decode.cache_lengths` up to the model's context
    ``max_positions``); ``kv_bytes_per_slot``: one sequence's static-cache bytes per slot (every layer's keys and
    values); ``compile``: transformers' ``CompileConfig`` keywords; ``key_parts`` and ``key_label``: the compile
    cache key's call-independent parts (:func:`cudaload.policies.decode.decode_key_base`), so a call's artifact
    has the key a declared plan or ``cudaload precompile --decode`` gives the same bucket and batch."""

    facts: dict[str, Any]
    weight_scale: float = 1.0
    layer_scale: float = 1.0
    facts_text: str = ""
    buckets: tuple[int, ...] = ()
    max_positions: int | None = None
    kv_bytes_per_slot: int = 0
    compile: dict[str, Any] = field(default_factory=dict)
    key_parts: dict[str, Any] = field(default_factory=dict)
    key_label: tuple[str, str] = ("", "")

    def to_dict(self) -> dict[str, Any]:
        return {
            "facts": dict(self.facts),
            "weight_scale": self.weight_scale,
            "layer_scale": self.layer_scale,
            "facts_text": self.facts_text,
            "buckets": list(self.buckets),
            "max_positions": self.max_positions,
            "kv_bytes_per_slot": self.kv_bytes_per_slot,
            "compile": dict(self.compile),
            "key_parts": dict(self.key_parts),
            "key_label": list(self.key_label),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> PerCallDecode:
        label = tuple(str(x) for x in d.get("key_label") or ("", ""))
        return cls(
            facts=dict(d["facts"]),
            weight_scale=float(d.get("weight_scale", 1.0)),
            layer_scale=float(d.get("layer_scale", 1.0)),
            facts_text=str(d.get("facts_text") or ""),
            buckets=tuple(int(x) for x in d.get("buckets", ())),
            max_positions=None if d.get("max_positions") is None else int(d["max_positions"]),
            kv_bytes_per_slot=int(d.get("kv_bytes_per_slot", 0)),
            compile=dict(d.get("compile") or {}),
            key_parts=dict(d.get("key_parts") or {}),
            key_label=(label[0], label[1]) if len(label) == 2 else ("", ""),
        )


@dataclass(frozen=True)
class DecodePlan:
    """How generate() decodes, and why.

    ``mode``: the decision (:data:`DECODE_MODES`), with every candidate and the costs each would pay;
    ``work``: what it was decided for; ``max_cache_len``: the static cache's slots (a bucket: calls whose prompt +
    new tokens fit in it reuse the compiled graph; None for dynamic); ``cache_buckets``: the buckets in order
    (a longer call moves to the next one: one more compile); ``batch_sizes``: the batch sizes compiled ahead
    (another batch size compiles once more); ``compile``: transformers' ``CompileConfig`` keywords;
    ``expected``: the costs the decision weighed, in seconds and ms (``ms_per_token_dynamic``,
    ``ms_per_token_compiled``, ``compile_s_cold``, ``compile_s_warm``, ``job_s_dynamic``, ``job_s_compiled``,
    ``breakeven_tokens``); ``cache_key``: the key of the persistent compile cache (torch, GPU, model shape,
    bucket) or None; ``assumed``: what was taken for granted; ``per_call``: set on a dynamic plan whose
    ``generate()`` calls each decide their decode (no work declared, ``decode='auto'``; None: every call is
    dynamic, or the plan is compiled)."""

    mode: Decision
    work: DecodeWork = field(default_factory=DecodeWork)
    max_cache_len: int | None = None
    cache_buckets: tuple[int, ...] = ()
    batch_sizes: tuple[int, ...] = ()
    compile: dict[str, Any] = field(default_factory=dict)
    expected: dict[str, float] = field(default_factory=dict)
    cache_key: str | None = None
    assumed: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    per_call: PerCallDecode | None = None

    @property
    def compiled(self) -> bool:
        return self.mode.choice == "compiled"

    def generation_settings(self) -> dict[str, Any]:
        """The generation-config fields the plan sets (empty for dynamic): ``cache_implementation``,
        ``max_cache_len`` and ``compile_config`` (a dict of ``CompileConfig`` keywords)."""
        if not self.compiled:
            return {}
        out: dict[str, Any] = {"cache_implementation": "static", "compile_config": dict(self.compile)}
        if self.max_cache_len is not None:
            out["max_cache_len"] = self.max_cache_len
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "mode": self.mode.to_dict(),
            "work": self.work.to_dict(),
            "max_cache_len": self.max_cache_len,
            "cache_buckets": list(self.cache_buckets),
            "batch_sizes": list(self.batch_sizes),
            "compile": dict(self.compile),
            "expected": dict(self.expected),
            "cache_key": self.cache_key,
            "assumed": list(self.assumed),
            "notes": list(self.notes),
            "per_call": self.per_call.to_dict() if self.per_call is not None else None,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> DecodePlan:
        return cls(
            mode=Decision.from_dict(d["mode"]),
            work=DecodeWork.from_dict(d.get("work") or {}),
            max_cache_len=None if d.get("max_cache_len") is None else int(d["max_cache_len"]),
            cache_buckets=tuple(int(x) for x in d.get("cache_buckets", ())),
            batch_sizes=tuple(int(x) for x in d.get("batch_sizes", ())),
            compile=dict(d.get("compile") or {}),
            expected={k: float(v) for k, v in (d.get("expected") or {}).items()},
            cache_key=d.get("cache_key"),
            assumed=tuple(d.get("assumed", ())),
            notes=tuple(d.get("notes", ())),
            per_call=PerCallDecode.from_dict(d["per_call"]) if d.get("per_call") else None,
        )

    def explain_lines(self) -> list[str]:
        """The decode section of ``Plan.explain()``."""
        lines = self.mode.explain_lines("decode")
        if self.compiled:
            lines.insert(
                1,
                f"    static cache of {self.max_cache_len:,} slots (buckets {', '.join(f'{b:,}' for b in self.cache_buckets)}); "
                f"batch sizes {', '.join(str(b) for b in self.batch_sizes) or '-'}",
            )
            lines.insert(
                2,
                "    generate(): greedy and sampling calls read the stop one step late, so the host queues the next "
                "step while the GPU runs this one (cudaload.execute.runtime.decode_loop)",
            )
        if self.per_call is not None:
            lines.insert(
                1,
                "    per call: decided at each generate() call; after load_model(), each call's choice and why "
                "in plan.verified['decode']['calls']",
            )
        lines[1:1] = [f"    assumed: {a}" for a in self.assumed]
        lines += [f"    note: {n}" for n in self.notes]
        return lines
