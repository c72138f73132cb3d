"""Numbers as a person reads them in messages and in ``Plan.explain()``, below every policy."""

from __future__ import annotations


def param_count(n: int) -> str:
    """A parameter count a person reads: 8.19 B, 596.0 M, 94.6 K (a tiny model is not "0.00 B")."""
    for unit, scale in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.2f} {unit}" if unit == "B" else f"{n / scale:.1f} {unit}"
    return str(n)


def byte_size(n: int) -> str:
    """Bytes of memory a person reads, in binary units: 1.60 GiB, 369.5 KiB, 12 B."""
    if abs(n) >= 1 << 30:
        return f"{n / (1 << 30):.2f} GiB"
    if abs(n) >= 1 << 20:
        return f"{n / (1 << 20):.1f} MiB"
    return f"{n / 1024:.1f} KiB" if abs(n) >= 1024 else f"{n} B"


def file_size(n: int) -> str:
    """Bytes of files a person reads, in decimal units as file sizes are listed: 5.00 GB, 0.38 MB."""
    return f"{n / 1e9:.2f} GB" if n >= 10**7 else f"{n / 1e6:.2f} MB"
