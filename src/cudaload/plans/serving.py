"""The serving section of a Plan: transformers' continuous-batching settings, pure data.

It sits beside :mod:`cudaload.plans.plan` and below every policy: :mod:`cudaload.policies.serving` decides the values,
``Plan`` holds and (de)serialises them, and neither this module nor ``plans`` imports a policy.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .decision import Decision

#: transformers' default tokens per KV block (5.17 configuration_utils.py:1753); a plan whose block-size
#: decision has no choice falls back to it
TF_DEFAULT_BLOCK_SIZE = 256

_GiB = 1 << 30


@dataclass(frozen=True)
class ServingPlan:
    """The serving section of a Plan: transformers' continuous-batching settings and why."""

    attention: Decision  # the paged attention implementation (cudaload's name, "paged|...")
    attn_implementation: str  # the string the installed transformers takes
    cuda_graphs: Decision  # "on" / "off"
    async_batching: Decision  # "on" / "off" / "unavailable"
    block_size: Decision  # "256", "128", ...
    num_blocks: int
    max_batch_tokens: int
    max_requests_per_batch: int | None
    max_memory_percent: float
    memory: dict[str, int] = field(
        default_factory=dict
    )  # bytes per device: weights, context, working set, ...
    kv_bytes_per_token: int = 0
    tensor_parallel: int = 1
    concurrent_requests: int | None = None  # declared requests (seq_len long) that fit at once
    notes: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    batch_tokens: Decision | None = None  # max_batch_tokens and why (None in plans saved before it existed)

    @property
    def cache_tokens(self) -> int:
        return self.num_blocks * int(self.block_size.choice or TF_DEFAULT_BLOCK_SIZE)

    def continuous_batching_config(self, fields: Iterable[str] | None = None) -> dict[str, Any]:
        """Keyword arguments for transformers' ``ContinuousBatchingConfig``. ``fields``: the installed class's
        field names (``dataclasses.fields``), so a renamed knob follows it (``block_size`` became ``page_size``
        by 5.22, configuration_utils.py:1901-1906 there) and an absent one is left out."""
        graphs = self.cuda_graphs.choice == "on"
        kw: dict[str, Any] = {
            "block_size": int(self.block_size.choice or TF_DEFAULT_BLOCK_SIZE),
            "num_blocks": self.num_blocks,
            "max_batch_tokens": self.max_batch_tokens,
            "max_memory_percent": self.max_memory_percent,
            "use_cuda_graph": graphs,
            "use_async_batching": self.async_batching.choice == "on",
        }
        if self.max_requests_per_batch is not None:
            kw["max_requests_per_batch"] = self.max_requests_per_batch
        if fields is None:
            return kw
        names = set(fields)
        if "auto_switch_to_flash" in names:
            # from 5.19 the manager swaps an sdpa/eager model to FA3/FA2 (package or Hub kernel) at its start unless
            # told not to (5.19 continuous_api.py:746-764, 5.24 :755-773): the plan's attention is the one served,
            # the one the cache was sized for and the attention decision checked (FA3 drops sinks, for one). 5.17
            # and 5.18 have no such field and switch whenever FA3/FA2 is available (5.17 continuous_api.py:660-668)
            kw["auto_switch_to_flash"] = False
        if "block_size" in kw and "page_size" in names:
            kw["page_size"] = kw.pop("block_size")
        return {k: v for k, v in kw.items() if k in names}

    def settings(self, fields: Iterable[str] | None = None) -> dict[str, Any]:
        """``{"attn_implementation": ..., "continuous_batching": {ContinuousBatchingConfig kwargs}}``."""
        return {
            "attn_implementation": self.attn_implementation,
            "continuous_batching": self.continuous_batching_config(fields),
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            "attention": self.attention.to_dict(),
            "attn_implementation": self.attn_implementation,
            "cuda_graphs": self.cuda_graphs.to_dict(),
            "async_batching": self.async_batching.to_dict(),
            "block_size": self.block_size.to_dict(),
            "num_blocks": self.num_blocks,
            "max_batch_tokens": self.max_batch_tokens,
            "max_requests_per_batch": self.max_requests_per_batch,
            "max_memory_percent": self.max_memory_percent,
            "memory": dict(self.memory),
            "kv_bytes_per_token": self.kv_bytes_per_token,
            "tensor_parallel": self.tensor_parallel,
            "concurrent_requests": self.concurrent_requests,
            "notes": list(self.notes),
            "warnings": list(self.warnings),
            "batch_tokens": self.batch_tokens.to_dict() if self.batch_tokens is not None else None,
            "continuous_batching_config": self.continuous_batching_config(),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ServingPlan:
        return cls(
            attention=Decision.from_dict(d["attention"]),
            attn_implementation=str(d["attn_implementation"]),
            cuda_graphs=Decision.from_dict(d["cuda_graphs"]),
            async_batching=Decision.from_dict(d["async_batching"]),
            block_size=Decision.from_dict(d["block_size"]),
            num_blocks=int(d["num_blocks"]),
            max_batch_tokens=int(d["max_batch_tokens"]),
            max_requests_per_batch=d.get("max_requests_per_batch"),
            max_memory_percent=float(d["max_memory_percent"]),
            memory={k: int(v) for k, v in d.get("memory", {}).items()},
            kv_bytes_per_token=int(d.get("kv_bytes_per_token", 0)),
            tensor_parallel=int(d.get("tensor_parallel", 1)),
            concurrent_requests=d.get("concurrent_requests"),
            notes=tuple(d.get("notes", ())),
            warnings=tuple(d.get("warnings", ())),
            batch_tokens=Decision.from_dict(d["batch_tokens"]) if d.get("batch_tokens") else None,
        )

    def explain_lines(self) -> list[str]:
        out = ["serving (transformers continuous batching):"]
        decisions = [
            ("attention", self.attention),
            ("cuda graphs", self.cuda_graphs),
            ("async batching", self.async_batching),
            ("block size", self.block_size),
        ]
        if self.batch_tokens is not None:
            decisions.append(("max batch tokens", self.batch_tokens))
        for label, dec in decisions:
            out.append(f"  {label}: {dec.choice}" + (f"  ({'; '.join(dec.reasons)})" if dec.reasons else ""))
            for c in dec.candidates:
                if c.name != dec.choice:
                    mark = "ok" if c.ok else "rejected"
                    out.append(f"      {c.name}: {mark}: {'; '.join(c.reasons)}")
        out.append(
            f"  KV cache: {self.num_blocks} blocks x {self.block_size.choice} tokens = {self.cache_tokens:,} tokens "
            f"({self.kv_bytes_per_token / 1024:.0f} KiB/token, {self.cache_tokens * self.kv_bytes_per_token / _GiB:.1f}"
            f" GiB); max_batch_tokens {self.max_batch_tokens}; max_requests_per_batch {self.max_requests_per_batch}"
        )
        if self.memory:
            out.append(
                "  memory per device: " + ", ".join(f"{k} {v / _GiB:.2f} GiB" for k, v in self.memory.items())
            )
        if self.tensor_parallel > 1:
            out.append(
                f"  tensor parallel over {self.tensor_parallel} GPUs: each rank holds its share of the cache"
            )
        out += [f"  note: {n}" for n in self.notes]
        out += [f"  WARNING: {w}" for w in self.warnings]
        kw = ", ".join(f"{k}={v!r}" for k, v in self.continuous_batching_config().items())
        out.append(f"  ContinuousBatchingConfig({kw}); attn_implementation={self.attn_implementation!r}")
        return out
