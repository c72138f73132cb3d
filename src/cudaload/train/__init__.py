"""The trainer side: what a trainer takes from a Plan once the model is loaded.

- :mod:`~cudaload.train.arguments`: ``TrainingArguments`` keywords (:func:`training_arguments`),
  :func:`training_setup` (the arguments, the collator and the packed data set), TRL's ``SFTConfig`` keywords
  (:func:`sft_config_arguments`).
- :mod:`~cudaload.train.data`: the data set checked, packed into the plan's steps, and collated.

Importing this package imports neither torch nor transformers.
"""

from __future__ import annotations

from .arguments import TrainingSetup, sft_config_arguments, training_arguments, training_setup

__all__ = ["TrainingSetup", "sft_config_arguments", "training_arguments", "training_setup"]
