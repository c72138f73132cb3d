"""What a measured attention timing is valid for: the model's attention signature and the work's bucket.

Two models with the same signature run the same attention kernels on the same shapes per head, so a timing
measured for one tells about the other; the bucket groups works whose prefill shape and decode length are
close enough that the backends' order does not change between them (powers of two: the order flipped
between 1 x 512 + 32 and 1 x 4096 + 64 on the H200, never within a factor of two of one work). Pure: no
torch, no transformers.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from ..model_info import ModelInfo


def _fact(info: ModelInfo, name: str, default: Any) -> Any:
    """A model fact from ModelInfo or its summary; fields added later read with a default."""
    v = getattr(info, name, None)
    if v is None:
        v = getattr(getattr(info, "summary", None), name, None)
    return default if v is None else v


@dataclass(frozen=True)
class AttentionSignature:
    """The attention problem a model poses, per layer: what decides which kernel runs and how fast."""

    heads: int
    kv_heads: int
    qk_head_dim: int
    v_head_dim: int
    dtype: str
    sliding_window: int | None = None
    softcap: float | None = None
    sinks: bool = False
    alibi: bool = False

    def key(self) -> str:
        """Exact identity, for the cache."""
        return (
            f"h{self.heads}/kv{self.kv_heads}/qk{self.qk_head_dim}/v{self.v_head_dim}/{self.dtype}"
            f"/win{self.sliding_window or 0}/cap{self.softcap or 0:g}/sinks{int(self.sinks)}"
            f"/alibi{int(self.alibi)}"
        )

    def klass(self) -> str:
        """The compatibility class a shipped prior must share: head dims, dtype and the features that switch
        kernels or reject backends (window, soft-capping, sinks, ALiBi). Head counts are left out: they
        scale every backend's work alike."""
        feats = [n for n, on in (("window", self.sliding_window), ("softcap", self.softcap)) if on]
        feats += [n for n, on in (("sinks", self.sinks), ("alibi", self.alibi)) if on]
        return f"qk{self.qk_head_dim}/v{self.v_head_dim}/{self.dtype}/{'+'.join(feats) or 'plain'}"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> AttentionSignature:
        return cls(
            heads=int(d["heads"]),
            kv_heads=int(d["kv_heads"]),
            qk_head_dim=int(d["qk_head_dim"]),
            v_head_dim=int(d["v_head_dim"]),
            dtype=str(d["dtype"]),
            sliding_window=None if d.get("sliding_window") is None else int(d["sliding_window"]),
            softcap=None if d.get("softcap") is None else float(d["softcap"]),
            sinks=bool(d.get("sinks", False)),
            alibi=bool(d.get("alibi", False)),
        )


def signature(info: ModelInfo, dtype: str) -> AttentionSignature:
    """The signature of a :class:`cudaload.model_info.ModelInfo` computed in ``dtype`` ("bfloat16"...).

    q/k and v head dims differ for MLA models (DeepSeek-V3: 192 and 128); ModelInfo carries them as
    ``qk_head_dim``/``v_head_dim`` (0 = same as ``head_dim``). The window counts only where some layer
    uses it (``sliding_layers``)."""
    head_dim = int(_fact(info, "head_dim", 0))
    qk = int(_fact(info, "qk_head_dim", 0) or head_dim)
    v = int(_fact(info, "v_head_dim", 0) or qk)
    window = _fact(info, "sliding_window", None)
    if int(_fact(info, "sliding_layers", 1 if window else 0)) == 0:
        window = None
    softcap = _fact(info, "attn_softcapping", None)
    heads = int(_fact(info, "num_heads", 0))
    return AttentionSignature(
        heads=heads,
        kv_heads=int(_fact(info, "num_kv_heads", 0) or heads),
        qk_head_dim=qk,
        v_head_dim=v,
        dtype=str(dtype).replace("torch.", ""),
        sliding_window=int(window) if window else None,
        softcap=float(softcap) if softcap else None,
        sinks=bool(_fact(info, "sinks", False)),
        alibi=bool(_fact(info, "alibi", False)),
    )


@dataclass(frozen=True)
class Work:
    """Declared work of one generate() call: ``batch_size`` prompts of ``prompt_len`` tokens (the longest,
    when padded), ``new_tokens`` generated (None: not declared), ``padded``: left-padded prompts of varying
    length. Unpadded means equal-length prompts with the tokenizer's all-ones attention_mask."""

    batch_size: int
    prompt_len: int
    new_tokens: int | None = None
    padded: bool = False

    def __post_init__(self) -> None:
        if (
            self.batch_size < 1
            or self.prompt_len < 1
            or (self.new_tokens is not None and self.new_tokens < 1)
        ):
            raise ValueError(f"work sizes must be >= 1: {self}")

    @classmethod
    def from_total(
        cls, batch_size: int, seq_len: int, new_tokens: int | None = None, padded: bool = False
    ) -> Work:
        """From plan()'s (batch_size, seq_len), where seq_len counts the prompt and the new tokens."""
        prompt = seq_len - new_tokens if new_tokens is not None and seq_len > new_tokens else seq_len
        return cls(batch_size, prompt, new_tokens, padded)

    def describe(self) -> str:
        new = f" + {self.new_tokens} new" if self.new_tokens is not None else ""
        return f"batch {self.batch_size} x {self.prompt_len}{new}{', left-padded' if self.padded else ''}"


def _pow2(n: int) -> int:
    return 1 << max(0, math.ceil(math.log2(max(1, n))))


@dataclass(frozen=True)
class WorkBucket:
    """A work rounded up to powers of two (prompt at least 64, new tokens at least 16)."""

    batch: int
    prompt: int
    new_tokens: int | None
    padded: bool

    def key(self) -> str:
        return f"b{self.batch}/p{self.prompt}/n{self.new_tokens or 'any'}/pad{int(self.padded)}"

    def distance(self, other: WorkBucket) -> float:
        """How far apart two buckets are, in doublings. Padded and unpadded work never answer each other
        (infinite): left padding changed the winner on the H200 (8 x 2048 + 32: sdpa 1.69 s unpadded,
        eager 2.21 s padded). New tokens not declared on either side count nothing."""
        d = abs(math.log2(self.batch) - math.log2(other.batch))
        d += abs(math.log2(self.prompt) - math.log2(other.prompt))
        if self.new_tokens and other.new_tokens:
            d += abs(math.log2(self.new_tokens) - math.log2(other.new_tokens))
        return math.inf if self.padded != other.padded else d

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> WorkBucket:
        nt = d.get("new_tokens")
        return cls(int(d["batch"]), int(d["prompt"]), None if nt is None else int(nt), bool(d["padded"]))


def bucket(work: Work) -> WorkBucket:
    return WorkBucket(
        batch=_pow2(work.batch_size),
        prompt=max(64, _pow2(work.prompt_len)),
        new_tokens=None if work.new_tokens is None else max(16, _pow2(work.new_tokens)),
        padded=work.padded,
    )


def as_work(work: Work | tuple[int, int] | Mapping[str, Any]) -> Work:
    """A Work from what callers hold: a Work, plan()'s (batch_size, seq_len) pair, or a mapping with
    batch_size, prompt_len (or seq_len), new_tokens and padded."""
    if isinstance(work, Work):
        return work
    if isinstance(work, tuple):
        return Work(int(work[0]), int(work[1]))
    nt = work.get("new_tokens")
    new = None if nt is None else int(nt)
    if "prompt_len" in work:
        return Work(int(work["batch_size"]), int(work["prompt_len"]), new, bool(work.get("padded", False)))
    return Work.from_total(
        int(work["batch_size"]), int(work["seq_len"]), new, bool(work.get("padded", False))
    )
