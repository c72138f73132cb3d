"""dtype names, their spellings and bytes per element: below model_info and the policies, which both read them
(model_info sizes a checkpoint it has no safetensors for, the policies size everything they plan)."""

from __future__ import annotations

from .errors import InvalidChoiceError

DTYPES = ("bfloat16", "float16", "float32")
_ALIASES = {
    "bf16": "bfloat16",
    "bfloat16": "bfloat16",
    "torch.bfloat16": "bfloat16",
    "fp16": "float16",
    "float16": "float16",
    "half": "float16",
    "torch.float16": "float16",
    "fp32": "float32",
    "float32": "float32",
    "float": "float32",
    "torch.float32": "float32",
}
_BYTES = {
    "bfloat16": 2,
    "float16": 2,
    "float32": 4,
    "float64": 8,
    "int8": 1,
    "uint8": 1,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
}


def dtype_bytes(name: str) -> int:
    return _BYTES.get(normalize_dtype(name) if name in _ALIASES else name, 2)


def normalize_dtype(name: object) -> str:
    """'bf16', 'torch.bfloat16', torch.bfloat16 -> 'bfloat16'. InvalidChoiceError for anything else."""
    key = str(name).strip().lower()
    if key in _ALIASES:
        return _ALIASES[key]
    raise InvalidChoiceError(f"unknown dtype {name!r}", fix=f"use one of {', '.join(DTYPES)} or 'auto'")
