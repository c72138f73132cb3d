"""What a user asked for, checked once: :class:`Request`.

``cudaload.load_model``, ``cudaload.plan``, ``cudaload tune`` and the ``cudaload`` command take the same
wishes (the model, the intent, the work's sizes, attention / dtype / quantization / placement, training
options). A :class:`Request` holds all of them and checks them when it is made: types (``True`` is not a
batch size), ranges, names (with the closest valid one), combinations that cannot work together, and every
environment variable cudaload reads (:func:`cudaload._env.check_all`). A refusal is a cudaload error whose
``fix`` works when followed; a legal input that is probably a mistake warns once
(:class:`~cudaload.errors.CudaloadWarning`).

``Request.build(model, entry="plan", **options)`` makes one from the keywords of ``entry`` (``"plan"``,
``"load_model"`` or ``"tune"``); :meth:`Request.plan_kwargs`, :meth:`Request.load_kwargs` and
:meth:`Request.tune_kwargs` give back exactly the keywords those functions take.

Nothing here imports torch or transformers: the ``cudaload`` command refuses a bad value before either is
imported. Facts about the machine or the model are used only where they are cheap (a snapshot given as
``hardware``, a local ``config.json``); everything else is the planner's.

One module per question: :mod:`.request` (the :class:`Request`, its construction and the keywords it gives back),
:mod:`.options` (one option each), :mod:`.lora` (``lora=``), :mod:`.passed_on` (what goes to ``from_pretrained``),
:mod:`.placement` (``device_map=``, ``max_memory=``, :func:`check_devices`), :mod:`.machine` (``hardware=``, is there
a GPU), :mod:`.model` (``model=`` and its ``config.json``), :mod:`.together` (options that cannot work together),
:mod:`.suspicious` (legal and probably a mistake: the warnings), :mod:`.warn` (a warning at the caller's line).
"""

from __future__ import annotations

from . import options as _options
from . import warn as _warning
from .lora import LORA_KEYS as LORA_KEYS
from .options import BATCH_LAYOUTS as BATCH_LAYOUTS
from .options import DECODES as DECODES
from .options import ENTRIES as ENTRIES
from .options import QUANTIZATIONS as QUANTIZATIONS
from .options import TRAINING_INTENTS as TRAINING_INTENTS
from .options import TRAINING_LOSSES as TRAINING_LOSSES
from .options import attention_name as attention_name
from .options import package_names as package_names
from .placement import check_devices as check_devices
from .request import Request as Request

__all__ = [
    "BATCH_LAYOUTS",
    "DECODES",
    "ENTRIES",
    "LORA_KEYS",
    "QUANTIZATIONS",
    "TRAINING_INTENTS",
    "TRAINING_LOSSES",
    "Request",
    "attention_name",
    "check_devices",
    "package_names",
]

# names from before request.py was a package, kept for their importers: the CLI reads --intent with _choice,
# training_data and execute.adapters warn through _warn
_choice = _options.choice
_positive_int = _options.positive_int
_warn = _warning.warn
