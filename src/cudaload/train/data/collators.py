"""The collators that turn a step into the tensors the model takes: packed (one row, the boundaries by position
ids or flash attention's cumulative lengths) or padded; :func:`collator_for` picks the plan's. Nothing here
imports torch until a collator is called."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ...errors import ConfigurationError
from ...plans.plan import Plan
from .checks import IGNORE_INDEX, Example, example


def _examples(features: Sequence[Mapping[str, Any]]) -> list[Example]:
    """The sequences of a batch: the items of a :class:`PackedDataset` (each a whole step) or plain examples."""
    out: list[Example] = []
    for i, f in enumerate(features):
        ids = f["input_ids"] if isinstance(f, Mapping) and "input_ids" in f else None
        if ids is not None and not hasattr(ids, "tolist") and len(ids) and isinstance(ids[0], (list, tuple)):
            labels = f.get("labels")
            for j, seq in enumerate(ids):
                row = {"input_ids": seq, "labels": labels[j] if labels is not None else None}
                out.append(example(row, i))
        else:
            out.append(example(f, i))
    return out


@dataclass
class PackedCollator:
    """One row per batch: every sequence of the batch (or of each packed step in it) concatenated.

    ``boundaries="cu_seq_lens"`` adds flash attention's varlen keywords (int32 cumulative lengths and the
    longest length as a Python int), which transformers' flash path uses as given; ``"position_ids"`` leaves
    the boundaries to the restarting position ids, from which transformers builds a block-diagonal mask for
    sdpa, flex_attention and eager."""

    boundaries: str = "position_ids"
    separator_id: int = IGNORE_INDEX

    def __post_init__(self) -> None:
        if self.boundaries not in ("cu_seq_lens", "position_ids"):
            raise ConfigurationError(
                f"boundaries={self.boundaries!r}", fix="use 'cu_seq_lens' (flash attention) or 'position_ids'"
            )

    def __call__(self, features: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        import torch

        seqs = [e for e in _examples(features) if e.input_ids]  # an empty sequence has no first token
        if not seqs:
            raise ConfigurationError("a batch with no token", fix="drop empty examples from the data set")
        ids: list[int] = []
        labels: list[int] = []
        pos: list[int] = []
        cu = [0]
        for e in seqs:
            lab = e.labels if e.labels is not None else e.input_ids
            ids += e.input_ids
            # the first token of a sequence is nobody's target: the model shifts labels left by one, so the
            # previous sequence's last token would otherwise learn to predict it
            labels += [self.separator_id, *lab[1:]]
            pos += range(len(e))
            cu.append(cu[-1] + len(e))
        out: dict[str, Any] = {
            "input_ids": torch.tensor([ids], dtype=torch.long),
            "labels": torch.tensor([labels], dtype=torch.long),
            "position_ids": torch.tensor([pos], dtype=torch.long),
            # transformers builds the block-diagonal mask from the position ids only when no cache is passed
            # (masking_utils._preprocess_mask_arguments, 5.17 lines 852-860), and a decoder makes a DynamicCache
            # whenever use_cache is on, in training too (modeling_qwen3.py ``if use_cache and past_key_values is
            # None``): with the config's default use_cache=True every packed sequence would see its neighbours
            "use_cache": False,
        }
        if self.boundaries == "cu_seq_lens":
            cu_t = torch.tensor(cu, dtype=torch.int32)
            longest = max(len(e) for e in seqs)
            out.update(cu_seq_lens_q=cu_t, cu_seq_lens_k=cu_t, max_length_q=longest, max_length_k=longest)
        return out


@dataclass
class PaddedCollator:
    """A padded batch: right padding to the longest sequence (a multiple of ``pad_to_multiple_of``), an
    attention mask, labels -100 at the padding. The pad id is never attended to nor learnt, so any id works."""

    pad_token_id: int = 0
    pad_to_multiple_of: int = 8

    def __call__(self, features: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        import torch

        seqs = _examples(features)
        n = max(len(e) for e in seqs)
        m = max(self.pad_to_multiple_of, 1)
        n = -(-n // m) * m
        ids = torch.full((len(seqs), n), self.pad_token_id, dtype=torch.long)
        labels = torch.full((len(seqs), n), IGNORE_INDEX, dtype=torch.long)
        mask = torch.zeros((len(seqs), n), dtype=torch.long)
        for i, e in enumerate(seqs):
            k = len(e)
            ids[i, :k] = torch.tensor(e.input_ids)
            labels[i, :k] = torch.tensor(e.labels if e.labels is not None else e.input_ids)
            mask[i, :k] = 1
        return {"input_ids": ids, "labels": labels, "attention_mask": mask, "use_cache": False}


def collator_for(plan: Plan) -> PackedCollator | PaddedCollator | None:
    """The collator the plan's batch layout needs; None for a model that does not train as a causal LM
    (classification or seq2seq labels: Trainer's own collator pads them)."""
    t = plan.training
    if t is not None and not t.causal_lm:
        return None
    if t is not None and t.packed:
        return PackedCollator(boundaries=t.boundaries or "position_ids")
    return PaddedCollator()
