"""Models cudaload makes for itself: tiny random checkpoints (tests, benchmarks, ``cudaload demo``) and
full-size configs for planning. Nothing here downloads anything."""

from .models import TINY_KINDS, make_tiny, make_tokenizer, tiny_config
from .shapes import FULL_SHAPES, full_config

__all__ = ["FULL_SHAPES", "TINY_KINDS", "full_config", "make_tiny", "make_tokenizer", "tiny_config"]
