"""The checks on a training data set, each failure named by its example and column: one example a row
(:func:`check_rows`), token ids that are integers within the vocabulary and labels of the same length, ids or -100
(:func:`example`, :func:`check_ids`), and a label to learn (:func:`checked`, the one pass that reads them for
packing). :class:`Example` is one checked sequence.
"""

from __future__ import annotations

import array
import itertools
import numbers
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ...errors import ConfigurationError
from ...request import _warn

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
