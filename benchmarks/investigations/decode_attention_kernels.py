#!/usr/bin/env python
"""One decode step's attention over a static cache (issue 35): where the compiled path's time per unused slot goes.

The 8B shape's layer (32 query heads, 8 key/value heads, head_dim 128, bf16), batch 1, one query, a static cache of
C slots of which the first `valid` hold tokens, as transformers' sdpa path runs it with a static cache: the key /
value heads repeated to the query heads (transformers 5.17 integrations/sdpa_attention.py:27-36: GQA only without a
mask) and a boolean mask over the slots. Each torch SDPA backend forced in turn (sdpa_kernel), and the flash kernel
over the valid slots alone (no mask, enable_gqa) as the floor. Microseconds per call (CUDA events, 200 calls after
20), printed as JSON lines. Kernel-only: the model's own path decides, this only locates the cost.

    python benchmarks/investigations/decode_attention_kernels.py > OUT/kernels.jsonl
"""

# every lambda below is timed at once, inside its iteration: the loop variables it reads are the current ones
# ruff: noqa: B023
from __future__ import annotations

import json

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.functional import scaled_dot_product_attention as sdpa


def timed(fn, n: int = 200) -> float:
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(n):
        fn()
    b.record()
    torch.cuda.synchronize()
    return a.elapsed_time(b) / n * 1000


def main() -> None:
    dev, dt = "cuda", torch.bfloat16
    hq, hkv, d = 32, 8, 128
    for cache in (1024, 4096, 8192):
        valid = cache * 2 // 3
        q = torch.randn(1, hq, 1, d, device=dev, dtype=dt)
        k = torch.randn(1, hkv, cache, d, device=dev, dtype=dt)
        v = torch.randn(1, hkv, cache, d, device=dev, dtype=dt)
        mask = torch.zeros(1, 1, 1, cache, dtype=torch.bool, device=dev)
        mask[..., :valid] = True
        kr = k.repeat_interleave(hq // hkv, dim=1)
        vr = v.repeat_interleave(hq // hkv, dim=1)
        row = {"cache": cache, "valid": valid}
        row["repeat_kv_us"] = timed(lambda: (k.repeat_interleave(4, dim=1), v.repeat_interleave(4, dim=1)))
        for name, be in (
            ("efficient", SDPBackend.EFFICIENT_ATTENTION),
            ("cudnn", SDPBackend.CUDNN_ATTENTION),
            ("math", SDPBackend.MATH),
        ):
            try:
                with sdpa_kernel([be]):
                    row[f"{name}_masked_us"] = timed(lambda: sdpa(q, kr, vr, attn_mask=mask))
            except RuntimeError as e:
                row[f"{name}_masked_us"] = f"error: {str(e).splitlines()[0][:120]}"
        for name, be in (
            ("flash", SDPBackend.FLASH_ATTENTION),
            ("cudnn", SDPBackend.CUDNN_ATTENTION),
            ("efficient", SDPBackend.EFFICIENT_ATTENTION),
        ):
            try:
                kv_k, kv_v = k[:, :, :valid], v[:, :, :valid]
                with sdpa_kernel([be]):
                    row[f"{name}_valid_gqa_us"] = timed(lambda: sdpa(q, kv_k, kv_v, enable_gqa=True))
            except RuntimeError as e:
                row[f"{name}_valid_gqa_us"] = f"error: {str(e).splitlines()[0][:120]}"
        with torch.no_grad():
            row["default_masked_us"] = timed(lambda: sdpa(q, kr, vr, attn_mask=mask))
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
