"""The values ``prefetch=`` takes: checked by the request, run by :mod:`cudaload.execute.runtime.prefetch`."""

from __future__ import annotations

MODES = ("read", "off")
#: What ``load_model(prefetch=True)`` uses.
DEFAULT_MODE = "read"
#: Modes that existed and were removed -> why, for the error a caller still naming one gets.
REMOVED_MODES = {
    "willneed": "readahead advice measured slower than plain from_pretrained (24.81 s against 23.58 s to the "
    "first forward, 8B cold on the H200) and than reading (14.20 s), so it was removed",
}
