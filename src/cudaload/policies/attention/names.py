"""The attention backends cudaload plans and the tables that name them: the distribution that provides each
flash version and its Hub-kernel form, the flash-attn versions transformers accepts, the intents that train, and
how short a declared work must be to count as short decode. No rule lives here; the rules read these tables."""

from __future__ import annotations

from ..sdpa_dispatch import SDPA_DECODE, SDPA_NO_CUDNN

#: attn_implementation -> distribution that provides it
FLASH_PACKAGE = {
    "flash_attention_2": "flash-attn",
    "flash_attention_3": "flash-attn-3",
    "flash_attention_4": "flash-attn-4",
}
#: attn_implementation -> its Hub-kernel form. Same ids in transformers 5.17 and 5.24
#: (modeling_flash_attention_utils.FLASH_ATTN_KERNEL_FALLBACK, CUDA entries).
HUB_KERNEL = {
    "flash_attention_2": "kernels-community/flash-attn2",
    "flash_attention_3": "kernels-community/vllm-flash-attn3",
    "flash_attention_4": "kernels-community/flash-attn4",
}
_KERNEL_TO_IMPL = {v: k for k, v in HUB_KERNEL.items()}
_VLLM_FA3 = HUB_KERNEL["flash_attention_3"]
#: flash-attn 2 gained soft-capping in 2.6.0 (its changelog); older builds fail on the softcap argument.
_FA2_SOFTCAP_MIN = (2, 6, 0)
_FA2_MIN = (2, 3, 3)  # transformers refuses older flash-attn (is_flash_attn_2_available)
_TRAINING = ("training", "lora", "qlora")
#: the flash implementations (package and Hub-kernel forms): each takes a packed step's boundaries
#: (``cu_seq_lens``) and runs a varlen forward and backward (transformers' flash path,
#: modeling_flash_attention_utils._flash_attention_forward, 5.17 lines 759-817)
#: cudaload's attention function over torch's own flash kernels (varlen forward and backward, no package:
#: cudaload.execute.varlen_attention; its rules: :mod:`.torch_varlen_rules`)
TORCH_VARLEN = "cudaload_varlen"
VARLEN = frozenset({*FLASH_PACKAGE, *HUB_KERNEL.values(), TORCH_VARLEN})

#: Declared work of one sequence up to this many tokens (prompt + new) is decode-bound: each new token costs
#: one attention call per layer and the host-side cost of the call decides. Measured on the H200, Qwen3-8B
#: shape, generate() with three backends loaded at once and interleaved (/work/shared/device/README.md,
#: "Measured there"): 1 x 512 + 32 tokens, eager 1.03 s, sdpa 1.07 s, FA4 1.84 s; at 1 x 4096
#: + 64 sdpa won (2.37 s vs eager 2.63 s), so the rule stops well below that.
SHORT_DECODE_MAX_TOKENS = 1024

ALL_NAMES = (
    "flash_attention_4",
    HUB_KERNEL["flash_attention_4"],
    "flash_attention_3",
    HUB_KERNEL["flash_attention_3"],
    "flash_attention_2",
    HUB_KERNEL["flash_attention_2"],
    "sdpa",
    SDPA_DECODE,
    SDPA_NO_CUDNN,
    TORCH_VARLEN,
    "flex_attention",
    "eager",
)
