"""``cudaload demo``: the whole path (detect, plan, load, verify, run) on a tiny model made on the spot.

Offline by construction: the model is random weights from a config and the tokenizer is built locally.
Decoder kinds generate text; encoder kinds (bert) have no ``generate`` and run feature extraction instead.
"""

from __future__ import annotations

import dataclasses
import logging
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from functools import lru_cache
from typing import TYPE_CHECKING, Any, TextIO

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)


@contextmanager
def quiet_progress_bars() -> Iterator[None]:
    """transformers' progress bars off inside the block, restored after: the demo prints its own timings,
    and a library caller's setting is left as it was (no global side effect outliving the call)."""
    from transformers.utils import logging as tf_logging

    was_on = tf_logging.is_progress_bar_enabled()
    if was_on:
        tf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_on:
            tf_logging.enable_progress_bar()


@lru_cache(maxsize=1)
def _byte_of_symbol() -> dict[str, int]:
    """The inverse of GPT-2's byte-to-symbol table (transformers 5.17
    src/transformers/models/gpt2/tokenization_gpt2.py ``bytes_to_unicode``): byte-level BPE writes each byte
    as one printable symbol."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    symbols = list(printable)
    n = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            symbols.append(256 + n)
            n += 1
    return {chr(s): b for b, s in zip(printable, symbols, strict=True)}


def readable(tokens: Sequence[str], specials: Sequence[str] = ()) -> str:
    """Byte-level BPE tokens as text a terminal shows: the bytes they stand for, decoded as UTF-8 with
    every byte that is not part of a valid character, and every control character, written as ``\\xNN``. Random weights pick bytes at
    random, so ``tokenizer.decode`` would turn most of them into U+FFFD replacement characters."""
    table = _byte_of_symbol()
    out: list[str] = []
    raw = bytearray()
    for t in tokens:
        if t in specials:
            continue
        if all(ch in table for ch in t):
            raw.extend(table[ch] for ch in t)
            continue
        out.append(raw.decode("utf-8", errors="backslashreplace"))  # a filler token: shown by name
        raw.clear()
        out.append(t)
    out.append(raw.decode("utf-8", errors="backslashreplace"))
    # control characters (ESC would drive the terminal) are escaped too
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in "".join(out))


def run(
    kind: str = "qwen3",
    prompt: str = "The fastest way to load a model is",
    max_new_tokens: int = 16,
    cpu: bool = False,
    out: TextIO | None = None,
) -> int:
    from transformers import AutoTokenizer

    from ..detection import GPU_SELECTION, detect
    from ..execute import load_model
    from ..testing import make_tiny

    out = out or sys.stdout

    def say(text: str = "") -> None:
        print(text, file=out, flush=True)

    caps = detect()
    selection = [f for f in caps.findings if f.code in GPU_SELECTION]
    if cpu:
        # the CPU was asked for: which GPU this process would use (CUDA_VISIBLE_DEVICES, LOCAL_RANK...) does
        # not matter, and a problem with it must not stop a CPU run
        had_gpu = bool(caps.gpus)
        caps = dataclasses.replace(
            caps, gpus=(), findings=tuple(f for f in caps.findings if f.code not in GPU_SELECTION)
        )
        say("--cpu given: running on the CPU" + (" although a GPU is present." if had_gpu else "."))
        for f in selection:
            say(f"  (not in the way of a CPU run: {f.message})")
    elif not caps.gpus:
        say(
            "No usable NVIDIA GPU found: running on the CPU (float32). On a GPU machine the same command uses the GPU."
        )
        for f in selection:
            say(f"  {f.message}\n  fix: {f.fix}")
    else:
        g = caps.gpus[0]
        say(
            f"GPU found: cuda:{g.index} {g.name} ({g.architecture}, sm{g.sm}, {g.total_memory / 2**30:.0f} GiB)."
        )

    with quiet_progress_bars(), tempfile.TemporaryDirectory(prefix="cudaload-demo-") as tmp:
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
        if model.can_generate():
            _generate(model, tok, inputs, prompt, max_new_tokens, device, say)
        else:
            _features(model, inputs, prompt, device, say)
    return 0


def _generate(
    model: Any,
    tok: Any,
    inputs: Mapping[str, torch.Tensor],
    prompt: str,
    max_new_tokens: int,
    device: torch.device,
    say: Callable[[str], None],
) -> None:
    import torch

    torch.manual_seed(0)
    t = time.perf_counter()
    with torch.no_grad():
        ids = model.generate(
            **inputs, max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=tok.pad_token_id
        )
    dt = time.perf_counter() - t
    new = ids[0, inputs["input_ids"].shape[1] :].tolist()
    say(f"Generated {len(new)} tokens in {dt:.3f} s on {device} (random weights, so the text is noise):")
    text = readable(tok.convert_ids_to_tokens(new), tok.all_special_tokens)
    say(f'  "{prompt}" -> "{text}"')


def _features(
    model: Any,
    inputs: Mapping[str, torch.Tensor],
    prompt: str,
    device: torch.device,
    say: Callable[[str], None],
) -> None:
    """An encoder has no ``generate``: one forward pass, mean-pooled over the tokens (feature extraction)."""
    import torch

    t = time.perf_counter()
    with torch.no_grad():
        hidden = model(**inputs).last_hidden_state
    dt = time.perf_counter() - t
    mask = inputs["attention_mask"].unsqueeze(-1).to(hidden.dtype)
    pooled = (hidden * mask).sum(1) / mask.sum(1)
    head = ", ".join(f"{v:+.3f}" for v in pooled[0, :4].float().tolist())
    say(
        f"Encoded {hidden.shape[1]} tokens in {dt:.3f} s on {device}: an encoder has no generate(), so this "
        "is feature extraction (random weights, so the numbers are noise):"
    )
    say(f'  "{prompt}" -> hidden states {tuple(hidden.shape)}, mean-pooled embedding [{head}, ...]')
