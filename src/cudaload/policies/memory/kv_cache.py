"""The KV cache's bytes: every full-attention layer holds ``seq_len`` tokens per sequence, a sliding-window
layer at most its window; none for encoders and models that cannot generate."""

from __future__ import annotations

from ...dtypes import dtype_bytes
from ...model_info import ModelInfo


def kv_cache_bytes(info: ModelInfo, dtype: str, seq_len: int, batch_size: int) -> int:
    s = info.summary
    if not info.can_generate or s.is_encoder:
        return 0
    window = s.sliding_window or seq_len
    full = s.layers - info.sliding_layers
    tokens = full * seq_len + info.sliding_layers * min(seq_len, window)
    return int(2 * batch_size * s.num_kv_heads * s.head_dim * tokens * dtype_bytes(dtype))
