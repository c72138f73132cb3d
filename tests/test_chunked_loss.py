"""cudaload's chunked linear cross-entropy (src/cudaload/execute/chunked_loss.py): the loss and its gradients
against transformers' own ForCausalLMLoss on the CPU (fp32, exact to float rounding; bf16 within its rounding),
installed on tiny Qwen3 and Llama causal LMs (full training, LoRA, packed rows) against the uninstalled model,
the calls that keep the model's own forward, and the models it refuses. The GPU test (marker ``gpu``) checks
that the chunked step's peak CUDA memory is below transformers' on a vocabulary-heavy model."""

from __future__ import annotations

import copy
import inspect
from typing import Any

import pytest
import torch

from cudaload.execute.chunked_loss import (
    chunked_cross_entropy,
    chunked_loss_problem,
    has_chunked_loss,
    install_chunked_loss,
    remove_chunked_loss,
)

transformers = pytest.importorskip("transformers")
from transformers.loss.loss_utils import ForCausalLMLoss  # noqa: E402

B, T, H, V = 2, 13, 16, 37


def _inputs(dtype: torch.dtype = torch.float32, bias: bool = True, seed: int = 0) -> dict[str, Any]:
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, V, (B, T), generator=g)
    labels[0, :7] = -100  # with rows 3, 1 or 7, at least one chunk whose targets are all ignored
    labels[1, -4:] = -100  # the padded tail of a shorter row
    labels[1, 5] = -100
    return {
        "hidden": torch.randn(B, T, H, generator=g).to(dtype).requires_grad_(),
        "weight": (torch.randn(V, H, generator=g) * 0.3).to(dtype).requires_grad_(),
        "bias": (torch.randn(V, generator=g) * 0.1).to(dtype).requires_grad_() if bias else None,
        "labels": labels,
    }


def _leaves(x: dict[str, Any], dtype: torch.dtype | None = None) -> dict[str, Any]:
    """Fresh leaves with the same values (optionally cast), so each path has its own .grad."""
    out = dict(x)
    for k in ("hidden", "weight", "bias"):
        if x[k] is not None:
            out[k] = x[k].detach().to(dtype or x[k].dtype).requires_grad_()
    return out


def _reference(x: dict[str, Any], **kw: Any) -> torch.Tensor:
    logits = torch.nn.functional.linear(x["hidden"], x["weight"], x["bias"])
    loss: torch.Tensor = ForCausalLMLoss(logits, x["labels"], vocab_size=V, **kw)
    return loss


def _ours(x: dict[str, Any], **kw: Any) -> torch.Tensor:
    return chunked_cross_entropy(x["hidden"], x["weight"], x["labels"], bias=x["bias"], **kw)


def _grads(x: dict[str, Any]) -> list[torch.Tensor]:
    return [x[k].grad for k in ("hidden", "weight", "bias") if x[k] is not None]


def _check(
    a: dict[str, Any], b: dict[str, Any], la: torch.Tensor, lb: torch.Tensor, atol: float = 1e-5
) -> None:
    assert la.dtype == torch.float32 and la.dim() == 0
    torch.testing.assert_close(la, lb.float(), atol=atol, rtol=atol)
    la.backward()
    lb.backward()
    for ga, gb in zip(_grads(a), _grads(b), strict=True):
        torch.testing.assert_close(ga.float(), gb.float(), atol=atol, rtol=atol)


@pytest.mark.parametrize("rows", [1, 3, 7, B * T, 1000, None])
@pytest.mark.parametrize("items", [None, 17, "tensor"])
@pytest.mark.parametrize("bias", [True, False])
def test_equals_transformers_loss_and_gradients(rows: int | None, items: Any, bias: bool) -> None:
    x = _inputs(bias=bias)
    num = torch.tensor(17) if items == "tensor" else items
    ours, ref = _leaves(x), _leaves(x)
    _check(ours, ref, _ours(ours, rows=rows, num_items_in_batch=num), _reference(ref, num_items_in_batch=num))


def test_only_rows_with_a_target_go_through_the_head() -> None:
    """A masked prompt costs no head or loss work: the head's matmul FLOPs (forward and the gradients made in
    it) follow the rows that have a target, not the rows of the step."""
    from torch.utils.flop_counter import FlopCounterMode

    g = torch.Generator().manual_seed(3)
    rows, h, v = 512, 32, 1024
    hidden = torch.randn(1, rows, h, generator=g, requires_grad=True)
    weight = (torch.randn(v, h, generator=g) * 0.1).requires_grad_()

    def head_flops(masked: int) -> int:
        labels = torch.randint(0, v, (1, rows), generator=g)
        labels[0, :masked] = -100  # a prompt of ``masked`` tokens
        with FlopCounterMode(display=False) as fc:
            chunked_cross_entropy(hidden, weight, labels, rows=128).backward()
        return int(fc.get_total_flops())

    full, quarter = head_flops(0), head_flops(3 * rows // 4)
    # the shift leaves rows - 1 targets unmasked, rows // 4 - 1 with the prompt masked: ~1/4 of the work
    assert 0.2 < quarter / full < 0.3, (quarter, full)


def test_shift_labels_given_are_taken_as_they_are() -> None:
    x = _inputs()
    # rolled by 3, not shifted by one: a second shift would show
    shifted = torch.roll(x["labels"], 3, dims=1)
    ours, ref = _leaves(x), _leaves(x)
    kw = {"shift_labels": shifted, "num_items_in_batch": 11}
    _check(ours, ref, _ours(ours, rows=5, **kw), _reference(ref, **kw))


def test_other_ignore_index() -> None:
    x = _inputs()
    x["labels"] = torch.where(x["labels"] == -100, torch.full_like(x["labels"], -1), x["labels"])
    ours, ref = _leaves(x), _leaves(x)
    _check(ours, ref, _ours(ours, rows=4, ignore_index=-1), _reference(ref, ignore_index=-1))


def test_every_target_ignored_is_nan_with_zero_gradients_like_torch() -> None:
    x = _inputs()
    x["labels"] = torch.full_like(x["labels"], -100)
    ours, ref = _leaves(x), _leaves(x)
    lo, lr = _ours(ours, rows=4), _reference(ref)
    assert torch.isnan(lo) and torch.isnan(lr)
    lo.backward()
    lr.backward()
    for a, b in zip(_grads(ours), _grads(ref), strict=True):
        assert torch.equal(a, b) and not a.any()


def test_incoming_gradient_scales_and_frozen_head_gets_none() -> None:
    x = _inputs()
    ours, ref = _leaves(x), _leaves(x)
    ours["weight"].requires_grad_(False)
    ref["weight"].requires_grad_(False)
    (_ours(ours, rows=5) * 3.5).backward()
    (_reference(ref) * 3.5).backward()
    assert ours["weight"].grad is None
    torch.testing.assert_close(ours["hidden"].grad, ref["hidden"].grad, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ours["bias"].grad, ref["bias"].grad, atol=1e-5, rtol=1e-5)


def test_a_second_backward_through_the_same_loss_is_refused() -> None:
    x = _leaves(_inputs())
    loss = _ours(x, rows=5)
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="second backward"):
        loss.backward()


def test_without_autograd_only_the_loss() -> None:
    x = _leaves(_inputs())
    with torch.no_grad():
        lo = _ours(x, rows=4)
        lr = _reference(x)
    assert lo.grad_fn is None
    torch.testing.assert_close(lo, lr, atol=1e-5, rtol=1e-5)
    plain = {k: (v.detach() if torch.is_tensor(v) else v) for k, v in x.items()}
    torch.testing.assert_close(_ours(plain, rows=3), lr, atol=1e-5, rtol=1e-5)


def test_bf16_within_bf16_rounding_of_transformers_fp32_loss() -> None:
    x = _inputs(dtype=torch.bfloat16)
    ours, ref = _leaves(x), _leaves(x, torch.float32)
    lo, lr = _ours(ours, rows=5, num_items_in_batch=17), _reference(ref, num_items_in_batch=17)
    assert lo.dtype == torch.float32
    torch.testing.assert_close(lo, lr, atol=2e-2, rtol=2e-2)
    lo.backward()
    lr.backward()
    for a, b in zip(_grads(ours), _grads(ref), strict=True):
        assert a.dtype == torch.bfloat16
        torch.testing.assert_close(a.float(), b, atol=2e-2, rtol=5e-2)


def test_default_rows_come_from_the_policy() -> None:
    from cudaload.policies.training.loss import chunk_rows

    assert 1 <= chunk_rows(B * T, H, V) <= B * T
    x = _inputs()
    ours, ref = _leaves(x), _leaves(x)
    _check(ours, ref, _ours(ours), _reference(ref))


def test_mismatched_shapes_are_refused() -> None:
    x = _inputs()
    with pytest.raises(ValueError, match="targets"):
        chunked_cross_entropy(x["hidden"], x["weight"], x["labels"][:, :5])
    with pytest.raises(ValueError, match="features"):
        chunked_cross_entropy(x["hidden"], x["weight"][:, :5], x["labels"])


# ---------------------------------------------------------------------------------------------------------------
# installed on tiny causal LMs


def _qwen3(**kw: Any) -> Any:
    from cudaload.testing import tiny_config

    cfg = tiny_config("qwen3", vocab_size=300, max_position_embeddings=256, tie_word_embeddings=False, **kw)
    torch.manual_seed(0)
    return transformers.Qwen3ForCausalLM(cfg).float()


def _llama(**kw: Any) -> Any:
    from cudaload.testing import tiny_config

    # tied: the head's gradient reaches the embedding through both uses
    cfg = tiny_config("llama", vocab_size=300, max_position_embeddings=256, tie_word_embeddings=True, **kw)
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(cfg).float()


MAKERS = {"qwen3": _qwen3, "llama": _llama}


def _batch(seed: int = 1) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 300, (2, 12), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 8:] = 0  # a right-padded second row
    ids[1, 8:] = 0
    labels = ids.masked_fill(mask == 0, -100)
    labels[0, :3] = -100  # a prompt without targets
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def _pair(kind: str) -> tuple[Any, Any]:
    ref = MAKERS[kind]()
    ours = copy.deepcopy(ref)
    ref.train()
    ours.train()
    return ref, ours


def _step(model: Any, batch: dict[str, Any]) -> Any:
    model.zero_grad(set_to_none=True)
    out = model(**batch)
    out.loss.backward()
    return out


def _same_grads(ref: Any, ours: Any, atol: float = 1e-5) -> int:
    checked = 0
    for (n, p), (m, q) in zip(ref.named_parameters(), ours.named_parameters(), strict=True):
        assert n == m
        if p.grad is None:
            assert q.grad is None, n
            continue
        torch.testing.assert_close(q.grad, p.grad, atol=atol, rtol=1e-4, msg=n)
        checked += 1
    return checked


@pytest.mark.parametrize("kind", ["qwen3", "llama"])
@pytest.mark.parametrize("items", [None, 9])
def test_installed_training_step_equals_transformers(kind: str, items: int | None) -> None:
    ref, ours = _pair(kind)
    assert chunked_loss_problem(ours) is None
    assert install_chunked_loss(ours) and has_chunked_loss(ours)
    batch: dict[str, Any] = _batch()
    if items is not None:
        batch["num_items_in_batch"] = torch.tensor(items)
    r, o = _step(ref, batch), _step(ours, batch)
    assert o.logits is None and r.logits is not None
    torch.testing.assert_close(o.loss, r.loss, atol=1e-5, rtol=1e-5)
    assert _same_grads(ref, ours) == len([p for p in ref.parameters() if p.requires_grad])


def test_head_is_read_at_call_time() -> None:
    ref, ours = _pair("qwen3")
    install_chunked_loss(ours)
    torch.manual_seed(5)
    head = torch.nn.Linear(64, 300, bias=True)
    ref.lm_head = head
    ours.lm_head = copy.deepcopy(head)  # replaced after install, with a bias the old head did not have
    r, o = _step(ref, _batch()), _step(ours, _batch())
    torch.testing.assert_close(o.loss, r.loss, atol=1e-5, rtol=1e-5)
    _same_grads(ref, ours)


def test_return_dict_false_and_cache_field_like_the_original() -> None:
    ref, ours = _pair("qwen3")
    install_chunked_loss(ours)
    batch = {**_batch(), "use_cache": True}
    r, o = ref(**batch), ours(**batch)
    field = (
        "cache"
        if "cache" in transformers.modeling_outputs.CausalLMOutputWithPast.__dataclass_fields__
        else "past_key_values"
    )
    assert type(getattr(o, field)) is type(getattr(r, field)) and getattr(o, field) is not None
    rt, ot = ref(**batch, return_dict=False), ours(**batch, return_dict=False)
    assert isinstance(ot, tuple) and isinstance(rt, tuple)
    torch.testing.assert_close(ot[0], rt[0], atol=1e-5, rtol=1e-5)


def test_packed_row_with_flattening_collator_kwargs() -> None:
    """DataCollatorWithFlattening's row: position_ids restart per sequence, -100 at each start, and the varlen
    keywords, which reach the decoder as they do through the model's own forward."""
    ref, ours = _pair("qwen3")
    install_chunked_loss(ours)
    collate = transformers.DataCollatorWithFlattening(return_flash_attn_kwargs=True, return_position_ids=True)
    g = torch.Generator().manual_seed(3)
    rows = [{"input_ids": torch.randint(3, 300, (n,), generator=g).tolist()} for n in (5, 7, 4)]
    batch = collate(rows)
    assert batch["position_ids"][0].tolist() == [*range(5), *range(7), *range(4)]
    seen: dict[str, set[str]] = {}

    def spy(name: str) -> Any:
        def hook(module: Any, args: Any, kwargs: dict[str, Any]) -> None:
            seen[name] = set(kwargs)

        return hook

    ref.model.register_forward_pre_hook(spy("ref"), with_kwargs=True)
    ours.model.register_forward_pre_hook(spy("ours"), with_kwargs=True)
    r, o = _step(ref, dict(batch)), _step(ours, dict(batch))
    torch.testing.assert_close(o.loss, r.loss, atol=1e-5, rtol=1e-5)
    _same_grads(ref, ours)
    assert {"cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k", "position_ids"} <= seen["ours"]
    assert seen["ours"] == seen["ref"]


def test_lora_gradients_equal() -> None:
    peft = pytest.importorskip("peft")
    ref, ours = _pair("qwen3")
    cfg = peft.LoraConfig(
        r=4, lora_alpha=8, target_modules="all-linear", lora_dropout=0.0, init_lora_weights=False
    )
    ref = peft.get_peft_model(ref, cfg)
    ours = peft.get_peft_model(ours, copy.deepcopy(cfg))
    ours.load_state_dict(ref.state_dict())
    ref.train()
    ours.train()
    assert install_chunked_loss(ours) and has_chunked_loss(ours)
    assert "forward" in ours.get_base_model().__dict__
    batch = {**_batch(), "num_items_in_batch": torch.tensor(15)}
    r, o = _step(ref, batch), _step(ours, batch)
    torch.testing.assert_close(o.loss, r.loss, atol=1e-5, rtol=1e-5)
    assert _same_grads(ref, ours) == 2 * 7 * 2  # A and B of 7 linears in 2 layers; the rest is frozen


@pytest.mark.parametrize("how", ["eval", "no_labels", "no_grad", "positional", "logits_to_keep"])
def test_other_calls_run_the_models_own_forward(how: str) -> None:
    ref, ours = _pair("llama")
    install_chunked_loss(ours)
    batch: dict[str, Any] = _batch()
    args: tuple[Any, ...] = ()
    if how == "eval":
        ref.eval()
        ours.eval()
    elif how == "no_labels":
        del batch["labels"]
    elif how == "positional":
        args = (batch.pop("input_ids"),)
    elif how == "logits_to_keep":
        batch["logits_to_keep"] = 2  # the last two positions' logits, labelled as such (row 0's are targets)
        batch["labels"] = batch["labels"][:, -2:]
    with torch.no_grad() if how == "no_grad" else torch.enable_grad():
        r, o = ref(*args, **batch), ours(*args, **batch)
    assert o.logits is not None
    torch.testing.assert_close(o.logits, r.logits)
    if r.loss is not None:
        assert not torch.isnan(r.loss)
        torch.testing.assert_close(o.loss, r.loss)


def test_generate_unchanged() -> None:
    ref, ours = _pair("qwen3")
    install_chunked_loss(ours)
    ids = _batch()["input_ids"][:1, :5]
    for m in (ref, ours):
        m.eval()
    kw = {"max_new_tokens": 6, "do_sample": False, "pad_token_id": 0}
    assert torch.equal(ours.generate(ids, **kw), ref.generate(ids, **kw))
    ours.train()  # generate() from a training model too (no labels: the own forward)
    assert torch.equal(ours.generate(ids, **kw), ref.generate(ids, **kw))


def test_install_is_idempotent_and_remove_restores_the_class_forward() -> None:
    model = _qwen3()
    cls_forward = type(model).forward
    assert install_chunked_loss(model)
    installed = model.__dict__["forward"]
    assert install_chunked_loss(model) and model.__dict__["forward"] is installed
    # Trainer reads the forward's parameters (labels, **kwargs for num_items_in_batch)
    params = inspect.signature(model.forward).parameters
    assert "labels" in params and any(p.kind is p.VAR_KEYWORD for p in params.values())
    assert remove_chunked_loss(model)
    assert "forward" not in model.__dict__ and model.forward.__func__ is cls_forward
    assert not has_chunked_loss(model) and not remove_chunked_loss(model)


def test_an_instance_forward_set_before_install_comes_back() -> None:
    model = _qwen3()
    own = model.forward

    def mine(*a: Any, **k: Any) -> Any:
        return own(*a, **k)

    model.forward = mine
    install_chunked_loss(model)
    assert model.forward is not mine
    remove_chunked_loss(model)
    assert model.forward is mine


def _refused(model: Any, words: str) -> None:
    reason = chunked_loss_problem(model)
    assert reason is not None and words in reason, reason
    before = dict(vars(model.get_base_model() if hasattr(model, "get_base_model") else model))
    with pytest.raises(ValueError, match=words):
        install_chunked_loss(model)
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    assert "forward" not in base.__dict__ and not has_chunked_loss(model)
    assert vars(base).keys() == before.keys()


def test_softcapped_logits_are_refused() -> None:
    from cudaload.testing import tiny_config

    cfg = tiny_config("gemma2", final_logit_softcapping=30.0)
    _refused(transformers.Gemma2ForCausalLM(cfg), "final_logit_softcapping=30.0")


def test_lora_on_the_head_is_refused() -> None:
    peft = pytest.importorskip("peft")
    model = peft.get_peft_model(_qwen3(), peft.LoraConfig(r=4, target_modules=["q_proj", "lm_head"]))
    _refused(model, "not a plain torch.nn.Linear")


def test_models_without_a_causal_lm_loss_are_refused() -> None:
    _refused(_qwen3().model, "not a transformers causal LM")


def test_other_loss_type_is_refused() -> None:
    model = _qwen3()
    model.config.loss_type = "ForMaskedLM"
    _refused(model, "loss_type='ForMaskedLM'")


def test_other_loss_function_is_refused() -> None:
    model = _qwen3()
    model.loss_function = lambda **kw: torch.zeros(())
    _refused(model, "not transformers' ForCausalLMLoss")


@pytest.mark.gpu
def test_gpu_chunked_step_peaks_below_transformers() -> None:
    """A vocabulary-heavy tiny model (V=32768, H=256, bf16, 4 x 1024 tokens): the chunked step's forward and
    backward peak below transformers' loss, whose fp32 logits alone are 4096 x 32768 x 4 B = 512 MiB."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    cfg = transformers.Qwen3Config(
        vocab_size=32768,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=2048,
    )
    torch.manual_seed(0)
    model = transformers.Qwen3ForCausalLM(cfg).to("cuda", torch.bfloat16).train()
    ids = torch.randint(0, 32768, (4, 1024), device="cuda")
    batch = {"input_ids": ids, "labels": ids, "use_cache": False}

    def peak() -> tuple[int, float]:
        model.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        start = torch.cuda.memory_allocated()
        loss = model(**batch).loss
        loss.backward()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - start, float(loss)

    plain, plain_loss = peak()
    install_chunked_loss(model)
    chunked, chunked_loss = peak()
    remove_chunked_loss(model)
    assert abs(chunked_loss - plain_loss) < 2e-2 * abs(plain_loss)
    assert chunked < plain - 256 * 2**20, (chunked, plain)


@pytest.mark.parametrize("keyword", ["past_key_values", "cache"])
def test_a_cache_passed_under_either_name_reaches_the_decoder(keyword: str) -> None:
    """5.24 renamed past_key_values to cache (the old name still accepted): the chunked path hands the decoder
    the cache under the name its transformers takes, and returns the filled cache as the own forward does."""
    from transformers import DynamicCache

    ref, ours = _pair("qwen3")
    install_chunked_loss(ours)
    takes = "cache" if "cache" in inspect.signature(type(ref).forward).parameters else "past_key_values"
    if keyword == "cache" and takes != "cache":
        pytest.skip("this transformers takes the cache as past_key_values")
    batch = _batch()
    outs = [m(**batch, use_cache=True, **{keyword: DynamicCache(config=m.config)}) for m in (ref, ours)]
    torch.testing.assert_close(outs[1].loss, outs[0].loss, atol=1e-5, rtol=1e-5)
    caches = [getattr(o, takes) for o in outs]
    assert all(c is not None for c in caches)
    assert caches[1].get_seq_length() == caches[0].get_seq_length() == batch["input_ids"].shape[1]
