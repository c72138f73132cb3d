"""How the weights are read: cudaload's own safetensors-to-GPU loader ("fast") or ``from_pretrained``.

The fast path covers exactly what it can do bit for bit: an unquantized local safetensors checkpoint of a
model transformers knows (no remote code), placed on GPUs without offload. Everything else goes through
``from_pretrained``, and the plan says why.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..model_info import ModelInfo
from ..plans.decision import Candidate, Decision
from ..plans.plan import Placement

#: ``from_pretrained`` keywords the fast path honours exactly. ``variant``, ``subfolder``, ``use_safetensors``
#: and the config's ``transformers_weights`` pick the files through transformers' own
#: ``_get_resolved_checkpoint_files``; ``ignore_mismatched_sizes`` reports and re-initialises mismatched tensors
#: as transformers does; the Hub keywords (``revision``, ``token``, ``cache_dir``...) do nothing for a local
#: directory; ``weights_only``/``disable_mmap`` only concern *how* transformers reads the same bytes; the rest
#: are keywords transformers 5 accepts and drops (5.17 modeling_utils.py:4093 from_pretrained, "for name in ['mirror',
#: '_fast_init', ...]: kwargs.pop(name)"). Every other keyword that is not in FROM_PRETRAINED_ONLY is what
#: from_pretrained makes of it too: a config override when the config has that attribute
#: (``AutoConfig.from_pretrained(path, **kwargs)``), else a keyword of the model's ``__init__``.
FAST_LOADER_KWARGS = frozenset(
    {
        "variant",
        "subfolder",
        "use_safetensors",
        "ignore_mismatched_sizes",
        "trust_remote_code",
        "revision",
        "code_revision",
        "token",
        "cache_dir",
        "force_download",
        "local_files_only",
        "proxies",
        "weights_only",
        "disable_mmap",
        "tqdm_class",
        "mirror",
        "_fast_init",
        "low_cpu_mem_usage",
        "from_tf",
        "from_flax",
        "offload_state_dict",
    }
)

#: ``from_pretrained`` keywords only ``from_pretrained`` can honour -> why the fast path steps aside.
FROM_PRETRAINED_ONLY: Mapping[str, str] = {
    "config": "a config object replaces config.json",
    "state_dict": "weights come from a state_dict, not the files",
    "gguf_file": "GGUF checkpoints are dequantized by transformers",
    "key_mapping": "custom checkpoint key renames",
    "quantization_config": "quantization happens inside from_pretrained",
    "device_map": "accelerate places the modules",
    "max_memory": "accelerate places the modules",
    "offload_folder": "offload is handled by accelerate hooks",
    "offload_buffers": "offload is handled by accelerate hooks",
    "tp_plan": "tensor parallelism",
    "tp_size": "tensor parallelism",
    "distributed_config": "tensor/pipeline parallelism",
    "device_mesh": "tensor parallelism",
    "adapter_name": "a PEFT adapter is loaded on top",
    "adapter_kwargs": "a PEFT adapter is loaded on top",
    "output_loading_info": "returns (model, loading_info)",
    "generation_config": "a generation config object replaces generation_config.json",
    "use_kernels": "hub kernels are applied by from_pretrained",
    "kernel_config": "hub kernels are applied by from_pretrained",
    "allow_all_kernels": "hub kernels are applied by from_pretrained",
    "fusion_config": "module fusions are registered by from_pretrained",
    "experts_implementation": "MoE experts implementation is set by from_pretrained",
}


def fast_kwargs_blockers(kwargs: Mapping[str, Any]) -> list[str]:
    """Why the ``from_pretrained`` keywords ``kwargs`` keep a load off the fast path (empty: it honours them)."""
    out = [
        f"from_pretrained keyword {k}=: {why}"
        for k, why in FROM_PRETRAINED_ONLY.items()
        if kwargs.get(k) is not None
    ]
    if kwargs.get("use_safetensors") is False:
        out.append("from_pretrained keyword use_safetensors=False: the weights come from .bin files")
    return out


#: Below this checkpoint size the fast path is not known to win: its fixed costs (pinning the staging pool,
#: building the skeleton) are ~0.15 s. Measured on the H200 (torch 2.11, transformers 5.17, warm page cache,
#: benchmarks/results/2026-11-29-h200/fastload.md): Qwen3-0.6B shape, 1.19 GB, fast 0.227 s vs from_pretrained
#: 0.284 s; Qwen3-8B shape, 16.4 GB, 0.767 s vs 2.630 s. Smaller checkpoints were not measured.
FAST_MIN_BYTES = 1 * 10**9


#: bitsandbytes methods cudaload.fastload.quantized loads exactly as from_pretrained does (it steps aside at
#: load time where it cannot: pre-quantized checkpoints, fused MoE experts, bitsandbytes not importable...)
QUANTIZED_FAST = frozenset({"int8", "nf4"})


def choose_load_path(
    info: ModelInfo,
    *,
    quantization: str | None,
    placement: Placement,
    prefer: bool | None = None,
    from_pretrained_kwargs: Mapping[str, Any] | None = None,
) -> Decision:
    """``prefer``: None decides by size; True takes the fast path whenever it can do the load; False never.
    ``from_pretrained_kwargs``: the keywords load_model passes on; one the fast path cannot honour exactly
    (:data:`FROM_PRETRAINED_ONLY`) makes it choose from_pretrained, with the keyword named in the reasons."""
    s = info.summary
    if prefer is False:
        fp = Candidate("from_pretrained", True, ("fast=False was passed",))
        return Decision(
            "from_pretrained",
            fp.reasons,
            (Candidate("fast", False, ("fast=False was passed",)), fp),
            explicit=True,
        )
    bad: list[str] = fast_kwargs_blockers(from_pretrained_kwargs or {})
    if not s.local_path:
        bad.append("the checkpoint is not a local directory (config-only or Hub plan)")
    elif not s.safetensors and s.weights_source == "config":
        # a bare config.json: nothing to load yet; the path is decided again when weights are there
        bad.append("config only: no weights next to config.json yet")
    elif not s.safetensors:
        bad.append("no .safetensors files (.bin weights go through from_pretrained)")
    if quantization and quantization not in QUANTIZED_FAST:
        bad.append(f"{quantization} quantization is done inside from_pretrained")
    elif quantization and from_pretrained_kwargs:
        # load_model does not pass from_pretrained keywords to cudaload.fastload.quantized (execute._load_once),
        # although load_quantized resolves them as the unquantized fast path does: not yet measured on a GPU
        bad.append(
            f"a {quantization} load with from_pretrained keywords "
            f"({', '.join(sorted(from_pretrained_kwargs))}) goes through from_pretrained"
        )
    if info.remote_code:
        bad.append("the model needs remote code (auto_map)")
    if placement.offload:
        bad.append("CPU/disk offload is handled by accelerate hooks")
    if not any(d.startswith("cuda") for d in placement.devices):
        bad.append("no GPU in the placement: the fast path copies to GPUs")
    elif len(placement.devices) > 1:
        bad.append("split across several GPUs: the fast path fills one device")
    if prefer is None and s.weights_bytes and s.weights_bytes < FAST_MIN_BYTES:
        bad.append(
            f"checkpoint of {s.weights_bytes / 1e9:.2f} GB: below {FAST_MIN_BYTES / 1e9:.0f} GB the fast path "
            "is not known to beat from_pretrained (its fixed cost is ~0.15 s; fast=True forces it)"
        )
    fast = Candidate(
        "fast",
        not bad,
        tuple(bad)
        or (
            (
                f"local safetensors quantized to {quantization} on the GPU one layer at a time with "
                "bitsandbytes' own functions (from_pretrained in transformers 5.17 copies each weight to the "
                "CPU and back: 15.6 s vs 2.8 s for int8 vs nf4 on the H200, "
                "benchmarks/results/2026-12-01-h200/run1-qprof); same packed weights",
            )
            if quantization
            else (
                "unquantized local safetensors on GPU: parallel reads into pinned buffers, "
                "copied straight into the parameters (no second copy)",
            )
        ),
    )
    fp = Candidate("from_pretrained", True, ("transformers' loader: handles every case",))
    if fast.ok:
        return Decision("fast", fast.reasons, (fast, fp), explicit=prefer is True)
    if prefer is True:
        from ..errors import InvalidChoiceError

        raise InvalidChoiceError(
            "fast=True but the fast loader cannot do this load",
            reasons=bad,
            fix="drop fast=True (from_pretrained handles every case)",
        )
    return Decision(
        "from_pretrained", ("the fast loader does not cover this load: " + "; ".join(bad),), (fast, fp)
    )
