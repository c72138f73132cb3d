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

:mod:`~cudaload.train.data.checks` holds the checks on the data (:func:`check_rows`, :func:`check_ids`,
:func:`checked`), :mod:`~cudaload.train.data.packing` the steps, :mod:`~cudaload.train.data.collators` the
collators; every name is re-exported here.
"""

from .checks import IGNORE_INDEX, UNTRAINED_WARN_SHARE, Example, check_ids, check_rows, checked, example
from .collators import PackedCollator, PaddedCollator, collator_for
from .packing import PackedDataset, PackSummary, as_rows, pack

__all__ = [
    "IGNORE_INDEX",
    "UNTRAINED_WARN_SHARE",
    "Example",
    "PackSummary",
    "PackedCollator",
    "PackedDataset",
    "PaddedCollator",
    "as_rows",
    "check_ids",
    "check_rows",
    "checked",
    "collator_for",
    "example",
    "pack",
]
