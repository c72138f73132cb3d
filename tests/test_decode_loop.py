"""cudaload.decode_loop: transformers' sampling loop with the stop read one step late (issue 35).

The loop runs on the CPU here through a test ``custom_generate`` that calls it directly (``late_stop_sample``
itself keeps transformers' loop on the CPU, where the host waits for nothing): the same ids as transformers'
``_sample`` for greedy and seeded sampling, with early EOS stops in a padded batch, on every installed
transformers."""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from cudaload import decode_loop
from cudaload.errors import ConfigurationError


@pytest.fixture
def lm(tiny_model: Callable[..., Path]) -> Iterator[Any]:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model("qwen3"), dtype=torch.float32).eval()
    yield model


def _forced(
    model: Any,
    input_ids: Any,
    logits_processor: Any,
    stopping_criteria: Any,
    generation_config: Any,
    synced_gpus: bool = False,
    streamer: Any = None,
    **model_kwargs: Any,
) -> Any:
    """The late-stop loop on any device (what late_stop_sample runs on CUDA)."""
    return decode_loop._loop(
        model, input_ids, logits_processor, stopping_criteria, generation_config, streamer, model_kwargs
    )


def _batch(vocab: int) -> dict[str, Any]:
    import torch

    g = torch.Generator().manual_seed(3)
    ids = torch.randint(3, vocab, (3, 11), generator=g)
    mask = torch.ones_like(ids)
    ids[1, :4] = 0  # left padding, as generate() wants for a decoder
    mask[1, :4] = 0
    ids[2, :7] = 0
    mask[2, :7] = 0
    return {"input_ids": ids, "attention_mask": mask}


class _Collect:
    """A streamer that keeps what it is given (transformers' BaseStreamer protocol: put, end)."""

    def __init__(self) -> None:
        self.got: list[list[int]] = []
        self.ended = 0

    def put(self, value: Any) -> None:
        self.got.append(value.reshape(-1).tolist())

    def end(self) -> None:
        self.ended += 1


def test_the_late_loop_gives_transformers_greedy_ids_with_early_stops_in_a_padded_batch(lm: Any) -> None:
    x = _batch(lm.config.vocab_size)
    free = lm.generate(**x, max_new_tokens=12, do_sample=False, pad_token_id=0, eos_token_id=None)
    new = free[:, x["input_ids"].shape[1] :]
    # EOS ids that end the rows at different steps (a row's 3rd and another's 7th token), and one never seen
    for eos in ([int(new[0, 2])], [int(new[1, 6]), int(new[2, 2])], [lm.config.vocab_size - 1]):
        want = lm.generate(**x, max_new_tokens=12, do_sample=False, pad_token_id=0, eos_token_id=eos)
        got = lm.generate(
            **x, max_new_tokens=12, do_sample=False, pad_token_id=0, eos_token_id=eos, custom_generate=_forced
        )
        assert got.tolist() == want.tolist(), eos
    # a stop at the first decoded token, and a length limit of one token
    first = [int(new[0, 0]), int(new[1, 0]), int(new[2, 0])]
    for kw in ({"max_new_tokens": 5, "eos_token_id": first}, {"max_new_tokens": 1, "eos_token_id": None}):
        want = lm.generate(**x, do_sample=False, pad_token_id=0, **kw)
        got = lm.generate(**x, do_sample=False, pad_token_id=0, custom_generate=_forced, **kw)
        assert got.tolist() == want.tolist(), kw


def test_the_late_loop_gives_transformers_sampled_ids_for_the_same_seed(lm: Any) -> None:
    import torch

    x = _batch(lm.config.vocab_size)
    kw = {"max_new_tokens": 9, "do_sample": True, "top_k": 20, "temperature": 0.8, "pad_token_id": 0}
    torch.manual_seed(7)
    want = lm.generate(**x, **kw)
    torch.manual_seed(7)
    got = lm.generate(**x, custom_generate=_forced, **kw)
    assert got.tolist() == want.tolist()


def test_late_stop_stops_one_step_late_and_undoes_that_step() -> None:
    import torch

    ids = torch.zeros((2, 4), dtype=torch.long)
    streamer = _Collect()
    stop = decode_loop.LateStop(ids, max_length=100, streamer=streamer)
    ones = torch.ones(2, dtype=torch.long)
    assert stop(ones, torch.tensor([5, 6]), 5) is False
    assert (
        stop(torch.tensor([0, 0]), torch.tensor([7, 8]), 6) is False
    )  # everything stopped: seen one step later
    assert stop(torch.tensor([0, 0]), torch.tensor([0, 0]), 7) is True
    assert stop.finish() == 1
    assert streamer.got == [[5, 6], [7, 8]]  # the undone step's tokens are never streamed


def test_late_stop_stops_at_the_length_limit_at_once_and_streams_the_last_tokens() -> None:
    import torch

    ids = torch.zeros((1, 4), dtype=torch.long)
    streamer = _Collect()
    stop = decode_loop.LateStop(ids, max_length=6, streamer=streamer)
    one = torch.ones(1, dtype=torch.long)
    assert stop(one, torch.tensor([5]), 5) is False
    assert stop(one, torch.tensor([9]), 6) is True
    assert stop.finish() == 0
    assert streamer.got == [[5], [9]]


def test_late_stop_sample_keeps_transformers_loop_where_it_must(lm: Any) -> None:
    """On the CPU (and wherever late_stop_refusal says so) it is transformers' _sample: same ids, dict outputs."""
    import torch

    x = _batch(lm.config.vocab_size)
    want = lm.generate(**x, max_new_tokens=6, do_sample=False, pad_token_id=0)
    got = lm.generate(
        **x, max_new_tokens=6, do_sample=False, pad_token_id=0, custom_generate=decode_loop.late_stop_sample
    )
    assert got.tolist() == want.tolist()
    out = lm.generate(
        **x,
        max_new_tokens=4,
        do_sample=False,
        pad_token_id=0,
        return_dict_in_generate=True,
        output_logits=True,
        custom_generate=decode_loop.late_stop_sample,
    )
    assert len(out.logits) == 4 and torch.equal(out.sequences[:, :-4], x["input_ids"])


def test_late_stop_sample_sends_a_beam_search_to_transformers_beam_search(lm: Any) -> None:
    x = _batch(lm.config.vocab_size)
    kw = {"max_new_tokens": 5, "num_beams": 3, "do_sample": False, "pad_token_id": 0}
    want = lm.generate(**x, **kw)
    got = lm.generate(**x, custom_generate=decode_loop.late_stop_sample, **kw)
    assert got.tolist() == want.tolist()


def test_the_refusals_name_their_reason() -> None:
    import torch
    from transformers import GenerationConfig

    class Cfg:
        is_encoder_decoder = False

    class M:
        config = Cfg()

    class UserCache:
        _is_user_defined = True

    cuda_ids = torch.zeros((1, 2), dtype=torch.long, device="meta")
    cuda_ids = type("Ids", (), {"device": torch.device("cuda", 0)})()
    gc = GenerationConfig()
    assert decode_loop.late_stop_refusal(M(), cuda_ids, gc, False, {}) is None
    assert "synced_gpus" in str(decode_loop.late_stop_refusal(M(), cuda_ids, gc, True, {}))
    assert "return_dict" in str(
        decode_loop.late_stop_refusal(
            M(), cuda_ids, GenerationConfig(return_dict_in_generate=True), False, {}
        )
    )
    assert "cache passed" in str(
        decode_loop.late_stop_refusal(M(), cuda_ids, gc, False, {"past_key_values": UserCache()})
    )
    enc = M()
    enc.config = type("C", (), {"is_encoder_decoder": True})()
    assert "encoder-decoder" in str(decode_loop.late_stop_refusal(enc, cuda_ids, gc, False, {}))
    assert str(decode_loop.late_stop_refusal(M(), torch.zeros(1), gc, False, {})).startswith("cpu:")


def test_install_passes_the_loop_to_sampling_calls_only(lm: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[bool] = []
    real = decode_loop.late_stop_sample

    def spy(*a: Any, **k: Any) -> Any:
        seen.append(True)
        return real(*a, **k)

    monkeypatch.setattr(decode_loop, "late_stop_sample", spy)
    x = _batch(lm.config.vocab_size)
    want = lm.generate(**x, max_new_tokens=4, do_sample=False, pad_token_id=0)
    decode_loop.install(lm)
    assert decode_loop.installed(lm)
    assert lm.generate(**x, max_new_tokens=4, do_sample=False, pad_token_id=0).tolist() == want.tolist()
    assert seen == [True]
    lm.generate(**x, max_new_tokens=4, do_sample=True, pad_token_id=0)
    assert seen == [True, True]
    # beams, a streamer, synced_gpus or the caller's own custom_generate: transformers' generate() untouched
    lm.generate(**x, max_new_tokens=3, num_beams=2, do_sample=False, pad_token_id=0)
    lm.generate(input_ids=x["input_ids"][:1], max_new_tokens=3, pad_token_id=0, streamer=_Collect())
    lm.generate(**x, max_new_tokens=3, do_sample=False, pad_token_id=0, custom_generate=_forced)
    assert seen == [True, True]
    decode_loop.uninstall(lm)
    assert not decode_loop.installed(lm) and "generate" not in vars(lm)


def test_an_installed_generate_follows_a_deep_copy(lm: Any) -> None:
    decode_loop.install(lm)
    twin = copy.deepcopy(lm)
    assert decode_loop.installed(twin)
    assert twin.generate.__self__ is twin  # not the original's


def test_a_mode_moved_to_the_hub_is_refused_with_the_fix(lm: Any) -> None:
    """Contrastive search lives in a Hub repo since transformers 4.56: with cudaload's callable, generate() does
    not load it, and the loop says how to get it."""
    x = _batch(lm.config.vocab_size)
    with pytest.raises(ConfigurationError, match="trust_remote_code"):
        lm.generate(
            **x,
            max_new_tokens=3,
            penalty_alpha=0.6,
            top_k=4,
            pad_token_id=0,
            custom_generate=decode_loop.late_stop_sample,
        )


@pytest.mark.gpu
def test_gpu_the_late_loop_runs_on_cuda_and_gives_transformers_ids(
    small_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On CUDA late_stop_sample runs its own loop (not transformers' fallback) and returns transformers' greedy
    ids, early EOS stops in a padded batch included."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        str(small_model), dtype=torch.bfloat16, device_map="cuda"
    ).eval()
    ran: list[int] = []
    real = decode_loop._loop

    def spy(*a: Any, **k: Any) -> Any:
        ran.append(1)
        return real(*a, **k)

    monkeypatch.setattr(decode_loop, "_loop", spy)
    x = {k: v.cuda() for k, v in _batch(512).items()}
    free = model.generate(**x, max_new_tokens=10, do_sample=False, pad_token_id=0, eos_token_id=None)
    new = free[:, x["input_ids"].shape[1] :]
    for eos in (None, [int(new[0, 3]), int(new[1, 3]), int(new[2, 5])]):
        kw = {"max_new_tokens": 10, "do_sample": False, "pad_token_id": 0, "eos_token_id": eos}
        want = model.generate(**x, **kw)
        got = model.generate(**x, custom_generate=decode_loop.late_stop_sample, **kw)
        assert got.tolist() == want.tolist(), eos
    assert len(ran) == 2
