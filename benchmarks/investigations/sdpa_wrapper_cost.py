"""What ``cudaload_sdpa`` adds to each attention call, on the host, in the state where lengths repeat.

Once a problem shape has recurred, ``cudaload.execute.runtime.sdpa_decode.sdpa_decode_forward`` calls transformers' own
``sdpa_attention_forward`` with no flag switch, after one counted-shape lookup. On a host-bound decode that
lookup is all the variant can cost against plain sdpa, so this times the two functions on tiny CPU tensors
(the kernel's own time near its floor), interleaved in rounds of 100 calls, and prints each one's minimum and
median microseconds per call; ``cudaload_sdpa_nocudnn`` (the flag switched around every call) beside them.

    python benchmarks/investigations/sdpa_wrapper_cost.py            # CPU, ~10 s

Recorded: benchmarks/results/2026-12-02-h200/README.md, run 36 (measured on the 2-core CPU this project's CI
runs on, idle: medians 12.1 us for sdpa, 15.0 us for cudaload_sdpa, 14.3 us for cudaload_sdpa_nocudnn).
"""

from __future__ import annotations

import argparse
import statistics
import time


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=200)
    args = ap.parse_args(argv)

    import torch
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    from cudaload.execute.runtime import sdpa_decode

    class Layer(torch.nn.Module):  # what sdpa_attention_forward reads from a decoder layer's attention
        def __init__(self) -> None:
            super().__init__()
            self.layer_idx, self.is_causal, self.num_key_value_groups = 3, True, 4

    layer = Layer()
    q, k, v = torch.randn(1, 4, 1, 8), torch.randn(1, 1, 4, 8), torch.randn(1, 1, 4, 8)
    fns = {
        "sdpa": sdpa_attention_forward,
        sdpa_decode.SDPA_DECODE: sdpa_decode.sdpa_decode_forward,
        sdpa_decode.SDPA_NO_CUDNN: sdpa_decode.sdpa_no_cudnn_forward,
    }
    kw = {"dropout": 0.0, "scaling": None, "is_causal": True}
    for f in fns.values():  # past RECUR: cudaload_sdpa's shape now recurs
        for _ in range(300):
            f(layer, q, k, v, None, **kw)
    us: dict[str, list[float]] = {n: [] for n in fns}
    for _ in range(args.rounds):
        for name, f in fns.items():
            t = time.perf_counter()
            for _ in range(100):
                f(layer, q, k, v, None, **kw)
            us[name].append((time.perf_counter() - t) / 100 * 1e6)
    for name, xs in us.items():
        print(f"{name}: min {min(xs):.1f} us, median {statistics.median(xs):.1f} us per call")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
