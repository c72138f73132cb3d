"""How the weights are read: cudaload's own safetensors-to-GPU loader ("fast") or ``from_pretrained``.

The fast path covers exactly what it can do bit for bit: an unquantized local safetensors checkpoint of a
model transformers knows (no remote code), placed on GPUs without offload. Everything else goes through
``from_pretrained``, and the plan says why.
"""

from __future__ import annotations

from typing import Any

from ..decision import Candidate, Decision
from ..plans import Placement


def choose_load_path(info: Any, *, quantization: str | None, placement: Placement) -> Decision:
    s = info.summary
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
        return Decision("fast", fast.reasons, (fast, fp))
    return Decision(
        "from_pretrained", ("the fast loader does not cover this load: " + "; ".join(bad),), (fast, fp)
    )
