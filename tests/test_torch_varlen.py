"""cudaload_varlen (torch's own varlen flash kernels, no flash-attn package), on the CPU: the policy over explicit
facts (profiles and snapshots: accepted or rejected, with the reason), the training order and the packed
layout it brings, detection of torch's entry points from the installed files, the boundaries derived from
position ids, the mask function, and the attention function's plumbing through a tiny model with a stand-in
kernel (per-sequence sdpa) in place of the CUDA one. The kernels themselves: tests/test_torch_varlen_gpu.py."""

from __future__ import annotations

import itertools
import json
from dataclasses import replace
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

import cudaload
from cudaload.capabilities import GPU, Capabilities
from cudaload.detection import versions
from cudaload.execute import varlen_attention as V
from cudaload.model_info import ModelInfo, model_info
from cudaload.policies.attention import choose_attention
from cudaload.policies.attention.names import TORCH_VARLEN, VARLEN
from cudaload.policies.attention.torch_varlen_rules import torch_varlen_checks, torch_varlen_entry
from cudaload.policies.training import boundaries_for
from cudaload.policies.training_facts import TrainingFacts
from cudaload.profiles import hardware
from cudaload.testing import full_config

_SMALL = {"num_hidden_layers": 2, "vocab_size": 256, "intermediate_size": 64}


@cache
def info(model_type: str = "qwen3", **extra: Any) -> ModelInfo:
    base = {"model_type": model_type, "hidden_size": 256, "num_attention_heads": 4, "head_dim": 128}
    return model_info({**_SMALL, **base, **extra})


def snapshot(
    torch_version: str | None = "2.11.0+cu130", cuda: str | None = "13.0", **kw: Any
) -> Capabilities:
    return Capabilities(
        source="test",
        gpus=(GPU(0, "NVIDIA H200", (9, 0), 140 << 30),),
        torch_version=torch_version,
        torch_cuda_version=cuda,
        **kw,
    )


def lora(i: ModelInfo, caps: Capabilities, **kw: Any) -> Any:
    kw.setdefault("dtype", "bfloat16")
    return choose_attention(i, caps, intent="lora", **kw)


# -- the rules ------------------------------------------------------------------------------------------------


def test_chosen_for_training_on_the_default_install() -> None:
    d = lora(info(), hardware("H200"))
    assert d.choice == TORCH_VARLEN
    assert any("no flash-attn package" in r for r in d.reasons)
    assert TORCH_VARLEN in VARLEN and boundaries_for(TORCH_VARLEN) == "cu_seq_lens"


def test_an_installed_flash_package_stays_ahead() -> None:
    d = lora(info(), hardware("H200").with_packages(["flash-attn-4"]))
    assert d.choice == "flash_attention_4"
    assert d.candidate(TORCH_VARLEN).ok
    names = [c.name for c in d.candidates if c.ok]
    assert (
        names.index(TORCH_VARLEN) < names.index("sdpa") or names[1] == "sdpa"
    )  # sdpa right after the choice


def test_inference_has_no_such_candidate() -> None:
    d = choose_attention(info(), hardware("H200"), dtype="bfloat16")
    assert d.candidate(TORCH_VARLEN) is None
    assert d.choice != TORCH_VARLEN


@pytest.mark.parametrize(
    ("caps", "reason"),
    [
        (hardware("T4"), "need sm80 or newer"),
        (Capabilities(source="test"), "no GPU"),
        (snapshot("2.11.0+cpu", None), "CPU build"),
        (snapshot("2.8.0+cu128", "12.8"), "has no varlen flash attention"),
        (snapshot("2.11.0+cu130", "13.0", torch_varlen="none"), "has no varlen flash attention"),
    ],
)
def test_rejected_by_the_machine(caps: Capabilities, reason: str) -> None:
    bad = torch_varlen_checks(info(), caps, "bfloat16", "lora")
    assert any(reason in r for r in bad), bad
    d = lora(info(), caps)
    assert d.choice != TORCH_VARLEN


@pytest.mark.parametrize(
    ("i", "dtype", "reason"),
    [
        (info(), "float32", "need float16 or bfloat16"),
        (info(head_dim=512, hidden_size=512), "bfloat16", "> 256"),
        (info(head_dim=100, hidden_size=400), "bfloat16", "not a multiple of 8"),
        (info(attention_dropout=0.1), "bfloat16", "attention_dropout=0.1"),
        (info("gemma2", head_dim=256, attn_logit_softcapping=50.0), "bfloat16", "soft-caps"),
    ],
)
def test_rejected_by_the_model(i: ModelInfo, dtype: str, reason: str) -> None:
    bad = torch_varlen_checks(i, hardware("H200"), dtype, "lora")
    assert any(reason in r for r in bad), bad


def test_sliding_window_is_passed_not_refused() -> None:
    i = info("mistral", head_dim=128, sliding_window=64)
    d = lora(i, hardware("H200"))
    assert d.choice == TORCH_VARLEN
    assert any("sliding window 64" in r for r in d.candidate(TORCH_VARLEN).reasons)


@pytest.mark.parametrize(
    ("caps", "entry"),
    [
        (snapshot("2.9.0+cu128", "12.8"), "aten"),
        (snapshot("2.10.0+cu128", "12.8"), "aten"),
        (snapshot("2.11.0+cu130", "13.0"), "varlen_attn"),
        (snapshot("2.13.0+cu130", "13.0"), "varlen_attn"),
        (snapshot("2.11.0+cu130", "13.0", torch_varlen="aten"), "aten"),  # what detection read wins
        (hardware("H200"), "varlen_attn"),  # a profile: a current CUDA build
    ],
)
def test_entry_point_per_torch_release(caps: Capabilities, entry: str) -> None:
    assert torch_varlen_entry(caps)[0] == entry
    assert lora(info(), caps).choice == TORCH_VARLEN


def test_measured_order() -> None:
    caps = hardware("H200")
    fact = TrainingFacts(
        gpu="NVIDIA H200/sm90",
        versions={"torch": "2.11.0"},
        date="2026-12-07",
        model="Qwen3-8B shape",
        intent="lora",
        layout="packed",
        tokens_per_s={"flash_attention_4": 10000.0, "sdpa": 4500.0},
        source="test",
    )
    # sdpa measured, FA4 not installed: the varlen kernel still goes before sdpa
    assert lora(info(), caps, training_facts=[fact]).choice == TORCH_VARLEN
    # FA4 installed and measured faster: FA4
    assert (
        lora(info(), caps.with_packages(["flash-attn-4"]), training_facts=[fact]).choice
        == "flash_attention_4"
    )
    # cudaload_varlen measured faster than FA4: it goes first
    fast = replace(fact, tokens_per_s={**fact.tokens_per_s, TORCH_VARLEN: 11000.0})
    assert lora(info(), caps.with_packages(["flash-attn-4"]), training_facts=[fast]).choice == TORCH_VARLEN


def test_explicit_request_refused_with_reasons() -> None:
    from cudaload.errors import InvalidChoiceError

    with pytest.raises(InvalidChoiceError) as e:
        lora(info(), hardware("T4"), requested=TORCH_VARLEN)
    assert "sm80" in str(e.value) or any("sm80" in r for r in e.value.reasons)


def test_plan_packs_with_cu_seq_lens_and_says_so() -> None:
    p = cudaload.plan(
        full_config("Qwen3-8B"), hardware=hardware("H200"), intent="lora", seq_len=2048, batch_size=8
    )
    assert p.attention.choice == TORCH_VARLEN
    assert p.training is not None and p.training.packed and p.training.boundaries == "cu_seq_lens"
    text = p.explain()
    assert "cudaload_varlen runs torch's own flash kernels" in text


# -- detection --------------------------------------------------------------------------------------------------

_VARLEN_211 = """
def varlen_attn(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, return_aux=None, scale=None,
                window_size=(-1, -1)):
    pass
_varlen_attn.register_autograd(_backward, setup_context=_setup_context)
"""
_VARLEN_210 = """
def varlen_attn(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, is_causal=False, return_aux=None):
    pass
_varlen_attn.register_autograd(_backward, setup_context=_setup_context)
"""
_NATIVE = (
    "- func: _flash_attention_forward(Tensor query, Tensor key, Tensor value, Tensor? cum_seq_q, Tensor? cum_seq_k, "
    "SymInt max_q, SymInt max_k, float dropout_p, bool is_causal, bool return_debug_mask, *, float? scale=None, "
    "SymInt? window_size_left=None, SymInt? window_size_right=None) -> (Tensor output)\n"
)
_DERIVS = "- name: _flash_attention_forward(Tensor query, ...)\n"


def _fake_torch(root: Path, varlen: str | None, aten: bool) -> Path:
    pkg = root / "torch"
    (pkg / "nn" / "attention").mkdir(parents=True)
    if varlen is not None:
        (pkg / "nn" / "attention" / "varlen.py").write_text(varlen)
    if aten:
        (root / "torchgen/packaged/ATen/native").mkdir(parents=True)
        (root / "torchgen/packaged/autograd").mkdir(parents=True)
        (root / "torchgen/packaged/ATen/native/native_functions.yaml").write_text(_NATIVE)
        (root / "torchgen/packaged/autograd/derivatives.yaml").write_text(_DERIVS)
    return pkg


@pytest.mark.parametrize(
    ("varlen", "aten", "expected"),
    [
        (_VARLEN_211, True, "varlen_attn"),  # 2.11, 2.13
        (_VARLEN_210, True, "aten"),  # 2.10: varlen_attn without scale or window
        (None, True, "aten"),  # 2.9
        (None, False, "none"),
    ],
)
def test_detection_reads_torch_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, varlen: str | None, aten: bool, expected: str
) -> None:
    pkg = _fake_torch(tmp_path, varlen, aten)
    monkeypatch.setattr(versions, "package_locations", lambda module: [pkg] if module == "torch" else [])
    assert versions.torch_varlen() == expected


def test_installed_torch_and_snapshot_round_trip() -> None:
    assert versions.torch_varlen() == "varlen_attn"  # the test environments' torch 2.13
    caps = snapshot(torch_varlen="aten")
    again = Capabilities.from_json(caps.to_json())
    assert again == caps and json.loads(caps.to_json())["torch_varlen"] == "aten"
    assert Capabilities.from_dict({}).torch_varlen is None


# -- boundaries and mask ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pos", "cu", "longest"),
    [
        ([0, 1, 2, 0, 1, 0, 1, 2, 3], [0, 3, 5, 9], 4),
        ([0, 1, 2, 3], [0, 4], 4),
        ([5, 6, 7, 0, 1], [0, 3, 5], 3),  # a row that starts mid-sequence: sdpa's rule (+1 continues)
        ([0, 0, 0], [0, 1, 2, 3], 1),
    ],
)
def test_boundaries_from_position_ids(pos: list[int], cu: list[int], longest: int) -> None:
    got, n = V.boundaries_from_position_ids(torch.tensor([pos]))
    assert got.dtype == torch.int32 and got.tolist() == cu and n == longest
    # the same sequences as transformers' block-diagonal mask for sdpa
    from transformers.masking_utils import find_packed_sequence_indices

    ids = find_packed_sequence_indices(torch.tensor([pos]))
    seq_of = ids[0].tolist() if ids is not None else [0] * len(pos)
    starts = [i for i in range(len(pos)) if i == 0 or seq_of[i] != seq_of[i - 1]]
    assert [*starts, len(pos)] == cu


def test_boundaries_are_computed_once_per_position_ids() -> None:
    pos = torch.tensor([[0, 1, 0, 1, 2]])
    a = V._cached_boundaries(pos)
    assert V._cached_boundaries(pos) is a
    assert V._cached_boundaries(pos.clone()) is not a


def test_mask_none_only_for_one_unpadded_row() -> None:
    assert V.varlen_mask(1, 8, 8, attention_mask=None) is None
    assert V.varlen_mask(1, 8, 8, attention_mask=torch.ones(1, 8, dtype=torch.bool)) is None
    padded = torch.tensor([[True] * 6 + [False] * 2])
    m = V.varlen_mask(1, 8, 8, attention_mask=padded, allow_is_causal_skip=True)
    assert m is not None and m.shape[-1] == 8
    # a batch of two rows: sdpa's mask (None here: causal without padding, which sdpa runs with is_causal)
    from transformers.masking_utils import sdpa_mask

    assert V.varlen_mask(2, 8, 8, allow_is_causal_skip=False).equal(
        sdpa_mask(2, 8, 8, allow_is_causal_skip=False)
    )


# -- the attention function through a model, with a stand-in kernel ----------------------------------------------


def _reference_aten(
    q: Any,
    k: Any,
    v: Any,
    cu_q: Any,
    cu_k: Any,
    max_q: int,
    max_k: int,
    dropout: float,
    is_causal: bool,
    debug: bool,
    *,
    scale: float,
    window_size_left: int | None = None,
    window_size_right: int | None = None,
) -> tuple[Any, ...]:
    """aten._flash_attention_forward's contract on the CPU: per-sequence attention, (tokens, heads, dim)."""
    assert (
        dropout == 0.0
        and q.dim() == 3
        and max_q == max(int(b - a) for a, b in itertools.pairwise(cu_q.tolist()))
    )
    causal = is_causal or window_size_right == 0
    outs = []
    for a, b in itertools.pairwise(cu_q.tolist()):
        qi, ki, vi = (t[a:b].transpose(0, 1)[None] for t in (q, k, v))
        n = b - a
        i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
        keep = (j <= i) if causal else torch.ones(n, n, dtype=torch.bool)
        if window_size_left is not None and window_size_left >= 0:
            keep = keep & (j >= i - window_size_left)
        o = F.scaled_dot_product_attention(qi, ki, vi, attn_mask=keep, scale=scale, enable_gqa=True)
        outs.append(o[0].transpose(0, 1))
    return torch.cat(outs), None, None, None, None


@pytest.fixture
def cpu_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(V, "_KERNEL", ("aten", _reference_aten, False))
    monkeypatch.setattr(V, "_flash_device", lambda t: True)  # the kernel path on the CPU
    V.register()


def _model(kind: str, attn: str, **cfg: Any) -> Any:
    from transformers import AutoModelForCausalLM

    from cudaload.testing import tiny_config

    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(tiny_config(kind, **cfg), attn_implementation=attn).float()


def _seqs(lengths: tuple[int, ...], seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, 300, (n,), generator=g).tolist() for n in lengths]


def _loss_grads(model: Any, **batch: Any) -> tuple[float, dict[str, Any]]:
    model.zero_grad(set_to_none=True)
    loss = model(**batch).loss
    loss.backward()
    return float(loss.detach()), {
        n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None
    }


def _separately(model: Any, seqs: list[list[int]]) -> tuple[float, dict[str, Any]]:
    """sdpa on each sequence alone, weighted as the packed row's loss weighs it (tokens after the first)."""
    model.zero_grad(set_to_none=True)
    total = sum(len(s) - 1 for s in seqs)
    loss_sum = 0.0
    for s in seqs:
        ids = torch.tensor([s])
        part = model(input_ids=ids, labels=ids, use_cache=False).loss * (len(s) - 1) / total
        part.backward()
        loss_sum += float(part)
    return loss_sum, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("boundaries", ["cu_seq_lens", "position_ids"])
@pytest.mark.parametrize(("kind", "lengths"), [("qwen3", (7, 19, 12)), ("mistral", (40, 90, 70))])
def test_packed_row_equals_each_sequence_alone(
    cpu_kernel: None, boundaries: str, kind: str, lengths: tuple[int, ...]
) -> None:
    from cudaload.train.data import PackedCollator

    seqs = _seqs(lengths)
    batch = PackedCollator(boundaries=boundaries)([{"input_ids": s} for s in seqs])
    varlen = _model(kind, TORCH_VARLEN)
    ref = _model(kind, "sdpa")
    loss, grads = _loss_grads(varlen, **batch)
    ref_loss, ref_grads = _separately(ref, seqs)
    assert loss == pytest.approx(ref_loss, rel=1e-5, abs=1e-6)
    assert grads.keys() == ref_grads.keys()
    for n in grads:
        torch.testing.assert_close(grads[n], ref_grads[n], rtol=1e-4, atol=1e-6, msg=n)


@pytest.mark.parametrize(("kind", "lengths"), [("qwen3", (7, 19, 12)), ("mistral", (40, 90, 70))])
def test_off_cuda_a_packed_row_runs_masked_sdpa_with_the_same_numbers(
    kind: str, lengths: tuple[int, ...]
) -> None:
    """No stand-in: on the CPU the function itself keeps the sequences apart (sdpa with their block mask)."""
    from cudaload.train.data import PackedCollator

    V.register()
    seqs = _seqs(lengths)
    batch = PackedCollator(boundaries="position_ids")([{"input_ids": s} for s in seqs])
    loss, grads = _loss_grads(_model(kind, TORCH_VARLEN), **batch)
    ref_loss, ref_grads = _separately(_model(kind, "sdpa"), seqs)
    assert loss == pytest.approx(ref_loss, rel=1e-5, abs=1e-6)
    for n in grads:
        torch.testing.assert_close(grads[n], ref_grads[n], rtol=1e-4, atol=1e-6, msg=n)


def test_padded_batch_goes_to_sdpa_with_the_same_numbers(
    cpu_kernel: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    from cudaload.train.data import PaddedCollator

    def never(*a: Any, **k: Any) -> Any:
        raise AssertionError("a padded batch must not reach the varlen kernel")

    monkeypatch.setattr(V, "_KERNEL", ("aten", never, False))
    batch = PaddedCollator()([{"input_ids": s} for s in _seqs((5, 11, 8))])
    varlen = _model("qwen3", TORCH_VARLEN)
    ref = _model("qwen3", "sdpa")
    loss, grads = _loss_grads(varlen, **batch)
    ref_loss, ref_grads = _loss_grads(ref, **batch)
    assert loss == ref_loss
    for n in grads:
        torch.testing.assert_close(grads[n], ref_grads[n], rtol=0, atol=0)


def test_generate_runs_prefill_varlen_and_decodes_through_sdpa(cpu_kernel: None) -> None:
    varlen = _model("qwen3", TORCH_VARLEN).eval()
    ref = _model("qwen3", "sdpa").eval()
    ids = torch.tensor([_seqs((9,))[0]])
    kw = {"max_new_tokens": 6, "do_sample": False, "pad_token_id": 0}
    assert varlen.generate(ids, **kw).tolist() == ref.generate(ids, **kw).tolist()


def test_dropout_is_refused() -> None:
    q = torch.zeros(1, 2, 4, 8)
    with pytest.raises(ValueError, match="no attention dropout"):
        V.varlen_attention_forward(object(), q, q, q, None, dropout=0.1)


def test_registered_with_transformers() -> None:
    V.register()
    assert V.registered()
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    assert AttentionInterface._global_mapping[TORCH_VARLEN] is V.varlen_attention_forward
    assert AttentionMaskInterface._global_mapping[TORCH_VARLEN] is V.varlen_mask
