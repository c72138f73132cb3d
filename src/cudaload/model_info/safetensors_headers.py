"""The checkpoint's safetensors files and their headers: stored bytes, parameters and the dominant dtype,
read without touching the tensor data."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

from ..errors import CheckpointError

#: Bytes per element of the safetensors dtype codes.
_ST_BYTES = {
    "F64": 8,
    "I64": 8,
    "U64": 8,
    "F32": 4,
    "I32": 4,
    "U32": 4,
    "F16": 2,
    "BF16": 2,
    "I16": 2,
    "U16": 2,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
    "I8": 1,
    "U8": 1,
    "BOOL": 1,
}
_ST_NAMES = {
    "F64": "float64",
    "F32": "float32",
    "F16": "float16",
    "BF16": "bfloat16",
    "F8_E4M3": "float8_e4m3fn",
    "F8_E5M2": "float8_e5m2",
    "I8": "int8",
    "U8": "uint8",
}


def safetensors_files(path: Path) -> list[Path]:
    index = path / "model.safetensors.index.json"
    if index.is_file():
        try:
            names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (OSError, ValueError, KeyError) as e:
            raise CheckpointError(
                f"{index} is unreadable: {e}", fix="re-save or re-download the checkpoint"
            ) from None
        return [path / n for n in names]
    single = path / "model.safetensors"
    return [single] if single.is_file() else []


def read_header(file: Path) -> dict[str, Any]:
    """The JSON header of one safetensors file (8-byte little-endian length, then JSON), validated."""
    try:
        size = file.stat().st_size
        with file.open("rb") as f:
            raw = f.read(8)
            if len(raw) < 8:
                raise CheckpointError(
                    f"{file} is truncated (no header)", fix="re-save or re-download the checkpoint"
                )
            (n,) = struct.unpack("<Q", raw)
            if n > size - 8 or n > 100_000_000:
                raise CheckpointError(
                    f"{file} has a corrupt header length ({n})", fix="re-download the checkpoint"
                )
            raw_header = f.read(n)
    except OSError as e:
        raise CheckpointError(f"cannot read {file}: {e}", fix="check permissions and the path") from None
    # parsed outside the try above: CheckpointError is a ValueError, and wrapping it again said its fix twice
    try:
        header: dict[str, Any] = json.loads(raw_header)
        if not isinstance(header, dict):
            raise ValueError("the header is not a JSON object")
        end = max((int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"), default=0)
    except (ValueError, TypeError, KeyError, IndexError) as e:
        raise CheckpointError(f"{file} has a corrupt header: {e}", fix="re-download the checkpoint") from None
    if 8 + n + end > size:
        raise CheckpointError(
            f"{file} is truncated ({size} bytes, header promises {8 + n + end})",
            fix="re-save or re-download the checkpoint",
        )
    return header


def _stored(files: list[Path]) -> tuple[int, int, str | None]:
    """(bytes, params, dominant dtype name) over the files' headers."""
    total = params = 0
    by_dtype: dict[str, int] = {}
    for f in files:
        for k, v in read_header(f).items():
            if k == "__metadata__":
                continue
            n = 1
            for d in v["shape"]:
                n *= int(d)
            b = n * _ST_BYTES.get(v["dtype"], 2)
            total += b
            params += n
            by_dtype[v["dtype"]] = by_dtype.get(v["dtype"], 0) + b
    dom = max(by_dtype, key=lambda k: by_dtype[k]) if by_dtype else None
    return total, params, _ST_NAMES.get(dom, dom.lower()) if dom else None
