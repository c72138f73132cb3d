"""Legal, and probably not what was meant: each warned once, at the caller's line (:func:`warn_suspicious`); options
with no effect on the machine planned for, and this machine's variables that point nowhere (:func:`warn_machine`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .. import _env
from .fields import RequestFields
from .machine import has_no_gpu, this_machine_has_no_gpu
from .model import context_length, is_local
from .options import TRAINING_INTENTS
from .placement import max_memory_bytes, names_cuda
from .warn import warn

#: a max_memory entry below this is bytes meant as MiB or GiB, most likely
_TINY_BYTES = 1 << 20


def warn_suspicious(req: RequestFields, config: Mapping[str, Any] | None) -> None:
    """Legal, and probably not what was meant: each warned once (see the package docstring)."""
    if req.intent in TRAINING_INTENTS and (req.new_tokens is not None or req.padded):
        warn(
            f"new_tokens= and padded= describe generate() calls; intent={req.intent!r} trains and ignores them: "
            "drop them"
        )
    elif req.entry != "tune" and not req.declares_work and (req.new_tokens is not None or req.padded):
        warn(
            "new_tokens= and padded= count only with both batch_size= and seq_len= (the declared work: the "
            "measured attention timings, and the decode plan's longest sequence and batch): pass both, or "
            "drop them"
        )
    if req.tune_budget_s is not None and req.entry == "load_model" and not req.tune:
        warn("tune_budget_s= has no effect without tune=True: pass tune=True, or drop tune_budget_s=")
    if req.tune and (req.attn != "auto" or req.intent != "inference"):
        warn(
            "tune=True measures attention for inference with attn='auto'; with "
            f"attn={req.attn!r}, intent={req.intent!r} nothing is measured: drop tune=True"
        )
    if req.tokens_per_step is not None and req.seq_len is not None and req.tokens_per_step < req.seq_len:
        warn(
            f"tokens_per_step={req.tokens_per_step} is fewer tokens than one sequence (seq_len={req.seq_len}): "
            f"a packed step must hold the longest sequence; pass tokens_per_step={req.seq_len} or more"
        )
    if "*" in req.trust_kernels:
        warn(
            "trust_kernels=['*'] lets code from every Hub kernel publisher run in this process: name the "
            "publishers (trust_kernels=['kernels-community/*'])"
        )
    limit = context_length(config)
    if limit is not None and req.seq_len is not None and req.seq_len > limit:
        warn(
            f"seq_len={req.seq_len} is longer than the model's context (max_position_embeddings {limit}): "
            f"positions past it were never trained; pass seq_len={limit} or less"
        )
    if names_cuda(req.device_map) and req.device_map != "cpu" and has_no_gpu(req.hardware, req.env):
        warn(
            f"device_map={req.device_map!r} names a GPU, and this machine has none: the model loads on the "
            "CPU; pass device_map='cpu' to say so, or run where a GPU is visible"
        )
    warn_machine(req, config)
    for key, size in max_memory_bytes(req.max_memory).items():
        if 0 < size < _TINY_BYTES:
            warn(
                f"max_memory[{key!r}] is {size} bytes, less than 1 MiB: sizes without a unit are bytes; "
                f"write the unit ({size!r} -> '{size}GiB' or '{size}MiB')"
            )


def warn_machine(req: RequestFields, config: Mapping[str, Any] | None) -> None:
    """Options with no effect on the machine planned for, and this machine's variables that point nowhere."""
    here = req.hardware is None  # this machine, detected when planning
    cvd = _env.cuda_visible_devices(req.env)
    if here and cvd and cvd.strip() and not cvd.strip().startswith("-") and this_machine_has_no_gpu(req.env):
        # detection finds the same (cvd-no-gpu) and the plan lists it among its warnings, which nobody sees
        warn(
            f"CUDA_VISIBLE_DEVICES={cvd!r} selects GPUs, and this machine has no NVIDIA GPU (no NVIDIA driver is "
            "loaded): the model loads on the CPU; unset CUDA_VISIBLE_DEVICES (or set it empty) to run on the "
            "CPU, or run where a GPU is visible"
        )
    no_gpu = has_no_gpu(req.hardware, req.env)
    machine = "this machine" if here else f"hardware={req.hardware.source.split(':', 1)[-1]!r}"
    if req.kernels is True and no_gpu:
        warn(
            f"kernels=True: Hub layer kernels run on CUDA GPUs, and {machine} has none, so none is used; drop "
            "kernels=, or plan for a GPU (hardware='H100')"
        )
    if req.tune and here and no_gpu:
        warn(
            "tune=True times attention backends on a CUDA GPU, and this machine has none: nothing is measured "
            "and the plan follows its rules; drop tune=True"
        )
    launch = _env.launch(req.env)
    if here and (launch.local_rank is not None or (launch.world_size or 0) > 1) and no_gpu:
        name = "LOCAL_RANK" if launch.local_rank is not None else "WORLD_SIZE"
        warn(
            f"{name}={getattr(launch, name.lower())} makes this process a rank, and this machine has no GPU: "
            "every rank loads its own whole copy on the CPU; run where each rank has a GPU, or unset "
            "LOCAL_RANK and WORLD_SIZE for one process"
        )
    if req.revision is not None and req.entry != "tune" and is_local(req.model):
        warn(
            f"revision={req.revision!r} has no effect: model= is read from the local disk as it is; drop "
            "revision=, or pass the Hub id (model='org/name') to read that revision"
        )
    if req.intent == "serving" and req.batch_size is not None:
        from ..policies.serving.kv_cache import TF_MAX_REQUESTS

        if req.batch_size > TF_MAX_REQUESTS:
            warn(
                f"batch_size={req.batch_size} concurrent requests: transformers' continuous batching runs at "
                f"most {TF_MAX_REQUESTS} at once (transformers continuous_batching/initialization.py:32; max_batch_tokens "
                f"caps them further) and queues the rest; declare the requests served at once "
                f"(batch_size={TF_MAX_REQUESTS} or fewer)"
            )
