"""Safetensors headers, read and checked without touching tensor data.

A safetensors file is ``u64 little-endian header length`` + ``JSON header`` + data. The header maps each
tensor name to ``{"dtype", "shape", "data_offsets": [begin, end]}`` relative to the data section. A sharded
checkpoint adds ``model.safetensors.index.json`` whose ``weight_map`` names the shard of every tensor.

Everything here is pure and cheap (a few small reads per file): :func:`read_header` is what
:func:`cudaload.fastload.supports` and the loader's planning use, and every check that can fail on a bad file
fails here, *before* any memory is allocated for the model.
"""

from __future__ import annotations

import json
import math
import os
import struct
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import CheckpointError, ModelNotFoundError

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"

#: safetensors dtype -> bytes per element
DTYPE_SIZES: Mapping[str, int] = {
    "F64": 8,
    "F32": 4,
    "F16": 2,
    "BF16": 2,
    "I64": 8,
    "I32": 4,
    "I16": 2,
    "I8": 1,
    "U64": 8,
    "U32": 4,
    "U16": 2,
    "U8": 1,
    "BOOL": 1,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
}

#: A header larger than this is not a real header (the format's own reference reader uses 100 MB).
_MAX_HEADER = 100_000_000


@dataclass(frozen=True)
class TensorInfo:
    """One tensor of a checkpoint: where its bytes are (absolute offsets in ``file``) and what they are."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    file: str
    start: int
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.start

    @property
    def itemsize(self) -> int:
        return DTYPE_SIZES[self.dtype]

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True)
class CheckpointHeader:
    """All tensors of a checkpoint (single file or sharded), in file order, plus per-file metadata."""

    root: str
    files: tuple[str, ...]
    tensors: Mapping[str, TensorInfo]
    metadata: Mapping[str, Mapping[str, str]] = field(default_factory=dict)  # file -> __metadata__

    @property
    def total_bytes(self) -> int:
        return sum(t.nbytes for t in self.tensors.values())

    def dtypes(self) -> dict[str, int]:
        """dtype -> bytes of tensors with that dtype."""
        out: dict[str, int] = {}
        for t in self.tensors.values():
            out[t.dtype] = out.get(t.dtype, 0) + t.nbytes
        return out

    def in_file_order(self) -> Iterator[TensorInfo]:
        for f in self.files:
            yield from sorted((t for t in self.tensors.values() if t.file == f), key=lambda t: t.start)


def _bad(file: str | os.PathLike[str], what: str) -> CheckpointError:
    return CheckpointError(
        f"{os.fspath(file)} is not a valid safetensors file: {what}",
        fix="re-download or re-save the checkpoint (the file is truncated or corrupt)",
    )


def read_file_header(file: str | os.PathLike[str]) -> tuple[dict[str, TensorInfo], dict[str, str]]:
    """Parse and check one ``.safetensors`` file's header: (name -> TensorInfo, ``__metadata__``)."""
    fname = os.fspath(file)
    try:
        size = os.path.getsize(fname)
        with open(fname, "rb") as fh:
            head = fh.read(8)
            if len(head) < 8:
                raise _bad(fname, f"file is {size} bytes, shorter than the 8-byte header length")
            (hlen,) = struct.unpack("<Q", head)
            if hlen > _MAX_HEADER or 8 + hlen > size:
                raise _bad(fname, f"header length {hlen} does not fit in a file of {size} bytes")
            raw = fh.read(hlen)
    except FileNotFoundError:
        raise ModelNotFoundError(f"{fname} does not exist", fix="check the checkpoint directory") from None
    except OSError as e:
        raise CheckpointError(f"cannot read {fname}: {e}", fix="check the file's permissions and disk") from e
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise _bad(fname, f"header is not JSON ({e})") from None
    if not isinstance(header, dict):
        raise _bad(fname, "header is not a JSON object")
    base = 8 + hlen
    metadata_raw = header.pop("__metadata__", None) or {}
    metadata = {str(k): str(v) for k, v in metadata_raw.items()} if isinstance(metadata_raw, dict) else {}
    out: dict[str, TensorInfo] = {}
    for name, entry in header.items():
        try:
            dtype = entry["dtype"]
            shape = tuple(int(d) for d in entry["shape"])
            begin, end = (int(x) for x in entry["data_offsets"])
        except (KeyError, TypeError, ValueError):
            raise _bad(fname, f"entry for {name!r} lacks dtype/shape/data_offsets") from None
        if dtype not in DTYPE_SIZES:
            raise _bad(fname, f"tensor {name!r} has unsupported dtype {dtype!r}")
        if any(d < 0 for d in shape) or begin < 0 or end < begin:
            raise _bad(fname, f"tensor {name!r} has a negative dimension or offsets {begin}..{end}")
        expected = math.prod(shape) * DTYPE_SIZES[dtype]
        if end - begin != expected:
            raise _bad(
                fname, f"tensor {name!r} spans {end - begin} bytes, its shape and dtype need {expected}"
            )
        if base + end > size:
            raise _bad(
                fname, f"tensor {name!r} ends at byte {base + end}, past the end of the file ({size} bytes)"
            )
        out[name] = TensorInfo(name, dtype, shape, fname, base + begin, base + end)
    return out, metadata


def checkpoint_files(path: str | os.PathLike[str]) -> tuple[list[str], dict[str, str] | None]:
    """The safetensors files of a checkpoint directory (or a single file) and, when sharded, the weight map.

    Raises ModelNotFoundError when there is no safetensors checkpoint at ``path``."""
    p = Path(path)
    if p.is_file():
        return [str(p)], None
    if not p.is_dir():
        raise ModelNotFoundError(f"{p} does not exist", fix="pass a local checkpoint directory")
    index = p / INDEX_FILE
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
            if not isinstance(weight_map, dict):
                raise TypeError("weight_map is not an object")
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise CheckpointError(
                f"{index} is not a valid safetensors index ({e})", fix="re-download or re-save the checkpoint"
            ) from None
        files = sorted({str(p / f) for f in weight_map.values()})
        return files, {str(k): str(p / v) for k, v in weight_map.items()}
    single = p / SINGLE_FILE
    if single.is_file():
        return [str(single)], None
    raise ModelNotFoundError(
        f"no {SINGLE_FILE} or {INDEX_FILE} in {p}",
        fix="save the model with save_pretrained(..., safe_serialization=True) "
        "or load it with from_pretrained",
    )


def read_header(path: str | os.PathLike[str]) -> CheckpointHeader:
    """Names, dtypes, shapes and absolute byte ranges of every tensor in a safetensors checkpoint.

    ``path`` is a checkpoint directory (``model.safetensors`` or a sharded ``model.safetensors.index.json``)
    or one ``.safetensors`` file. Reads only headers; raises :class:`~cudaload.errors.CheckpointError` naming
    the file when a header is malformed, a tensor lies past the end of its file (truncated download), or the
    index names a tensor its shard does not hold."""
    files, weight_map = checkpoint_files(path)
    tensors: dict[str, TensorInfo] = {}
    metadata: dict[str, dict[str, str]] = {}
    for f in files:
        found, meta = read_file_header(f)
        metadata[f] = meta
        for name, info in found.items():
            if weight_map is not None and weight_map.get(name, f) != f:
                continue  # the index says another shard owns it; transformers reads by index, so do we
            if name in tensors:
                raise _bad(f, f"tensor {name!r} is also in {tensors[name].file}")
            tensors[name] = info
    if weight_map is not None:
        lost = sorted(k for k in weight_map if k not in tensors)
        if lost:
            raise CheckpointError(
                f"{len(lost)} tensors listed in {INDEX_FILE} are missing from their shards, e.g. {lost[0]!r} "
                f"(expected in {weight_map[lost[0]]})",
                fix="re-download or re-save the checkpoint (a shard is incomplete)",
            )
    root = str(Path(path) if Path(path).is_dir() else Path(path).parent)
    return CheckpointHeader(root=root, files=tuple(files), tensors=tensors, metadata=metadata)
