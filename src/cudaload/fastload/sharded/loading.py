""":func:`load_fsdp2`, step by step: build and finish on meta, vote, shard, give each rank storage for its
shards, read them, vote again.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ...errors import ConfigurationError, DependencyError
from ..materialize import (
    build_skeleton,
    check_keys,
    clear_tracebacks,
    load_report,
    model_class,
    plan_keys,
    prepare,
    resolve_device,
    step_aside,
    torch_dtype,
)
from .lora import _check_lora_sharding, _wrap_lora
from .rows import _plan_shards, _Shard
from .units import (
    _agree_on_initialised,
    _check_shardable,
    _check_shared_within_units,
    _checkpoint_layers,
    _finish_on_meta,
    _real_tensors,
    _restore,
)
from .vote import _fingerprint, _Vote

if TYPE_CHECKING:
    import torch
    from peft import LoraConfig

logger = logging.getLogger(__name__)


def _process_group_or_fail() -> Any:
    try:
        import torch.distributed as dist
    except ImportError as e:  # a torch built without distributed support
        raise DependencyError(
            "torch.distributed is not available in this torch build", fix="install a torch with distributed"
        ) from e
    if not dist.is_available() or not dist.is_initialized():
        raise ConfigurationError(
            "sharded FSDP2 loading needs an initialised default process group, and there is none",
            fix="launch with torchrun and call torch.distributed.init_process_group() (nccl on GPUs, gloo on "
            "the CPU) before load_fsdp2, or load in one process with cudaload.fastload.load",
        )
    return dist


def _default_device(dist: Any) -> torch.device:
    import torch

    backend = str(dist.get_backend())
    if torch.cuda.is_available() and "nccl" in backend:
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _fsdp_env_on() -> bool:
    """transformers' FSDP1 loading switch (5.17 distributed/fsdp.py:41-47): when it is on, its
    ``_finalize_model_loading`` zero-fills every tensor on the CPU on ranks other than each node's local 0
    (modeling_utils.py:4718-4724) and skips initialising them (:4757-4769): neither is wanted here."""
    import transformers.integrations as hf_integrations

    is_fsdp_enabled = getattr(hf_integrations, "is_fsdp_enabled", None)
    return bool(is_fsdp_enabled is not None and is_fsdp_enabled())


def load_fsdp2(
    path: str | os.PathLike[str],
    *,
    dtype: torch.dtype,
    auto_class: str = "AutoModelForCausalLM",
    device: str | torch.device | None = None,
    mesh: Any = None,
    mp_policy: Any = None,
    offload_policy: Any = None,
    reshard_after_forward: bool = True,
    activation_checkpointing: bool = False,
    peft_config: LoraConfig | None = None,
    wrap_peft: Callable[[Any, Any], Any] | None = None,
    attn_implementation: str | None = None,
    threads: int | None = None,
    buffer_bytes: int | None = None,
    **from_pretrained_kwargs: Any,
) -> Any:
    """Load a safetensors checkpoint as an FSDP2-sharded model, each rank reading only its own shards.

    Call it on every rank of an initialised default process group (``torch.distributed.init_process_group``).
    ``device``: where this rank's shards live (default: the current CUDA device under nccl, else the CPU).
    ``mesh``: a 1-D DeviceMesh to shard over (default: the whole world on ``device``'s type).
    ``mp_policy``: a ``torch.distributed.fsdp.MixedPrecisionPolicy`` for every ``fully_shard`` call.
    ``offload_policy``: a ``CPUOffloadPolicy`` keeps the shards in host memory (FSDP2 copies them to ``device``
    for compute); buffers, which FSDP2 does not shard, stay on ``device``.
    ``reshard_after_forward``: for the decoder layers (the root keeps FSDP2's default).
    ``activation_checkpointing``: wrap each decoder layer in torch's ``checkpoint_wrapper`` before sharding it,
    as accelerate does for ``fsdp_config["activation_checkpointing"]`` (1.15 utils/fsdp_utils.py:701-727,
    applied before ``fully_shard`` at accelerator.py:1696-1698; its wrap policy looks through the wrapper,
    fsdp_utils.py:959-962). A Trainer given the result must not wrap again (see
    ``cudaload.policies.parallelism.parallel_training_arguments``).
    ``wrap_peft``: the function that wraps it (default ``peft.get_peft_model``; load_model passes its own, which
    translates peft's errors). ``peft_config``: a peft ``LoraConfig``: the finished meta model is wrapped by ``peft.get_peft_model`` before
    sharding (see :func:`_wrap_lora`), and the PeftModel, sharded as the root, is returned. The frozen base
    weights keep ``dtype``; the LoRA weights are float32 (peft's ``autocast_adapter_dtype``), drawn by peft's
    own initialisation on rank 0 and broadcast, so every rank shards the same tensors (lora_B zero: the
    model computes what the base model computes). Configurations whose adapters need the base weights' values
    (PiSSA, OLoRA, LoftQ, EVA, CorDA, orthogonal, DoRA) or copy base modules (``modules_to_save``,
    ``trainable_token_indices``, ``layer_replication``), and adapters on parameters (``target_parameters``)
    step aside.
    ``from_pretrained_kwargs`` mean what they mean to ``from_pretrained``, as for :func:`cudaload.fastload.load`.

    Returns the model (an ``FSDPModule``; with ``peft_config`` the PeftModel), in eval mode like
    ``from_pretrained``'s (a PeftModel as ``get_peft_model`` leaves it); ``model.cudaload_fastload``
    says what this rank read (``bytes``), its rank, world and the shards it holds. Raises
    :class:`~cudaload.fastload.StepAside` on every rank when the load cannot be exact on some rank (before any
    weight storage is allocated, except a shard layout FSDP2 did not give as expected), the failing rank's error
    on that rank and LoadError on the others when a rank fails, ConfigurationError when there is no process
    group."""
    dist = _process_group_or_fail()
    import torch
    from torch.distributed.device_mesh import init_device_mesh

    try:
        from torch.distributed.fsdp import (
            CPUOffloadPolicy,
            FSDPModule,
            MixedPrecisionPolicy,
            OffloadPolicy,
            fully_shard,
        )
    except ImportError as e:
        raise DependencyError(
            f"this torch ({torch.__version__}) has no FSDP2 (torch.distributed.fsdp.fully_shard)",
            fix="upgrade torch to 2.6 or newer",
        ) from e
    from .. import staging

    t0 = time.perf_counter()
    dev = resolve_device(device) if device is not None else _default_device(dist)
    threads, buffer_bytes = staging.io_settings(threads, buffer_bytes)
    if mesh is None:
        mesh = init_device_mesh(dev.type, (dist.get_world_size(),))
    if mesh.ndim != 1:
        raise ConfigurationError(
            f"load_fsdp2 shards over a 1-D device mesh, not {mesh.ndim}-D", fix="pass a 1-D DeviceMesh"
        )
    world, rank = mesh.size(), mesh.get_local_rank()
    vote = _Vote(dist, mesh, rank, world, dev)
    # Every rank reaches each vote whatever happened before it on that rank: a StepAside or an error raised on
    # one rank only (its own copy of the files differs, a read fails) is then raised on every rank, before the
    # next collective, instead of one rank falling back to a whole-model load (or leaving) while the others go
    # on into FSDP2's collectives and wait there for it.
    model: Any = None
    failure: Exception | None = None
    try:
        if peft_config is not None:
            _check_lora_sharding(str(path), peft_config, world)
        prep = prepare(path, from_pretrained_kwargs)
        root = prep.options.path
        if _fsdp_env_on():
            raise step_aside(
                root,
                "ACCELERATE_USE_FSDP and FSDP_CPU_RAM_EFFICIENT_LOADING are set: transformers' own FSDP loading "
                "would zero the weights on all but local rank 0",
            )
        config = prep.config
        if attn_implementation is not None:
            config._attn_implementation = attn_implementation
        config.name_or_path = root  # as from_pretrained sets it
        model = build_skeleton(config, model_class(config, auto_class), dtype, prep.model_kwargs)
        keys = plan_keys(model, prep.header)
        check_keys(keys, prep)
        layers = _check_shardable(model, root)
        tied = getattr(model, "all_tied_weights_keys", None) or {}
        both = [f"{t} and {src}" for t, src in tied.items() if t in keys.load and src in keys.load]
        if both:
            # from_pretrained ties them only when their values are equal, and leaves them untied when both are
            # on meta (transformers 5.17 modeling_utils.py:2553-2573): the skeleton cannot decide it
            raise step_aside(root, f"the checkpoint holds both sides of tied weights ({both[0]})")
        # what from_pretrained keeps for save_pretrained (5.17 core_model_loading.py:1795-1798)
        model._weight_conversions = [c for c in keys.conversions if c.was_used()]
        info = _finish_on_meta(model, keys, prep, dev, dtype)
        # each checkpoint name's module, by identity: PEFT (q_proj -> q_proj.base_layer under
        # base_model.model.) and checkpoint wrappers rename them, fully_shard keeps the objects
        base_modules: dict[int, list[str]] = {}
        for n, m in model.named_modules(remove_duplicate=False):
            base_modules.setdefault(id(m), []).append(n)
        lora_tensors = 0
        if peft_config is not None:
            model, lora_tensors = _wrap_lora(model, peft_config, dev, root, wrap_peft)
        _check_shared_within_units(model, layers, root)
        fingerprint = _fingerprint(model, keys, prep.header.tensors)
    except Exception as e:
        failure, model = e, None
        fingerprint = 0
    shards: list[_Shard] = []
    try:
        vote.agree(failure, fingerprint, "building the model")
        try:
            _agree_on_initialised(model, dist, mesh)
            t_build = time.perf_counter()
            kw: dict[str, Any] = {
                "mesh": mesh,
                "mp_policy": mp_policy or MixedPrecisionPolicy(),
                "offload_policy": offload_policy or OffloadPolicy(),
            }
            if activation_checkpointing:
                layers = _checkpoint_layers(model, layers, keep_names=peft_config is not None)
            for layer in layers:
                fully_shard(layer, reshard_after_forward=reshard_after_forward, **kw)
            fully_shard(model, **kw)
            # CPU offload: the sharded parameters live in host memory (torch 2.13 _fsdp_param.py:311-314 moves an
            # initialised shard there the same way)
            shard_dev = torch.device("cpu") if isinstance(offload_policy, CPUOffloadPolicy) else dev
            kept = _real_tensors(model)
            model.to_empty(device=shard_dev)
            _restore(model, kept, dev)
            t_alloc = time.perf_counter()
            shards = _plan_shards(model, base_modules, keys, prep.header.tensors, world, rank, root)
            fill_times: dict[str, float] = {}
            with torch.no_grad():
                for on_cuda in (False, True):
                    part = [s for s in shards if (s.target.device.type == "cuda") == on_cuda]
                    if not part:
                        continue
                    targets = [staging.Target(s.name, s.target, torch_dtype(s.source.dtype)) for s in part]
                    sources = [s.source for s in part]
                    if on_cuda:
                        fill_times = staging.fill_cuda(
                            targets, sources, device=dev, threads=threads, buffer_bytes=buffer_bytes
                        )
                    else:
                        staging.fill_cpu(targets, sources, threads=threads, buffer_bytes=buffer_bytes)
            t_fill = time.perf_counter()
            if not isinstance(model, FSDPModule):  # fully_shard on the root makes it one
                raise step_aside(root, "fully_shard did not make the root an FSDPModule")
        except Exception as e:
            failure = e
        vote.agree(failure, 0, "sharding and reading the weights")
    except BaseException as e:
        model = None
        shards = []
        clear_tracebacks(e)
        if dev.type == "cuda":
            torch.cuda.empty_cache()
        raise
    read_bytes = sum(s.source.nbytes for s in shards)
    t_end = time.perf_counter()
    model.cudaload_fastload = {
        "seconds": round(t_end - t0, 4),
        "build_s": round(t_build - t0, 4),
        "alloc_s": round(t_alloc - t_build, 4),
        "fill_s": round(t_fill - t_alloc, 4),
        **fill_times,
        "bytes": read_bytes,
        "checkpoint_bytes": prep.header.total_bytes,
        "sharded": {
            "world": world,
            "rank": rank,
            "layers": len(layers),
            "tensors": len(shards),
            # what forward computes in: the mixed-precision policy's parameter dtype, else the load dtype
            "param_dtype": str(getattr(mp_policy, "param_dtype", None) or dtype).removeprefix("torch."),
            # LoRA weight tensors initialised here (peft's init, rank 0's draw); 0 without peft_config
            "lora_tensors": lora_tensors,
        },
        **load_report(prep.header, info, threads, buffer_bytes, dev),
    }
    logger.info(
        "rank %d/%d loaded its FSDP2 shards of %s: read %.3f of %.3f GB in %.2f s",
        rank,
        world,
        root,
        read_bytes / 1e9,
        prep.header.total_bytes / 1e9,
        t_end - t0,
    )
    return model
