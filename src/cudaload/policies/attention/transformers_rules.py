"""What transformers itself does with a flash request, before any kernel runs: the model facts the rules read
(q/k and v head dims, sliding window), the requests it rewrites or refuses (``_transformers_checks``), and the
arguments it hands a kernel only where the kernel takes them (attention sinks, dropout). The kernel packages'
own rules are in :mod:`.fa2_fa3_rules` and :mod:`.fa4_rules`."""

from __future__ import annotations

from ...model_info import ModelInfo


def _qk_dim(info: ModelInfo) -> int:
    return int(getattr(info, "qk_head_dim", 0) or info.summary.head_dim)


def _v_dim(info: ModelInfo) -> int:
    return int(getattr(info, "v_head_dim", 0) or _qk_dim(info))


def _sliding(info: ModelInfo) -> bool:
    return bool(info.summary.sliding_window) and int(getattr(info, "sliding_layers", 0) or 0) > 0


def _transformers_checks(name: str, impl: str, info: ModelInfo, dtype: str) -> list[str]:
    """What transformers itself does with a flash request for this model, before any kernel runs."""
    bad: list[str] = []
    cls = info.class_name or info.summary.type
    if not info.supports_flash_attn:
        bad.append(f"{cls} does not support flash attention (_supports_flash_attn is False)")
        return bad
    compatible = getattr(info, "compatible_flash", None)
    if compatible and name not in compatible:
        # modeling_utils.py (5.17) _check_and_adjust_attn_implementation:1747-1762 rewrites the request
        bad.append(
            f"transformers replaces a {name} request for {cls} by {compatible[0]} "
            f"(its _compatible_flash_implementations: {', '.join(compatible)}); request that instead"
        )
    classes = getattr(info, "attention_classes", None)
    if classes is not None and name not in classes:
        # e.g. modeling_falcon.py (5.17) FALCON_ATTENTION_CLASSES:542-546, indexed at :555
        bad.append(
            f"{cls} builds its attention from a fixed table ({', '.join(classes)}): "
            f"attn_implementation={name!r} fails with KeyError when the model is built"
        )
    if getattr(info, "alibi", False):
        # modeling_falcon.py raises on an ALiBi bias with any flash attention: 5.17 FalconFlashAttention2.forward
        # :476-477 ('`alibi` is not supported'), 5.25 FalconModel.forward :567-571 ('flash attention does not use')
        bad.append(
            f"{cls} uses ALiBi, which transformers' flash path refuses (it adds the bias to the mask, which "
            "flash kernels do not read)"
        )
    if dtype not in ("bfloat16", "float16"):
        bad.append(f"flash attention needs float16 or bfloat16; the plan's dtype is {dtype}")
    qk, v = _qk_dim(info), _v_dim(info)
    if v > qk:
        # integrations/flash_attention.py (5.17) :60-64 pads v up to the q/k head dim (F.pad by qk - v: a
        # negative width cuts a wider v) and crops the output back at :99-100 (integrations/flash_paged.py
        # :43-47 the same). That is all transformers does to head dims: it rounds none, and hands the
        # package's own flash_attn_func / flash_attn_varlen_func / flash_attn_with_kvcache to the model
        # (modeling_flash_attention_utils.py (5.17) _lazy_imports :167, :177, :179, Hub kernels :194-196), so
        # whether a head dim is padded to the kernel's multiple is the kernel package's business (_fa2_checks,
        # _head_dim_fa3, _fa4_checks)
        bad.append(f"v head dim {v} > q/k head dim {qk}: transformers' flash path would cut v to {qk}")
    return bad


def _no_sink_param(impl: str, info: ModelInfo) -> str | None:
    if getattr(info, "sinks", False):
        # modeling_flash_attention_utils.py (5.17) :665-669 passes s_aux only to a kernel whose signature has
        # s_aux / learnable_sink; flash-attn 2 and hopper's flash_attn_interface have neither, so the sinks
        # would be dropped without a word
        return f"the model has attention sinks; {impl} has no sink argument, transformers would drop them (wrong outputs)"
    return None


def _no_dropout(impl: str, info: ModelInfo, training: bool) -> str | None:
    if training and (info.attention_dropout or 0) > 0:
        # no dropout_p in FA3 / FA4 / vllm-flash-attn3: transformers maps only supported arguments
        # (modeling_flash_attention_utils.py (5.17) :647-648) and merely warns (_flash_attn_can_dispatch)
        return f"attention_dropout={info.attention_dropout}: {impl} has no dropout (training would differ)"
    return None
