"""Measured attention choices: time every usable backend on this GPU, cache the result, ship priors.

See :mod:`cudaload.tuning.measure` for what is timed. Nothing here imports torch at import time.
"""

from __future__ import annotations
