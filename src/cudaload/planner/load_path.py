"""Fast loader or ``from_pretrained``, where the parallelism decides it (tensor parallel and FSDP ranks whose
weights fit no GPU whole) before the load-path policy does (cudaload.policies.load_path)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ..model_info import ModelInfo
from ..plans.decision import Candidate, Decision
from ..plans.plan import Parallelism
from ..policies.load_path import choose_load_path, fast_kwargs_blockers
from ..policies.parallelism import SHARDED_REASON, SHARDED_STEPPED_ASIDE
from ..request import Request
from .sizing import Sized


def load_path_for(req: Request, info: ModelInfo, sized: Sized) -> tuple[Decision, Parallelism | None]:
    """The load-path decision, and the parallelism as the load will run it (an FSDP2 plan whose sharded load
    cannot run states the host memory of the whole-model load instead)."""
    fr, placement = sized.fit, sized.placement
    from_pretrained_kwargs = dict(req.from_pretrained_kwargs) or None
    fast = req.fast
    par = sized.parallelism
    if par is not None and par.choice in ("tp", "tp_fp8") and par.launched:
        # each rank holds a shard of every weight: transformers slices them as it loads (distributed_config,
        # transformers 5.17 modeling_utils.py:4082); the fast path fills whole tensors on one device
        why = "tensor parallel under torchrun: from_pretrained shards each weight as it loads"
        lp = Decision(
            "from_pretrained",
            (why,),
            (Candidate("fast", False, (why,)), Candidate("from_pretrained", True, (why,))),
        )
    elif par is not None and par.launched and par.config.get("weights_on_cpu"):
        lp, par = _weights_on_cpu(par, from_pretrained_kwargs, fast)
    else:
        lp = choose_load_path(
            info,
            quantization=fr.decision.choice,
            placement=placement,
            prefer=fast,
            from_pretrained_kwargs=from_pretrained_kwargs,
        )

    return lp, par


def _weights_on_cpu(
    par: Parallelism, from_pretrained_kwargs: dict[str, Any] | None, fast: bool | None
) -> tuple[Decision, Parallelism]:
    """FSDP ranks whose weights fit no GPU whole: each reads only its shards (the fast sharded load), or, where
    that cannot run, from_pretrained loads the whole model on each rank's CPU."""
    why = (
        "FSDP with weights that fit no GPU whole: from_pretrained loads them on each rank's CPU; the fast "
        "path fills a GPU"
    )
    blocked = fast_kwargs_blockers(from_pretrained_kwargs or {})
    if fast is False:
        blocked.append("fast=False was passed")
    if par.config.get("sharded_load") and not blocked:
        # cudaload.fastload.sharded.load_fsdp2 under this rank's process group (execute._load_once)
        sharded = (
            f"FSDP2 with weights that fit no GPU whole: each rank builds the model on the meta device, shards "
            f"it and reads only its own rows of each weight (1/{par.world_size}) from the safetensors files "
            "onto its GPU; if the fast path steps aside at load time, from_pretrained loads the whole model "
            "on each rank's CPU"
        )
        lp = Decision(
            "fast",
            (sharded,),
            (Candidate("fast", True, (sharded,)), Candidate("from_pretrained", True, (why,))),
        )
    else:
        if par.config.get("sharded_load"):
            # the ranks will load whole on their CPUs after all: the host figure is the staged one
            cfg = dict(par.config)
            cfg["host_bytes_per_node"] = cfg.pop("host_bytes_per_node_if_stepped_aside")
            cfg.pop("sharded_load")
            staged = tuple(
                r.replace(SHARDED_STEPPED_ASIDE, "while the Trainer shards")
                for r in par.decision.reasons
                if not r.startswith(SHARDED_REASON)
            )
            par = replace(par, config=cfg, decision=replace(par.decision, reasons=staged))
            why += f" (no sharded loading: {'; '.join(blocked)})"
        lp = Decision(
            "from_pretrained",
            (why,),
            (Candidate("fast", False, (why,)), Candidate("from_pretrained", True, (why,))),
        )
    return lp, par
