"""Parameter counts from the config on the meta device: the model built with one and two decoder layers and
extrapolated linearly (the full model counted when a 1-layer copy is refused), cached per class and config."""

from __future__ import annotations

import copy
import json
import logging
import threading
from typing import Any

from .records import ParamCounts

# the name the module had before it became a package, so a handler or level set on it still applies
log = logging.getLogger("cudaload.model_info")


def _with_layers(config: Any, n: int) -> Any:
    c = copy.deepcopy(config)
    text = c.get_text_config() if hasattr(c, "get_text_config") else c
    text.num_hidden_layers = n
    for attr in ("layer_types", "mlp_only_layers"):
        v = getattr(text, attr, None)
        if isinstance(v, list):
            setattr(
                text,
                attr,
                [x for x in v if not isinstance(x, int) or x < n][:n] if attr == "mlp_only_layers" else v[:n],
            )
    return c


def _count(cls: Any, config: Any) -> tuple[int, int, int, int, int, int, int]:
    """(linear, head, embedding, other, linear modules, sum in+out, q/k norms) of ``cls`` built on the meta
    device. A q/k norm is an attention's ``q_norm`` module (Qwen3, Gemma3, OLMo2...: its fp32 input is kept for
    backward, a training activation the memory model counts)."""
    import torch

    with torch.device("meta"):
        model = cls._from_config(config) if hasattr(cls, "_from_config") else cls(config)
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    head_ids = {id(p) for p in head.parameters()} if head is not None else set()
    emb_ids: set[int] = set()
    lin_ids: set[int] = set()
    mods = ins = qk = 0
    for name, m in model.named_modules():
        if name.rsplit(".", 1)[-1] == "q_norm" and any(True for _ in m.parameters()):
            qk += 1
        if isinstance(m, torch.nn.Embedding):
            emb_ids.update(id(p) for p in m.parameters(recurse=False))
        elif isinstance(m, torch.nn.Linear) and m is not head:
            lin_ids.update(id(p) for p in m.parameters(recurse=False))
            mods += 1
            ins += m.in_features + m.out_features
    lin = hd = emb = other = 0
    for p in model.parameters():  # de-duplicated: a tied head counts once, as the embedding
        n = p.numel()
        if id(p) in emb_ids:
            emb += n
        elif id(p) in head_ids:
            hd += n
        elif id(p) in lin_ids:
            lin += n
        else:
            other += n
    return lin, hd, emb, other, mods, ins, qk


#: (class, config JSON) -> counts. Plans are re-made often for the same model (CLI, tests, load_model).
_COUNTS: dict[tuple[Any, str], ParamCounts] = {}
_COUNTS_LOCK = threading.Lock()


def _counts_cached(cls: Any, config: Any, layers: int) -> ParamCounts:
    key = (cls, json.dumps(config.to_dict(), sort_keys=True, default=str))
    with _COUNTS_LOCK:
        hit = _COUNTS.get(key)
    if hit is None:
        hit = _counts(cls, config, layers)
        with _COUNTS_LOCK:
            if len(_COUNTS) > 64:
                _COUNTS.clear()
            _COUNTS[key] = hit
    return hit


def _counts(cls: Any, config: Any, layers: int) -> ParamCounts:
    try:
        one = _count(cls, _with_layers(config, 1))
        two = _count(cls, _with_layers(config, 2))
    except Exception as e:  # some configs refuse 1-layer copies; count the real thing instead
        log.debug("layer extrapolation failed (%s); counting the full model on meta", e)
        full = _count(cls, config)
        return ParamCounts(
            *full[:4],
            per_layer=sum(full[:4]) // max(layers, 1),
            linear_modules=full[4],
            linear_in_out=full[5],
            qk_norms=full[6],
        )
    per = [b - a for a, b in zip(one, two, strict=True)]
    base = [a - p for a, p in zip(one, per, strict=True)]
    tot = [b + layers * p for b, p in zip(base, per, strict=True)]
    return ParamCounts(
        linear=tot[0],
        head=tot[1],
        embedding=tot[2],
        other=tot[3],
        per_layer=sum(per[:4]),
        linear_modules=tot[4],
        linear_in_out=tot[5],
        qk_norms=tot[6],
    )
