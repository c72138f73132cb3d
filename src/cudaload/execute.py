"""Execute a Plan: the only module that asks transformers to load weights.

``load_model()`` = detect -> plan -> load (cudaload's fast path or ``from_pretrained``) -> probe the attention
backend -> verify -> (PEFT-wrap) -> hand back the model with ``model.cudaload_plan`` attached.
Failures are translated into cudaload's error tree *after* the failed attempt's tensors are released, so a
failed load leaves GPU memory where it was.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from . import probes
from .capabilities import Capabilities
from .decision import Decision
from .errors import (
    CheckpointError,
    ConfigurationError,
    CudaloadError,
    DependencyError,
    DeviceSelectionError,
    DoesNotFitError,
    LoadError,
    ModelNotFoundError,
    VerificationError,
)
from .plans import Placement, Plan
from .policies.sdpa_dispatch import NAMES as SDPA_VARIANTS
from .prefetch import MODES as _PREFETCH_MODES

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)

#: task / model_class shorthands -> transformers auto class
AUTO_CLASSES = {
    "causal-lm": "AutoModelForCausalLM",
    "text-generation": "AutoModelForCausalLM",
    "feature-extraction": "AutoModel",
    "embedding": "AutoModel",
    "base": "AutoModel",
    "masked-lm": "AutoModelForMaskedLM",
    "fill-mask": "AutoModelForMaskedLM",
    "sequence-classification": "AutoModelForSequenceClassification",
    "text-classification": "AutoModelForSequenceClassification",
    "token-classification": "AutoModelForTokenClassification",
    "question-answering": "AutoModelForQuestionAnswering",
    "seq2seq": "AutoModelForSeq2SeqLM",
    "text2text-generation": "AutoModelForSeq2SeqLM",
    "image-text-to-text": "AutoModelForImageTextToText",
    "vision-language": "AutoModelForImageTextToText",
}

# detection findings that make "which GPU" ambiguous or wrong; load_model refuses to guess past them
_DEVICE_FINDINGS = {"cvd-unmatched", "cvd-duplicate", "cvd-after-init", "local-rank"}

# from_pretrained keywords that cudaload decides; passing them twice would make the plan a lie.
_DECIDED = {
    "dtype",
    "torch_dtype",
    "attn_implementation",
    "device_map",
    "max_memory",
    "use_kernels",
    "kernel_config",
}

# transformers' from_pretrained temporarily switches torch's process-wide default dtype while it builds the
# model, so two loads racing in threads can build each other's modules in the wrong dtype. Building and
# filling happen inside one call on both paths, so threaded loads are serialised: correct before concurrent.
_BUILD_LOCK = threading.RLock()


class _Phases:
    """Seconds spent in each step of one load_model() call, in order."""

    def __init__(self) -> None:
        self._last = self._start = time.perf_counter()
        self._spent: dict[str, float] = {}

    def mark(self, name: str) -> None:
        now = time.perf_counter()
        self._spent[name] = round(now - self._last, 4)
        self._last = now

    def as_dict(self, fastload: Mapping[str, Any] | None) -> dict[str, float]:
        out = dict(self._spent)
        # the fast path's own split of "load": skeleton, GPU storage, read+copy, finish; the quantized fast path
        # reports its unquantized tensors (plain) and its layer-by-layer read+quantize instead of alloc/fill
        if fastload:
            for key in ("build_s", "alloc_s", "fill_s", "plain_s", "quantize_s", "finish_s"):
                if key in fastload:
                    out[f"load.{key.removesuffix('_s')}"] = fastload[key]
        out["total"] = round(time.perf_counter() - self._start, 4)
        return out


def resolve_auto_class(model_class: str | None, task: str | None, plan: Plan) -> str:
    """The transformers auto class name to load with."""
    if model_class and task:
        raise ConfigurationError("pass model_class or task, not both", fix="drop one of them")
    if model_class:
        return model_class
    if task:
        try:
            return AUTO_CLASSES[task]
        except KeyError:
            raise ConfigurationError(
                f"unknown task {task!r}",
                fix=f"use one of {', '.join(sorted(AUTO_CLASSES))} or pass model_class=",
            ) from None
    # An encoder has no causal-LM head: AutoModelForCausalLM would bolt a random one on.
    return "AutoModel" if plan.model.is_encoder else "AutoModelForCausalLM"


def _torch_dtype(name: str) -> torch.dtype:
    import torch

    return {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}[name]


def _gpu_memory_snapshot() -> dict[int, int]:
    import torch

    if not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return {}
    return {i: torch.cuda.memory_allocated(i) for i in range(torch.cuda.device_count())}


def _release_memory() -> None:
    """Drop what a failed attempt left: unreachable tensors, then the allocator's cached blocks."""
    import torch

    gc.collect()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def _translate(exc: BaseException, where: str) -> CudaloadError:
    """A dependency's exception as cudaload's; carries the text, not the traceback (which pins tensors)."""
    if isinstance(exc, CudaloadError):
        exc.__traceback__ = None
        return exc
    text = f"{type(exc).__name__}: {exc}"
    low = text.lower()
    name = type(exc).__name__
    if name == "OutOfMemoryError" or "out of memory" in low:
        return DoesNotFitError(
            f"{where} ran out of GPU memory",
            reasons=[text],
            fix="quantize (quantization='nf4'), shorten seq_len, add GPUs, or free memory held by other processes",
        )
    if "safetensor" in low or ("header" in low and "deserializ" in low) or "incomplete metadata" in low:
        return CheckpointError(
            f"{where}: the checkpoint is corrupt or truncated",
            reasons=[text],
            fix="re-download or re-save the checkpoint (a partial download leaves truncated .safetensors files)",
        )
    if "unrecognized model" in low or ("model_type" in low and "key" in low):
        # transformers' message lists every model type it knows (~10 KB): keep the line that names this one
        import re

        m = re.search(r"model_type[\"']?\s*[:=]?\s*['\"]?([\w.-]+)|identifier:?\s*['\"]?([\w.-]+)", text)
        mtype = next((str(g) for g in (m.groups() if m else ()) if g), None)
        if mtype:
            import transformers
            from transformers.models.auto import configuration_auto

            known = configuration_auto.CONFIG_MAPPING_NAMES  # type: ignore[attr-defined]

            from .errors import unknown_model_type

            err = unknown_model_type(mtype, known, transformers.__version__)
            err.message = f"{where}: {err.message}"
            return err
        return CheckpointError(
            f"{where}: unknown model type",
            reasons=[text[:300]],
            fix="upgrade transformers, or check config.json's model_type",
        )
    if isinstance(exc, (FileNotFoundError, OSError)) and (
        "does not appear to have" in low
        or "no such file" in low
        or "not a valid model identifier" in low
        or "can't load" in low
        or "offline" in low
    ):
        return ModelNotFoundError(
            f"{where}: model files not found",
            reasons=[text],
            fix="check the path, or download the model once with network access (it is then used offline)",
        )
    if isinstance(exc, ImportError):
        return DependencyError(
            f"{where} needs a package that is missing or broken",
            reasons=[text],
            fix="install the package named above, or choose another option",
        )
    return LoadError(
        f"{where} failed", reasons=[text], fix="see the reason above; rerun with -v for the plan"
    )


def _from_pretrained(auto_class: str, path: str, kwargs: dict[str, Any]) -> Any:
    import transformers

    cls = getattr(transformers, auto_class, None)
    if cls is None:
        raise ConfigurationError(
            f"transformers has no {auto_class}", fix="pass a transformers auto class name"
        )
    with _BUILD_LOCK:
        return cls.from_pretrained(path, **kwargs)


def _load_kwargs(plan: Plan, passthrough: Mapping[str, Any]) -> dict[str, Any]:
    kw: dict[str, Any] = {"trust_remote_code": False, **passthrough}
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


def _fsdp_weights_on_cpu(plan: Plan) -> bool:
    par = plan.parallelism
    return bool(par is not None and par.launched and par.config.get("weights_on_cpu"))


#: Why an FSDP rank whose weights fit no GPU whole loads them plainly on its CPU, not through transformers' own
#: FSDP loading (is_fsdp_enabled: a process group plus ACCELERATE_USE_FSDP and FSDP_CPU_RAM_EFFICIENT_LOADING,
#: 5.17 distributed/fsdp.py:41-47). That path reads the checkpoint on every rank too and in 5.17-5.22 then
#: writes zeros over it on all but each node's local rank 0 (modeling_utils.py:4718-4724): no host memory saved
#: (zeros_like writes its pages), and a Trainer built without cpu_ram_efficient_loading would shard those zeros
#: and train them without a word. From 5.23 it keeps the weights on every rank, as this does on every version.
_STAGED_NOTE = (
    "FSDP: the weights fit no GPU whole, so this rank loaded them on its CPU (every rank holds them); the Trainer "
    "shards the model onto the GPUs, and with training_arguments(plan)'s cpu_ram_efficient_loading accelerate "
    "sends each rank its part of rank 0's weights"
)


def _fsdp_sharded(plan: Plan) -> bool:
    """The plan's FSDP2 ranks each read only their own shards (cudaload.fastload.sharded.load_fsdp2)."""
    par = plan.parallelism
    return bool(
        _fsdp_weights_on_cpu(plan)
        and par
        and par.config.get("sharded_load")
        and plan.load_path.choice == "fast"
    )


def _load_sharded(plan: Plan, auto_class: str, passthrough: Mapping[str, Any], notes: list[str]) -> Any:
    """load_fsdp2 as the Trainer's FSDP2 set-up would have left the model: under bf16, float32 master
    parameters (accelerate 1.15 utils/fsdp_utils.py:815-820 upcasts the trainable ones) computed in bf16
    (the MixedPrecisionPolicy accelerate builds from mixed_precision, utils/dataclasses.py:2135-2143), because
    fsdp2_prepare_model hands an FSDPModule back untouched (utils/fsdp_utils.py:763-767). For intent "lora" the
    PeftModel is built before sharding and is the FSDPModule: a frozen base in the plan's dtype, float32 LoRA
    weights computed in bf16 (FSDP2 wants one original dtype among a unit's trainable parameters only, torch
    2.13 _fully_shard/_fsdp_param_group.py:276-286; with param_dtype set every all-gather input is cast to it,
    and an all-gather of mixed input dtypes goes as bytes, _fsdp_collectives.py:789-800). What it did is
    appended to ``notes`` (also when the load then steps aside)."""
    import torch
    import torch.distributed as dist

    from .fastload import StepAside

    cuda = torch.cuda.is_available()
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if cuda:
        torch.cuda.set_device(local)
    created = not dist.is_initialized()
    if created:
        backend = "nccl" if cuda else "gloo"
        # env://: torchrun's RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT. device_id binds NCCL to this rank's GPU:
        # the communicator is formed now (a broken NCCL set-up fails here, not in the first collective) and
        # barriers know their device (torch 2.13 distributed_c10d.py:1741-1750, :5311-5332)
        device_id = torch.device("cuda", local) if cuda else None
        dist.init_process_group(backend, device_id=device_id)
        notes.append(f"initialised the default process group ({backend}) from torchrun's environment")
    try:
        return _load_fsdp2_for_plan(plan, auto_class, passthrough, notes, local, cuda)
    except StepAside:
        raise  # every rank steps aside alike (load_fsdp2's votes): the whole-model load still needs the group
    except BaseException:
        # every rank fails alike (load_fsdp2's votes): a group started here is not left behind for a caller that
        # catches the error (torch warns at exit about a group never destroyed)
        if created and dist.is_initialized():
            dist.destroy_process_group()
        raise


def _load_fsdp2_for_plan(
    plan: Plan, auto_class: str, passthrough: Mapping[str, Any], notes: list[str], local: int, cuda: bool
) -> Any:
    import torch
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy

    from .fastload.sharded import load_fsdp2

    want = plan.dtype.choice or "float32"
    # LoRA: the frozen base stays in the plan's dtype (what load_model's whole-model path loads and accelerate
    # leaves alone: it upcasts trainable parameters only, 1.15 utils/fsdp_utils.py:816-820), the adapters are
    # float32 (peft's autocast_adapter_dtype). A full fine-tune: float32 masters, as accelerate's upcast gives.
    lora = plan.intent == "lora"
    peft_config = _lora_config(plan) if lora else None
    policy = None
    if want != "float32":
        bf = _torch_dtype(want)
        policy = MixedPrecisionPolicy(param_dtype=bf, reduce_dtype=bf, output_dtype=bf)
    # fsdp2_offload: fsdp_config cpu_offload, which accelerate turns into CPUOffloadPolicy() (1.15
    # utils/dataclasses.py:2184-2189); pinning needs CUDA
    par = plan.parallelism
    offload = CPUOffloadPolicy(pin_memory=cuda) if par is not None and par.choice == "fsdp2_offload" else None
    fsdp_config = dict((par.config.get("training_arguments") or {}).get("fsdp_config") or {}) if par else {}
    path = plan.model.local_path or plan.model.name
    with _BUILD_LOCK:
        model = load_fsdp2(
            path,
            dtype=_torch_dtype(want) if lora else torch.float32,
            auto_class=auto_class,
            device=f"cuda:{local}" if cuda else "cpu",
            mp_policy=policy,
            offload_policy=offload,
            # what fsdp_config asks accelerate for; training_arguments(plan) then leaves it out
            activation_checkpointing=bool(fsdp_config.get("activation_checkpointing")),
            peft_config=peft_config,
            attn_implementation=plan.attention.choice,
            **passthrough,
        )
    info = model.cudaload_fastload
    notes.append(
        f"FSDP2: this rank read {info['bytes'] / 1e9:.3f} of {info['checkpoint_bytes'] / 1e9:.3f} GB (its rows of "
        f"each weight, 1/{info['sharded']['world']}) onto {info['device']}; "
        + (
            f"LoRA ({info['sharded']['lora_tensors']} float32 adapter tensors, peft's initialisation, rank 0's "
            f"draw) on the frozen {want} base, wrapped by peft before sharding"
            if lora
            else "float32 master parameters"
        )
        + (f", computed in {want} (MixedPrecisionPolicy)" if policy is not None else "")
        + ("; the shards stay in host memory (CPUOffloadPolicy)" if offload is not None else "")
    )
    return model


def _load_once(plan: Plan, auto_class: str, passthrough: Mapping[str, Any]) -> tuple[Any, str, list[str]]:
    """Load by the planned path; the fast path steps aside to from_pretrained on anything it cannot do
    exactly as from_pretrained does, and fails only where from_pretrained fails too (corrupt checkpoint,
    mismatched shapes without ignore_mismatched_sizes)."""
    path = plan.model.local_path or plan.model.name
    notes: list[str] = []
    if _fsdp_sharded(plan):
        from .fastload import StepAside

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
        from . import fastload

        try:
            with _BUILD_LOCK:
                if plan.quantization.choice:
                    from .fastload.quantized import load_quantized

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
            from .fastload.quantized import StepAside as QuantizedStepAside

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


def _module_devices(model: Any) -> dict[str, set[str]]:
    """device -> names of modules with parameters or buffers there."""
    out: dict[str, set[str]] = {}
    for name, t in [*model.named_parameters(), *model.named_buffers()]:
        module = name.rsplit(".", 1)[0] if "." in name else name
        out.setdefault(str(t.device), set()).add(module)
    return out


def verify(model: Any, plan: Plan, *, allow_offload: bool) -> dict[str, Any]:
    """Check the loaded model against the plan; raise VerificationError naming what differs."""
    import torch

    problems: list[str] = []
    devices = _module_devices(model)
    planned = {d if ":" in d or d == "cpu" else f"{d}:0" for d in plan.placement.devices}
    if "meta" in devices:
        problems.append(f"modules left on the meta device (never loaded): {sorted(devices['meta'])[:8]}")
    device_map = getattr(model, "hf_device_map", None) or {}
    offloaded = sorted(k for k, v in device_map.items() if str(v) in ("cpu", "disk"))
    if offloaded and not (allow_offload or plan.placement.offload):
        problems.append(f"modules offloaded to cpu/disk without permission: {offloaded[:8]}")
    elsewhere = {d: m for d, m in devices.items() if d != "meta" and d not in planned}
    if elsewhere and not (allow_offload or plan.placement.offload):
        for d, mods in elsewhere.items():
            problems.append(f"modules on {d}, which the plan did not place anything on: {sorted(mods)[:8]}")

    want = plan.dtype.choice or "float32"
    by_dtype: dict[str, int] = {}
    for p in model.parameters():
        name = str(p.dtype).removeprefix("torch.")
        by_dtype[name] = by_dtype.get(name, 0) + p.numel()
    floating = {k: v for k, v in by_dtype.items() if getattr(torch, k).is_floating_point}
    mostly = max(floating, key=lambda k: floating[k]) if floating else None
    # a sharded FSDP2 load keeps float32 master parameters and computes in the plan's dtype
    compute = ((getattr(model, "cudaload_fastload", None) or {}).get("sharded") or {}).get("param_dtype")
    if mostly is not None and mostly != want and compute != want:
        problems.append(f"parameters are mostly {mostly}, the plan said {want}")

    attn = getattr(model.config, "_attn_implementation", None)
    if plan.attention.choice and attn != plan.attention.choice:
        problems.append(f"attention implementation is {attn!r}, the plan said {plan.attention.choice!r}")

    quant = None
    if getattr(model, "is_loaded_in_4bit", False):
        quant = "nf4"
    elif getattr(model, "is_loaded_in_8bit", False):
        quant = "int8"
    if quant != plan.quantization.choice:
        problems.append(f"quantization is {quant}, the plan said {plan.quantization.choice}")

    if problems:
        raise VerificationError(
            "the loaded model is not what the plan said",
            reasons=problems,
            fix="pass allow_offload=True to accept offloading, or report this as a bug",
        )
    return {
        "attn_implementation": attn,
        "devices": sorted(d for d in devices if d != "meta"),
        "parameters_by_dtype": by_dtype,
        "quantization": quant,
        "offloaded_modules": offloaded,
    }


def _next_attention(plan: Plan, failed: str) -> str | None:
    names = [c.name for c in plan.attention.candidates if c.ok]
    if failed in names:
        names = names[names.index(failed) + 1 :]
    return names[0] if names else None


def _probe_and_fallback(
    model: Any, plan: Plan, caps: Capabilities, *, warmup: bool
) -> tuple[Plan, list[dict[str, str]]]:
    """Run a one-step forward on the chosen backend; step down the valid candidates when it fails."""
    fallbacks: list[dict[str, str]] = []
    current = plan.attention.choice
    while current is not None:
        ok, reason = probes.attention_works(model, current, caps, force=warmup)
        if ok:
            break
        if plan.attention.explicit:
            raise LoadError(
                f"attention backend {current!r} fails on this machine",
                reasons=[reason],
                fix="choose another backend with attn=..., or attn='auto' to let cudaload fall back",
            )
        nxt = _next_attention(plan, current)
        if nxt is None:
            raise LoadError(
                "no attention backend works on this machine",
                reasons=[reason],
                fix="report this: even sdpa failed a one-step forward",
            )
        logger.warning("attention %s failed its probe (%s); falling back to %s", current, reason, nxt)
        fallbacks.append({"from": current, "to": nxt, "reason": reason})
        model.set_attn_implementation(nxt)
        current = nxt
    if fallbacks:
        att = plan.attention
        plan = replace(
            plan,
            attention=Decision(
                choice=current,
                candidates=att.candidates,
                explicit=att.explicit,
                reasons=(
                    *att.reasons,
                    *(f"runtime fallback: {f['from']} -> {f['to']}: {f['reason']}" for f in fallbacks),
                ),
            ),
        )
    return plan, fallbacks


def _confirm_sdpa_variant(model: Any, plan: Plan) -> tuple[Plan, dict[str, Any] | None]:
    """A variant chosen automatically is kept only where torch really sends decode steps to cuDNN on this GPU
    (the policy predicted it from the snapshot); elsewhere the model takes plain sdpa, which then runs the same
    kernels without the per-call switch."""
    att = plan.attention
    if att.choice not in SDPA_VARIANTS:
        return plan, None
    from .sdpa_decode import confirm

    keep, seen, why = confirm(model)
    if keep or att.explicit:
        return plan, {"backend": seen, "kept": True, "why": why}
    model.set_attn_implementation("sdpa")
    plan = replace(
        plan,
        attention=replace(
            att, choice="sdpa", reasons=(*att.reasons, f"checked on the GPU: {why}; sdpa kept")
        ),
    )
    return plan, {"backend": seen, "kept": False, "why": why}


def _tuned_plan(
    model: Any, plan: Plan, caps: Capabilities, plan_kwargs: Mapping[str, Any], budget_s: float | None
) -> Plan:
    """``load_model(tune=True)``: the plan again, with this GPU's measured attention timings for the work."""
    from .model_info import model_info
    from .planner import plan as make_plan
    from .tuning import DEFAULT_BUDGET_S, Work, measured_or_tune

    if plan_kwargs.get("batch_size") is None or plan_kwargs.get("seq_len") is None:
        raise ConfigurationError(
            "tune=True needs the work to measure", fix="pass batch_size= and seq_len= (and new_tokens=)"
        )
    if plan.intent != "inference" or plan_kwargs.get("attn", "auto") != "auto" or not caps.gpus:
        return plan  # nothing to measure: training, an explicit backend, or no GPU
    work = Work.from_total(
        int(plan_kwargs["batch_size"]),
        int(plan_kwargs["seq_len"]),
        plan_kwargs.get("new_tokens"),
        bool(plan_kwargs.get("padded")),
    )
    info = model_info(model, model_class=plan_kwargs.get("model_class"), revision=plan_kwargs.get("revision"))
    path = plan.model.local_path or plan.model.name
    timings = measured_or_tune(
        path, caps, info, plan.dtype.choice or "float32", work, budget_s=budget_s or DEFAULT_BUDGET_S
    )
    return make_plan(model, **{**plan_kwargs, "timings": timings})


def _lora_config(plan: Plan) -> Any:
    """The plan's LoraConfig (one for the whole-model and the sharded path alike)."""
    try:
        from peft import LoraConfig
    except ImportError as e:
        raise DependencyError(
            f"intent {plan.intent!r} needs peft", reasons=[str(e)], fix="pip install 'cudaload[peft]'"
        ) from None
    return LoraConfig(**(plan.peft or {"target_modules": "all-linear"}))


def _wrap_peft(model: Any, plan: Plan) -> Any:
    config = _lora_config(plan)
    from peft import get_peft_model, prepare_model_for_kbit_training

    if plan.quantization.choice in ("nf4", "int8"):
        # casts norms to fp32 and enables input grads so checkpointed k-bit layers train stably
        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=True)
    return get_peft_model(model, config)


def _serving_after_fallback(plan: Plan, model: Any, plan_kwargs: Mapping[str, Any]) -> Plan:
    """After a runtime attention fallback (:func:`_probe_and_fallback`) the serving section is planned again for
    the attention the model now has, where it pages another one: a section planned for paged flash counts no
    dense mask and turns graphs on for an unmasked step, neither true of paged sdpa/eager. The attention decision
    (with its fallback) and the rest of the plan stay as they are."""
    from .planner import plan as make_plan

    current = plan.attention.choice
    if plan.serving is None or current is None:
        return plan
    if (plan.serving.attention.choice or "").removeprefix("paged|") == current:
        return plan
    again = make_plan(model, **{**plan_kwargs, "attn": current}).serving
    assert again is not None
    note = (
        f"planned again for {current}: the runtime attention fallback replaced "
        f"{plan.serving.attention.choice} (see the attention decision)"
    )
    return replace(plan, serving=replace(again, notes=(*again.notes, note)))


def _attach_serving(model: Any, plan: Plan, verified: dict[str, Any]) -> Plan:
    """intent="serving": the plan's cache settled against the memory free after loading (measured here, passed to
    the pure policy), then transformers' own ``ContinuousBatchingConfig`` at ``model.cudaload_cb_config`` for
    ``generate_batch`` / ``continuous_batching_context_manager``. At the manager's start transformers switches the
    model's attention to its paged form (5.17 continuous_api.py:651-683) and back at stop, so the model keeps its
    planned attention unless the serving plan pages another one (paged|sdpa for paged|eager's memory, or for a flash
    form transformers cannot run paged, e.g. flash-attn-4 before 5.19): then it takes that one here."""
    from dataclasses import fields

    import torch
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    from .policies.serving import settle

    section = plan.serving
    assert section is not None
    # transformers pages the model's current attention at the manager's start (continuous_api.py:651-683): where
    # the serving policy pages sdpa or eager instead of the loaded one (paged|eager's scores do not fit; an
    # explicit flash_attention_4 that transformers < 5.19 cannot run paged), the model takes it so that it does
    base = (section.attention.choice or "").removeprefix("paged|")
    current = getattr(model.config, "_attn_implementation", None)
    if base in ("sdpa", "eager") and current is not None and current != base:
        model.set_attn_implementation(base)
        verified["serving_attention"] = base
    device = getattr(model, "device", None)
    if device is not None and device.type == "cuda" and torch.cuda.is_available():
        free, _ = torch.cuda.mem_get_info(device)
        section = settle(section, int(free), longest_request=plan.seq_len)
    names = [f.name for f in fields(ContinuousBatchingConfig)]
    kwargs = section.continuous_batching_config(names)
    model.cudaload_cb_config = ContinuousBatchingConfig(**kwargs)
    verified["serving"] = {"continuous_batching_config": kwargs, "num_blocks": section.num_blocks}
    return replace(plan, serving=section)


def _rank_error(e: BaseException) -> dict[str, Any]:
    """What a rank that raises publishes to the others instead of its facts or its plan."""
    first = str(e).splitlines()[0] if str(e) else ""
    return {"error": f"{type(e).__name__}: {first}", "fix": getattr(e, "fix", None)}


def _tell_ranks_before_planning(caps: Capabilities, e: BaseException, model: str | os.PathLike[str]) -> None:
    """A torchrun rank that stops before the GPU exchange (a broken GPU selection) publishes its error there,
    so that the other ranks stop with its reason at once instead of waiting CUDALOAD_RANKS_TIMEOUT (300 s) for
    it and then loading without it."""
    from .detection.ranks import open_rendezvous

    d = caps.distributed
    try:
        rendezvous, _ = open_rendezvous(d.rank or 0, d.world_size or 1, model=model)
        if rendezvous is not None:
            rendezvous.tell("gpus", _rank_error(e))
    except Exception as why:  # this rank's own error is the one to raise
        logger.debug("cudaload: could not tell the other ranks: %s", why)


def _agree_on_gpus(caps: Capabilities, model: str | os.PathLike[str]) -> tuple[Capabilities, Any, str]:
    """Every torchrun rank's GPU, exchanged before anyone plans or loads (cudaload.detection.ranks), and this
    rank's Capabilities planned from all of them (cudaload.policies.ranks.agree). Returns the rendezvous for
    comparing the plans afterwards (None when the ranks could not agree) and a line for plan.verified."""
    from .capabilities import RankGPU
    from .detection.ranks import host, open_rendezvous
    from .policies.ranks import agree, check_failed, facts

    d = caps.distributed
    rendezvous, why = open_rendezvous(d.rank or 0, d.world_size or 1, model=model)
    if rendezvous is None:
        return caps, None, why
    got = rendezvous.exchange("gpus", facts(caps, host()).to_dict())
    if got is None:
        alone = f"not every rank published its GPU within {rendezvous.timeout_s:.0f} s: planned alone"
        # a rank that arrives later finds every GPU published and plans; it must not wait a second timeout for
        # this rank's plan, which will never come
        with contextlib.suppress(Exception):  # a store that went away: the late rank has nobody to wait for
            rendezvous.publish(
                "plans", {"alone": f"not every rank's GPU was published within {rendezvous.timeout_s:.0f} s"}
            )
        return caps, None, alone
    check_failed(got)  # a rank that stopped before planning (a broken GPU selection): its reason, at once
    agreed = agree(caps, [RankGPU.from_dict(x) for x in got])
    return agreed, rendezvous, f"the {d.world_size} ranks planned from the same GPU facts ({rendezvous.how})"


def load_model(
    model: str | os.PathLike[str],
    *,
    hardware: Capabilities | str | os.PathLike[str] | None = None,
    intent: str = "inference",
    seq_len: int | None = None,
    batch_size: int | None = None,
    attn: str = "auto",
    dtype: str = "auto",
    quantization: str = "auto",
    device_map: str | dict[str, Any] | None = None,
    max_memory: dict[str, Any] | None = None,
    allow_offload: bool = False,
    kernels: bool | None = None,
    trust_kernels: Sequence[str] = (),
    model_class: str | None = None,
    task: str | None = None,
    fast: bool | None = None,
    warmup: bool = False,
    prefetch: bool | str = True,
    new_tokens: int | None = None,
    padded: bool = False,
    tune: bool = False,
    tune_budget_s: float | None = None,
    **from_pretrained_kwargs: Any,
) -> Any:
    """Detect the machine, plan, load, verify and return a ready transformers model.

    The result is the model transformers would return (a ``PeftModel`` for ``intent="lora"/"qlora"``),
    on the planned device(s), in eval mode for inference and train mode otherwise, with the plan (including
    what was verified) at ``model.cudaload_plan``. cudaload's options are keyword-only; anything else is passed
    to ``from_pretrained`` (``revision``, ``token``, ``trust_remote_code`` - False unless you say so...).

    ``prefetch`` (default True): a local checkpoint's files are read into the page cache on background
    threads from the first line of this call, while torch and transformers are still being imported, so a
    cold load waits for about max(imports, disk read) instead of their sum (see :mod:`cudaload.prefetch`).
    A mode name picks how: ``"read"`` (threads that read the files, skipping what the page cache already holds;
    the default, measured cold on the H200 at 0.60x plain ``from_pretrained``) or ``"willneed"`` (kernel
    readahead advice, which the kernel throttled there: 1.05x); False turns it off. With it, when the GPU the
    model will load onto is known before planning (cuda:LOCAL_RANK under torchrun, a one-GPU process, a
    ``device_map`` naming one GPU), its CUDA context and cuBLAS are created on a thread while transformers
    imports (0.4-0.6 s a fresh process otherwise waits for after the imports; see :mod:`cudaload.gpu_start`).
    A call refused after that (a plan that does not fit, another rank's error) holds no memory of the load but
    leaves CUDA initialised in the process, as any torch.cuda call does: the context stays on that GPU, and
    CUDA_VISIBLE_DEVICES no longer changes anything in this process. ``prefetch=False`` or
    ``CUDALOAD_GPU_START=0`` touches no GPU before the load itself. ``plan.verified["phases"]`` says where the
    seconds went.

    Declared work (``batch_size``, ``seq_len`` = prompt + new tokens, ``new_tokens``, ``padded``) lets the
    attention choice use measured timings: this GPU's tune cache, else cudaload's shipped priors.
    ``tune=True`` measures them here first when the cache has none for this work (every usable backend through
    generate(), within ``tune_budget_s``; needs ``batch_size`` and ``seq_len``), as ``cudaload tune`` does.
    """
    phases = _Phases()
    clash = sorted(_DECIDED & from_pretrained_kwargs.keys())
    if "torch_dtype" in from_pretrained_kwargs and dtype == "auto":
        dtype = str(from_pretrained_kwargs.pop("torch_dtype")).replace("torch.", "")
        clash.remove("torch_dtype")
    if "attn_implementation" in from_pretrained_kwargs and attn == "auto":
        attn = str(from_pretrained_kwargs.pop("attn_implementation"))
        clash.remove("attn_implementation")
    if clash:
        raise ConfigurationError(
            f"{', '.join(clash)} are decided by cudaload",
            fix="use load_model's own options (dtype=, attn=, device_map=)",
        )
    from .planner import hub_probe_for, resolve_hardware
    from .planner import plan as make_plan

    # a profile name or a recorded machine's JSON, as plan() takes: resolved the same way (cheap), and refused
    # when it is not this machine, before any file is read
    caps = resolve_hardware(hardware) if hardware is not None else None
    if caps is not None and caps.source.startswith("profile:"):
        raise ConfigurationError(
            f"load_model() loads on this machine, not on {caps.source}",
            fix="use cudaload.plan(..., hardware=...) to plan for other hardware",
        )
    # after the argument checks (no reading for a call that is refused), before everything slow
    pre = None
    early: Any = None
    if prefetch is not True and prefetch is not False and prefetch not in _PREFETCH_MODES:
        raise ConfigurationError(
            f"prefetch={prefetch!r} is not a prefetch mode",
            fix=f"use prefetch=True, False or one of {', '.join(repr(m) for m in _PREFETCH_MODES)}",
        )
    if prefetch:
        from . import prefetch as _prefetch

        pre = _prefetch.start(
            model,
            mode=_prefetch.DEFAULT_MODE if prefetch is True else str(prefetch),
            subfolder=str(from_pretrained_kwargs.get("subfolder") or ""),
            variant=from_pretrained_kwargs.get("variant"),
        )
    # a refusal from here to the load (a broken GPU selection, a plan that does not fit, an import) must not
    # leave the threads reading a checkpoint nobody will load
    try:
        hub = None
        if caps is None:
            caps = resolve_hardware(None)  # detect(): NVML, no CUDA initialisation, no network
            # asked now, answered after transformers has imported: the round trip hides under the imports
            hub = hub_probe_for(caps)
        phases.mark("detect")
        # A GPU selection that is broken (a CUDA_VISIBLE_DEVICES entry matching nothing, LOCAL_RANK past the
        # visible GPUs...) would otherwise load somewhere the user did not mean, or on the CPU: stop here.
        broken = [f for f in caps.findings if f.severity == "error" and f.code in _DEVICE_FINDINGS]
        if broken:
            if pre is not None:
                pre.stop()
            bad_selection = DeviceSelectionError(
                "the GPUs this process may use are misconfigured",
                reasons=[f.message for f in broken],
                fix="; ".join(dict.fromkeys(f.fix for f in broken)),
            )
            if caps.distributed.active:
                _tell_ranks_before_planning(caps, bad_selection, model)
            raise bad_selection
        if prefetch and prefetch != "off":
            # the CUDA context and cuBLAS on the GPU the load will use, made while transformers imports
            from . import gpu_start as _gpu_start

            early = _gpu_start.start(caps, device_map)
        # under torchrun: every rank plans from the same GPU facts (cudaload.policies.ranks), or errs alike
        rendezvous, ranks_note = None, None
        if caps.distributed.active:
            caps, rendezvous, ranks_note = _agree_on_gpus(caps, model)
            phases.mark("ranks")
        plan_kwargs: dict[str, Any] = dict(
            hardware=caps,
            intent=intent,
            seq_len=seq_len,
            batch_size=batch_size,
            attn=attn,
            dtype=dtype,
            quantization=quantization,
            device_map=device_map,
            max_memory=max_memory,
            allow_offload=allow_offload,
            kernels=kernels,
            trust_kernels=trust_kernels,
            model_class=model_class,
            revision=from_pretrained_kwargs.get("revision"),
            fast=fast,
            new_tokens=new_tokens,
            padded=padded,
            from_pretrained_kwargs=from_pretrained_kwargs,
        )
        try:  # from here to the plans' exchange, a rank that raises tells the others (they would wait for it)
            # timed apart because users ask where the seconds go: transformers is a lazy module, so name what the
            # plan and the load use (the config machinery and modeling_utils, which imports most of it)
            from transformers import AutoConfig, PreTrainedModel  # noqa: F401

            phases.mark("import_transformers")
            if hub is not None:
                from .detection import with_hub_answer

                plan_kwargs["hardware"] = caps = with_hub_answer(caps, hub)
                phases.mark("hub_probe")
            plan = make_plan(model, **plan_kwargs)
            if tune:
                plan = _tuned_plan(model, plan, caps, plan_kwargs, tune_budget_s)
            auto_class = resolve_auto_class(model_class, task, plan)
        except Exception as e:
            if rendezvous is not None:  # the other ranks stop with this rank's reason instead of waiting
                rendezvous.tell("plans", _rank_error(e))
            raise
        if rendezvous is not None:
            from .policies.ranks import check_same, decisions

            published = rendezvous.exchange("plans", {"decisions": decisions(plan)})
            if published is not None:
                unchecked = check_same(published)
                if unchecked:
                    ranks_note = f"{ranks_note}; {unchecked}"
            else:
                ranks_note = (
                    f"{ranks_note}; the ranks' plans were not compared (a rank did not publish in time)"
                )
        phases.mark("plan")
        is_main = caps.distributed.rank in (None, 0)
        logger.log(logging.INFO if is_main else logging.DEBUG, "cudaload plan:\n%s", plan.explain())

        if plan.attention.choice in ("flash_attention_4", "kernels-community/flash-attn4"):
            # FA4 JIT-compiles its kernels in every new process (~3 s on the H200) unless its persistent cache is
            # on; cudaload turns it on under its own cache directory where the user has not set it (the variables
            # are read once, when flash_attn.cute is first imported: so before the load imports it)
            from .tuning import enable_fa4_compile_cache

            fa4_cache_note = enable_fa4_compile_cache().note
        else:
            fa4_cache_note = None
        if any(c.ok and c.name in SDPA_VARIANTS for c in plan.attention.candidates):
            # cudaload's sdpa variants are transformers attention functions: registered before the model is built
            # (and for a runtime fallback to one of them)
            from .sdpa_decode import register as _register_sdpa_variants

            _register_sdpa_variants()
    except BaseException:
        if pre is not None:
            pre.stop()
        if early is not None:
            early.join()  # short: no thread of this call outlives its error
        raise
    early_start = early.join() if early is not None else None
    before = _gpu_memory_snapshot()
    failure: CudaloadError | None = None
    loaded: Any = None
    t0 = time.perf_counter()
    try:
        loaded, path_taken, notes = _load_once(plan, auto_class, from_pretrained_kwargs)
        if plan.kernels.get("use_kernels"):
            # exactly the planned mapping, by kernels' kernelize after loading (see hub_kernels.plan_kernels:
            # from_pretrained's use_kernels also pulls transformers' default kernels from the Hub)
            from .hub_kernels import apply_kernels

            apply_kernels(loaded, plan.kernels)
        seconds = time.perf_counter() - t0
        phases.mark("load")
        if path_taken == "fast_sharded":
            # the plan placed the weights on the CPU for the whole-model fallback; they are this rank's shards
            dev = str(loaded.cudaload_fastload["device"])
            offloaded = plan.parallelism is not None and plan.parallelism.choice == "fsdp2_offload"
            where = f"in host memory (computed on {dev})" if offloaded and dev != "cpu" else f"on {dev}"
            plan = replace(
                plan,
                placement=Placement(
                    dev,
                    tuple(dict.fromkeys((dev, "cpu") if offloaded else (dev,))),
                    offload=offloaded,
                    reasons=(
                        f"FSDP2: this rank's shards of every weight {where} (cudaload.fastload.sharded)",
                    ),
                ),
            )
        if _fsdp_weights_on_cpu(plan):
            # the model is on the CPU until the Trainer shards it: a forward
            # here would test nothing about the GPU backend, and a 70B CPU forward takes minutes
            fallbacks: list[dict[str, str]] = []
        else:
            plan, fallbacks = _probe_and_fallback(loaded, plan, caps, warmup=warmup)
            if fallbacks and plan.serving is not None:
                plan = _serving_after_fallback(plan, model, plan_kwargs)
        plan, sdpa_dispatch = _confirm_sdpa_variant(loaded, plan)
        phases.mark("probe")
        verified = verify(loaded, plan, allow_offload=allow_offload)
        phases.mark("verify")
    except Exception as e:  # translated below, after the attempt's memory is released
        failure = _translate(e, f"loading {plan.model.name}")
        del e
    if failure is not None:
        if pre is not None:
            pre.stop()  # nothing will read those pages now
        loaded = None
        _release_memory()
        after = _gpu_memory_snapshot()
        leaked = {i: after[i] - before.get(i, 0) for i in after if after[i] > before.get(i, 0)}
        if leaked:
            logger.error("GPU memory still held after a failed load: %s bytes", leaked)
        raise failure

    verified.update(
        {
            "load_path": path_taken,
            "load_seconds": round(seconds, 4),
            "attention_fallbacks": fallbacks,
            "notes": notes,
            "auto_class": auto_class,
            "phases": phases.as_dict(getattr(loaded, "cudaload_fastload", None)),
            "fa4_compile_cache": fa4_cache_note,
            "sdpa_decode_dispatch": sdpa_dispatch,
            "prefetch": pre.summary() if pre is not None else None,
            "gpu_start": early_start,
            "ranks": ranks_note,
        }
    )
    if plan.intent in ("lora", "qlora"):
        if path_taken != "fast_sharded":  # the sharded loader wrapped it before sharding (peft_config)
            loaded = _wrap_peft(loaded, plan)
        trainable = sum(p.numel() for p in loaded.parameters() if p.requires_grad)
        verified["trainable_parameters"] = trainable
    if plan.intent in ("inference", "serving"):
        loaded.eval()
    else:
        loaded.train()
    if plan.serving is not None:
        refusal: DoesNotFitError | None = None
        try:
            plan = _attach_serving(loaded, plan, verified)
        except DoesNotFitError as e:
            # less is free after loading than serving needs: nothing is handed back, so nothing stays held. The
            # traceback holds _attach_serving's frame and its `model` local (the whole model, its GPU memory) for
            # as long as the caller keeps the error: dropped before the memory is released
            e.__traceback__ = None
            refusal = e
            del e
        if refusal is not None:
            if pre is not None:
                pre.stop()  # nothing will read those pages now
            loaded = None
            _release_memory()
            raise refusal
    plan = plan.with_verified(verified)
    loaded.cudaload_plan = plan
    logger.log(
        logging.INFO if is_main else logging.DEBUG,
        "cudaload loaded %s in %.2fs via %s",
        plan.model.name,
        seconds,
        path_taken,
    )
    return loaded
