"""FSDP2 loading in which every rank reads only its own shard of each weight from the checkpoint files.

    import torch.distributed as dist
    dist.init_process_group("nccl")          # torchrun sets RANK, WORLD_SIZE, MASTER_ADDR...
    model = cudaload.fastload.sharded.load_fsdp2(path, dtype=torch.bfloat16)   # an FSDPModule

Loading a model whole on every rank and then sharding it needs ``local ranks x model`` of host memory (a 70B
model on 8 ranks: over 1 TiB). Here the model never exists whole anywhere:

1. the skeleton is built on the meta device exactly as the fast path builds it
   (:mod:`cudaload.fastload.materialize`: ``prepare``, ``build_skeleton``, ``plan_keys``, ``check_keys``), and
   finished on meta the way ``from_pretrained`` finishes (transformers' own ``_finalize_model_loading``: tied
   weights tied, missing keys initialised, non-persistent buffers such as rotary ``inv_freq`` recomputed by
   transformers' ``_init_weights``);
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

Where each part lives (``from cudaload.fastload.sharded import load_fsdp2, shard_rows, StepAside``):

* :mod:`.loading`: :func:`load_fsdp2`, the steps above in order;
* :mod:`.units`: the decoder layers as FSDP2 units and the checks on them, activation checkpointing, the
  finishing on meta, the tensors kept across ``to_empty``;
* :mod:`.lora`: the LoRA adapters built on the meta model (``peft_config``);
* :mod:`.vote`: the ranks' two votes;
* :mod:`.rows`: which rows, and so which bytes, each rank reads (:func:`shard_rows`).

Importing this package does not import torch or transformers.
"""

from __future__ import annotations

from ..materialize import StepAside
from .loading import load_fsdp2
from .rows import shard_rows

__all__ = ["StepAside", "load_fsdp2", "shard_rows"]
