"""Numbers as a person reads them in messages and in the explanation, below every policy."""

from __future__ import annotations


def param_count(n: int) -> str:
    """A parameter count a person reads: 8.19 B, 596.0 M, 94.6 K (a tiny model is not "0.00 B")."""
    for unit, scale in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.2f} {unit}" if unit == "B" else f"{n / scale:.1f} {unit}"
    return str(n)
