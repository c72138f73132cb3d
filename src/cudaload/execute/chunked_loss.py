"""cudaload's chunked linear cross-entropy (the ``cudaload_chunked`` loss): a causal LM's output head and its loss
computed a chunk of rows at a time, so the logits of the whole step over the vocabulary never exist at once.

Transformers' causal-LM loss takes the head's logits of every token and casts them to fp32 before the
cross-entropy (transformers 5.17 loss/loss_utils.py:59 ``logits = logits.float()``, :40 ``cross_entropy``); for an
8B model at 9k tokens those buffers are most of a step's activation memory. :func:`chunked_cross_entropy` does
what Liger's fused linear cross-entropy does, in torch alone: per chunk the logits, their loss, and at once the
gradients with respect to the hidden states (and the head's weight and bias where they train), which the
forward keeps; the backward only scales them by the loss's incoming gradient (liger-kernel 0.8.5
ops/fused_linear_cross_entropy.py:497-500, :574-578, :610-613).

:func:`install_chunked_loss` puts it in a causal LM's training forward: an instance ``forward`` (transformers'
classes are untouched, as in :mod:`cudaload.execute.layer_compile`) that runs the decoder, then the chunked loss
on its last hidden state, for a training call with labels under autograd; every other call (evaluation,
``generate()``, a call without labels) runs the model's own forward."""

from __future__ import annotations

import functools
import inspect
import warnings
import weakref
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

#: causal LM -> the instance forward it had before install_chunked_loss (None: its class's), so remove puts it back
_ORIGINAL: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()
#: models whose chunked loss was set aside once (said once per model, not per step)
_WARNED: weakref.WeakSet[Any] = weakref.WeakSet()

#: config keys that transform the head's output before the loss, and their neutral values (the same table as
#: cudaload.model_info.build: gemma2 ``final_logit_softcapping``, cohere ``logit_scale``, granite
#: ``logits_scaling``); the chunked loss takes the head's output as the logits, so any of them set refuses it
_HEAD_TRANSFORMS: dict[str, float | None] = {
    "final_logit_softcapping": None,
    "logit_scale": 1.0,
    "logits_scaling": 1.0,
}


def chunked_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor | None,
    *,
    num_items_in_batch: torch.Tensor | int | None = None,
    ignore_index: int = -100,
    shift_labels: torch.Tensor | None = None,
    rows: int | None = None,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """Transformers' causal-LM loss of ``hidden @ weight.T (+ bias)`` against ``labels``, computed ``rows`` rows at
    a time; a 0-dim fp32 tensor.

    The semantics are transformers' ``ForCausalLMLoss`` (5.17 and 5.25 loss/loss_utils.py, the same function):
    ``labels`` shifted left by one with ``ignore_index`` padded at the end, unless ``shift_labels`` is given; the
    sum of the targets' losses divided by ``num_items_in_batch`` where given (an int or a tensor), else their
    mean (NaN when every target is ignored, as torch's mean is); fp32 from the logits on.

    ``hidden``: ``[..., H]``; ``weight``: ``[V, H]``; ``labels`` (or ``shift_labels``): ``hidden``'s leading
    dims. ``rows``: rows per chunk (default: :func:`cudaload.policies.training.loss.chunk_rows`). Under autograd,
    with ``hidden``, ``weight`` or ``bias`` requiring grad, the gradients are computed in this call and kept for
    the backward (memory: a ``hidden``-sized buffer, plus a ``weight``-sized one where the head trains); else
    only the loss is computed."""
    import torch

    if shift_labels is None:
        if labels is None:
            raise ValueError("chunked_cross_entropy needs labels or shift_labels")
        # transformers 5.17 loss/loss_utils.py:61-64: tokens < n predict n; the last position predicts nothing
        padded = torch.nn.functional.pad(labels, (0, 1), value=ignore_index)
        shift_labels = padded[..., 1:]
    size = hidden.shape[-1]
    flat = hidden.reshape(-1, size)
    target = shift_labels.reshape(-1).to(flat.device)
    if target.shape[0] != flat.shape[0]:
        raise ValueError(
            f"chunked_cross_entropy: {flat.shape[0]} rows of hidden states but {target.shape[0]} targets "
            f"(hidden {tuple(hidden.shape)}, labels {tuple(shift_labels.shape)})"
        )
    if weight.dim() != 2 or weight.shape[1] != size:
        raise ValueError(f"chunked_cross_entropy: weight {tuple(weight.shape)} does not map {size} features")
    tokens, vocab = flat.shape[0], weight.shape[0]
    if rows is None:
        from ..policies.training.loss import chunk_rows

        rows = chunk_rows(max(tokens, 1), size, vocab)
    if rows < 1:
        raise ValueError(f"chunked_cross_entropy: rows must be at least 1, got {rows}")

    # the normaliser first: each chunk's gradient is scaled by it before it is summed into the buffers (Liger
    # counts the targets before its loop for the same reason, ops/fused_linear_cross_entropy.py:131-132). A
    # tensor, not .item(): no host sync; 1/0 where no target counts, but then no row takes the scale
    valid = target != ignore_index
    if num_items_in_batch is None:
        norm: Any = valid.sum().to(torch.float32)
    elif torch.is_tensor(num_items_in_batch):
        # transformers 5.17 loss/loss_utils.py:43-44: a tensor count is moved to the loss's device
        norm = num_items_in_batch.to(flat.device)
    else:
        norm = num_items_in_batch

    params = (flat, weight) if bias is None else (flat, weight, bias)
    if torch.is_grad_enabled() and any(t.requires_grad for t in params):
        loss: torch.Tensor = _function().apply(flat, weight, bias, target, valid, norm, ignore_index, rows)
        return loss
    total = _chunks(flat, weight, bias, target, valid, None, rows, None)[0]
    only: torch.Tensor = total / norm
    return only


def _chunks(
    flat: Any, weight: Any, bias: Any, target: Any, valid: Any, norm: Any, rows: int, grads: Any
) -> tuple[Any, Any, Any, Any]:
    """The summed fp32 loss of the valid rows, chunk by chunk; with ``grads`` (``(hidden, weight, bias)`` flags)
    also the gradients of ``sum / norm`` with respect to the rows (``flat``'s dtype), ``weight`` and ``bias``
    (their dtypes), each None where its flag is off."""
    import torch

    want_x, want_w, want_b = grads if grads is not None else (False, False, False)
    grad_x = torch.zeros_like(flat) if want_x else None
    # only the rows with a target go through the head: an ignored row (a prompt token a chat template masks, a
    # sequence's last position, padding) adds nothing to the loss and gets a zero gradient, so its logits are
    # never computed (issue 44: TRL 1.16 computes its head over labelled positions only). One host sync
    # a step, to count them
    rows_with_target = valid.nonzero().squeeze(1)
    if rows_with_target.numel() < valid.numel():
        flat, target, valid = (
            flat.index_select(0, rows_with_target),
            target[rows_with_target],
            valid[rows_with_target],
        )
    else:
        rows_with_target = None
    tokens = flat.shape[0]
    # the head's gradient is summed in the head's dtype, as Liger does with accum_dtype=None
    # (ops/fused_linear_cross_entropy.py:114-117): a bf16 head gets a bf16 buffer, not an fp32 one of V x H
    grad_w = torch.zeros_like(weight) if want_w else None
    grad_b = torch.zeros_like(bias) if want_b and bias is not None else None
    total = torch.zeros((), dtype=torch.float32, device=flat.device)
    # ignored targets (-100) index nothing: take the row's first logit and mask the row out
    safe = torch.where(valid, target, torch.zeros_like(target))
    if grads is not None:
        # 0 on ignored rows (so they add nothing, and no 0 * inf where no target counts), 1/norm on valid ones:
        # the gradient of sum / norm, as transformers' loss/loss_utils.py:40-45 divides the summed loss
        scale = torch.where(valid, 1.0 / torch.as_tensor(norm, dtype=torch.float32, device=flat.device), 0.0)
    for start in range(0, tokens, rows):
        end = min(start + rows, tokens)
        x = flat[start:end]
        if x.dtype != weight.dtype:
            x = x.to(weight.dtype)
        # the head in its own dtype, as nn.Linear would run it; fp32 from here on (loss_utils.py:59)
        logits = x @ weight.t()
        if bias is not None:
            logits = logits + bias
        logits = logits.float()
        lse = torch.logsumexp(logits, dim=-1)
        picked = logits.gather(1, safe[start:end, None]).squeeze(1)
        ok = valid[start:end]
        total = total + torch.where(ok, lse - picked, 0.0).sum()
        if grads is None:
            continue
        # d(loss)/d(logits) = softmax - onehot(target) on valid rows, scaled by 1/norm; in place in the fp32
        # logits (the chunk's only V-wide fp32 buffer)
        probs = logits.sub_(lse[:, None]).exp_()
        probs.scatter_add_(1, safe[start:end, None], -ok.to(probs.dtype)[:, None])
        probs.mul_(scale[start:end, None])
        g = probs.to(weight.dtype)
        del logits, probs
        if grad_x is not None:
            if rows_with_target is None:
                grad_x[start:end] = g @ weight
            else:
                grad_x.index_copy_(0, rows_with_target[start:end], (g @ weight).to(grad_x.dtype))
        if grad_w is not None:
            # accumulated in place with addmm, operands in the head's dtype (an in-place out= op is not
            # autocast): liger-kernel 0.8.5 ops/fused_linear_cross_entropy.py:361-369
            grad_w.addmm_(g.t(), x.to(grad_w.dtype))
        if grad_b is not None:
            # liger-kernel 0.8.5 ops/fused_linear_cross_entropy.py:378-384: the bias's gradient is the rows' sum
            grad_b.add_(g.sum(dim=0).to(grad_b.dtype))
    return total, grad_x, grad_w, grad_b


@functools.lru_cache(maxsize=1)
def _function() -> Any:
    """The ``torch.autograd.Function`` (made on first use, so importing this module does not import torch)."""
    import torch

    class ChunkedLinearCrossEntropy(torch.autograd.Function):
        @staticmethod
        def forward(
            ctx: Any,
            flat: Any,
            weight: Any,
            bias: Any,
            target: Any,
            valid: Any,
            norm: Any,
            ignore_index: int,
            rows: int,
        ) -> Any:
            wants = (
                ctx.needs_input_grad[0],
                ctx.needs_input_grad[1],
                bias is not None and ctx.needs_input_grad[2],
            )
            total, gx, gw, gb = _chunks(flat, weight, bias, target, valid, norm, rows, wants)
            # kept on ctx, not save_for_backward: they are neither inputs nor outputs, and the backward scales
            # them in place (below)
            ctx.grads = (gx, gw, gb)
            return total / norm

        @staticmethod
        def backward(ctx: Any, grad_output: Any) -> Any:
            grads = ctx.grads
            if grads is None:
                raise RuntimeError(
                    "cudaload's chunked loss: a second backward through the same loss (retain_graph) is not "
                    "supported; its gradients were computed in the forward and handed out by the first"
                )
            ctx.grads = None
            # the loss is a step's last op, so grad_output is mostly 1 and the saved gradients are the answer
            # (liger-kernel 0.8.5 ops/fused_linear_cross_entropy.py:419-420); else scaled in place, as Liger's
            # element_mul_kernel does (:427-463), so no second buffer of the hidden states (or the head) exists
            # at the backward's start, the step's peak
            if not torch.equal(grad_output, torch.ones_like(grad_output)):
                for g in grads:
                    if g is not None:
                        g.mul_(grad_output.to(g.dtype))
            gx, gw, gb = grads
            return gx, gw, gb, None, None, None, None, None

    return ChunkedLinearCrossEntropy


# ---------------------------------------------------------------------------------------------------------------
# The model side


def _causal_lm(model: Any) -> Any:
    """The transformers causal LM under ``model``: PEFT's base model where ``model`` is a PEFT model."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def _cache_field(output_class: Any) -> str:
    """The name a KV cache has in ``output_class``: ``cache`` from transformers 5.24, ``past_key_values``
    before (5.24 renamed the keyword and the output field: modeling_qwen3.py 5.25 ``cache=outputs.cache``)."""
    fields = getattr(output_class, "__dataclass_fields__", {})
    return "cache" if "cache" in fields else "past_key_values"


def chunked_loss_problem(model: Any) -> str | None:
    """Why cudaload's chunked loss cannot replace ``model``'s loss (None where it can).

    It replaces exactly what a plain transformers causal LM's forward does after its decoder (transformers 5.17
    and 5.25 modeling_qwen3.py / modeling_llama.py ``*ForCausalLM.forward``: ``outputs = self.model(...)``, the
    head on ``outputs.last_hidden_state``, ``self.loss_function(logits, labels, vocab_size, **kwargs)``, a
    ``CausalLMOutputWithPast``), so it asks for that shape: a causal-LM class with a ``model`` decoder and a
    forward that takes ``labels`` and returns ``CausalLMOutputWithPast`` (a MoE model's returns another output
    and adds its router's loss), a plain ``torch.nn.Linear`` head (not a LoRA, bitsandbytes or PEFT-wrapped
    one, whose forward differs from ``x @ W.T + b``), no config key that transforms the logits before the loss,
    transformers' ``ForCausalLM`` loss, and no accelerate hooks (a device map over several devices, or
    offload: the chunked path reads the head's weight itself, past the hooks that would move or load it)."""
    import torch

    base = _causal_lm(model)
    cls = type(base)
    name = cls.__name__
    try:
        from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

        causal = {v for v in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values() if isinstance(v, str)}
    except ImportError:  # pragma: no cover - transformers without the auto tables
        causal = set()
    if name not in causal and not name.endswith("ForCausalLM"):
        return (
            f"{name} is not a transformers causal LM (not in MODEL_FOR_CAUSAL_LM_MAPPING, not *ForCausalLM)"
        )
    decoder = getattr(base, "model", None)
    if not isinstance(decoder, torch.nn.Module):
        return f"{name} has no `model` decoder for the chunked path to run (its forward calls something else)"
    try:
        sig = inspect.signature(cls.forward)
    except (TypeError, ValueError):
        return f"{name}.forward has no signature to check"
    if "labels" not in sig.parameters:
        return f"{name}.forward takes no labels: it computes no loss to replace"
    returns = sig.return_annotation
    returns_name = returns if isinstance(returns, str) else getattr(returns, "__name__", repr(returns))
    if returns_name != "CausalLMOutputWithPast":
        return (
            f"{name}.forward returns {returns_name}, not CausalLMOutputWithPast: its loss may hold more than the "
            "head's cross-entropy (a MoE router's auxiliary loss)"
        )
    config: Any = getattr(base, "config", None)
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    for key, neutral in _HEAD_TRANSFORMS.items():
        value = getattr(text, key, None)
        if value is not None and value != neutral:
            return f"the config transforms the head's logits before the loss ({key}={value})"
    loss_type = getattr(config, "loss_type", None)
    if loss_type is not None and loss_type != "ForCausalLM":
        return f"the config asks for loss_type={loss_type!r}, not ForCausalLM"
    try:
        from transformers.loss.loss_utils import ForCausalLMLoss

        if base.loss_function is not ForCausalLMLoss:
            return f"the model's loss_function is {getattr(base.loss_function, '__name__', base.loss_function)}, not transformers' ForCausalLMLoss"
    except (ImportError, AttributeError):
        return "transformers' ForCausalLMLoss could not be found to compare the model's loss with"
    head = base.get_output_embeddings() if hasattr(base, "get_output_embeddings") else None
    if head is None:
        return f"{name} has no output head (get_output_embeddings() is None)"
    if type(head) is not torch.nn.Linear:
        return (
            f"the output head is a {type(head).__module__}.{type(head).__name__}, not a plain torch.nn.Linear "
            "(a LoRA or quantized head computes more than x @ W.T + b)"
        )
    if head.weight.is_meta:
        return "the output head's weight is on the meta device (offloaded)"
    if type(head.weight.data).__name__ == "DTensor":
        # tensor parallel or FSDP2 shards the head; the chunked path's `x @ W.T` would run outside the hooks and
        # plans that gather or split it
        return "the output head's weight is sharded (a DTensor: tensor parallel or FSDP2)"
    vocab = getattr(text, "vocab_size", None)
    if vocab is not None and head.weight.shape[0] != vocab:
        return f"the head has {head.weight.shape[0]} outputs but the config's vocab_size is {vocab}"
    if hasattr(base, "_hf_hook") or hasattr(head, "_hf_hook"):
        return (
            "the model carries accelerate hooks (a device map over several devices, or offload): the chunked "
            "path would bypass those that move its inputs and the head's weight"
        )
    return None


def has_chunked_loss(model: Any) -> bool:
    """Whether :func:`install_chunked_loss` installed the chunked loss on ``model`` (and it was not removed)."""
    return _causal_lm(model) in _ORIGINAL


def install_chunked_loss(model: Any) -> bool:
    """Compute ``model``'s training loss with :func:`chunked_cross_entropy`; True (also where already installed).

    ``model``: a transformers causal LM, or a PEFT model over one. The causal LM gets an instance ``forward``
    (as accelerate's hooks set theirs, accelerate 1.16 hooks.py:193; the class is untouched) that runs the
    chunked path for a training call: labels given, the model training, autograd on, keyword arguments only
    (as Trainer and PEFT call it), ``logits_to_keep`` left at 0. Any other call runs the model's own forward
    unchanged. The chunked path returns the same ``CausalLMOutputWithPast`` with ``logits=None``.

    Raises ValueError naming the reason where :func:`chunked_loss_problem` finds one; the model is untouched."""
    import torch

    base = _causal_lm(model)
    if base in _ORIGINAL:
        return True
    problem = chunked_loss_problem(model)
    if problem is not None:
        raise ValueError(f"cudaload's chunked loss cannot replace this model's loss: {problem}")
    own = base.__dict__.get("forward")
    original = base.forward

    # wraps: Trainer reads the forward's signature (which columns to keep, whether it takes num_items_in_batch);
    # inspect.signature follows __wrapped__ to the model's own
    @functools.wraps(original)
    def forward(*args: Any, _base: Any = base, _original: Any = original, **kwargs: Any) -> Any:
        keep = kwargs.get("logits_to_keep", 0)
        if (
            args
            or kwargs.get("labels") is None
            or not _base.training
            or not torch.is_grad_enabled()
            or not (isinstance(keep, int) and keep == 0)
        ):
            return _original(*args, **kwargs)
        changed = _head_changed(_base)
        if changed is not None:
            # the head became one the chunked path cannot compute (adapters put on it after the install, a
            # sharded or hooked head): its own forward, once said, rather than a loss without the adapters
            if _base not in _WARNED:
                _WARNED.add(_base)
                warnings.warn(
                    f"cudaload's chunked loss is set aside for this model: {changed}; the model's own forward "
                    "computes the loss (all the step's logits)",
                    RuntimeWarning,
                    stacklevel=2,
                )
            return _original(*args, **kwargs)
        return _chunked_forward(_base, kwargs)

    forward.__cudaload_chunked_loss__ = True  # type: ignore[attr-defined]
    base.forward = forward
    _ORIGINAL[base] = own
    return True


def _head_changed(base: Any) -> str | None:
    """Why the head the model has now cannot go through the chunked path (None where it can): what
    :func:`chunked_loss_problem` checks of the head, per call, since a user may add adapters to it or shard it
    after the install."""
    import torch

    head = base.get_output_embeddings()
    if type(head) is not torch.nn.Linear:
        return f"its output head is now a {type(head).__name__}, not a plain torch.nn.Linear"
    if hasattr(head, "_hf_hook") or type(head.weight.data).__name__ == "DTensor":
        return "its output head is now hooked or sharded"
    return None


def _chunked_forward(base: Any, kwargs: dict[str, Any]) -> Any:
    """The causal LM's forward with the chunked loss: its decoder, then the loss on the last hidden state."""
    from transformers.modeling_outputs import CausalLMOutputWithPast

    kwargs = dict(kwargs)
    labels = kwargs.pop("labels")
    kwargs.pop("logits_to_keep", None)
    # transformers' can_return_tuple (utils/generic.py, 5.17 :933-942) pops return_dict before the forward runs
    # and falls back to the config's
    return_dict = kwargs.pop("return_dict", None)
    if return_dict is None:
        return_dict = getattr(base.config, "return_dict", True)
    # the model's own forward passes every other keyword to its decoder and to its loss function alike (5.17
    # modeling_qwen3.py ``self.model(..., **kwargs)`` and ``self.loss_function(..., **kwargs)``): the decoder
    # gets num_items_in_batch and shift_labels too, as it does there (it ignores them), and the packed-attention
    # keywords (cu_seq_lens_q/k, max_length_q/k); its named parameters are passed with their defaults, as the own
    # forward passes them, the KV cache under the name its transformers uses (past_key_values before 5.24, cache
    # from it)
    for key, default in _decoder_parameters(base.__class__).items():
        if key == "cache" and "past_key_values" in kwargs and "cache" not in kwargs:
            # 5.24+ takes the cache as ``cache``; its forward's deprecate_kwarg renames the old keyword first
            kwargs["cache"] = kwargs.pop("past_key_values")
        kwargs.setdefault(key, default)
    outputs = base.model(**kwargs)
    head = base.get_output_embeddings()  # read per call: a moved, re-tied or resized head is the one used
    loss = chunked_cross_entropy(
        outputs.last_hidden_state,
        head.weight,
        labels,
        num_items_in_batch=kwargs.get("num_items_in_batch"),
        ignore_index=kwargs.get("ignore_index", -100),
        shift_labels=kwargs.get("shift_labels"),
        bias=head.bias,
    )
    field = _cache_field(CausalLMOutputWithPast)
    result = CausalLMOutputWithPast(
        loss=loss,
        logits=None,
        hidden_states=outputs.hidden_states,
        attentions=outputs.attentions,
        **{field: getattr(outputs, field, None)},
    )
    return result if return_dict else result.to_tuple()


@functools.lru_cache(maxsize=64)
def _decoder_parameters(cls: Any) -> dict[str, Any]:
    """The named parameters ``cls.forward`` hands its decoder, with their defaults: all but ``self``, ``labels``
    and ``logits_to_keep`` (5.17 modeling_qwen3.py: input_ids, attention_mask, position_ids, past_key_values,
    inputs_embeds, use_cache; 5.25 the same with ``cache``). The chunked path passes them as the own forward
    does, defaults included, so the decoder gets the same call either way."""
    out: dict[str, Any] = {}
    for key, param in inspect.signature(cls.forward).parameters.items():
        if key in ("self", "labels", "logits_to_keep") or param.kind not in (
            param.POSITIONAL_OR_KEYWORD,
            param.KEYWORD_ONLY,
        ):
            continue
        out[key] = None if param.default is param.empty else param.default
    return out


def remove_chunked_loss(model: Any) -> bool:
    """Put ``model``'s own forward back (the class's, or the instance forward it had before); True if the chunked
    loss was installed."""
    base = _causal_lm(model)
    if base not in _ORIGINAL:
        return False
    if not getattr(base.__dict__.get("forward"), "__cudaload_chunked_loss__", False):
        # something replaced the forward after the install (TRL's SFTTrainer puts its fused head on the same
        # instance and calls ours for the rest, trl 1.16 trainer/utils.py add_fused_lm_head): deleting it would
        # undo theirs, so both stay
        warnings.warn(
            "cudaload's chunked loss was not removed: the model's forward was replaced after it was installed "
            "(and may call it); reload the model for its own forward",
            RuntimeWarning,
            stacklevel=2,
        )
        return False
    own = _ORIGINAL.pop(base)
    if own is None:
        del base.forward  # the class's forward again
    else:
        base.forward = own
    return True
