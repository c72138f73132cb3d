"""The planned load path carried out: cudaload's fast path (plain or quantized), FSDP2's sharded load, or
from_pretrained, which the others step aside to."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from ..checkpoint_coverage import NewWeights, architecture_names, check_coverage, matches
from ..errors import CheckpointCoverageError, CheckpointError, LoadError
from ..plans.plan import Plan
from .failures import release_memory
from .from_pretrained import BUILD_LOCK, _from_pretrained, _load_kwargs, _torch_dtype
from .sharded import STAGED_NOTE, fsdp_sharded, fsdp_weights_on_cpu, load_sharded

# the package's one logger, named as it was before the split (logging configuration refers to it)
logger = logging.getLogger("cudaload.execute")


def _load_once(
    plan: Plan, auto_class: str, passthrough: Mapping[str, Any], *, new_weights: NewWeights = False
) -> tuple[Any, str, list[str]]:
    """:func:`load_covered` without what it accepted: (model, path taken, notes)."""
    model, taken, notes, _ = load_covered(plan, auto_class, passthrough, new_weights=new_weights)
    return model, taken, notes


def load_covered(
    plan: Plan, auto_class: str, passthrough: Mapping[str, Any], *, new_weights: NewWeights = False
) -> tuple[Any, str, list[str], dict[str, Any]]:
    """Load by the planned path (:func:`_load_by_path`), then refuse a checkpoint whose tensors do not cover
    the model (:func:`cudaload.checkpoint_coverage.check_coverage`, on transformers' own load report, for
    every path), releasing the model first so that a retry has its memory. Returns the model, the path taken,
    the notes and what the check accepted (``plan.verified["checkpoint"]``).

    ``new_weights``: the tensors meant to be new (``load_model(new_weights=...)``). Where it is given, the
    loaders get ``ignore_mismatched_sizes=True`` so that a reshaped tensor it names can be re-initialised; the
    check then refuses every one it does not name, unless the caller passed ignore_mismatched_sizes itself."""
    asked_ims = bool(passthrough.get("ignore_mismatched_sizes"))
    kwargs = dict(passthrough)
    if new_weights and not asked_ims:
        kwargs["ignore_mismatched_sizes"] = True
    model, taken, notes, report = _load_by_path(plan, auto_class, kwargs, new_weights)
    path = plan.model.local_path or plan.model.name
    try:
        prefix, base_names = architecture_names(model)
        coverage = check_coverage(
            report,
            new_weights=new_weights,
            ignore_mismatched_sizes=asked_ims,
            prefix=prefix,
            base_names=base_names,
            where=str(path),
            model_name=type(model).__name__,
        )
    except BaseException:
        # leave nothing behind: this frame holds the only reference to the model (the traceback keeps the
        # frame, not the value once it is dropped); its GPU memory goes back before the error goes up
        model = None
        release_memory()
        raise
    if coverage["new_weights"] or coverage["unused"]:
        logger.info(
            "%s: %d tensors initialised anew (not in the checkpoint), %d checkpoint tensors unused",
            path,
            len(coverage["new_weights"]),
            len(coverage["unused"]),
        )
    return model, taken, notes, coverage


def _fast_report(model: Any) -> dict[str, Any]:
    """transformers' load report as the fast loaders keep it (``load_report``, in ``model.cudaload_fastload``)."""
    info = getattr(model, "cudaload_fastload", None) or {}
    return {k: info.get(k) or [] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")}


def _load_by_path(
    plan: Plan, auto_class: str, passthrough: Mapping[str, Any], new_weights: NewWeights
) -> tuple[Any, str, list[str], dict[str, Any]]:
    """Load by the planned path; the fast path steps aside to from_pretrained on anything it cannot do
    exactly as from_pretrained does, and fails only where from_pretrained fails too (corrupt checkpoint,
    mismatched shapes without ignore_mismatched_sizes). Returns transformers' load report with the model."""
    path = plan.model.local_path or plan.model.name
    notes: list[str] = []
    if fsdp_sharded(plan):
        from ..fastload import StepAside

        try:
            model = load_sharded(plan, auto_class, passthrough, notes)
            return model, "fast_sharded", notes, _fast_report(model)
        except (CheckpointError, LoadError):
            raise  # from_pretrained fails on these too
        except StepAside as e:
            notes.append(
                f"sharded FSDP2 load stepped aside ({e}); every rank loads the whole model on its CPU"
            )
            logger.warning("%s", notes[-1])
            del e
            release_memory()
    elif plan.load_path.choice == "fast":
        from .. import fastload

        try:
            with BUILD_LOCK:
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
            return model, "fast", notes, _fast_report(model)
        except CheckpointCoverageError as e:
            # the quantized fast path takes no from_pretrained keywords, so it refuses reshaped tensors before
            # loading even where new_weights names them: from_pretrained re-initialises those
            meant = e.mismatched and not (e.missing or e.unexpected)
            if not (
                meant and plan.quantization.choice and all(matches(k, new_weights) for k in e.mismatched)
            ):
                raise
            notes.append(
                f"fast path stepped aside: new_weights names {len(e.mismatched)} reshaped tensors it does not "
                "re-initialise; loaded with from_pretrained instead"
            )
            del e
            release_memory()
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
            release_memory()
    model, report = _from_pretrained(auto_class, path, _load_kwargs(plan, passthrough))
    if fsdp_weights_on_cpu(plan):
        notes.append(STAGED_NOTE)
    return model, "from_pretrained", notes, report
