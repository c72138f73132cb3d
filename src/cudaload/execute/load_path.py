"""The planned load path carried out: cudaload's fast path (plain or quantized), FSDP2's sharded load, or
from_pretrained, which the others step aside to."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from ..errors import CheckpointError, LoadError
from ..plans import Plan
from .failures import _release_memory
from .from_pretrained import _BUILD_LOCK, _from_pretrained, _load_kwargs, _torch_dtype
from .sharded import _STAGED_NOTE, _fsdp_sharded, _fsdp_weights_on_cpu, _load_sharded

# the package's one logger, named as it was before the split (logging configuration refers to it)
logger = logging.getLogger("cudaload.execute")


def _load_once(plan: Plan, auto_class: str, passthrough: Mapping[str, Any]) -> tuple[Any, str, list[str]]:
    """Load by the planned path; the fast path steps aside to from_pretrained on anything it cannot do
    exactly as from_pretrained does, and fails only where from_pretrained fails too (corrupt checkpoint,
    mismatched shapes without ignore_mismatched_sizes)."""
    path = plan.model.local_path or plan.model.name
    notes: list[str] = []
    if _fsdp_sharded(plan):
        from ..fastload import StepAside

        try:
            return _load_sharded(plan, auto_class, passthrough, notes), "fast_sharded", notes
        except (CheckpointError, LoadError):
            raise  # from_pretrained fails on these too
        except StepAside as e:
            notes.append(
                f"sharded FSDP2 load stepped aside ({e}); every rank loads the whole model on its CPU"
            )
            logger.warning("%s", notes[-1])
            del e
            _release_memory()
    elif plan.load_path.choice == "fast":
        from .. import fastload

        try:
            with _BUILD_LOCK:
                if plan.quantization.choice:
                    from ..fastload.quantized import load_quantized

                    model = load_quantized(
                        path,
                        quantization_config=_load_kwargs(plan, {})["quantization_config"],
                        auto_class=auto_class,
                        device=plan.placement.devices[0],
                        dtype=_torch_dtype(plan.dtype.choice or "float32"),
                        attn_implementation=plan.attention.choice,
                    )
                else:
                    model = fastload.load(
                        path,
                        auto_class=auto_class,
                        device=plan.placement.devices[0],
                        dtype=_torch_dtype(plan.dtype.choice or "float32"),
                        attn_implementation=plan.attention.choice,
                        **passthrough,
                    )
            return model, "fast", notes
        except (CheckpointError, LoadError):
            raise  # from_pretrained fails on these too (the fast path only raises them when it would)
        except Exception as e:  # the fast path is an optimisation: never the reason a load fails
            from ..fastload.quantized import StepAside as QuantizedStepAside

            stepped = isinstance(e, (fastload.StepAside, QuantizedStepAside))
            what = "stepped aside" if stepped else "failed"
            notes.append(f"fast path {what} ({type(e).__name__}: {e}); loaded with from_pretrained instead")
            # the load still succeeds, but slower than planned: say so where it is seen, not only in the plan
            logger.warning("%s", notes[-1])
            del e
            _release_memory()
    model = _from_pretrained(auto_class, path, _load_kwargs(plan, passthrough))
    if _fsdp_weights_on_cpu(plan):
        notes.append(_STAGED_NOTE)
    return model, "from_pretrained", notes
