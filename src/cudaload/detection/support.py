"""Per-architecture support facts, in one place.

Pure functions of a compute capability: the detector, ``cudaload doctor`` and the attention / quantization
policies all import these, so "does FA3 run on an A100" has exactly one answer in the code base. Each
returns ``(ok, reason)``; the reason is a sentence fit for an explanation either way.

Sources (the released code, each rule cites its file and line):
- flash-attn 2.8.3 (sdist): csrc/flash_attn/flash_api.cpp:369-370 refuses compute capability < 8; setup.py:70
  builds ``FLASH_ATTN_CUDA_ARCHS`` "80;90;100;120" and setup.py:180-191 emits SASS only (``code=sm_XX``, no
  PTX) for sm80, sm90 and, with CUDA >= 12.8, sm100 / sm120. SASS runs only within its major version, so
  sm8x runs the sm80 code, sm103 the sm100 code, sm121 the sm120 code, and sm110 (Thor) has no kernel.
  The sm100/sm120 gencode lines first appear in 2.7.3 (git tag v2.7.3 setup.py; absent in v2.7.2).
- flash-attn-3 (Dao-AILab/flash-attention hopper/ at commit 0251105a, __version__ 3.0.0; not on PyPI): hopper/setup.py compiles *_sm90.cu
  for sm_90a and *_sm80.cu for sm_80 unless FLASH_ATTENTION_DISABLE_SM80=TRUE; hopper/static_switch.h
  ARCH_SWITCH routes 8.6/8.9 to the sm86 path, other 8.x to sm80 and everything >= 9.0 to the sm90a kernels,
  which do not run on sm10x/sm12x.
- flash-attn-4 4.0.0b36 (flash_attn/cute/interface.py): the forward asserts ``arch // 10 in [8, 9, 10, 11,
  12]`` (line 845), the backward ``arch // 10 in [9, 10, 11, 12]`` (line 2288): inference on sm8x, training
  from sm90.
- kernels-community Hub builds (build.toml ``cuda-capabilities``): flash-attn2 "8.0", "9.0", "10.0", "12.0";
  vllm-flash-attn3 "8.0", "9.0a" (its flash_api.cpp uses the same ARCH_SWITCH as hopper/).
- Shared memory per block (opt-in), CUDA C Programming Guide "Technical Specifications per Compute
  Capability": 8.0 / 8.7: 163 KB; 8.6 / 8.9 / 12.x: 99 KB; 9.0 / 10.x: 227 KB. flash-attn 2.8.3
  flash_bwd_launch_template.h:296-303 names the 99 KB parts ("sm86 and sm89, max smem is 99 KB").
- bitsandbytes 0.50 README: NVIDIA x86-64 "SM60+ minimum, SM75+ recommended"; aarch64 "SM75+".
"""

from __future__ import annotations

from .versions import version_tuple as _version

CC = tuple[int, int]

#: distribution name -> (transformers ``attn_implementation``, importable module holding the kernels)
FLASH_PACKAGES: dict[str, tuple[str, str]] = {
    "flash-attn": ("flash_attention_2", "flash_attn"),
    "flash-attn-3": ("flash_attention_3", "flash_attn_interface"),
    "flash-attn-4": ("flash_attention_4", "flash_attn.cute"),
}


def _sm(cc: CC) -> str:
    return f"sm{cc[0]}{cc[1]}"


#: flash-attn 2 release that first compiles sm100 / sm120 kernels (setup.py of git tag v2.7.3, lines 186-191)
FA2_BLACKWELL_MIN = (2, 7, 3)


def flash_support(package: str, cc: CC, version: str | None = None) -> tuple[bool, str]:
    """Whether the flash-attention ``package`` ("flash-attn", "flash-attn-3", "flash-attn-4") has kernels for a
    GPU of compute capability ``cc``. Architecture (and, for flash-attn 2, the release) only: whether it is
    installed, and what the model asks of it, are checked by the attention policy.
    """
    sm = _sm(cc)
    if package == "flash-attn":
        if cc < (8, 0):
            # flash_api.cpp:369-370 TORCH_CHECK(cc_major >= 8, "FlashAttention only supports Ampere GPUs or newer.")
            return False, f"flash-attn 2 needs Ampere or newer (sm80+); this GPU is {sm}"
        if cc[0] in (8, 9):
            return True, f"flash-attn 2 supports {sm} (its sm80 / sm90 kernels)"
        if cc[0] in (10, 12):
            v = _version(version)
            if v is not None and v < FA2_BLACKWELL_MIN:
                return False, (
                    f"flash-attn {version} has no {sm} kernels: sm100 / sm120 builds start at 2.7.3 "
                    "(setup.py gencode, CUDA >= 12.8)"
                )
            return True, (
                f"flash-attn 2 runs on {sm} through its sm{cc[0]}0 kernels when built with CUDA >= 12.8 "
                "(flash-attn >= 2.7.3)"
            )
        return False, (
            f"flash-attn 2 has no {sm} kernels: 2.8.3 compiles sm80, sm90, sm100 and sm120 only "
            "(setup.py FLASH_ATTN_CUDA_ARCHS), and another major version cannot run them"
        )
    if package == "flash-attn-3":
        if cc[0] == 8:
            return (
                True,
                f"flash-attn 3 runs {sm} through its sm80 kernels (hopper/static_switch.h ARCH_SWITCH), "
                "unless it was built with FLASH_ATTENTION_DISABLE_SM80=TRUE",
            )
        if cc == (9, 0):
            return True, f"flash-attn 3 is built for Hopper ({sm}, sm_90a)"
        return (
            False,
            f"flash-attn 3 has kernels for sm8x and sm90 only (sm_80 / sm_90a builds); this GPU is {sm}",
        )
    if package == "flash-attn-4":
        if cc[0] == 8:
            return True, (
                f"flash-attn 4 runs its forward on {sm} (SM80 MMA path); its backward needs sm90+, "
                "so inference only"
            )
        if cc[0] in (9, 10, 11):
            return True, f"flash-attn 4 supports {sm} (Hopper / datacenter Blackwell)"
        if cc[0] == 12:
            return True, (
                f"flash-attn 4 runs on consumer Blackwell ({sm}) through its SM80-MMA path with 99 KB of "
                "shared memory"
            )
        return (
            False,
            f"flash-attn 4 runs on sm8x-sm12x (interface.py asserts arch // 10 in 8..12); this GPU is {sm}",
        )
    raise ValueError(f"unknown flash-attention package {package!r}; expected one of {sorted(FLASH_PACKAGES)}")


#: kernels-community Hub repo -> compute capabilities its build.toml compiles (exact entries; "9.0a" is the
#: arch-specific Hopper target, which no other GPU runs)
HUB_KERNEL_CAPABILITIES: dict[str, tuple[str, ...]] = {
    "kernels-community/flash-attn2": ("8.0", "9.0", "10.0", "12.0"),
    "kernels-community/vllm-flash-attn3": ("8.0", "9.0a"),
}


def hub_kernel_support(repo: str, cc: CC) -> tuple[bool, str]:
    """Whether the Hub attention kernel ``repo`` has code for ``cc``: plain "X.Y" SASS runs on X.Z with Z >= Y;
    "9.0a" runs on 9.0 only. Repos without a table entry (kernels-community/flash-attn4, the CuTe DSL
    FlashAttention-4, compiled on the GPU at first use) follow :func:`flash_support` for flash-attn-4."""
    sm = _sm(cc)
    caps = HUB_KERNEL_CAPABILITIES.get(repo)
    if caps is None:
        return flash_support("flash-attn-4", cc)
    for c in caps:
        arch_specific = c.endswith("a")
        major, minor = (int(x) for x in c.rstrip("a").split("."))
        if (arch_specific and cc == (major, minor)) or (
            not arch_specific and cc[0] == major and cc[1] >= minor
        ):
            return True, f"{repo} is built for {', '.join(caps)} (build.toml), which covers {sm}"
    return (
        False,
        f"{repo} is built for {', '.join(caps)} only (build.toml cuda-capabilities); this GPU is {sm}",
    )


#: compute capability -> shared memory per block with opt-in, bytes (CUDA C Programming Guide, Technical
#: Specifications per Compute Capability). Unknown parts: None.
_SMEM_PER_BLOCK = {
    (8, 0): 163 * 1024,
    (8, 6): 99 * 1024,
    (8, 7): 163 * 1024,
    (8, 9): 99 * 1024,
    (9, 0): 227 * 1024,
    (10, 0): 227 * 1024,
    (10, 3): 227 * 1024,
    (12, 0): 99 * 1024,
    (12, 1): 99 * 1024,
}


def smem_per_block(cc: CC) -> int | None:
    """Largest shared memory one block can opt into on ``cc`` (bytes), None when not in the table."""
    return _SMEM_PER_BLOCK.get(cc)


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
