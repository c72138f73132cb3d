#!/usr/bin/env python
"""Where the compiled decode step's host time goes (issue 35, goal <= 7 ms a token): torch.compile options that
transformers' ``CompileConfig`` passes on, each in a fresh process, on the 8B shape with cudaload_sdpa (grouped
decode attention), a static cache of 2,048 slots, batch 1.

H200 run43's profile: 5.5 ms of GPU work per step against 7.6 ms a token; the rest is the host between CUDA graph
replays (generate() synchronises every step, so the GPU waits for it). Variants:

- ``base``: cudaload's plan (``mode="reduce-overhead"``: inductor with CUDA graph trees);
- ``freeze``: the same CUDA graphs with inductor's ``freezing`` (the weights become constants of the graph, not
  ~400 inputs that every call passes through dynamo's, AOTAutograd's and the CUDA graph tree's wrappers);
- ``legacy``: CUDA graphs without graph trees (``triton.cudagraph_trees=False``).

Issue 43 item 3 (the compiled step toward the memory bound: 5.6 ms of GPU work a step on the H200 against 3.4 ms
of weight reads; cuBLAS's GEMVs at 1.6-4.4 TB/s, the small k/v projections slowest), not yet run:

- ``cdt``: CUDA graphs with inductor's ``coordinate_descent_tuning`` (gpt-fast's setting). With it inductor
  decomposes every M=1 matmul into a multiply and a sum (torch 2.13 _inductor/decomposition.py:433-442, "Our
  matrix vector multiplies only achieve peak bandwidth with coordinate descent tuning"): at batch 1 each
  projection becomes a Triton reduction, tuned by coordinate descent at compile time, in place of cuBLAS's GEMV;
- ``fused``: ``base`` on a model whose projections that read one input share one GEMM (q/k/v: 8B 4096 x 6144,
  gate/up: 4096 x 24576; :func:`fuse_projections`): 3 GEMVs a layer fewer, the small k/v ones inside a large one.
  inductor's own ``batch_linear_lhs`` pre-grad fusion does not apply (it matches 2-D inputs only, torch 2.13
  _inductor/fx_passes/group_batch_fusion.py:595-608; transformers' hidden states are 3-D);
- ``fused_cdt``: both;
- ``fused_mat``: ``fused`` with ``mode="max-autotune"`` (each projection's GEMM autotuned among inductor's Triton
  templates and cuBLAS; the longest compile, run last).

Per variant: the compile (the first warm-up call), ms per decode token on three 512 + 256 calls ((call - its
prefill) / 255), the peak memory, and greedy parity: the compiled tokens against the dynamic path's on a 512 + 64
call up to the first step whose dynamic top-2 margin is within 4 bf16 steps (a near-tie). JSON lines.

    python benchmarks/investigations/decode_compile_options.py [--variants base,freeze,legacy] > OUT/options.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Any

TAG = "OPTIONS "
VARIANTS: dict[str, dict[str, Any]] = {
    "base": {"mode": "reduce-overhead"},
    "freeze": {"mode": None, "options": {"triton.cudagraphs": True, "freezing": True}},
    "legacy": {"mode": None, "options": {"triton.cudagraphs": True, "triton.cudagraph_trees": False}},
    "cdt": {"mode": None, "options": {"triton.cudagraphs": True, "coordinate_descent_tuning": True}},
    "fused": {"mode": "reduce-overhead", "fuse": True},
    "fused_cdt": {
        "mode": None,
        "options": {"triton.cudagraphs": True, "coordinate_descent_tuning": True},
        "fuse": True,
    },
    # inductor's Triton GEMM templates autotuned against cuBLAS for each projection's M=1 shape (compile: minutes)
    "fused_mat": {"mode": "max-autotune", "fuse": True},
}


def fuse_projections(model: Any) -> int:
    """Give the projections of each layer that read one input one GEMM: every layer's q/k/v (``self_attn``) and
    gate/up (``mlp``) weights concatenated into one parameter, the old modules replaced by slices of it. The first
    projection of a group computes the whole product; the others return their slice when they get the same input
    tensor (else they compute their own part), and the last clears it, so nothing outlives the forward. The
    weights become views of the shared parameter: no extra memory. Returns how many groups were fused."""
    import torch
    import torch.nn.functional as F

    class Shared(torch.nn.Module):
        def __init__(self, linears: list[Any]) -> None:
            super().__init__()
            self.weight = torch.nn.Parameter(torch.cat([m.weight.data for m in linears]), requires_grad=False)
            biases = [m.bias for m in linears]
            self.bias = (
                None
                if all(b is None for b in biases)
                else torch.nn.Parameter(torch.cat([b.data for b in biases]), requires_grad=False)
            )
            self.x: Any = None
            self.y: Any = None

    class Part(torch.nn.Module):
        def __init__(self, shared: Shared, start: int, size: int, first: bool, last: bool) -> None:
            super().__init__()
            self.__dict__["shared"] = shared  # not a submodule: the shared weight is registered once
            self.start, self.size, self.first, self.last = start, size, first, last
            self.weight = torch.nn.Parameter(shared.weight.data[start : start + size], requires_grad=False)

        def forward(self, x: Any) -> Any:
            s = self.shared
            if self.first or s.x is not x:
                s.x, s.y = x, F.linear(x, s.weight, s.bias)
            out = s.y[..., self.start : self.start + self.size]
            if self.last:
                s.x = s.y = None
            return out

    groups = 0
    for layer in model.model.layers:
        for owner, names in (
            (layer.self_attn, ("q_proj", "k_proj", "v_proj")),
            (layer.mlp, ("gate_proj", "up_proj")),
        ):
            linears = [getattr(owner, n) for n in names]
            shared = Shared(linears)
            owner.add_module("fused_" + "_".join(n.split("_")[0] for n in names), shared)
            start = 0
            for i, (n, m) in enumerate(zip(names, linears, strict=True)):
                setattr(owner, n, Part(shared, start, m.out_features, i == 0, i == len(names) - 1))
                start += m.out_features
            groups += 1
    return groups


def child(variant: str, smoke: bool) -> dict[str, Any]:
    import torch
    from transformers import AutoModelForCausalLM, CompileConfig

    from cudaload.execute.runtime.sdpa_decode import register
    from cudaload.testing import full_config, tiny_config

    register()
    cuda = torch.cuda.is_available()
    dev, dt = ("cuda", torch.bfloat16) if cuda else ("cpu", torch.float32)
    cfg = tiny_config("qwen3") if smoke else full_config("Qwen3-8B")
    torch.manual_seed(0)
    with torch.device(dev):
        model = AutoModelForCausalLM.from_config(cfg, dtype=dt, attn_implementation="cudaload_sdpa").eval()
    spec = dict(VARIANTS[variant])
    fused = fuse_projections(model) if spec.pop("fuse", False) else 0
    gc = model.generation_config
    gc.eos_token_id, gc.pad_token_id, gc.do_sample = None, 0, False
    vocab = cfg.vocab_size
    g = torch.Generator().manual_seed(1)
    prompt, new, slots = (16, 8, 64) if smoke else (512, 256, 2048)
    ids = torch.randint(10, vocab - 10, (1, prompt), generator=g).to(dev)

    def gen(n: int, **kw: Any) -> Any:
        return model.generate(
            input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n, **kw
        )

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    ref = gen(new // 4, output_logits=True, return_dict_in_generate=True)
    top2 = torch.stack([lg.float().topk(2).values for lg in ref.logits], dim=1)[0]
    ulp = torch.finfo(torch.bfloat16).eps * torch.exp2(torch.floor(torch.log2(top2[:, 0].abs())))
    tie = (top2[:, 0] - top2[:, 1]) < 4 * ulp
    gc.cache_implementation, gc.max_cache_len = "static", slots
    cc = CompileConfig(fullgraph=False, dynamic=False, **spec)
    if not cuda:
        cc.backend, cc.mode, cc.options = "aot_eager", None, None
        cc._compile_all_devices = True
    gc.compile_config = cc
    out: dict[str, Any] = {"variant": variant, "fused_groups": fused}
    sync()
    t0 = time.perf_counter()
    gen(8)
    sync()
    out["compile_s"] = time.perf_counter() - t0
    gen(8)
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    ms = []
    for _ in range(3):
        sync()
        t0 = time.perf_counter()
        gen(new)
        sync()
        call = time.perf_counter() - t0
        t0 = time.perf_counter()
        gen(1)
        sync()
        ms.append((call - (time.perf_counter() - t0)) / (new - 1) * 1000)
    out["ms_per_token"] = ms
    got = gen(new // 4)[0, prompt:]
    want = ref.sequences[0, prompt:]
    compared = mismatched = 0
    for step in range(new // 4):
        if bool(tie[step]):
            break
        compared += 1
        mismatched += int(got[step] != want[step])
    out["parity"] = {"compared": compared, "mismatched": mismatched, "of": new // 4}
    if cuda:
        out["peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
    from torch._dynamo.utils import counters

    out["graphs"] = dict(counters["stats"])
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--variants", default="base,freeze,legacy")
    ap.add_argument("--timeout-s", type=float, default=110)
    ap.add_argument("--budget-s", type=float, default=0, help="all variants together (0: no limit)")
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--child")
    a = ap.parse_args()
    if a.child:
        try:
            r = child(a.child, a.smoke)
        except Exception as e:
            r = {"variant": a.child, "error": f"{type(e).__name__}: {str(e)[-600:]}"}
        print(TAG + json.dumps(r), flush=True)
        return 0
    end = time.monotonic() + a.budget_s if a.budget_s else float("inf")
    for v in a.variants.split(","):
        limit = min(a.timeout_s, end - time.monotonic())
        if limit < 30:
            print(json.dumps({"variant": v, "error": "not run: the budget is spent"}), flush=True)
            continue
        cmd = [sys.executable, __file__, "--child", v] + (["--smoke"] if a.smoke else [])
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=limit, env=dict(os.environ))
            line = next((x for x in reversed(p.stdout.splitlines()) if x.startswith(TAG)), None)
            r = json.loads(line[len(TAG) :]) if line else {"variant": v, "error": p.stderr[-1500:]}
        except subprocess.TimeoutExpired:
            r = {"variant": v, "error": f"timed out after {limit:.0f} s"}
        print(json.dumps(r), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
