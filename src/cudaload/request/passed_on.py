"""The keywords ``load_model`` passes on to ``from_pretrained`` (``plan``'s ``from_pretrained_kwargs``): which of
them are cudaload's own options under transformers' names, and which are misspelt cudaload options."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..errors import ConfigurationError


def misspelt_option(key: str, options: set[str]) -> str | None:
    """The cudaload option ``key`` (a keyword load_model passes to from_pretrained) is most likely a misspelling
    of: a close spelling (difflib ratio >= 0.8: seqlen, batchsize), never a keyword from_pretrained takes."""
    import difflib

    if key in _PASSED_ON:
        return None
    hits = difflib.get_close_matches(key, sorted(options), n=1, cutoff=0.8)
    return hits[0] if hits else None


#: keywords from_pretrained itself takes: never taken for a misspelt cudaload option
_PASSED_ON = frozenset(
    {
        "revision",
        "token",
        "subfolder",
        "variant",
        "trust_remote_code",
        "cache_dir",
        "local_files_only",
        "config",
        "quantization_config",
        "low_cpu_mem_usage",
        "use_safetensors",
        "tp_plan",
        "tp_size",
        "key_mapping",
        "offload_folder",
        "gguf_file",
    }
)


def absorb_aliases(given: dict[str, Any], fp: dict[str, Any], entry: str = "load_model") -> None:
    """load_model's reading of ``torch_dtype`` / ``attn_implementation`` while ``dtype`` / ``attn`` are auto,
    and its refusal of the other keywords cudaload decides (execute/load.py, load_model's first lines); plan()'s
    ``from_pretrained_kwargs`` the same way, so a plan is the plan of its load."""
    from ..auto_classes import DECIDED_KWARGS as _DECIDED

    clash = sorted(_DECIDED & fp.keys())
    if "torch_dtype" in fp and given.get("dtype", "auto") == "auto":
        given["dtype"] = str(fp.pop("torch_dtype")).replace("torch.", "")
        clash.remove("torch_dtype")
    if "attn_implementation" in fp and given.get("attn", "auto") == "auto":
        given["attn"] = str(fp.pop("attn_implementation"))
        clash.remove("attn_implementation")
    if clash:
        own = {"torch_dtype": "dtype", "attn_implementation": "attn", "use_kernels": "kernels"}
        example = ", ".join(f"{own.get(k, k)}={fp[k]!r}" for k in clash if own.get(k, k) != "kernel_config")
        where = (
            "from_pretrained_kwargs" if entry == "plan" else f"{entry}() keywords passed to from_pretrained"
        )
        raise ConfigurationError(
            f"{', '.join(clash)} in {where} {'is' if len(clash) == 1 else 'are'} decided by cudaload",
            fix=f"use {entry}'s own options instead"
            + (f": {entry}(model, {example})" if example else "")
            + " (dtype=, attn=, device_map=, max_memory=, kernels=)",
        )


def check_from_pretrained_kwargs(value: Any) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
        raise ConfigurationError(
            "from_pretrained_kwargs must be a dict of from_pretrained keywords",
            fix="pass a dict: from_pretrained_kwargs={'revision': 'main'}",
        )
    return dict(value)
