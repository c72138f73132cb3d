"""Safetensors headers, read and checked without touching tensor data.

A safetensors file is ``u64 little-endian header length`` + ``JSON header`` + data. The header maps each
tensor name to ``{"dtype", "shape", "data_offsets": [begin, end]}`` relative to the data section. A sharded
checkpoint adds ``model.safetensors.index.json`` whose ``weight_map`` names the shard of every tensor.

Everything here is pure and cheap (a few small reads per file): :func:`read_header` is what
:func:`cudaload.fastload.supports` and the loader's planning use, and every check that can fail on a bad file
fails here, *before* any memory is allocated for the model. A header is accepted exactly when the safetensors
library (which ``from_pretrained`` reads with) accepts it, so a file ``from_pretrained`` rejects is rejected
here too, and a file it loads is never called corrupt.
"""

from __future__ import annotations

import json
import math
import os
import struct
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import CheckpointError, ModelNotFoundError

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"

#: Every dtype the safetensors library knows -> bits per element. The list is safetensors 0.8.0's own (its
#: deserialisation error names them: "expected one of BOOL, F4, F6_E2M3, ..."); a dtype outside it makes
#: ``safe_open`` fail, so from_pretrained cannot load the file either.
DTYPE_BITS: Mapping[str, int] = {
    "BOOL": 8,
    "F4": 4,
    "F6_E2M3": 6,
    "F6_E3M2": 6,
    "U8": 8,
    "I8": 8,
    "F8_E5M2": 8,
    "F8_E4M3": 8,
    "F8_E8M0": 8,
    "F8_E4M3FNUZ": 8,
    "F8_E5M2FNUZ": 8,
    "I16": 16,
    "U16": 16,
    "F16": 16,
    "BF16": 16,
    "I32": 32,
    "U32": 32,
    "F32": 32,
    "C64": 64,
    "F64": 64,
    "I64": 64,
    "U64": 64,
}

#: The dtypes the fast path copies (safetensors dtype -> bytes per element). A checkpoint tensor of another
#: (valid) dtype that the model would load makes the fast path step aside to from_pretrained.
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

#: A header larger than this is not a real header (safetensors/src/tensor.rs MAX_HEADER_SIZE).
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
    """Parse and check one ``.safetensors`` file's header: (name -> TensorInfo, ``__metadata__``).

    The checks are the safetensors library's (huggingface/safetensors safetensors/src/tensor.rs,
    ``SafeTensors::read_metadata`` and ``Metadata::validate``): header at most 100 MB and inside the file;
    a JSON object of ``{dtype, shape, data_offsets}`` entries with known dtypes, non-negative integer shapes
    and offsets, and ``__metadata__`` a map of strings; sorted by offsets, the tensors tile the data section
    from byte 0 with no gap and no overlap (``InvalidOffset``); each spans exactly shape x dtype bits, a
    whole number of bytes (``TensorInvalidInfo``/``Misaligned``); and the last one ends at the end of the
    file (``MetadataIncompleteBuffer``). Pure header work: no tensor byte is read."""
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
    metadata_raw = header.pop("__metadata__", None)
    if metadata_raw is None:
        metadata_raw = {}
    if not isinstance(metadata_raw, dict) or not all(isinstance(v, str) for v in metadata_raw.values()):
        raise _bad(fname, "__metadata__ is not a map of strings")
    metadata = {str(k): v for k, v in metadata_raw.items()}
    entries: list[tuple[int, int, str, str, tuple[int, ...]]] = []
    for name, entry in header.items():
        try:
            dtype = entry["dtype"]
            shape = tuple(entry["shape"])
            begin, end = entry["data_offsets"]
        except (KeyError, TypeError, ValueError):
            raise _bad(fname, f"entry for {name!r} lacks dtype/shape/data_offsets") from None
        ints = (*shape, begin, end)
        if not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in ints):
            raise _bad(fname, f"tensor {name!r} has a shape or offsets that are not non-negative integers")
        if dtype not in DTYPE_BITS:
            raise _bad(fname, f"tensor {name!r} has dtype {dtype!r}, which safetensors does not know")
        entries.append((begin, end, name, dtype, shape))
    entries.sort(key=lambda e: (e[0], e[1]))  # safetensors sorts by data_offsets before validating
    out: dict[str, TensorInfo] = {}
    pos = 0
    for begin, end, name, dtype, shape in entries:
        if begin != pos or end < begin:
            what = "overlaps the previous tensor" if begin < pos else "leaves a gap after the previous tensor"
            if end < begin:
                what = "ends before it begins"
            raise _bad(fname, f"invalid offset for tensor {name!r}: data_offsets [{begin}, {end}] {what}")
        pos = end
        bits = math.prod(shape) * DTYPE_BITS[dtype]
        if bits % 8:
            raise _bad(fname, f"tensor {name!r} of {dtype} does not end on a byte boundary")
        if end - begin != bits // 8:
            raise _bad(
                fname, f"tensor {name!r} spans {end - begin} bytes, its shape and dtype need {bits // 8}"
            )
        out[name] = TensorInfo(name, dtype, shape, fname, base + begin, base + end)
    if base + pos != size:
        if base + pos > size:
            raise _bad(fname, f"tensors end at byte {base + pos}, past the end of the file ({size} bytes)")
        raise _bad(
            fname, f"tensors end at byte {base + pos} but the file has {size} bytes (not fully covered)"
        )
    return out, metadata


def checkpoint_files(path: str | os.PathLike[str]) -> tuple[list[str], dict[str, str] | None]:
    """The safetensors files of a checkpoint directory (or a single file) and, when sharded, the weight map.

    When a directory holds both ``model.safetensors`` and a sharded index, the single file is the checkpoint:
    transformers looks for it first (modeling_utils.py ``_get_resolved_checkpoint_files``, 5.17:594-607,
    5.24:591-604). The fast path's loader resolves files with that transformers function itself (honouring
    ``variant``, ``subfolder`` and ``transformers_weights``); this is its dependency-free twin for the plain
    case. Raises ModelNotFoundError when there is no safetensors checkpoint at ``path``."""
    p = Path(path)
    if p.is_file():
        return [str(p)], None
    if not p.is_dir():
        raise ModelNotFoundError(f"{p} does not exist", fix="pass a local checkpoint directory")
    single = p / SINGLE_FILE
    if single.is_file():
        return [str(single)], None
    index = p / INDEX_FILE
    if index.is_file():
        weight_map = read_weight_map(index)
        # the shard order transformers reads in: 5.17 utils/hub.py:890 get_checkpoint_shard_files, sorted(set(...))
        files = [str(p / f) for f in sorted(set(weight_map.values()))]
        return files, {k: str(p / v) for k, v in weight_map.items()}
    raise ModelNotFoundError(
        f"no {SINGLE_FILE} or {INDEX_FILE} in {p}",
        fix="save the model with save_pretrained(..., safe_serialization=True) "
        "or load it with from_pretrained",
    )


def read_weight_map(index: str | os.PathLike[str]) -> dict[str, str]:
    try:
        weight_map = json.loads(Path(index).read_text())["weight_map"]
        if not isinstance(weight_map, dict):
            raise TypeError("weight_map is not an object")
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise CheckpointError(
            f"{index} is not a valid safetensors index ({e})", fix="re-download or re-save the checkpoint"
        ) from None
    return {str(k): str(v) for k, v in weight_map.items()}


def read_files(files: Sequence[str | os.PathLike[str]], root: str | os.PathLike[str]) -> CheckpointHeader:
    """The checkpoint made of ``files``, merged the way from_pretrained merges them: every tensor of every file,
    a name found in two files taken from the later one (modeling_utils.py ``_load_pretrained_model`` fills one
    dict file after file, 5.17:4447, 5.24:4582). The index's weight_map does not decide which copy is read,
    and an index entry no shard holds is not an error: from_pretrained does not look at it."""
    tensors: dict[str, TensorInfo] = {}
    metadata: dict[str, dict[str, str]] = {}
    names = [os.fspath(f) for f in files]
    for f in names:
        found, meta = read_file_header(f)
        metadata[f] = meta
        for name, info in found.items():
            tensors.pop(name, None)  # the later file's copy, at its own place in file order
            tensors[name] = info
    return CheckpointHeader(root=os.fspath(root), files=tuple(names), tensors=tensors, metadata=metadata)


def read_header(path: str | os.PathLike[str]) -> CheckpointHeader:
    """Names, dtypes, shapes and absolute byte ranges of every tensor in a safetensors checkpoint.

    ``path`` is a checkpoint directory (``model.safetensors``, else a sharded ``model.safetensors.index.json``)
    or one ``.safetensors`` file. Reads only headers; raises :class:`~cudaload.errors.CheckpointError` naming
    the file when a header is one the safetensors library rejects (malformed, offsets overlapping or leaving
    gaps, a tensor past the end of its file after a truncated download)."""
    files, _ = checkpoint_files(path)
    root = Path(path) if Path(path).is_dir() else Path(path).parent
    return read_files(files, root)
