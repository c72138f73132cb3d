"""Pure policies: each takes plain data (a ModelInfo, a Capabilities, the request) and returns its choice with
every candidate and the reasons, never touching a GPU, the network or the environment."""

from __future__ import annotations

from .attention import choose_attention
from .dtype import choose_dtype, normalize_dtype
from .load_path import choose_load_path
from .memory import estimate
from .placement import place
from .quantization import fit

__all__ = [
    "choose_attention",
    "choose_dtype",
    "choose_load_path",
    "estimate",
    "fit",
    "normalize_dtype",
    "place",
]
