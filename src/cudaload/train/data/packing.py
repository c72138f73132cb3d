"""Packing: a data set's checked examples grouped into steps of at most the plan's ``sequences_per_step``
sequences and ``tokens_per_step`` real tokens (:func:`pack`), as a map-style data set of whole steps
(:class:`PackedDataset`) with what was made (:class:`PackSummary`)."""

from __future__ import annotations

import random
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ...errors import ConfigurationError
from .checks import Example, checked


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
            f"{self.mean_step_tokens:,.0f} tokens a step on average ("
            + (
                f"filled up to {self.tokens_per_step:,} tokens"
                if self.sequences_per_step >= self.tokens_per_step
                else f"at most {self.sequences_per_step} and {self.tokens_per_step:,} planned"
            )
            + f"; the fullest step holds {self.max_step_tokens:,})"
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
    vocab_size: int | None = None,
) -> PackedDataset:
    """Group ``dataset``'s tokenized examples into steps of at most ``sequences_per_step`` sequences and
    ``tokens_per_step`` tokens, in a random order fixed by ``seed`` (``shuffle=False`` keeps the data set's).

    A sequence longer than ``longest`` (the plan's ``seq_len``) is refused, or cut to it with ``truncate=True``:
    the plan's memory holds for sequences up to that length. ``vocab_size``: the bound token ids and labels
    are checked against (:func:`checked`; None: only that they are integers, 0 or more).

    Raises:
        ConfigurationError: an example without ``input_ids``, ids that are no integers or outside the
            vocabulary, mismatched ``labels``, no label to learn, bounds that cannot hold a sequence, or a
            sequence longer than ``longest`` without ``truncate``.
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
    examples, truncated, empty = checked(dataset, longest, truncate, vocab_size)
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
