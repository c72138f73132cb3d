"""The work a plan is sized for: what the caller declared (sequence length, sequences a batch), the defaults that
fill in what was not, and what that assumed, said in the plan."""

from __future__ import annotations

from dataclasses import dataclass

from ..model_info import ModelInfo
from ..request import Request

#: Default work size: the model's context, capped. Planning KV cache for a 128k context by default would
#: push every model into quantization for a length few callers use.
DEFAULT_SEQ_CAP = 4096
DEFAULT_SEQ_UNKNOWN = 2048


@dataclass(frozen=True)
class WorkSize:
    """``seq_len`` / ``batch_size`` as planned (defaults filled in), what was declared, and what was assumed."""

    seq_len: int
    batch_size: int
    declared_seq: int | None
    declared_batch: int | None
    assumed: tuple[str, ...] = ()

    @property
    def declared(self) -> tuple[int, int] | None:
        """(batch_size, seq_len) when the caller declared both: the work one generate() call runs."""
        if self.declared_batch is None or self.declared_seq is None:
            return None
        return self.declared_batch, self.declared_seq


def work_for(req: Request, info: ModelInfo) -> WorkSize:
    s = info.summary
    assumed: list[str] = []
    seq_len = req.seq_len
    if seq_len is None:
        seq_len = min(s.max_position_embeddings or DEFAULT_SEQ_UNKNOWN, DEFAULT_SEQ_CAP)
        assumed.append(
            f"sequences of at most {seq_len} tokens (the model's context, at most {DEFAULT_SEQ_CAP}; declare "
            "seq_len=, the longest sequence of the data)"
        )
    return WorkSize(seq_len, req.batch_size or 1, req.seq_len, req.batch_size, tuple(assumed))
