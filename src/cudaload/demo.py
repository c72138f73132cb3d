"""``cudaload demo``: the whole path (detect, plan, load, verify, generate) on a tiny model made on the spot.

Offline by construction: the model is random weights from a config and the tokenizer is built locally.
"""

from __future__ import annotations

import dataclasses
import logging
import sys
import tempfile
import time
from typing import TextIO

logger = logging.getLogger(__name__)


def run(
    kind: str = "qwen3",
    prompt: str = "The fastest way to load a model is",
    max_new_tokens: int = 16,
    cpu: bool = False,
    out: TextIO | None = None,
) -> int:
    import torch
    from transformers import AutoTokenizer

    from .detection import detect
    from .execute import load_model
    from .testing import make_tiny

    out = out or sys.stdout

    def say(text: str = "") -> None:
        print(text, file=out, flush=True)

    caps = detect()
    if cpu and caps.gpus:
        caps = dataclasses.replace(caps, gpus=())
        say("--cpu given: running on the CPU although a GPU is present.")
    elif not caps.gpus:
        say(
            "No usable NVIDIA GPU found: running on the CPU (float32). On a GPU machine the same command uses the GPU."
        )
    else:
        g = caps.gpus[0]
        say(
            f"GPU found: cuda:{g.index} {g.name} ({g.architecture}, sm{g.sm}, {g.total_memory / 2**30:.0f} GiB)."
        )

    with tempfile.TemporaryDirectory(prefix="cudaload-demo-") as tmp:
        t = time.perf_counter()
        path = make_tiny(kind, tmp, dtype="bfloat16")
        say(
            f"Made a tiny random {kind} checkpoint (safetensors + local tokenizer) in {time.perf_counter() - t:.2f} s."
        )
        say("")
        model = load_model(str(path), hardware=caps)
        plan = model.cudaload_plan
        say(plan.explain())
        say("")
        v = plan.verified or {}
        say(
            f"Loaded in {v.get('load_seconds', 0):.3f} s via {v.get('load_path')}; verified: devices "
            f"{', '.join(v.get('devices', []))}, attention {v.get('attn_implementation')}, "
            f"parameters {', '.join(v.get('parameters_by_dtype', {}))}."
        )
        tok = AutoTokenizer.from_pretrained(str(path))
        device = next(model.parameters()).device
        inputs = tok(prompt, return_tensors="pt").to(device)
        torch.manual_seed(0)
        t = time.perf_counter()
        with torch.no_grad():
            ids = model.generate(
                **inputs, max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=tok.pad_token_id
            )
        dt = time.perf_counter() - t
        new = ids[0, inputs["input_ids"].shape[1] :]
        say(f"Generated {len(new)} tokens in {dt:.3f} s on {device} (random weights, so the text is noise):")
        say(f"  {prompt!r} -> {tok.decode(new, skip_special_tokens=True)!r}")
    return 0
