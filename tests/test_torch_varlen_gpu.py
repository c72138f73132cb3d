"""cudaload_varlen on a real GPU (the H200 device machine): a packed row of 3 sequences through torch's own varlen
flash kernels trains like sdpa run on each sequence alone (loss and every gradient, bf16 tolerances), with the
boundaries from the collator (cu_seq_lens) or from the position ids, through both of torch's entry points
(varlen_attn where this torch has it with a scale and a window, and the aten op), and a padded batch gives
exactly sdpa's numbers."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
import torch

from cudaload.execute import varlen_attention as V
from cudaload.policies.attention.names import TORCH_VARLEN
from cudaload.train.data import PackedCollator, PaddedCollator

pytestmark = pytest.mark.gpu

LENGTHS = (37, 300, 129)


def _seqs(seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, 500) for _ in range(n)] for n in LENGTHS]


def _on_gpu(batch: dict[str, Any]) -> dict[str, Any]:
    return {k: v.cuda() if isinstance(v, torch.Tensor) else v for k, v in batch.items()}


def _model(path: Path, attn: str) -> Any:
    from transformers import AutoModelForCausalLM

    V.register()
    return (
        AutoModelForCausalLM.from_pretrained(path, attn_implementation=attn, dtype=torch.bfloat16)
        .cuda()
        .train()
    )


def _grads(model: Any) -> dict[str, torch.Tensor]:
    return {n: p.grad.float() for n, p in model.named_parameters() if p.grad is not None}


def _packed(model: Any, batch: dict[str, Any]) -> tuple[float, dict[str, torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    loss = model(**_on_gpu(batch)).loss
    loss.backward()
    return float(loss.detach()), _grads(model)


def _separately(model: Any, seqs: list[list[int]]) -> tuple[float, dict[str, torch.Tensor]]:
    """sdpa on each sequence alone, each weighted as the packed row weighs it (its tokens after the first)."""
    model.zero_grad(set_to_none=True)
    total = sum(len(s) - 1 for s in seqs)
    out = 0.0
    for s in seqs:
        ids = torch.tensor([s], device="cuda")
        part = model(input_ids=ids, labels=ids, use_cache=False).loss * ((len(s) - 1) / total)
        part.backward()
        out += float(part.detach())
    return out, _grads(model)


def _close(grads: dict[str, torch.Tensor], ref: dict[str, torch.Tensor]) -> None:
    assert grads.keys() == ref.keys()
    for n, g in grads.items():
        r = ref[n]
        # bf16 weights and activations: relative to the gradient's own scale
        scale = float(r.abs().max()) or 1.0
        err = float((g - r).abs().max())
        assert err <= 0.05 * scale + 1e-4, f"{n}: max |diff| {err:.3g} against max |ref| {scale:.3g}"


@pytest.fixture(params=["installed", "aten"])
def entry(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Both of torch's entry points: what this torch offers (varlen_attn on 2.11+), and the aten op forced."""
    V._KERNEL = None
    which = V.kernel()[0]
    if request.param == "aten":
        monkeypatch.setattr(V, "_KERNEL", ("aten", torch.ops.aten._flash_attention_forward, False))
        which = "aten"
    return which


@pytest.mark.parametrize("boundaries", ["cu_seq_lens", "position_ids"])
def test_packed_equals_sdpa_per_sequence(small_model: Path, entry: str, boundaries: str) -> None:
    seqs = _seqs()
    batch = PackedCollator(boundaries=boundaries)([{"input_ids": s} for s in seqs])
    loss, grads = _packed(_model(small_model, TORCH_VARLEN), batch)
    ref_loss, ref_grads = _separately(_model(small_model, "sdpa"), seqs)
    assert loss == pytest.approx(ref_loss, rel=2e-2), (entry, loss, ref_loss)
    _close(grads, ref_grads)


def test_forward_outputs_per_sequence(small_model: Path, entry: str) -> None:
    """The packed row's logits equal each sequence's own logits under sdpa (forward alone, bf16)."""
    seqs = _seqs(1)
    batch = _on_gpu(PackedCollator(boundaries="cu_seq_lens")([{"input_ids": s} for s in seqs]))
    batch.pop("labels")
    varlen, ref = _model(small_model, TORCH_VARLEN).eval(), _model(small_model, "sdpa").eval()
    with torch.no_grad():
        packed = varlen(**batch).logits[0].float()
        alone = torch.cat([ref(input_ids=torch.tensor([s], device="cuda")).logits[0].float() for s in seqs])
    torch.testing.assert_close(packed, alone, rtol=2e-2, atol=6e-2)


def test_padded_batch_runs_sdpa(small_model: Path) -> None:
    batch = PaddedCollator()([{"input_ids": s} for s in _seqs(2)])
    loss, grads = _packed(_model(small_model, TORCH_VARLEN), batch)
    ref_loss, ref_grads = _packed(_model(small_model, "sdpa"), batch)
    assert loss == pytest.approx(ref_loss, rel=1e-6)
    # the same sdpa calls; a backward kernel's accumulation order may differ from run to run
    _close(grads, ref_grads)


def test_installed_entry_point_matches_detection() -> None:
    from cudaload.detection.versions import torch_varlen

    V._KERNEL = None
    assert V.kernel()[0] == torch_varlen()
