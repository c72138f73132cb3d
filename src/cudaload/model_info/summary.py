"""The model as a Plan records it (:class:`ModelSummary`): what the planner knows from the config and the
safetensors headers. It sits here, with the facts it is built from, so that ``model_info`` needs nothing above it;
``cudaload.plans`` re-exports it."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any


@dataclass(frozen=True)
class ModelSummary:
    """What the planner knows about the model, from its config (and safetensors headers when local)."""

    name: str
    type: str  # config.model_type, e.g. "qwen3"
    architecture: str | None = None  # e.g. "Qwen3ForCausalLM"
    params: int = 0
    layers: int = 0
    hidden_size: int = 0
    num_heads: int = 0
    num_kv_heads: int = 0
    head_dim: int = 0
    vocab_size: int = 0
    max_position_embeddings: int | None = None
    sliding_window: int | None = None
    tied_embeddings: bool = False
    checkpoint_dtype: str | None = None
    weights_bytes: int = 0  # as stored in the checkpoint's dtype
    weights_source: str = "config"  # "safetensors" (headers read) or "config" (meta-device count)
    is_moe: bool = False
    is_encoder: bool = False
    local_path: str | None = None
    safetensors: bool = False

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ModelSummary:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in known})
