"""How the weights are read: cudaload's own safetensors-to-GPU loader ("fast") or ``from_pretrained``.

The fast path covers exactly what it can do bit for bit: an unquantized local safetensors checkpoint of a
model transformers knows (no remote code), placed on GPUs without offload. Everything else goes through
``from_pretrained``, and the plan says why.
"""

from __future__ import annotations

from typing import Any

from ..decision import Candidate, Decision
from ..plans import Placement

#: Below this checkpoint size the fast path is not known to win: its fixed costs (pinning the staging pool,
#: building the skeleton) are ~0.15 s. Measured on the H200 (torch 2.11, transformers 5.17, warm page cache,
#: benchmarks/results/2026-11-29-h200/fastload.md): Qwen3-0.6B shape, 1.19 GB, fast 0.227 s vs from_pretrained
#: 0.284 s; Qwen3-8B shape, 16.4 GB, 0.767 s vs 2.630 s. Smaller checkpoints were not measured.
FAST_MIN_BYTES = 1 * 10**9


def choose_load_path(
    info: Any, *, quantization: str | None, placement: Placement, prefer: bool | None = None
) -> Decision:
    """``prefer``: None decides by size; True takes the fast path whenever it can do the load; False never."""
    s = info.summary
    if prefer is False:
        fp = Candidate("from_pretrained", True, ("fast=False was passed",))
        return Decision(
            "from_pretrained",
            fp.reasons,
            (Candidate("fast", False, ("fast=False was passed",)), fp),
            explicit=True,
        )
    bad: list[str] = []
    if not s.local_path:
        bad.append("the checkpoint is not a local directory (config-only or Hub plan)")
    elif not s.safetensors:
        bad.append("no safetensors files (.bin checkpoints go through from_pretrained)")
    if quantization:
        bad.append(f"{quantization} quantization is done by bitsandbytes inside from_pretrained")
    if info.remote_code:
        bad.append("the model needs remote code (auto_map)")
    if placement.offload:
        bad.append("CPU/disk offload is handled by accelerate hooks")
    if not any(d.startswith("cuda") for d in placement.devices):
        bad.append("no GPU in the placement: the fast path copies to GPUs")
    elif len(placement.devices) > 1:
        bad.append("split across several GPUs: the fast path fills one device")
    if prefer is None and s.weights_bytes and s.weights_bytes < FAST_MIN_BYTES:
        bad.append(
            f"checkpoint of {s.weights_bytes / 1e9:.2f} GB: below {FAST_MIN_BYTES / 1e9:.0f} GB the fast path "
            "is not known to beat from_pretrained (its fixed cost is ~0.15 s; fast=True forces it)"
        )
    fast = Candidate(
        "fast",
        not bad,
        tuple(bad)
        or (
            "unquantized local safetensors on GPU: parallel reads into pinned buffers, "
            "copied straight into the "
            "parameters (no second copy)",
        ),
    )
    fp = Candidate("from_pretrained", True, ("transformers' loader: handles every case",))
    if fast.ok:
        return Decision("fast", fast.reasons, (fast, fp), explicit=prefer is True)
    if prefer is True:
        from ..errors import InvalidChoiceError

        raise InvalidChoiceError(
            "fast=True but the fast loader cannot do this load",
            reasons=bad,
            fix="drop fast=True (from_pretrained handles every case)",
        )
    return Decision(
        "from_pretrained", ("the fast loader does not cover this load: " + "; ".join(bad),), (fast, fp)
    )
