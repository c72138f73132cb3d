"""FSDP2 loading in which every rank reads only its own shard of each weight from the checkpoint files.

    import torch.distributed as dist
    dist.init_process_group("nccl")          # torchrun sets RANK, WORLD_SIZE, MASTER_ADDR...
    model = cudaload.fastload.sharded.load_fsdp2(path, dtype=torch.bfloat16)   # an FSDPModule

Loading a model whole on every rank and then sharding it needs ``local ranks x model`` of host memory (a 70B
model on 8 ranks: over 1 TiB). Here the model never exists whole anywhere:

1. the skeleton is built on the meta device exactly as the fast path builds it (:mod:`.materialize`:
   ``prepare``, ``build_skeleton``, ``plan_keys``, ``check_keys``), and finished on meta the way
   ``from_pretrained`` finishes (transformers' own ``_finalize_model_loading``: tied weights tied, missing keys
   initialised, non-persistent buffers such as rotary ``inv_freq`` recomputed by transformers' ``_init_weights``);
2. torch's FSDP2 ``fully_shard`` is applied to every decoder layer (the classes in ``_no_split_modules``), then
   to the root, still on meta;
3. ``to_empty`` gives each rank storage for its own shards only, and each shard is filled from the safetensors
   files by reading that rank's rows (FSDP2 shards dim 0 in ``torch.chunk`` pieces, so a rank's rows are one
   contiguous byte range of the tensor) with the fast path's reader and dtype conversion. Buffers (not sharded
   by FSDP2) are read whole.

With ``peft_config`` (a LoRA fine-tune) the finished meta model is wrapped by ``peft.get_peft_model`` before
step 2, and the LoRA weights are initialised by peft's own code on rank 0 and broadcast: the PeftModel is the
root unit, the decoder layers (with their LoRA weights) the others.

Each rank thus reads about ``1/world`` of the weights and holds only its shards. The parameters' full values
equal ``from_pretrained(path, dtype=...)``'s bit for bit, and so do the buffers. What cannot be done exactly
this way (quantization, keys that need transformers' weight converters such as fused MoE experts, remote code,
a model with no decoder layer classes to shard by, a checkpoint holding both sides of a tie, transformers'
own FSDP loading switched on by ACCELERATE_USE_FSDP + FSDP_CPU_RAM_EFFICIENT_LOADING) raises
:class:`~cudaload.fastload.StepAside` before the weights get storage. Missing keys are initialised as
from_pretrained initialises them, rank 0's draw broadcast to the others: each such tensor exists whole on
every rank's device until it is sharded (bounded by the missing keys, e.g. an untied head absent from the
checkpoint).

The ranks vote twice (one all_reduce each): after building the skeleton, on each rank's outcome and on a
fingerprint of the tensors it will read and initialise; and after reading. A StepAside or an error on one
rank is thus raised on every rank, and ranks that see different checkpoints fail with LoadError, instead of
some ranks going on into FSDP2's collectives that the others never join (a hung job rather than an error).

Importing this module does not import torch or transformers.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import ConfigurationError, DependencyError, LoadError
from .materialize import (
    KeyPlan,
    StepAside,
    _step_aside,
    allocate,
    build_skeleton,
    check_keys,
    clear_tracebacks,
    finish,
    load_report,
    model_class,
    plan_keys,
    prepare,
    resolve_device,
    torch_dtype,
)
from .reader import TensorInfo

if TYPE_CHECKING:
    import torch
    from peft import LoraConfig

logger = logging.getLogger(__name__)

__all__ = ["StepAside", "load_fsdp2", "shard_rows"]


def shard_rows(rows: int, world: int, rank: int) -> tuple[int, int]:
    """The rows ``[start, stop)`` of dim 0 that FSDP2 gives ``rank`` of ``world``.

    FSDP2 splits dim 0 with ``torch.chunk`` and pads the missing chunks with empty ones (torch 2.13
    distributed/fsdp/_fully_shard/_fsdp_common.py:134-140 ``_chunk_with_empty``, used at
    _fsdp_param.py:298): every chunk has ``ceil(rows / world)`` rows except the last non-empty one, and the
    ranks after it get none (7 rows on 3 ranks: 3, 3, 1; 5 rows on 4 ranks: 2, 2, 1, 0)."""
    if world < 1 or not 0 <= rank < world:
        raise ConfigurationError(f"rank {rank} of world {world}", fix="use 0 <= rank < world")
    per = -(-rows // world) if rows else 0
    start = min(rank * per, rows)
    return start, min(start + per, rows)


def _rows_info(info: TensorInfo, start: int, stop: int) -> TensorInfo:
    """The byte range of rows ``[start, stop)`` of a row-major checkpoint tensor, as a TensorInfo of its own."""
    rows = info.shape[0]
    row_bytes = info.nbytes // rows if rows else 0
    return TensorInfo(
        info.name,
        info.dtype,
        (stop - start, *info.shape[1:]),
        info.file,
        info.start + start * row_bytes,
        info.start + stop * row_bytes,
    )


@dataclass
class _Shard:
    name: str  # model key
    target: Any  # the contiguous local tensor to fill
    source: TensorInfo  # the byte range to read into it


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


def _layer_modules(model: Any) -> list[Any]:
    """The decoder layers FSDP2 wraps one by one: modules whose class is in ``_no_split_modules`` (the blocks
    transformers never splits across devices; accelerate's TRANSFORMER_BASED_WRAP uses the same classes,
    accelerate 1.15 utils/dataclasses.py FullyShardedDataParallelPlugin.set_auto_wrap_policy)."""
    names = set(getattr(model, "_no_split_modules", None) or ())
    return [m for m in model.modules() if m is not model and type(m).__name__ in names]


def _checkpoint_layers(model: Any, layers: list[Any], *, keep_names: bool = False) -> list[Any]:
    """Each layer replaced in its parent by ``checkpoint_wrapper(layer, preserve_rng_state=False)``, exactly as
    accelerate's fsdp2_apply_ac does (1.15 utils/fsdp_utils.py:719-727, ``model.set_submodule``); returns the
    wrappers, which FSDP2 then shards as the units.

    ``keep_names``: checkpoint each layer with torch's composable ``checkpoint`` instead (forward hooks; "does not
    modify model structure or fully-qualified names", torch 2.13 distributed/_composable/checkpoint_activation.py
    :38-47), for a PeftModel: peft 0.21 finds the adapters to save by module names (tuners_utils.py:1717
    _get_tuner_state_dict_key_prefixes) and matches them against the state dict's keys, which torch's
    ``get_model_state_dict`` gives without the wrapper's ``_checkpoint_wrapped_module.``: behind wrappers
    Trainer.save_model wrote an adapter file with no tensors. The RNG state is preserved (the default), so a
    LoRA dropout draws the same mask when the layer is recomputed. Returns the layers themselves."""
    if keep_names:
        from torch.distributed._composable.checkpoint_activation import checkpoint

        for layer in layers:
            checkpoint(layer)
        return list(layers)
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    wanted = {id(m) for m in layers}
    names = [n for n, m in model.named_modules() if id(m) in wanted]
    out = []
    for name in names:
        wrapped = checkpoint_wrapper(model.get_submodule(name), preserve_rng_state=False)
        model.set_submodule(name, wrapped)
        out.append(wrapped)
    return out


def _check_shardable(model: Any, root: str) -> list[Any]:
    layers = _layer_modules(model)
    if not layers:
        raise _step_aside(
            root, "the model declares no decoder layer classes (_no_split_modules) for FSDP2 to shard by"
        )
    scalars = [n for n, p in model.named_parameters() if p.ndim == 0]
    if scalars:
        # FSDP2 shards dim 0 and rejects a 0-dim parameter (torch 2.13 _fsdp_param.py:276-279)
        raise _step_aside(root, f"0-dim parameters FSDP2 cannot shard: {scalars[:4]}")
    return layers


def _check_shared_within_units(model: Any, layers: list[Any], root: str) -> None:
    """Step aside when one parameter (tied, or shared) belongs to two FSDP units, or one unit holds another.

    fully_shard gives each unit a DTensor of its own, so a tie across units is cut and the side not in the
    checkpoint is never read; torch 2.13 then raises at the first forward (_fully_shard/_fsdp_state.py:223,
    _validate_no_duplicate_params). RoBERTa as a causal LM has this: its embeddings are one of the
    _no_split_modules, the head tied to them is in the root unit. Nested units would need fully_shard bottom-up
    (accelerate 1.15 utils/fsdp_utils.py get_module_children_bottom_up): no causal LM here has them."""
    unit: dict[int, int] = {}  # id(parameter) -> the layer (unit) holding it
    inside: set[int] = set()  # modules within some layer
    for i, layer in enumerate(layers):
        subs = {id(m) for m in layer.modules()}
        if subs & inside or id(layer) in inside:
            raise _step_aside(root, f"decoder layer classes nest ({type(layer).__name__} in another)")
        inside |= subs
        for p in layer.parameters():
            if unit.setdefault(id(p), i) != i:
                raise _step_aside(
                    root, "a parameter is shared by two decoder layers: sharding per layer would cut it"
                )
    for name, module in model.named_modules():
        if id(module) in inside:
            continue
        for leaf, p in module.named_parameters(recurse=False):
            if id(p) in unit:
                raise _step_aside(
                    root,
                    f"{name}.{leaf} is tied to a parameter of a decoder layer class ({type(layers[unit[id(p)]]).__name__}"
                    ", one of _no_split_modules): sharding per layer would cut the tie",
                )


#: LoRA initialisations that draw A from peft's own reset and zero B, needing no base weight values (peft 0.21
#: tuners/lora/layer.py:332-343 ``reset_lora_parameters``, which ``update_layer`` calls for these); the others
#: (PiSSA, OLoRA, LoftQ, EVA, CorDA, orthogonal) compute from the base weights, which are on meta here, and
#: False leaves nn.Linear's init, B included (the model then differs from the base model)
_LORA_INITS: tuple[object, ...] = (True, "gaussian")

#: the peft modules holding LoRA weights in a LoraLayer (``LoraLayer.adapter_layer_names``, peft 0.21
#: tuners/lora/layer.py:110-116, less DoRA's lora_magnitude_vector, which steps aside)
_LORA_PARTS = ("lora_A", "lora_B", "lora_embedding_A", "lora_embedding_B")


def _lora_blockers(cfg: Any) -> list[str]:
    """What in a LoraConfig the sharded loader cannot build exactly on the meta device."""
    out: list[str] = []
    if type(cfg).__name__ != "LoraConfig":
        out.append(f"{type(cfg).__name__}: only LoRA adapters are built on the meta device")
        return out
    init = getattr(cfg, "init_lora_weights", True)
    if not any(init is x or (isinstance(x, str) and init == x) for x in _LORA_INITS):
        out.append(f"init_lora_weights={init!r} needs the base weights' values or leaves lora_B non-zero")
    if getattr(cfg, "use_dora", False):
        out.append("DoRA's magnitude vector is computed from the base weights' values")
    for key in ("modules_to_save", "trainable_token_indices", "layer_replication", "target_parameters"):
        if getattr(cfg, key, None):
            out.append(f"{key} copies or wraps base weights, whose values are not there before sharding")
    return out


def _wrap_lora(model: Any, cfg: Any, dev: torch.device, root: str) -> tuple[Any, int]:
    """``peft.get_peft_model(model, cfg)`` on the finished meta model, the LoRA weights then given storage on
    the CPU and initialised by peft's own ``reset_lora_parameters`` (what ``update_layer`` runs for
    ``init_lora_weights`` True or "gaussian", peft 0.21 tuners/lora/layer.py:311-312: A by kaiming-uniform or
    normal, B zeros), then moved to ``dev``.

    peft creates the adapters on the CPU, initialises them, and moves them to the base layer's device and
    dtype (layer.py:314, tuners_utils.py:2168-2212 ``_move_adapter_to_device_of_base_layer``): on meta here,
    so the draw is lost and is made again; ``cast_adapter_dtype`` (tuners_utils.py:2705-2745, get_peft_model's
    default autocast_adapter_dtype=True) has already made them float32, as on a real model. Each rank draws
    from its own generator; ``_agree_on_initialised`` then broadcasts rank 0's. Until sharding every rank
    holds every adapter whole in float32 on ``dev``: r x (in + out) per wrapped linear, 0.4 GB for a 70B at
    r=8. Returns the PeftModel and how many LoRA tensors it initialised; steps aside on what it cannot build
    exactly."""
    import torch

    try:
        from peft import get_peft_model
        from peft.tuners.lora import LoraLayer
    except ImportError as e:
        raise DependencyError(
            "a LoRA fine-tune needs peft", reasons=[str(e)], fix="pip install 'cudaload[peft]'"
        ) from None
    blockers = _lora_blockers(cfg)
    if blockers:
        raise _step_aside(root, f"the LoRA configuration: {'; '.join(blockers)}")
    before = {id(p) for p in model.parameters()}
    wrapped = get_peft_model(model, cfg)
    made: set[int] = set()
    with torch.no_grad():
        for module in wrapped.modules():
            if not isinstance(module, LoraLayer):
                continue
            parts = [getattr(module, n) for n in _LORA_PARTS if hasattr(module, n)]
            for part in parts:
                part.to_empty(device="cpu")  # the meta adapters' shapes and float32 dtype, with storage
            for adapter in {*module.lora_A.keys(), *module.lora_embedding_A.keys()}:
                module.reset_lora_parameters(adapter, cfg.init_lora_weights)
            base_dtype = getattr(getattr(module.get_base_layer(), "weight", None), "dtype", None)
            for part in parts:
                if base_dtype is not None and base_dtype.is_floating_point:
                    # peft draws in float32, moves the adapter to the base layer's dtype and upcasts it again
                    # (update_layer -> _move_adapter_to_device_of_base_layer, tuners_utils.py:2183-2210; then
                    # cast_adapter_dtype): on a bf16 base its values are bf16's, in float32
                    for t in part.parameters():
                        t.copy_(t.to(base_dtype))
                part.to(dev)
                made |= {id(t) for t in part.parameters()}
    # anything else new (a copy of a base module, a magnitude vector) would be left on meta, never read
    other = [n for n, p in wrapped.named_parameters() if id(p) not in before and id(p) not in made]
    if other:
        raise _step_aside(root, f"peft added parameters that are not LoRA weights: {other[:4]}")
    return wrapped, len(made)


def _fsdp_env_on() -> bool:
    """transformers' FSDP1 loading switch (5.17 distributed/fsdp.py:41-47): when it is on, its
    ``_finalize_model_loading`` zero-fills every tensor on the CPU on ranks other than each node's local 0
    (modeling_utils.py:4718-4724) and skips initialising them (:4757-4769): neither is wanted here."""
    import transformers.integrations as hf_integrations

    is_fsdp_enabled = getattr(hf_integrations, "is_fsdp_enabled", None)
    return bool(is_fsdp_enabled is not None and is_fsdp_enabled())


def _check_lora_sharding(root: str, peft_config: Any, world: int) -> None:
    """What a sharded LoRA model cannot yet train right (found with a real Trainer on 2 gloo ranks,
    tests/test_sharded_lora.py test_trainer_trains_and_saves_the_sharded_adapters): steps aside on every rank."""
    ranks = [
        int(getattr(peft_config, "r", 8) or 8),
        *(int(v) for v in (getattr(peft_config, "rank_pattern", None) or {}).values()),
    ]
    if min(ranks) < world:
        # some ranks' lora_A shards would be empty; accelerate 1.15 maps the optimizer's parameters to the
        # sharded ones by data_ptr (utils/fsdp_utils.py:670-698), which empty shards share
        raise _step_aside(
            root,
            f"LoRA rank r={min(ranks)} below the {world} ranks: empty adapter shards, which accelerate's optimizer "
            "swap cannot tell apart",
        )


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
    ``peft_config``: a peft ``LoraConfig``: the finished meta model is wrapped by ``peft.get_peft_model`` before
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
    from . import staging

    t0 = time.perf_counter()
    dev = resolve_device(device) if device is not None else _default_device(dist)
    threads = threads or staging.default_threads()
    buffer_bytes = buffer_bytes or staging.DEFAULT_BUFFER_BYTES
    if threads < 1 or buffer_bytes < 1 << 16:
        raise ConfigurationError(
            f"threads={threads}, buffer_bytes={buffer_bytes} out of range",
            fix="use threads >= 1 and buffer_bytes >= 64 KiB",
        )
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
            raise _step_aside(
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
            raise _step_aside(root, f"the checkpoint holds both sides of tied weights ({both[0]})")
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
            model, lora_tensors = _wrap_lora(model, peft_config, dev, root)
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
                raise _step_aside(root, "fully_shard did not make the root an FSDPModule")
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


class _Vote:
    """Where the ranks agree that all of them got this far: each rank's outcome (ok, stepped aside, failed) and a
    fingerprint of what it built, summed over the mesh's group in one all_reduce (gloo and NCCL both have it;
    a tensor on the mesh's device type, which NCCL needs)."""

    OK, STEPPED_ASIDE, FAILED = 0, 1, 2

    def __init__(self, dist: Any, mesh: Any, rank: int, world: int, dev: torch.device) -> None:
        import torch

        self.dist, self.group, self.rank, self.world = dist, mesh.get_group(), rank, world
        kind = mesh.device_type
        if dev.type == kind:
            self.device = dev  # this rank's GPU under NCCL, not whichever device is current
        elif kind == "cuda":
            self.device = torch.device("cuda", torch.cuda.current_device())
        else:
            self.device = torch.device(kind)

    def agree(self, failure: Exception | None, fingerprint: int, stage: str) -> None:
        """Raise ``failure`` on its rank, and on every other rank a StepAside (when every rank that stopped
        stepped aside: the whole-model load is then taken on every rank alike) or a LoadError naming the rank."""
        import torch

        code = (
            self.OK
            if failure is None
            else self.STEPPED_ASIDE
            if isinstance(failure, StepAside)
            else self.FAILED
        )
        t = torch.zeros(2 * self.world, dtype=torch.int64, device=self.device)
        t[self.rank] = code
        t[self.world + self.rank] = fingerprint
        self.dist.all_reduce(t, group=self.group)
        codes, prints = t[: self.world].tolist(), t[self.world :].tolist()
        if failure is not None:
            raise failure
        stopped = [r for r, c in enumerate(codes) if c != self.OK]
        if stopped:
            first = stopped[0]
            why = f"rank {first} of {self.world} could not go on {stage}"
            if all(codes[r] == self.STEPPED_ASIDE for r in stopped):
                raise StepAside(
                    f"fast loading steps aside: {why} (it stepped aside)", fix="load it with from_pretrained"
                )
            raise LoadError(
                f"sharded FSDP2 loading stopped: {why} (it raised an error; its log says which)",
                fix=f"fix what rank {first} reports (every rank must see the same checkpoint files)",
            )
        if len(set(prints)) > 1:
            odd = [r for r, f in enumerate(prints) if f != prints[0]]
            raise LoadError(
                f"the ranks read different checkpoints: ranks {odd[:8]} see other tensors than rank 0 "
                "(names, shapes, dtypes or missing keys differ)",
                fix="give every rank the same checkpoint files (one path on a shared file system, or identical "
                "copies on every node)",
            )


def _fingerprint(model: Any, keys: KeyPlan, tensors: Mapping[str, TensorInfo]) -> int:
    """What this rank will read and what it initialised itself, as 62 bits (hashlib, not hash(): that is salted
    per process). Ranks that agree on it read the same tensors and broadcast the same initialised ones."""
    import hashlib

    h = hashlib.sha256()
    for name in sorted(keys.load):
        t = tensors[keys.load[name]]
        h.update(f"{name}={t.name}:{t.dtype}:{tuple(t.shape)};".encode())
    for name, p in model.named_parameters():
        if p.device.type != "meta":
            h.update(f"init {name}:{p.dtype}:{tuple(p.shape)};".encode())
    return int.from_bytes(h.digest()[:8], "little") >> 2


def _finish_on_meta(model: Any, keys: KeyPlan, prep: Any, dev: torch.device, dtype: torch.dtype) -> Any:
    """Give every checkpoint-loaded tensor a meta stand-in of its load dtype, flagged loaded (the fast path's
    ``allocate`` on the meta device), then run from_pretrained's finishing (``materialize.finish``) with those
    stand-ins left on meta: tying, the initialisation of missing keys and non-persistent buffers (on ``dev``,
    whole) and the load report are transformers' own. transformers' init functions skip a tensor flagged
    ``_is_hf_initialized`` (transformers 5.17 initialization.py:45-71, e.g. ``normal_`` at :53), so the meta
    stand-ins are left alone."""
    import torch

    allocate(model, keys, prep.header, torch.device("meta"), dtype)
    try:
        return finish(model, keys, prep.options, prep.model_kwargs, dev, dtype, pending=keys.load.keys())
    except (StepAside, ConfigurationError):
        raise
    except Exception as e:  # e.g. a model's _init_weights that reads values: it needs real tensors
        raise _step_aside(
            prep.options.path, f"finishing the load on the meta device failed ({type(e).__name__}: {e})"
        ) from e


def _agree_on_initialised(model: Any, dist: Any, mesh: Any) -> None:
    """Parameters initialised here rather than read (missing or size-mismatched keys) were drawn from each
    rank's own random generator: take rank 0's, so every rank shards the same tensor."""
    real = [p for p in model.parameters() if p.device.type != "meta"]
    group = mesh.get_group()
    src = dist.get_global_rank(group, 0)
    for p in real:
        dist.broadcast(p.data, src=src, group=group)


def _real_tensors(model: Any) -> dict[str, Any]:
    """Tensors already holding values after ``fully_shard`` (non-persistent buffers, initialised missing
    parameters' local shards): ``to_empty`` replaces them with uninitialised storage, so keep them to put back.
    Keyed by every name (tied parameters under each)."""
    out: dict[str, Any] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        local = _local(p)
        if local.device.type != "meta":
            out[name] = local
    for name, b in model.named_buffers(remove_duplicate=False):
        if b.device.type != "meta":
            out[name] = b
    return out


def _restore(model: Any, kept: Mapping[str, Any], buffer_device: torch.device) -> None:
    """Put back what ``to_empty`` replaced: parameters' values into their new local shards, buffers as they
    were; the other buffers (read from the checkpoint next) get uninitialised storage on ``buffer_device``."""
    import torch

    buffers = dict(model.named_buffers(remove_duplicate=False))
    made: dict[int, Any] = {}  # a buffer under two names stays one tensor
    with torch.no_grad():
        for name, old in kept.items():
            if name not in buffers:
                owner, _, leaf = name.rpartition(".")
                _local(getattr(model.get_submodule(owner), leaf)).copy_(old)
        for name, buf in buffers.items():
            owner, _, leaf = name.rpartition(".")
            module = model.get_submodule(owner)
            if name in kept:
                module._buffers[leaf] = kept[name]
            elif buf.device != buffer_device:
                if id(buf) not in made:
                    made[id(buf)] = torch.empty_like(buf, device=buffer_device)
                module._buffers[leaf] = made[id(buf)]


def _local(t: Any) -> Any:
    """The local shard of an FSDP2 parameter (a DTensor), or the tensor itself."""
    return t._local_tensor if hasattr(t, "_local_tensor") else t


def _plan_shards(
    model: Any,
    base_modules: Mapping[int, list[str]],
    keys: KeyPlan,
    tensors: Mapping[str, TensorInfo],
    world: int,
    rank: int,
    root: str,
) -> list[_Shard]:
    """What this rank reads: for each sharded parameter, its rows of the checkpoint tensor into its local
    shard; for each buffer, the whole tensor. A tensor reached under two names (tied) is read once.
    ``base_modules``: id(module) -> its names in the model transformers built, before a checkpoint wrapper or
    PEFT renamed them (their own modules, e.g. lora_A, hold nothing from the checkpoint)."""
    from torch.distributed.tensor import DTensor, Shard

    params: dict[str, Any] = {}
    buffers: dict[str, Any] = {}
    for module in model.modules():
        names = base_modules.get(id(module), ())
        for leaf, p in module.named_parameters(recurse=False):
            for b in names:
                params[f"{b}.{leaf}" if b else leaf] = p
        for leaf, t in module.named_buffers(recurse=False):
            for b in names:
                buffers[f"{b}.{leaf}" if b else leaf] = t
    seen: set[int] = set()
    out: list[_Shard] = []
    for name, src in keys.load.items():
        t = params.get(name, buffers.get(name))
        if t is None:
            raise _step_aside(root, f"{name!r} is neither a parameter nor a buffer after sharding")
        if id(t) in seen:
            continue  # one tensor under two names: read once
        seen.add(id(t))
        info = tensors[src]
        if isinstance(t, DTensor):
            if tuple(t.placements) != (Shard(0),):
                raise _step_aside(root, f"{name!r} is sharded as {t.placements}, not on dim 0")
            local = t._local_tensor
            start, stop = shard_rows(info.shape[0], world, rank)
            expect = (stop - start, *info.shape[1:])
            if tuple(local.shape) != expect or not local.is_contiguous():
                raise _step_aside(
                    root,
                    f"{name!r}: FSDP2 gave rank {rank} a local shard of {tuple(local.shape)}, "
                    f"rows {start}:{stop} of {info.shape} expected",
                )
            if stop > start:
                out.append(_Shard(name, local, _rows_info(info, start, stop)))
        else:
            if math.prod(t.shape) and not t.is_contiguous():
                raise _step_aside(root, f"buffer {name!r} is not contiguous")
            out.append(_Shard(name, t, info))
    return out
