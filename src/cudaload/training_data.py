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

import array
import itertools
import numbers
import random
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .errors import ConfigurationError
from .plans import Plan
from .request import _warn

IGNORE_INDEX = -100


#: a share of examples with no label to learn above which training_setup warns: such rows cost a step's compute
#: and teach nothing (a prompt-only mask that covers the answer too, or answers cut off by truncation)
UNTRAINED_WARN_SHARE = 0.1

_TOKENIZE_FIX = (
    "tokenize first, one example a row with its ids: dataset.map(lambda b: tokenizer(b['text']), batched=True) "
    "(or {'input_ids': tokenizer(text)['input_ids']} for one text)"
)
_INT_FIX = (
    "cast the ids to int where the data set is made ([int(t) for t in ids], tensor.long(), "
    "array.astype('int64')): cudaload refuses what it would otherwise truncate"
)


def _where(index: int, what: str) -> str:
    return f"example {index}, column {what!r}"


def _float_ids(dtype: Any) -> bool | None:
    """Whether an array's or tensor's dtype holds no integers (True: floats, complex, bools; None: unknown)."""
    kind = getattr(dtype, "kind", None)  # numpy: 'i' / 'u' integers, 'f', 'c', 'b', 'O', 'U'...
    if isinstance(kind, str):
        return kind not in "iu"
    if str(dtype).startswith("torch."):
        return bool(dtype.is_floating_point or dtype.is_complex) or str(dtype) == "torch.bool"
    return None


def _ids(value: Any, what: str, index: int) -> list[int]:
    """A row's token ids as a list (lists, tuples, tensors and numpy arrays are accepted; a list is kept, not
    copied). A tensor's or array's dtype is checked here; the values of a list by :func:`_check_range`."""
    if hasattr(value, "tolist"):
        dtype = getattr(value, "dtype", None)
        if dtype is not None and _float_ids(dtype):
            raise ConfigurationError(
                f"{_where(index, what)}: token ids of dtype {dtype}, not integers", fix=_INT_FIX
            )
        value = value.tolist()
    if isinstance(value, (str, bytes)):
        raise ConfigurationError(
            f"{_where(index, what)} is text ({value[:40]!r}), not a sequence of token ids", fix=_TOKENIZE_FIX
        )
    if not isinstance(value, Sequence):
        raise ConfigurationError(
            f"{_where(index, what)} must be a sequence of token ids, not {type(value).__name__}",
            fix=_TOKENIZE_FIX,
        )
    return value if isinstance(value, list) else list(value)


def _int64(ids: list[int], what: str, index: int) -> Any:
    """``ids`` as an int64 numpy array, in one C pass (``array.array`` takes integers only: a float, a string or
    a nested list raises, and is then named by its position); None for integers beyond int64 (left to the
    range check). A float that is a whole number is refused too: converting it would hide a truncation."""
    import numpy as np

    try:
        return np.frombuffer(array.array("q", ids), dtype=np.int64)  # a view of the array's buffer: no copy
    except (OverflowError, TypeError):
        pass  # named below
    for j, v in enumerate(ids):
        if isinstance(v, numbers.Integral):
            continue
        at = f"{_where(index, what)}, position {j}"
        if isinstance(v, (list, tuple)) or hasattr(v, "tolist"):
            raise ConfigurationError(
                f"{_where(index, what)} is nested (already batched or packed)",
                fix="pass one example per row: {'input_ids': [...], 'labels': [...]} (tokenize without "
                "return_tensors='pt', which adds a batch dimension)",
            )
        if isinstance(v, str):
            raise ConfigurationError(
                f"{at}: {v!r} is a token string, not a token id",
                fix="convert with tokenizer.convert_tokens_to_ids",
            )
        if isinstance(v, numbers.Real):
            whole = " (a whole number, still refused)" if float(v).is_integer() else ""
            raise ConfigurationError(f"{at}: {v!r} is a float, not an integer token id{whole}", fix=_INT_FIX)
        raise ConfigurationError(f"{at}: {v!r} ({type(v).__name__}) is not an integer token id", fix=_INT_FIX)
    return None


def _check_range(ids: list[int], what: str, index: int, vocab_size: int | None, labels: bool) -> None:
    """Integer token ids in ``[0, vocab_size)`` (labels may also be -100): the types and the bounds at C speed
    (:func:`_int64`, numpy's min and max), the offending position searched only on a failure."""
    if not ids:
        return
    values = _int64(ids, what, index)
    if values is not None:
        if labels:
            values = values[values != IGNORE_INDEX]
        lo, hi = (int(values.min()), int(values.max())) if len(values) else (0, 0)
    else:
        rest = [v for v in ids if not (labels and v == IGNORE_INDEX)] or [0]
        lo, hi = min(rest), max(rest)
    if lo >= 0 and (vocab_size is None or hi < vocab_size):
        return

    def bad(v: int) -> bool:
        if labels and v == IGNORE_INDEX:
            return False
        return v < 0 or (vocab_size is not None and v >= vocab_size)

    j = next(j for j, v in enumerate(ids) if bad(v))
    v = int(ids[j])
    at = f"{_where(index, what)}, position {j}"
    bound = f"[0, {vocab_size})" if vocab_size is not None else "0 or more"
    if labels:
        raise ConfigurationError(
            f"{at}: label {v} is neither a token id in {bound} nor -100",
            fix="label each token with its own id, or -100 for a token not to learn",
        )
    if v < 0:
        raise ConfigurationError(
            f"{at}: token id {v} is negative",
            fix="pad input_ids with the tokenizer's pad_token_id and mark the padding with attention_mask 0 "
            "(-100 belongs in labels, never in input_ids)",
        )
    raise ConfigurationError(
        f"{at}: token id {v} is outside the model's vocabulary {bound}",
        fix="tokenize with the model's own tokenizer; after tokenizer.add_tokens(...) call "
        "model.resize_token_embeddings(len(tokenizer))",
    )


@dataclass(frozen=True)
class Example:
    """One tokenized sequence: its ids and labels (None: the ids themselves)."""

    input_ids: list[int]
    labels: list[int] | None = None

    def __len__(self) -> int:
        return len(self.input_ids)

    @property
    def targets(self) -> int:
        """How many labels this sequence trains: those after its first token that are not -100 (the model
        predicts token t+1 from the tokens up to t, and the packed collator masks each sequence's first)."""
        n = len(self.input_ids)
        if n < 2:
            return 0
        lab = self.labels
        if lab is None:
            return n - 1
        return n - 1 - (lab.count(IGNORE_INDEX) - (lab[0] == IGNORE_INDEX))


def example(row: Mapping[str, Any], index: int = 0, vocab_size: int | None = None) -> Example:
    """An :class:`Example` from one data set row: ``input_ids``, optional ``labels`` and ``attention_mask``
    (positions where the mask is 0 are padding the tokenizer added: dropped). Ids are integers, 0 or more and
    below ``vocab_size`` where given; labels the same or -100.

    Raises:
        ConfigurationError: naming the example and the column.
    """
    if not isinstance(row, Mapping) or "input_ids" not in row:
        if isinstance(row, (str, bytes)):
            raise ConfigurationError(
                f"example {index} is text ({row[:40]!r}), not token ids", fix=_TOKENIZE_FIX
            )
        if isinstance(row, Mapping) and "text" in row:
            raise ConfigurationError(
                f"example {index} has no 'input_ids', only text (keys: {', '.join(map(str, row))})",
                fix=_TOKENIZE_FIX,
            )
        raise ConfigurationError(
            f"example {index} has no 'input_ids'"
            + (
                f" (keys: {', '.join(map(str, row))})"
                if isinstance(row, Mapping)
                else f" ({type(row).__name__})"
            ),
            fix="tokenize the data set first (each example a dict with 'input_ids', optionally 'labels'): "
            "rows of bare ids become [{'input_ids': ids} for ids in rows]",
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
        keep = _mask(mask, index)
        if len(keep) != len(ids):
            raise ConfigurationError(
                f"example {index}: attention_mask has {len(keep)} entries for {len(ids)} input_ids",
                fix="pass the tokenizer's attention_mask unchanged, or none",
            )
        if not all(keep):
            ids = [t for t, m in zip(ids, keep, strict=True) if m]
            labels = [t for t, m in zip(labels, keep, strict=True) if m] if labels is not None else None
    # after the mask: padding the mask drops may hold any id
    _check_range(ids, "input_ids", index, vocab_size, labels=False)
    if labels is not None:
        _check_range(labels, "labels", index, vocab_size, labels=True)
    return Example(ids, labels)


def _mask(mask: Any, index: int) -> list[Any]:
    """An attention mask as a list: ints or bools, in a list, tensor or array (a true entry keeps its token)."""
    if hasattr(mask, "tolist"):
        mask = mask.tolist()
    if isinstance(mask, (str, bytes)) or not isinstance(mask, Sequence):
        raise ConfigurationError(
            f"{_where(index, 'attention_mask')} must be a sequence of 0 and 1, not {type(mask).__name__}",
            fix="pass the tokenizer's attention_mask unchanged, or none",
        )
    return mask if isinstance(mask, list) else list(mask)


def check_rows(dataset: Any) -> None:
    """One example a row: refuses, without iterating, the containers whose rows would be misread (a
    ``DatasetDict``'s split names, a columnar dict's column names, a text's characters).

    Raises:
        ConfigurationError: the container, with what to pass instead.
    """
    if isinstance(dataset, (str, bytes)):
        raise ConfigurationError("the data set is text, not tokenized examples", fix=_TOKENIZE_FIX)
    kinds = {c.__name__ for c in type(dataset).__mro__}
    if kinds & {"DatasetDict", "IterableDatasetDict"}:
        splits = [str(k) for k in dataset]
        pick = "train" if "train" in splits else (splits[0] if splits else "train")
        raise ConfigurationError(
            f"the data set is a {type(dataset).__name__} of splits ({', '.join(map(repr, splits)) or 'none'}), "
            "not one split",
            fix=f"pass dataset[{pick!r}]",
        )
    if type(dataset).__name__ == "DataFrame" and hasattr(dataset, "to_dict"):
        # iterating a pandas DataFrame gives its column names
        raise ConfigurationError(
            "the data set is a DataFrame, whose iteration gives its column names, not its rows",
            fix="pass datasets.Dataset.from_pandas(df), or df.to_dict('records')",
        )
    if isinstance(dataset, Mapping):
        keys = ", ".join(map(repr, dataset))
        ids = dataset.get("input_ids")
        first = _first(ids)
        if first is not None and (isinstance(first, (list, tuple)) or hasattr(first, "tolist")):
            raise ConfigurationError(
                f"the data set is a dict of columns ({keys}; a tokenizer's batch output is one), not one "
                "example a row",
                fix="pass datasets.Dataset.from_dict(data), or a list of rows: "
                "[dict(zip(data, row)) for row in zip(*data.values())]",
            )
        if ids is not None:
            raise ConfigurationError(
                f"the data set is one example ({keys}), not a collection of them",
                fix="pass a list: [example]",
            )
        raise ConfigurationError(
            f"the data set is a dict ({keys or 'empty'}) without 'input_ids'",
            fix="pass a datasets.Dataset or a list of tokenized rows, each {'input_ids': [...]}",
        )
    if not (hasattr(dataset, "__iter__") or hasattr(dataset, "__getitem__")):
        raise ConfigurationError(
            f"the data set is a {type(dataset).__name__}, which has no rows",
            fix="pass a datasets.Dataset, a torch Dataset or a list of tokenized rows, each {'input_ids': [...]}",
        )


def check_ids(dataset: Any, vocab_size: int | None) -> None:
    """The token ids of a data set handed over as it is (a model that is no causal LM, whose labels are its
    own): integers, 0 or more and below ``vocab_size``, in every row that has ``input_ids``. Read without a
    copy: a ``datasets.Dataset``'s column at Arrow speed (rows read one by one only to name a failing one), a
    list or tuple row by row; any other data set (a torch Dataset, a stream) its first row only, since reading
    it all may cost what training does (a lazy tokenization) or use it up (an iterator).

    Raises:
        ConfigurationError: naming the example and the column.
    """
    if _arrow_ids_ok(dataset, vocab_size):
        return
    rows: Iterable[Any]
    if isinstance(dataset, (list, tuple)) or _arrow_column(dataset) is not None:
        rows = dataset
    elif iter(dataset) is dataset:
        return  # an iterator: reading a row would take it from the trainer
    else:
        rows = itertools.islice(dataset, 1)
    for i, row in enumerate(rows):
        if isinstance(row, (str, bytes)):
            raise ConfigurationError(f"example {i} is text ({row[:40]!r}), not token ids", fix=_TOKENIZE_FIX)
        if isinstance(row, Mapping) and row.get("input_ids") is not None:
            _check_range(_ids(row["input_ids"], "input_ids", i), "input_ids", i, vocab_size, labels=False)


def _arrow_column(dataset: Any) -> Any:
    """A ``datasets.Dataset``'s ``input_ids`` column as Arrow holds it (all rows, before any ``select`` or
    ``shuffle`` indices), or None."""
    if type(dataset).__name__ != "Dataset" or "input_ids" not in (
        getattr(dataset, "column_names", None) or ()
    ):
        return None
    try:
        return dataset.data.column("input_ids")
    except (AttributeError, KeyError, TypeError):
        return None


def _arrow_ids_ok(dataset: Any, vocab_size: int | None) -> bool:
    """True where a ``datasets.Dataset``'s whole ``input_ids`` column is lists of integers within the bounds,
    checked by Arrow (one min/max over the flattened column); False where the rows must be read to say."""
    column = _arrow_column(dataset)
    if column is None:
        return False
    import pyarrow as pa  # type: ignore[import-untyped]  # datasets' own dependency: no stubs
    import pyarrow.compute as pc  # type: ignore[import-untyped]

    kind = column.type
    if not (pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind)):
        return False
    if not pa.types.is_integer(kind.value_type):
        return False
    bounds = pc.min_max(pc.list_flatten(column)).as_py()
    lo, hi = bounds["min"], bounds["max"]
    return lo is None or (lo >= 0 and (vocab_size is None or hi < vocab_size))


def _first(column: Any) -> Any:
    """A column's first entry, or None (no column, an empty or unindexable one)."""
    if column is None or isinstance(column, (str, bytes)):
        return None
    try:
        return column[0] if len(column) else None
    except (TypeError, IndexError, KeyError):
        return None


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
    dataset: Iterable[Mapping[str, Any]], longest: int, truncate: bool = False, vocab_size: int | None = None
) -> tuple[list[Example], int, int]:
    """The data set's examples, each checked (:func:`example`: integer ids in ``[0, vocab_size)``, labels of the
    same length, ids or -100) in the one pass that reads them; a sequence longer than ``longest`` refused, or
    cut to it with ``truncate``; empty ones skipped with a warning. A data set with no label to learn is refused
    (its loss would be nan), and one where a notable share of the examples has none is warned about. Returns
    (examples, how many were cut, how many skipped).

    Raises:
        ConfigurationError: a container that is not one example a row (:func:`check_rows`), a malformed example
            (named by its index and column), a sequence too long, no example, or no label to learn.
    """
    check_rows(dataset)
    examples: list[Example] = []
    too_long: list[tuple[int, int]] = []
    truncated = empty = untrained = rows = 0
    first_empty = first_untrained = -1
    for i, row in enumerate(dataset):
        rows += 1
        e = example(row, i, vocab_size)
        if not e.input_ids:
            empty += 1
            first_empty = i if first_empty < 0 else first_empty
            continue
        if len(e) > longest:
            if not truncate:
                too_long.append((i, len(e)))
                continue
            e = Example(e.input_ids[:longest], e.labels[:longest] if e.labels is not None else None)
            truncated += 1
        if not e.targets:
            untrained += 1
            first_untrained = i if first_untrained < 0 else first_untrained
        examples.append(e)
    if too_long:
        worst = max(n for _, n in too_long)
        raise ConfigurationError(
            f"{len(too_long)} sequences are longer than the plan's seq_len {longest} (the longest: {worst} tokens, "
            f"example {too_long[0][0]} is the first)",
            fix=f"load with seq_len={worst} (the longest sequence), or pass truncate=True to cut them to {longest}",
        )
    if not rows:
        raise ConfigurationError(
            "the data set is empty: it has no non-empty example (no row at all)",
            fix="pass the tokenized training split; check the filter or split that made it",
        )
    if not examples:
        raise ConfigurationError(
            f"the data set has no non-empty example: all {rows} have no token",
            fix=f"pass a tokenized data set ({_TOKENIZE_FIX})",
        )
    cut = " (truncate=True may have cut their answers off: a longer seq_len keeps them)" if truncated else ""
    if untrained == len(examples):
        raise ConfigurationError(
            f"no example has a label to learn: every label after each sequence's first token is -100{cut}, so the "
            "loss would be nan (the model predicts token t+1 from the tokens up to t: a first label is no target)",
            fix="check the label masking (a prompt mask that covers the answer too, a template the answers do "
            "not match), or pass no labels to learn every token",
        )
    if empty:
        _warn(
            f"{empty} of {rows} examples are empty (example {first_empty} is the first) and were skipped: "
            "drop them (dataset.filter(lambda r: len(r['input_ids']) > 0))"
        )
    if untrained >= UNTRAINED_WARN_SHARE * len(examples):
        _warn(
            f"{untrained} of {len(examples)} examples ({untrained / len(examples):.0%}) have no label to learn (a "
            f"single token, or -100 after the first; example {first_untrained} is the first){cut}: they cost compute and "
            "teach nothing: check the label masking, or drop them"
        )
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
