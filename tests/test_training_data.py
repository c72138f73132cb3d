"""Packing and the collators: every sequence lands in exactly one step within the plan's bounds, a packed step
trains exactly like the padded batch of the same sequences (loss and gradients), and no packed sequence sees
its neighbour. CPU, tiny models in fp32 (exact up to float rounding)."""

from __future__ import annotations

import itertools
import random
from pathlib import Path
from typing import Any

import pytest
import torch

from cudaload.errors import ConfigurationError
from cudaload.train.data import PackedCollator, PaddedCollator, pack


def _data(n: int = 50, lo: int = 1, hi: int = 40, seed: int = 0) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    return [{"input_ids": [rng.randrange(3, 90) for _ in range(rng.randrange(lo, hi + 1))]} for _ in range(n)]


def test_pack_respects_both_bounds_and_keeps_every_sequence_once() -> None:
    data = _data(200)
    ds = pack(data, tokens_per_step=96, sequences_per_step=4, longest=40)
    seen: list[tuple[int, ...]] = []
    for item in ds:
        seqs = item["input_ids"]
        assert 1 <= len(seqs) <= 4
        assert sum(map(len, seqs)) <= 96
        seen += [tuple(s) for s in seqs]
    assert sorted(seen) == sorted(tuple(d["input_ids"]) for d in data)
    s = ds.summary
    assert s.sequences == 200 and s.steps == len(ds) and s.max_step_tokens <= 96 and s.max_step_sequences <= 4
    assert s.tokens == sum(len(d["input_ids"]) for d in data)


def test_pack_is_seeded_and_closes_a_step_only_when_a_bound_would_break() -> None:
    data = _data(60)
    a = [x["input_ids"] for x in pack(data, tokens_per_step=80, sequences_per_step=3, longest=40, seed=1)]
    b = [x["input_ids"] for x in pack(data, tokens_per_step=80, sequences_per_step=3, longest=40, seed=1)]
    c = [x["input_ids"] for x in pack(data, tokens_per_step=80, sequences_per_step=3, longest=40, seed=2)]
    assert a == b and a != c
    # greedy in order: a step is closed because it is full or the next sequence would overflow it
    for step, nxt in itertools.pairwise(a):
        assert len(step) == 3 or sum(map(len, step)) + len(nxt[0]) > 80
    ordered = pack(data, tokens_per_step=10_000, sequences_per_step=1, longest=40, shuffle=False)
    assert [x["input_ids"][0] for x in ordered] == [d["input_ids"] for d in data]


def test_pack_refuses_a_sequence_longer_than_the_plan_and_names_the_fix() -> None:
    data = [*_data(5, hi=10), {"input_ids": list(range(3, 60))}]
    with pytest.raises(ConfigurationError) as e:
        pack(data, tokens_per_step=128, sequences_per_step=4, longest=32)
    assert "seq_len=57" in e.value.fix and "truncate=True" in e.value.fix
    ds = pack(data, tokens_per_step=128, sequences_per_step=4, longest=32, truncate=True)
    assert ds.summary.truncated == 1 and max(len(s) for x in ds for s in x["input_ids"]) == 32


@pytest.mark.parametrize(
    "rows, match",
    [
        ([{"text": "hello"}], "no 'input_ids'"),
        ([{"input_ids": "hello"}], "sequence of token ids"),
        ([{"input_ids": [[1, 2], [3]]}], "nested"),
        ([{"input_ids": [1, 2, 3], "labels": [1, 2]}], "2 labels for 3"),
        ([{"input_ids": [1, 2, 3], "attention_mask": [1, 1]}], "attention_mask has 2"),
        ([{"input_ids": []}], "no non-empty example"),
    ],
)
def test_pack_refuses_untokenized_or_malformed_rows(rows: list[dict[str, Any]], match: str) -> None:
    with pytest.raises(ConfigurationError, match=match):
        pack(rows, tokens_per_step=64, sequences_per_step=2, longest=32)


def test_pack_refuses_bounds_that_cannot_hold_a_sequence() -> None:
    with pytest.raises(ConfigurationError, match="does not fit a step"):
        pack(_data(3), tokens_per_step=16, sequences_per_step=2, longest=32)
    with pytest.raises(ConfigurationError, match="positive integer"):
        pack(_data(3), tokens_per_step=True, sequences_per_step=2, longest=32)  # type: ignore[arg-type]


def test_pack_drops_the_padding_an_attention_mask_marks() -> None:
    ds = pack(
        [{"input_ids": [0, 0, 5, 6, 7], "attention_mask": [0, 0, 1, 1, 1], "labels": [-100, -100, 5, 6, 7]}],
        tokens_per_step=16,
        sequences_per_step=2,
        longest=8,
    )
    assert ds[0] == {"input_ids": [[5, 6, 7]], "labels": [[5, 6, 7]]}


def test_packed_collator_layout_and_flash_boundaries() -> None:
    feats = [{"input_ids": [[5, 6, 7], [8, 9]], "labels": [[-100, 6, 7], [8, 9]]}]
    out = PackedCollator(boundaries="cu_seq_lens")(feats)
    assert out["input_ids"].tolist() == [[5, 6, 7, 8, 9]]
    assert out["position_ids"].tolist() == [[0, 1, 2, 0, 1]]
    # each sequence's first token is nobody's target (the model shifts labels left by one)
    assert out["labels"].tolist() == [[-100, 6, 7, -100, 9]]
    assert out["cu_seq_lens_q"].tolist() == [0, 3, 5] and out["cu_seq_lens_q"].dtype == torch.int32
    assert out["use_cache"] is False  # a cache would keep transformers from masking the pack
    assert out["max_length_q"] == 3 and isinstance(out["max_length_k"], int)
    plain = PackedCollator()([{"input_ids": [1, 2]}, {"input_ids": [3, 4, 5]}])
    assert "cu_seq_lens_q" not in plain and plain["position_ids"].tolist() == [[0, 1, 0, 1, 2]]


def test_padded_collator_pads_right_with_a_mask_and_ignored_labels() -> None:
    out = PaddedCollator(pad_to_multiple_of=4)([{"input_ids": [5, 6, 7]}, {"input_ids": [8]}])
    assert out["input_ids"].shape == (2, 4)
    assert out["attention_mask"].tolist() == [[1, 1, 1, 0], [1, 0, 0, 0]]
    assert out["labels"].tolist() == [[5, 6, 7, -100], [8, -100, -100, -100]]


@pytest.fixture(scope="module")
def tiny(tiny_model: Any) -> Path:
    return Path(tiny_model("qwen3"))


def _model(path: Path, attn: str) -> Any:
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    return AutoModelForCausalLM.from_pretrained(path, attn_implementation=attn, dtype=torch.float32).train()


def _loss_and_grads(model: Any, batch: dict[str, Any]) -> tuple[float, dict[str, torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    out = model(**batch)
    out.loss.backward()
    return float(out.loss), {
        n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None
    }


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_a_packed_step_trains_like_the_padded_batch(tiny: Path, attn: str) -> None:
    """Same sequences, two layouts: the same loss (mean over the same targets) and the same gradients."""
    model = _model(tiny, attn)
    assert model.config.attention_dropout == 0  # deterministic: the layouts are compared, not randomness
    seqs = [{"input_ids": s["input_ids"]} for s in _data(6, lo=4, hi=24, seed=3)]
    l_pad, g_pad = _loss_and_grads(model, PaddedCollator()(seqs))
    l_pack, g_pack = _loss_and_grads(model, PackedCollator()(seqs))
    assert l_pack == pytest.approx(l_pad, rel=1e-5, abs=1e-6)
    assert g_pad.keys() == g_pack.keys()
    for n in g_pad:
        torch.testing.assert_close(g_pack[n], g_pad[n], rtol=1e-4, atol=1e-6, msg=n)


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_no_packed_sequence_attends_to_its_neighbour(tiny: Path, attn: str) -> None:
    """Each sequence's logits in the pack equal its logits alone; with the boundaries hidden (positions not
    restarting, i.e. one long sequence) they do not, so this test catches a leak."""
    model = _model(tiny, attn).eval()
    a, b = [5, 9, 11, 13, 17, 19], [23, 29, 31, 37]
    packed = PackedCollator()([{"input_ids": a}, {"input_ids": b}])
    with torch.no_grad():
        both = model(**{k: v for k, v in packed.items() if k != "labels"}).logits[0]
        alone_b = model(input_ids=torch.tensor([b])).logits[0]
        alone_a = model(input_ids=torch.tensor([a])).logits[0]
        leaky = model(
            input_ids=packed["input_ids"], position_ids=torch.arange(10)[None], use_cache=False
        ).logits[0]
    torch.testing.assert_close(both[: len(a)], alone_a, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(both[len(a) :], alone_b, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(leaky[len(a) :], alone_b, rtol=1e-3, atol=1e-3)


def test_the_packed_collator_skips_an_empty_sequence_and_the_packed_set_slices() -> None:
    out = PackedCollator()([{"input_ids": [[5, 6], []]}])
    assert out["input_ids"].tolist() == [[5, 6]] and out["labels"].tolist() == [[-100, 6]]
    ds = pack(_data(20), tokens_per_step=64, sequences_per_step=2, longest=40, seed=0)
    assert ds[1:3] == [ds[1], ds[2]]
