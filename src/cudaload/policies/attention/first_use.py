"""First-use costs: the seconds a backend costs once per process before its first useful call (FA4's import and
CuTe DSL JIT, flex_attention's compile), and where each number is from. The choice adds them to measured
timings and, without timings, pays none of them for inference (:mod:`.choice`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from .names import HUB_KERNEL


@dataclass(frozen=True)
class FirstUse:
    """Seconds a backend costs once per process before its first useful call, and where the number is from."""

    seconds: float
    source: str


#: Measured on the H200 (/work/shared/device/README.md, "Measured there"): ``import
#: flash_attn.cute`` 9.7 s on cold files, ~2.7 s warm; the CuTe DSL JIT ~3 s in every new process, 0.55 s
#: once its disk cache (FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1) holds the kernels.
FA4_IMPORT_WARM_S = 2.7
FA4_IMPORT_COLD_S = 9.7
FA4_JIT_S = 3.0
FA4_JIT_CACHED_S = 0.55
#: Not measured yet: torch.compile of flex_attention's forward Triton kernels for one shape. An estimate,
#: to be replaced by ``cudaload tune``'s measurement (its benchmark reports flex's compile time apart).
FLEX_COMPILE_S = 5.0


def first_use_costs(*, fa4_cache_warm: bool = False, cold_files: bool = False) -> dict[str, FirstUse]:
    """The shipped first-use table. ``fa4_cache_warm``: FA4's persistent compile cache already holds this
    shape's kernels; ``cold_files``: the package files are not in the page cache (first run after boot)."""
    fa4_import = FA4_IMPORT_COLD_S if cold_files else FA4_IMPORT_WARM_S
    fa4_jit = FA4_JIT_CACHED_S if fa4_cache_warm else FA4_JIT_S
    fa4 = FirstUse(
        fa4_import + fa4_jit,
        f"import flash_attn.cute ~{fa4_import:g} s + CuTe JIT ~{fa4_jit:g} s per process (H200, 2026-11-30)",
    )
    return {
        "flash_attention_4": fa4,
        # the Hub build vendors the same CuTe DSL code: same import and JIT (assumed, not measured apart)
        HUB_KERNEL["flash_attention_4"]: FirstUse(fa4.seconds, fa4.source + "; same CuTe DSL code, assumed"),
        "flex_attention": FirstUse(
            FLEX_COMPILE_S, f"torch.compile of flex_attention ~{FLEX_COMPILE_S:g} s (estimate)"
        ),
    }


#: What a fresh process pays, files warm, FA4 cache not yet filled. Backends not listed cost nothing extra:
#: sdpa and eager are torch itself; flash-attn 2/3 and the other Hub kernels are compiled ahead of time, so
#: their first use is a shared-library load.
FIRST_USE: Mapping[str, FirstUse] = first_use_costs()
