"""Per-architecture support facts, in one place.

Pure functions of a compute capability: the detector, ``cudaload doctor`` and the attention / quantization
policies all import these, so "does FA3 run on an A100" has exactly one answer in the code base. Each
returns ``(ok, reason)``; the reason is a sentence fit for an explanation either way.

Sources (checked against the released packages, not blog posts):
- flash-attn 2.x README: Ampere, Ada, Hopper; Turing and older unsupported. Blackwell (sm100/sm120) kernels
  are compiled into builds made with CUDA >= 12.8 (flash-attn 2.7.4 and later).
- flash-attn-3 (``hopper/`` directory, module ``flash_attn_interface``): H100/H800-class, sm90 only.
- flash-attn-4 (CuTe DSL, ``flash_attn.cute``): "for Hopper and Blackwell GPUs"; 4.0.0b36's interface asserts
  ``arch // 10 in [8, 9, 10, 11, 12]`` but the sm80/sm120 paths lack the TMEM/WGMMA fast paths, and fp8 is
  sm100-only. We call sm90 / sm100 / sm103 / sm110 supported, sm120/121 supported with a caveat, Ampere/Ada
  not (its sm80 path exists but is not what the package is published for; FA2 is the right choice there).
- bitsandbytes 0.50 README: NVIDIA x86-64 "SM60+ minimum, SM75+ recommended"; aarch64 "SM75+".
"""

from __future__ import annotations

CC = tuple[int, int]

#: distribution name -> (transformers ``attn_implementation``, importable module holding the kernels)
FLASH_PACKAGES: dict[str, tuple[str, str]] = {
    "flash-attn": ("flash_attention_2", "flash_attn"),
    "flash-attn-3": ("flash_attention_3", "flash_attn_interface"),
    "flash-attn-4": ("flash_attention_4", "flash_attn.cute"),
}


def _sm(cc: CC) -> str:
    return f"sm{cc[0]}{cc[1]}"


def flash_support(package: str, cc: CC) -> tuple[bool, str]:
    """Whether the flash-attention ``package`` ("flash-attn", "flash-attn-3", "flash-attn-4") runs on a GPU
    of compute capability ``cc``. Architecture only: whether the package is installed is a separate fact.
    """
    sm = _sm(cc)
    if package == "flash-attn":
        if cc < (8, 0):
            return False, f"flash-attn 2 needs Ampere or newer (sm80+); this GPU is {sm}"
        if cc >= (10, 0):
            return True, f"flash-attn 2 runs on {sm} when built with CUDA >= 12.8 (flash-attn >= 2.7.4)"
        return True, f"flash-attn 2 supports {sm} (Ampere, Ada, Hopper)"
    if package == "flash-attn-3":
        if cc[0] == 9:
            return True, f"flash-attn 3 is built for Hopper ({sm})"
        return False, f"flash-attn 3 runs on Hopper (sm90) only; this GPU is {sm}"
    if package == "flash-attn-4":
        if cc[0] in (9, 10, 11):
            return True, f"flash-attn 4 supports {sm} (Hopper / datacenter Blackwell)"
        if cc[0] == 12:
            return True, (
                f"flash-attn 4 runs on consumer Blackwell ({sm}) through a slower path (no TMEM); "
                "needs a recent flash-attn-4 (4.0.0b36 accepts sm12x)"
            )
        return False, f"flash-attn 4 targets Hopper and Blackwell (sm90+); this GPU is {sm}"
    raise ValueError(f"unknown flash-attention package {package!r}; expected one of {sorted(FLASH_PACKAGES)}")


def bitsandbytes_support(cc: CC, cpu_arch: str | None = None) -> tuple[bool, str]:
    """Whether bitsandbytes' CUDA kernels (LLM.int8, nf4, 8-bit optimizers) support compute capability ``cc``.
    ``cpu_arch`` "aarch64" raises the floor to sm75, as bitsandbytes' aarch64 wheels are built that way.
    """
    sm = _sm(cc)
    floor = (7, 5) if cpu_arch == "aarch64" else (6, 0)
    if cc < floor:
        return (
            False,
            f"bitsandbytes needs sm{floor[0]}{floor[1]}+ on {cpu_arch or 'x86_64'}; this GPU is {sm}",
        )
    if cc < (7, 5):
        return True, f"bitsandbytes runs on {sm} but is slow below sm75 (no int8 tensor cores)"
    return True, f"bitsandbytes supports {sm}"


def bf16_native(cc: CC) -> bool:
    """Native bf16 arithmetic (Ampere+). Not ``torch.cuda.is_bf16_supported()``, which counts emulation."""
    return cc >= (8, 0)


def fp8_support(cc: CC) -> bool:
    """fp8 tensor cores: Ada (sm89), Hopper, Blackwell."""
    return cc >= (8, 9)
