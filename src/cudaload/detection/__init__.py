"""Machine detection: ``detect()`` builds a :class:`~cudaload.capabilities.Capabilities` snapshot."""

from __future__ import annotations
