"""The from_pretrained call: which auto class, with which keywords from the plan, under the build lock."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ..auto_classes import AUTO_CLASSES
from ..errors import ConfigurationError
from ..plans.plan import Plan

if TYPE_CHECKING:
    import torch


# transformers' from_pretrained temporarily switches torch's process-wide default dtype while it builds the
# model, so two loads racing in threads can build each other's modules in the wrong dtype. Building and
# filling happen inside one call on both paths, so threaded loads are serialised: correct before concurrent.
BUILD_LOCK = threading.RLock()


def resolve_auto_class(model_class: str | None, task: str | None, plan: Plan) -> str:
    """The transformers auto class name to load with: ``model_class`` and ``task`` as the request checked them
    (a task it knows, never both)."""
    if model_class:
        return model_class
    if task:
        return AUTO_CLASSES[task]
    # An encoder has no causal-LM head: AutoModelForCausalLM would bolt a random one on.
    return "AutoModel" if plan.model.is_encoder else "AutoModelForCausalLM"


def _torch_dtype(name: str) -> torch.dtype:
    import torch

    return {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}[name]


def _from_pretrained(auto_class: str, path: str, kwargs: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """(the model, transformers' load report after its own adjustments: ``missing_keys``,
    ``unexpected_keys``, ``mismatched_keys``), for cudaload's coverage check (execute.load_path).

    ``output_loading_info=True`` returns the report (transformers 5.25 modeling_utils.py:4530-4531, 5.17 the
    same: ``loading_info.to_dict()``). ``ignore_mismatched_sizes=True`` lets a reshaped tensor reach the report
    instead of a RuntimeError that names it only in a logged table (5.25 utils/loading_report.py:236-239);
    the coverage check refuses it unless the caller passed ignore_mismatched_sizes or new_weights naming it."""
    import transformers

    cls = getattr(transformers, auto_class, None)
    if cls is None:
        raise ConfigurationError(
            f"transformers has no {auto_class}", fix="pass a transformers auto class name"
        )
    kwargs = {**kwargs, "output_loading_info": True, "ignore_mismatched_sizes": True}
    with BUILD_LOCK:
        model, info = cls.from_pretrained(path, **kwargs)
    return model, dict(info)


def _load_kwargs(plan: Plan, passthrough: Mapping[str, Any]) -> dict[str, Any]:
    kw: dict[str, Any] = {"trust_remote_code": False, **passthrough}
    # transformers 5.25 kernelizes every load with its default Hub kernels unless told not to (use_kernels
    # None -> True, modeling_utils.py:4415-4423; 5.17-5.24 default to False): Hub kernels run downloaded code,
    # so cudaload applies only the kernels its plan trusted, after loading (execute.load)
    kw["use_kernels"] = False
    kw["dtype"] = _torch_dtype(plan.dtype.choice or "float32")
    if plan.attention.choice:
        kw["attn_implementation"] = plan.attention.choice
    kw["device_map"] = plan.placement.device_map
    if plan.placement.max_memory:
        # the plan keys GPUs as strings ("0") to survive JSON; accelerate only treats int keys as GPUs
        kw["max_memory"] = {
            int(k) if str(k).isdigit() else k: v for k, v in plan.placement.max_memory.items()
        }
    par = plan.parallelism
    if par is not None and par.choice in ("tp", "tp_fp8") and par.launched:
        # tensor parallel under torchrun: transformers places each rank's shards itself; a device_map would
        # fight it (the plan's from_pretrained settings: cudaload.policies.parallelism, tp/tp_fp8)
        from transformers.distributed import DistributedConfig  # type: ignore[attr-defined]

        fp = dict(par.config.get("from_pretrained") or {})
        kw.pop("device_map", None)
        kw.pop("max_memory", None)
        if fp.get("distributed_config"):
            kw["distributed_config"] = DistributedConfig(**fp["distributed_config"])
        if par.choice == "tp_fp8" and par.config.get("quantization_config"):
            from transformers import FineGrainedFP8Config

            fp8 = {k: v for k, v in par.config["quantization_config"].items() if k != "quant_method"}
            kw["quantization_config"] = FineGrainedFP8Config(**fp8)
    if plan.quantization.choice and plan.quantization_config is not None:
        from transformers import BitsAndBytesConfig

        qcfg = dict(plan.quantization_config)
        for key in ("bnb_4bit_compute_dtype",):
            if isinstance(qcfg.get(key), str):
                qcfg[key] = _torch_dtype(qcfg[key])
        kw["quantization_config"] = BitsAndBytesConfig(**qcfg)
    return kw
