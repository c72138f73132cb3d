"""Where the ranks agree before going on: every rank's outcome and a fingerprint of what it will read, in one
all_reduce (:class:`_Vote`), so a rank that steps aside or fails stops every rank instead of hanging them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ...errors import LoadError
from ..materialize import KeyPlan, StepAside
from ..reader import TensorInfo

if TYPE_CHECKING:
    import torch


class _Vote:
    """Where the ranks agree that all of them got this far: each rank's outcome (ok, stepped aside, failed) and a
    fingerprint of what it built, summed over the mesh's group in one all_reduce (gloo and NCCL both have it;
    a tensor on the mesh's device type, which NCCL needs)."""

    OK, STEPPED_ASIDE, FAILED = 0, 1, 2

    def __init__(self, dist: Any, mesh: Any, rank: int, world: int, dev: torch.device) -> None:
        import torch

        self.dist, self.group, self.rank, self.world = dist, mesh.get_group(), rank, world
        kind = mesh.device_type
        if dev.type == kind:
            self.device = dev  # this rank's GPU under NCCL, not whichever device is current
        elif kind == "cuda":
            self.device = torch.device("cuda", torch.cuda.current_device())
        else:
            self.device = torch.device(kind)

    def agree(self, failure: Exception | None, fingerprint: int, stage: str) -> None:
        """Raise ``failure`` on its rank, and on every other rank a StepAside (when every rank that stopped
        stepped aside: the whole-model load is then taken on every rank alike) or a LoadError naming the rank."""
        import torch

        code = (
            self.OK
            if failure is None
            else self.STEPPED_ASIDE
            if isinstance(failure, StepAside)
            else self.FAILED
        )
        t = torch.zeros(2 * self.world, dtype=torch.int64, device=self.device)
        t[self.rank] = code
        t[self.world + self.rank] = fingerprint
        self.dist.all_reduce(t, group=self.group)
        codes, prints = t[: self.world].tolist(), t[self.world :].tolist()
        if failure is not None:
            raise failure
        stopped = [r for r, c in enumerate(codes) if c != self.OK]
        if stopped:
            first = stopped[0]
            why = f"rank {first} of {self.world} could not go on {stage}"
            if all(codes[r] == self.STEPPED_ASIDE for r in stopped):
                raise StepAside(
                    f"fast loading steps aside: {why} (it stepped aside)", fix="load it with from_pretrained"
                )
            raise LoadError(
                f"sharded FSDP2 loading stopped: {why} (it raised an error; its log says which)",
                fix=f"fix what rank {first} reports (every rank must see the same checkpoint files)",
            )
        if len(set(prints)) > 1:
            odd = [r for r, f in enumerate(prints) if f != prints[0]]
            raise LoadError(
                f"the ranks read different checkpoints: ranks {odd[:8]} see other tensors than rank 0 "
                "(names, shapes, dtypes or missing keys differ)",
                fix="give every rank the same checkpoint files (one path on a shared file system, or identical "
                "copies on every node)",
            )


def _fingerprint(model: Any, keys: KeyPlan, tensors: Mapping[str, TensorInfo]) -> int:
    """What this rank will read and what it initialised itself, as 62 bits (hashlib, not hash(): that is salted
    per process). Ranks that agree on it read the same tensors and broadcast the same initialised ones."""
    import hashlib

    h = hashlib.sha256()
    for name in sorted(keys.load):
        t = tensors[keys.load[name]]
        h.update(f"{name}={t.name}:{t.dtype}:{tuple(t.shape)};".encode())
    for name, p in model.named_parameters():
        if p.device.type != "meta":
            h.update(f"init {name}:{p.dtype}:{tuple(p.shape)};".encode())
    return int.from_bytes(h.digest()[:8], "little") >> 2
