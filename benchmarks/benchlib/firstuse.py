"""Section "firstuse": first-call costs (JIT, imports) of the attention backends."""

from __future__ import annotations

import time
from typing import Any

from .common import _input_ids, _preimport, md_table


def w_firstuse(spec: dict[str, Any]) -> dict[str, Any]:
    """Load with cudaload (attn forced, warmup on/off), then time-to-first-token twice."""
    import torch

    import cudaload

    torch.cuda.init()
    imports_s = _preimport(spec["path"], cudaload_modules=True)
    t0 = time.perf_counter()
    model = cudaload.load_model(spec["path"], attn=spec["backend"], warmup=bool(spec["warmup"]))
    torch.cuda.synchronize()
    load_s = time.perf_counter() - t0
    ids = _input_ids(model, 1, int(spec["prompt"]), "cuda:0")
    ttft = []
    with torch.no_grad():
        for _ in range(2):
            t = time.perf_counter()
            model.generate(
                ids, attention_mask=torch.ones_like(ids), max_new_tokens=1, do_sample=False, pad_token_id=0
            )
            torch.cuda.synchronize()
            ttft.append(time.perf_counter() - t)
    return {
        "load_s": load_s,
        "imports_s": imports_s,
        "ttft_first_s": ttft[0],
        "ttft_second_s": ttft[1],
        # what the first token paid over a warm one: the JIT compile (0 when a warm-up or a cache paid it)
        "first_token_extra_s": ttft[0] - ttft[1],
        "ready_plus_first_token_s": load_s + ttft[0],
        "attention": model.config._attn_implementation,
    }


class FirstUseSection:
    """The Runner's firstuse section (a mixin of benchlib.runner.Runner: uses its args, worker(), save()...)."""

    args: Any
    results: Any

    def s_firstuse(self, sec: dict[str, Any]) -> None:
        if self._skip_gpu(sec):
            return
        if not self.usable("flash-attn-4", "flash_attn.cute"):
            sec["status"] = (
                "skipped: flash-attn-4 not usable here; on the H200 `source .whl/env.sh` with the fa4 "
                "wheels (they cannot travel with bitsandbytes)"
            )
            return
        shape = self.args.shape_list[0]
        path = self.checkpoint(shape)
        sec["shape"] = self.shape_label(shape)
        sec["prompt"] = 512
        rows = []
        # warmup=True first: it forces the probe forward and records the verdict, so the warmup=False load
        # after it finds a cached verdict, skips the probe, and pays the JIT at its first token (usual case).
        for backend in ("flash_attention_4", "sdpa"):
            for warmup in (True, False):
                if self.over_budget():
                    rows.append(
                        {"backend": backend, "warmup": warmup, "error": "skipped: time budget reached"}
                    )
                    continue
                self.log(f"firstuse {backend} warmup={warmup}")
                res = self.worker(
                    "firstuse", {"path": path, "backend": backend, "warmup": warmup, "prompt": 512}
                )
                rows.append({"backend": backend, "warmup": warmup, **res})
                self.save()
        sec["rows"] = rows


def _md_firstuse(sec: dict[str, Any]) -> list[str]:
    out = [
        *([f"From {sec['run']}.", ""] if sec.get("run") else []),
        f"{sec.get('shape')}, bs1, {sec.get('prompt')}-token prompt; `cudaload.load_model(path, attn=..., "
        "warmup=...)` then `generate(max_new_tokens=1)` twice. Ready + first token is what a user waits for.",
        "",
    ]
    rows = [
        [
            r["backend"],
            r["warmup"],
            r.get("load_s"),
            r.get("ttft_first_s"),
            r.get("ttft_second_s"),
            r.get("first_token_extra_s"),
            r.get("ready_plus_first_token_s"),
            r.get("error", "").splitlines()[0] if r.get("error") else None,
        ]
        for r in sec.get("rows", [])
    ]
    out += md_table(
        [
            "backend",
            "warmup",
            "load s",
            "first token s (1st)",
            "first token s (2nd)",
            "1st - 2nd (JIT) s",
            "ready + first token s",
            "error",
        ],
        rows,
    )
    for part in sec.get("also", []):
        out += ["", *_md_firstuse({**part, "also": []})]
    return out


def _merge_firstuse(ran: list[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    """One table per shape, each from the first run that measured it."""
    seen: set[str] = set()
    parts = []
    for label, sec in ran:
        if sec.get("shape") and sec["shape"] not in seen:
            seen.add(sec["shape"])
            parts.append({**sec, "run": label})
    base = dict(parts[0]) if parts else dict(ran[0][1])
    base["also"] = parts[1:]
    return base
