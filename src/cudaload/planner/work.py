"""The work a plan is sized for: what the caller declared (sequence length, sequences a batch), the defaults that
fill in what was not, and what that assumed, said in the plan."""

from __future__ import annotations

from dataclasses import dataclass

from ..model_info import ModelInfo
from ..plans.decode import DecodeWork
from ..request import Request
from ..tuning import Work

#: Default work size: the model's context, capped. Planning KV cache for a 128k context by default would
#: push every model into quantization for a length few callers use.
DEFAULT_SEQ_CAP = 4096
DEFAULT_SEQ_UNKNOWN = 2048


@dataclass(frozen=True)
class WorkSize:
    """The work a plan is sized for, made once from the request (:func:`work_for`) and handed to every step that
    reads it: ``seq_len`` / ``batch_size`` as planned (defaults filled in), ``declared_seq`` / ``declared_batch``
    as the caller gave them (None: not given), ``declared`` (both were: the request's
    :attr:`~cudaload.request.Request.declares_work`), ``new_tokens`` (of ``seq_len``, the tokens one generate()
    call adds), ``generate_calls`` (as given), ``padded`` (the batch's prompts differ in length), and what was
    assumed."""

    seq_len: int
    batch_size: int
    declared_seq: int | None
    declared_batch: int | None
    assumed: tuple[str, ...] = ()
    declared: bool = False
    new_tokens: int | None = None
    generate_calls: int | None = None
    padded: bool = False

    @property
    def call(self) -> tuple[int, int] | None:
        """(batch_size, seq_len) of the declared work, the one generate() call it runs; None when not declared."""
        return (self.batch_size, self.seq_len) if self.declared else None

    def timed(self) -> Work | None:
        """The declared work as the tune cache and the priors look it up (the prompt apart from the new tokens);
        None when not declared."""
        if not self.declared:
            return None
        return Work.from_total(self.batch_size, self.seq_len, self.new_tokens, self.padded)

    def decode(self) -> DecodeWork:
        """The declared decode work: ``new_tokens`` a call x ``generate_calls`` decode steps, the batch, the calls,
        the longest sequence (``seq_len``). Steps are declared only with the work itself, as the request's warning
        says (request/suspicious.py): new tokens of unknown sequences are no work."""
        steps = (
            self.new_tokens * (self.generate_calls or 1)
            if self.declared and self.new_tokens is not None
            else None
        )
        calls = self.generate_calls or (1 if steps is not None else None)
        return DecodeWork(new_tokens=steps, batch=self.batch_size, calls=calls, longest=self.seq_len)


#: A declared seq_len this many times the model's trained context (its RoPE scaling factor included) is no work the
#: model can do: the largest factors configs ship are 4-8 (YaRN), 32 at most (LongRoPE); past them a plan would
#: only size machines for positions the model never saw (seq_len=10**9 asked for 2 H100s of "seq_len <= 62500000")
ABSURD_CONTEXT_FACTOR = 64


def _trained_context(info: ModelInfo) -> int | None:
    """The longest sequence the model was made for: max_position_embeddings, times a RoPE scaling factor where the
    config has one (generous: most configs state the scaled length already)."""
    ctx = info.summary.max_position_embeddings
    if not isinstance(ctx, int) or isinstance(ctx, bool) or ctx <= 0:
        return None
    config = info.config
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    factor = 1.0
    for name in ("rope_scaling", "rope_parameters"):
        rope = getattr(text, name, None)
        if isinstance(rope, dict) and isinstance(rope.get("factor"), (int, float)):
            factor = max(factor, float(rope["factor"]))
    return int(ctx * factor)


def _check_intent(req: Request, info: ModelInfo) -> None:
    """An intent the model's class cannot serve: continuous batching runs generate(), which an encoder has not."""
    if req.intent == "serving" and not info.can_generate:
        from ..errors import InvalidChoiceError

        raise InvalidChoiceError(
            f"intent='serving' serves generate() requests with continuous batching, and {info.summary.name} loads as "
            f"{info.class_name or info.auto_class}, which has no generate() (an encoder: embeddings, classification)",
            fix="use intent='inference' (the model's forward pass)",
        )


def _check_seq_len(req: Request, info: ModelInfo) -> None:
    trained = _trained_context(info)
    if req.seq_len is None or trained is None or req.seq_len <= ABSURD_CONTEXT_FACTOR * trained:
        return
    from ..errors import DoesNotFitError
    from ..policies.quantization import Suggestion

    ctx = info.summary.max_position_embeddings
    assert ctx is not None
    # a DoesNotFitError, as a seq_len too long for the machine is, with the one suggestion that makes sense
    raise DoesNotFitError(
        f"seq_len={req.seq_len} tokens is {req.seq_len // ctx:,}x {info.summary.name}'s context "
        f"(max_position_embeddings {ctx:,}): no position past it was trained, and no machine is worth sizing for it",
        fix=f"pass seq_len={ctx} (the model's context) or less: the longest sequence of the work, prompt and new "
        "tokens together",
        suggestions=(Suggestion("seq_len", ctx, f"seq_len={ctx} (the model's context)"),),
    )


def work_for(req: Request, info: ModelInfo) -> WorkSize:
    _check_intent(req, info)
    _check_seq_len(req, info)
    s = info.summary
    assumed: list[str] = []
    seq_len = req.seq_len
    if seq_len is None:
        seq_len = min(s.max_position_embeddings or DEFAULT_SEQ_UNKNOWN, DEFAULT_SEQ_CAP)
        assumed.append(
            f"sequences of at most {seq_len} tokens (the model's context, at most {DEFAULT_SEQ_CAP}; declare "
            "seq_len=, the longest sequence of the data)"
        )
    return WorkSize(
        seq_len,
        req.batch_size or 1,
        req.seq_len,
        req.batch_size,
        tuple(assumed),
        declared=req.declares_work,
        new_tokens=req.new_tokens,
        generate_calls=req.generate_calls,
        padded=req.padded,
    )
