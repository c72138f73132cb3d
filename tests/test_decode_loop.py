"""cudaload.execute.runtime.decode_loop: transformers' sampling loop with the stop read one step late (issue 35).

The loop runs on the CPU here through ``late_stop_sample`` with its refusal of the CPU faked away (the
``late_on_cpu`` fixture; on the CPU it otherwise keeps transformers' loop, where the host waits for nothing): the
same ids as transformers' ``_sample`` for greedy and seeded sampling, with early EOS stops in a padded batch, on
every installed transformers."""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from cudaload.errors import ConfigurationError
from cudaload.execute.runtime import decode_loop


@pytest.fixture
def lm(tiny_model: Callable[..., Path]) -> Iterator[Any]:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model("qwen3"), dtype=torch.float32).eval()
    yield model


@pytest.fixture
def late_on_cpu(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """late_stop_sample runs its loop on the CPU too (its refusal of the CPU is tested below with explicit facts);
    the list counts the loop's runs."""
    ran: list[int] = []
    real = decode_loop._loop

    def counted(*a: Any, **k: Any) -> Any:
        ran.append(1)
        return real(*a, **k)

    monkeypatch.setattr(decode_loop, "late_stop_refusal", lambda *a: None)
    monkeypatch.setattr(decode_loop, "_loop", counted)
    return ran


_LATE = decode_loop.late_stop_sample


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


def test_the_late_loop_gives_transformers_greedy_ids_with_early_stops_in_a_padded_batch(
    lm: Any, late_on_cpu: list[int]
) -> None:
    x = _batch(lm.config.vocab_size)
    free = lm.generate(**x, max_new_tokens=12, do_sample=False, pad_token_id=0, eos_token_id=None)
    new = free[:, x["input_ids"].shape[1] :]
    # EOS ids that end the rows at different steps (a row's 3rd and another's 7th token), and one never seen
    for eos in ([int(new[0, 2])], [int(new[1, 6]), int(new[2, 2])], [lm.config.vocab_size - 1]):
        want = lm.generate(**x, max_new_tokens=12, do_sample=False, pad_token_id=0, eos_token_id=eos)
        got = lm.generate(
            **x, max_new_tokens=12, do_sample=False, pad_token_id=0, eos_token_id=eos, custom_generate=_LATE
        )
        assert got.tolist() == want.tolist(), eos
    # every row stopping, each at its own step: the loop ends on a stop it reads one step late and undoes that step
    eos = [int(new[0, 2]), int(new[1, 4]), int(new[2, 6])]
    want = lm.generate(**x, max_new_tokens=12, do_sample=False, pad_token_id=0, eos_token_id=eos)
    got = lm.generate(
        **x, max_new_tokens=12, do_sample=False, pad_token_id=0, eos_token_id=eos, custom_generate=_LATE
    )
    assert want.shape[1] < x["input_ids"].shape[1] + 12  # it did stop early
    assert got.tolist() == want.tolist()
    # a stop at the first decoded token, and a length limit of one token
    first = [int(new[0, 0]), int(new[1, 0]), int(new[2, 0])]
    for kw in ({"max_new_tokens": 5, "eos_token_id": first}, {"max_new_tokens": 1, "eos_token_id": None}):
        want = lm.generate(**x, do_sample=False, pad_token_id=0, **kw)
        got = lm.generate(**x, do_sample=False, pad_token_id=0, custom_generate=_LATE, **kw)
        assert got.tolist() == want.tolist(), kw
    assert len(late_on_cpu) == 6  # every late call ran cudaload's loop


def test_the_late_loop_gives_transformers_sampled_ids_for_the_same_seed(
    lm: Any, late_on_cpu: list[int]
) -> None:
    """Two seeded sampling calls in a row, stopping early at an EOS: the same ids as transformers' loop, the second
    call too (the undone step's draw is put back)."""
    import torch

    x = _batch(lm.config.vocab_size)
    for eos in (None, list(range(3, lm.config.vocab_size, 3))):  # a third of the vocabulary ends a row
        kw = {"max_new_tokens": 9, "do_sample": True, "top_k": 20, "temperature": 0.8, "pad_token_id": 0}
        kw["eos_token_id"] = eos
        torch.manual_seed(7)
        want = [lm.generate(**x, **kw) for _ in range(2)]
        torch.manual_seed(7)
        got = [lm.generate(**x, custom_generate=_LATE, **kw) for _ in range(2)]
        assert [g.tolist() for g in got] == [w.tolist() for w in want], eos
        if eos is not None:
            assert all(w.shape[1] < x["input_ids"].shape[1] + 9 for w in want)  # they stopped early
    assert len(late_on_cpu) == 4


def test_late_stop_stops_one_step_late_and_undoes_that_step() -> None:
    import torch

    stop = decode_loop.LateStop(torch.zeros((2, 4), dtype=torch.long), max_length=100)
    assert stop(torch.ones(2, dtype=torch.long), 5) is False
    assert stop(torch.tensor([0, 0]), 6) is False  # everything stopped: seen one step later
    assert stop(torch.tensor([0, 0]), 7) is True
    assert stop.finish() == 1


def test_late_stop_stops_at_the_length_limit_at_once() -> None:
    import torch

    stop = decode_loop.LateStop(torch.zeros((1, 4), dtype=torch.long), max_length=6)
    one = torch.ones(1, dtype=torch.long)
    assert stop(one, 5) is False
    assert stop(one, 6) is True
    assert stop.finish() == 0


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


@pytest.fixture
def on_cpu_too(monkeypatch: pytest.MonkeyPatch) -> None:
    """install() refuses a CPU model (tested below with explicit facts); these tests bind it there anyway."""
    monkeypatch.setattr(decode_loop, "install_refusal", lambda model: None)


def test_install_passes_the_loop_to_sampling_calls_only(
    lm: Any, monkeypatch: pytest.MonkeyPatch, on_cpu_too: None
) -> None:
    seen: list[bool] = []
    real = decode_loop.late_stop_sample

    def spy(*a: Any, **k: Any) -> Any:
        seen.append(True)
        return real(*a, **k)

    monkeypatch.setattr(decode_loop, "late_stop_sample", spy)
    x = _batch(lm.config.vocab_size)
    want = lm.generate(**x, max_new_tokens=4, do_sample=False, pad_token_id=0)
    assert decode_loop.install(lm) is None
    assert decode_loop.installed(lm)
    assert lm.generate(**x, max_new_tokens=4, do_sample=False, pad_token_id=0).tolist() == want.tolist()
    assert seen == [True]
    lm.generate(**x, max_new_tokens=4, do_sample=True, pad_token_id=0)
    assert seen == [True, True]
    # beams, a streamer, the caller's own custom_generate (None included) or criteria, a tokenizer (stop
    # strings): transformers' generate() untouched
    from transformers import StoppingCriteriaList

    from cudaload.testing import make_tokenizer

    tok = make_tokenizer(lm.config.vocab_size)
    lm.generate(**x, max_new_tokens=3, num_beams=2, do_sample=False, pad_token_id=0)
    lm.generate(input_ids=x["input_ids"][:1], max_new_tokens=3, pad_token_id=0, streamer=_Collect())
    lm.generate(**x, max_new_tokens=3, do_sample=False, pad_token_id=0, custom_generate=_LATE)
    lm.generate(**x, max_new_tokens=3, do_sample=False, pad_token_id=0, custom_generate=None)
    lm.generate(**x, max_new_tokens=3, pad_token_id=0, stopping_criteria=StoppingCriteriaList())
    lm.generate(**x, max_new_tokens=3, pad_token_id=0, stop_strings=["a"], tokenizer=tok)
    assert seen == [True, True]
    decode_loop.uninstall(lm)
    assert not decode_loop.installed(lm) and "generate" not in vars(lm)


def test_the_sampling_check_merges_a_passed_config_with_the_models(lm: Any) -> None:
    """transformers fills a passed generation config's unset fields from the model's (5.17
    generation/utils.py:1936): a model whose config asks for beams makes such a call a beam search."""
    from transformers import GenerationConfig

    assert decode_loop._sampling_call(lm, (), {"generation_config": GenerationConfig(max_new_tokens=4)})
    lm.generation_config.num_beams = 3
    assert not decode_loop._sampling_call(lm, (), {"generation_config": GenerationConfig(max_new_tokens=4)})
    assert decode_loop._sampling_call(
        lm, (), {"generation_config": GenerationConfig(max_new_tokens=4, num_beams=1)}
    )
    lm.generation_config.num_beams = 1
    lm.generation_config.stop_strings = ["x"]
    assert not decode_loop._sampling_call(lm, (), {})


def test_an_installed_generate_follows_a_deep_copy_and_pickles(lm: Any, on_cpu_too: None) -> None:
    import pickle

    decode_loop.install(lm)
    twin = copy.deepcopy(lm)
    assert decode_loop.installed(twin)
    assert twin.generate.args[0] is twin  # bound to the copy, not the original
    try:
        blob = pickle.dumps(lm)
    except Exception as e:  # some transformers' models do not pickle at all (not cudaload's doing)
        decode_loop.uninstall(lm)
        try:
            pickle.dumps(lm)
        except Exception:
            pytest.skip(f"this transformers' model does not pickle without cudaload either: {e}")
        raise
    back = pickle.loads(blob)
    assert decode_loop.installed(back) and back.generate.args[0] is back


def test_install_refuses_what_it_would_bypass_or_not_speed_up() -> None:
    """Explicit facts: a CUDA decoder-only model of a class with transformers' own generate and _sample is
    accepted; the CPU, an encoder-decoder, a class's own generate or _sample, or a generate already on the
    instance are refused with the reason."""
    import types

    import torch
    from transformers.generation.utils import GenerationMixin

    def model(**over: Any) -> Any:
        ns = {"generate": GenerationMixin.generate, "_sample": GenerationMixin._sample}
        ns.update(over.pop("cls", {}))
        m = type("Fake", (), ns)()
        m.device = over.get("device", torch.device("cuda", 1))
        m.config = types.SimpleNamespace(is_encoder_decoder=over.get("enc", False))
        return m

    assert decode_loop.install_refusal(model()) is None
    assert "not CUDA" in str(decode_loop.install_refusal(model(device=torch.device("cpu"))))
    assert "encoder-decoder" in str(decode_loop.install_refusal(model(enc=True)))
    assert "own generate()" in str(decode_loop.install_refusal(model(cls={"generate": lambda self: 0})))
    assert "own _sample()" in str(decode_loop.install_refusal(model(cls={"_sample": lambda self: 0})))
    own = model()
    own.generate = lambda: 0  # a checkpoint's custom_generate
    assert "already has its own generate" in str(decode_loop.install(own))
    assert not decode_loop.installed(own)


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
    # seeded sampling, two calls in a row, every row ending early at one of a third of the vocabulary
    kw = {
        "max_new_tokens": 10,
        "do_sample": True,
        "top_k": 50,
        "pad_token_id": 0,
        "eos_token_id": list(range(3, 512, 3)),
    }
    torch.manual_seed(5)
    want2 = [model.generate(**x, **kw) for _ in range(2)]
    torch.manual_seed(5)
    got2 = [model.generate(**x, custom_generate=decode_loop.late_stop_sample, **kw) for _ in range(2)]
    assert [g.tolist() for g in got2] == [w.tolist() for w in want2]
    assert len(ran) == 4
