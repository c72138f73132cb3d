#!/usr/bin/env python
"""One decode step's attention over a static cache (issue 35): where the compiled path's time per unused slot goes.

The 8B shape's layer (32 query heads, 8 key/value heads, head_dim 128, bf16), batch 1, one query, a static cache of
C slots of which the first `valid` hold tokens, as transformers' sdpa path runs it with a static cache: the key /
value heads repeated to the query heads (transformers 5.17 integrations/sdpa_attention.py:27-36: GQA only without a
mask) and a boolean mask over the slots. Each torch SDPA backend forced in turn (sdpa_kernel); the flash kernel over
the valid slots alone (no mask, enable_gqa) as the floor; and the candidates a compiled decode step could run
instead, each compiled as generate()'s step is (inductor):

- ``flex``: torch's flex_attention with the mask as a score_mod, GQA native (inductor's flex-decoding template:
  the key/value heads read once, split over the slots);
- ``grouped_bf16``: the query heads grouped per key/value head, two batched matmuls (bf16 scores), fp32 softmax;
- ``grouped_fp32``: the same with the scores reduced in fp32 by inductor (no bf16 rounding of the scores).

Microseconds per call, each call replayed from a CUDA graph of 50 (as a compiled decode step runs; eager where
capture fails, marked), and each candidate's largest difference from the flash floor over the valid slots.
Printed as JSON lines. Kernel-only: the model's own path decides, this only locates the cost.

    python benchmarks/investigations/decode_attention_kernels.py > OUT/kernels.jsonl
"""

# every lambda below is timed at once, inside its iteration: the loop variables it reads are the current ones
# ruff: noqa: B023
from __future__ import annotations

import json
from typing import Any

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.functional import scaled_dot_product_attention as sdpa

N = 50


def timed(fn: Any, n: int = N) -> tuple[float, str]:
    """Microseconds per call, from a CUDA graph of n calls (eager if the capture fails)."""
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    try:
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                fn()
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for _ in range(n):
                fn()
        g.replay()
        torch.cuda.synchronize()
        a.record()
        for _ in range(4):
            g.replay()
        b.record()
        torch.cuda.synchronize()
        return a.elapsed_time(b) / (4 * n) * 1000, "graph"
    except Exception:
        torch.cuda.synchronize()
        a.record()
        for _ in range(n * 4):
            fn()
        b.record()
        torch.cuda.synchronize()
        return a.elapsed_time(b) / (4 * n) * 1000, "eager"


def _flex(q: Any, k: Any, v: Any, mask: Any) -> Any:
    from torch.nn.attention.flex_attention import flex_attention

    def score_mod(score: Any, b: Any, h: Any, qi: Any, ki: Any) -> Any:
        return torch.where(mask[b, 0, qi, ki], score, -float("inf"))

    return flex_attention(q, k, v, score_mod=score_mod, enable_gqa=True)


def _grouped_bf16(q: Any, k: Any, v: Any, mask: Any) -> Any:
    b, hq, lq, d = q.shape
    hkv = k.shape[1]
    qg = q.view(b, hkv, (hq // hkv) * lq, d)
    s = torch.matmul(qg, k.transpose(-1, -2)).float() * d**-0.5
    s = s.masked_fill(~mask, -float("inf"))
    p = torch.softmax(s, dim=-1).to(q.dtype)
    return torch.matmul(p, v).view(b, hq, lq, d)


def _grouped_fp32(q: Any, k: Any, v: Any, mask: Any) -> Any:
    b, hq, lq, d = q.shape
    hkv = k.shape[1]
    qg = q.view(b, hkv, (hq // hkv) * lq, 1, d).float()
    s = (qg * k[:, :, None].float()).sum(-1) * d**-0.5
    s = s.masked_fill(~mask, -float("inf"))
    p = torch.softmax(s, dim=-1)
    return (p[..., None] * v[:, :, None].float()).sum(-2).to(q.dtype).view(b, hq, lq, d)


def main() -> None:
    dev, dt = "cuda", torch.bfloat16
    hq, hkv, d = 32, 8, 128
    torch._dynamo.config.cache_size_limit = 64
    compiled = {
        "flex": torch.compile(_flex, fullgraph=True, dynamic=False),
        "grouped_bf16": torch.compile(_grouped_bf16, fullgraph=True, dynamic=False),
        "grouped_fp32": torch.compile(_grouped_fp32, fullgraph=True, dynamic=False),
    }
    for cache in (1024, 4096, 8192):
        valid = cache * 2 // 3
        q = torch.randn(1, hq, 1, d, device=dev, dtype=dt)
        k = torch.randn(1, hkv, cache, d, device=dev, dtype=dt)
        v = torch.randn(1, hkv, cache, d, device=dev, dtype=dt)
        k[:, :, valid:] = 0  # a static cache's unused slots hold zeros
        v[:, :, valid:] = 0
        mask = torch.zeros(1, 1, 1, cache, dtype=torch.bool, device=dev)
        mask[..., :valid] = True
        kr = k.repeat_interleave(hq // hkv, dim=1)
        vr = v.repeat_interleave(hq // hkv, dim=1)
        kv_k, kv_v = k[:, :, :valid].contiguous(), v[:, :, :valid].contiguous()
        with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
            ref = sdpa(q, kv_k, kv_v, enable_gqa=True).float()
        row: dict[str, Any] = {"cache": cache, "valid": valid}
        row["repeat_kv_us"] = timed(lambda: (k.repeat_interleave(4, dim=1), v.repeat_interleave(4, dim=1)))
        for name, be in (
            ("efficient", SDPBackend.EFFICIENT_ATTENTION),
            ("cudnn", SDPBackend.CUDNN_ATTENTION),
            ("math", SDPBackend.MATH),
        ):
            try:
                with sdpa_kernel([be]):
                    row[f"{name}_masked_us"] = timed(lambda: sdpa(q, kr, vr, attn_mask=mask))
                    row[f"{name}_masked_maxdiff"] = float(
                        (sdpa(q, kr, vr, attn_mask=mask).float() - ref).abs().max()
                    )
            except RuntimeError as e:
                row[f"{name}_masked_us"] = f"error: {str(e).splitlines()[0][:120]}"
        for name, be in (
            ("flash", SDPBackend.FLASH_ATTENTION),
            ("cudnn", SDPBackend.CUDNN_ATTENTION),
            ("efficient", SDPBackend.EFFICIENT_ATTENTION),
        ):
            try:
                with sdpa_kernel([be]):
                    row[f"{name}_valid_gqa_us"] = timed(lambda: sdpa(q, kv_k, kv_v, enable_gqa=True))
            except RuntimeError as e:
                row[f"{name}_valid_gqa_us"] = f"error: {str(e).splitlines()[0][:120]}"
        for name, fn in compiled.items():
            try:
                got = fn(q, k, v, mask)
                row[f"{name}_maxdiff"] = float((got.float() - ref).abs().max())
                row[f"{name}_us"] = timed(lambda: fn(q, k, v, mask))
            except Exception as e:
                row[f"{name}_us"] = f"error: {type(e).__name__}: {str(e).splitlines()[0][:160]}"
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
