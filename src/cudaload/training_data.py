"""The data side of a training plan: packing sequences into steps, and the collators that turn a step into
the tensors the model takes.

* :func:`pack` groups a tokenized data set into steps of at most the plan's ``sequences_per_step`` sequences
  and ``tokens_per_step`` real tokens, in a seeded random order (a step is closed when the next sequence
  would break either bound), so every step fits the memory the plan was made for.
* :class:`PackedCollator` concatenates one step's sequences into a single row: ``input_ids``, ``labels``
  (the first token of each sequence is not a target, so no sequence learns to predict its neighbour's start),
  ``position_ids`` restarting at 0 for each sequence, and for flash attention's varlen kernels the boundaries
  once per step (``cu_seq_lens_q/k``, ``max_length_q/k``), which transformers' flash path reads instead of
  searching the position ids in every layer. The same layout as transformers' ``DataCollatorWithFlattening``
  (data/data_collator.py, 5.17: labels ``[-100] + labels[1:]`` per sequence, lines 1447-1454).
* :class:`PaddedCollator` pads a batch to its longest sequence (right padding, an attention mask, labels -100
  at the padding), for models or attention backends that cannot keep packed sequences apart.

Nothing here imports torch until a collator is called.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .errors import ConfigurationError
from .plans import Plan

IGNORE_INDEX = -100


def _ids(value: Any, what: str, index: int) -> list[int]:
    """A row's token ids as a list of ints (lists, tuples, tensors and numpy arrays are accepted)."""
    if hasattr(value, "tolist"):
        value = value.tolist()
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise ConfigurationError(
            f"example {index}: {what} must be a sequence of token ids, not {type(value).__name__}",
            fix="tokenize the data set first (each example a dict with 'input_ids', optionally 'labels')",
        )
    if value and isinstance(value[0], (list, tuple)):
        raise ConfigurationError(
            f"example {index}: {what} is nested (already batched or packed)",
            fix="pass one example per row: {'input_ids': [...], 'labels': [...]}",
        )
    return [int(v) for v in value]


@dataclass(frozen=True)
class Example:
    """One tokenized sequence: its ids and labels (None: the ids themselves)."""

    input_ids: list[int]
    labels: list[int] | None = None

    def __len__(self) -> int:
        return len(self.input_ids)


def example(row: Mapping[str, Any], index: int = 0) -> Example:
    """An :class:`Example` from one data set row: ``input_ids``, optional ``labels`` and ``attention_mask``
    (positions where the mask is 0 are padding the tokenizer added: dropped)."""
    if not isinstance(row, Mapping) or "input_ids" not in row:
        raise ConfigurationError(
            f"example {index} has no 'input_ids'"
            + (
                f" (keys: {', '.join(map(str, row))})"
                if isinstance(row, Mapping)
                else f" ({type(row).__name__})"
            ),
            fix="tokenize the data set first (each example a dict with 'input_ids', optionally 'labels')",
        )
    ids = _ids(row["input_ids"], "input_ids", index)
    labels = _ids(row["labels"], "labels", index) if row.get("labels") is not None else None
    if labels is not None and len(labels) != len(ids):
        raise ConfigurationError(
            f"example {index}: {len(labels)} labels for {len(ids)} input_ids",
            fix="give every token a label (-100 for tokens not to learn)",
        )
    mask = row.get("attention_mask")
    if mask is not None:
        keep = _ids(mask, "attention_mask", index)
        if len(keep) != len(ids):
            raise ConfigurationError(
                f"example {index}: attention_mask has {len(keep)} entries for {len(ids)} input_ids",
                fix="pass the tokenizer's attention_mask unchanged, or none",
            )
        if not all(keep):
            ids = [t for t, m in zip(ids, keep, strict=True) if m]
            labels = [t for t, m in zip(labels, keep, strict=True) if m] if labels is not None else None
    return Example(ids, labels)


@dataclass(frozen=True)
class PackSummary:
    """What :func:`pack` made: how many sequences went into how many steps, and how full the steps are."""

    sequences: int
    steps: int
    tokens: int
    max_step_tokens: int
    max_step_sequences: int
    truncated: int
    skipped_empty: int
    tokens_per_step: int
    sequences_per_step: int

    @property
    def mean_step_tokens(self) -> float:
        return self.tokens / self.steps if self.steps else 0.0

    @property
    def mean_step_sequences(self) -> float:
        return self.sequences / self.steps if self.steps else 0.0

    def describe(self) -> str:
        return (
            f"{self.sequences:,} sequences in {self.steps:,} steps: {self.mean_step_sequences:.1f} sequences and "
            f"{self.mean_step_tokens:,.0f} tokens a step on average (at most {self.sequences_per_step} and "
            f"{self.tokens_per_step:,} planned; the fullest step holds {self.max_step_tokens:,})"
            + (f"; {self.truncated} truncated" if self.truncated else "")
            + (f"; {self.skipped_empty} empty skipped" if self.skipped_empty else "")
        )


class PackedDataset(Sequence[dict[str, Any]]):
    """A map-style data set whose items are whole steps: ``{"input_ids": [[...], ...], "labels": [[...], ...]}``
    (``labels`` absent where no example had any). Give it to ``Trainer`` with ``per_device_train_batch_size=1``
    and :class:`PackedCollator`; ``summary`` says how full the steps are."""

    def __init__(self, steps: list[list[Example]], summary: PackSummary) -> None:
        self._steps = steps
        self.summary = summary
        self._labels = any(e.labels is not None for s in steps for e in s)

    def __len__(self) -> int:
        return len(self._steps)

    def __getitem__(self, i: int | slice) -> Any:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        step = self._steps[i]
        item: dict[str, Any] = {"input_ids": [e.input_ids for e in step]}
        if self._labels:
            item["labels"] = [e.labels if e.labels is not None else e.input_ids for e in step]
        return item

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return (self[i] for i in range(len(self)))


def checked(
    dataset: Iterable[Mapping[str, Any]], longest: int, truncate: bool = False
) -> tuple[list[Example], int, int]:
    """The data set's examples, each checked (:func:`example`); a sequence longer than ``longest`` refused, or
    cut to it with ``truncate``; empty ones skipped. Returns (examples, how many were cut, how many skipped)."""
    examples: list[Example] = []
    too_long: list[tuple[int, int]] = []
    truncated = empty = 0
    for i, row in enumerate(dataset):
        e = example(row, i)
        if not e.input_ids:
            empty += 1
            continue
        if len(e) > longest:
            if not truncate:
                too_long.append((i, len(e)))
                continue
            e = Example(e.input_ids[:longest], e.labels[:longest] if e.labels is not None else None)
            truncated += 1
        examples.append(e)
    if too_long:
        worst = max(n for _, n in too_long)
        raise ConfigurationError(
            f"{len(too_long)} sequences are longer than the plan's seq_len {longest} (the longest: {worst} tokens, "
            f"example {too_long[0][0]} is the first)",
            fix=f"load with seq_len={worst} (the longest sequence), or pass truncate=True to cut them to {longest}",
        )
    if not examples:
        raise ConfigurationError("the data set has no non-empty example", fix="pass a tokenized data set")
    return examples, truncated, empty


def as_rows(examples: Sequence[Example]) -> list[dict[str, Any]]:
    """Examples back as data set rows (``labels`` only where an example has its own)."""
    return [
        {"input_ids": e.input_ids} if e.labels is None else {"input_ids": e.input_ids, "labels": e.labels}
        for e in examples
    ]


def pack(
    dataset: Iterable[Mapping[str, Any]],
    *,
    tokens_per_step: int,
    sequences_per_step: int,
    longest: int,
    truncate: bool = False,
    shuffle: bool = True,
    seed: int = 0,
) -> PackedDataset:
    """Group ``dataset``'s tokenized examples into steps of at most ``sequences_per_step`` sequences and
    ``tokens_per_step`` tokens, in a random order fixed by ``seed`` (``shuffle=False`` keeps the data set's).

    A sequence longer than ``longest`` (the plan's ``seq_len``) is refused, or cut to it with ``truncate=True``:
    the plan's memory holds for sequences up to that length.

    Raises:
        ConfigurationError: an example without ``input_ids``, mismatched ``labels``, bounds that cannot hold a
            sequence, or a sequence longer than ``longest`` without ``truncate``.
    """
    for name, v in (
        ("tokens_per_step", tokens_per_step),
        ("sequences_per_step", sequences_per_step),
        ("longest", longest),
    ):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ConfigurationError(f"{name}={v!r} must be a positive integer", fix=f"pass {name}=1 or more")
    if longest > tokens_per_step:
        raise ConfigurationError(
            f"a sequence of up to {longest} tokens does not fit a step of {tokens_per_step} tokens",
            fix=f"plan with tokens_per_step >= {longest}, or a shorter seq_len",
        )
    examples, truncated, empty = checked(dataset, longest, truncate)
    order = list(range(len(examples)))
    if shuffle:
        random.Random(seed).shuffle(order)
    steps: list[list[Example]] = []
    cur: list[Example] = []
    cur_tokens = 0
    for i in order:
        e = examples[i]
        if cur and (len(cur) >= sequences_per_step or cur_tokens + len(e) > tokens_per_step):
            steps.append(cur)
            cur, cur_tokens = [], 0
        cur.append(e)
        cur_tokens += len(e)
    steps.append(cur)
    sizes = [sum(len(e) for e in s) for s in steps]
    summary = PackSummary(
        sequences=len(examples),
        steps=len(steps),
        tokens=sum(sizes),
        max_step_tokens=max(sizes),
        max_step_sequences=max(len(s) for s in steps),
        truncated=truncated,
        skipped_empty=empty,
        tokens_per_step=tokens_per_step,
        sequences_per_step=sequences_per_step,
    )
    return PackedDataset(steps, summary)


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
