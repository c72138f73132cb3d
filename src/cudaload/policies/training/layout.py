"""The batch layout: ``packed`` (a step's sequences concatenated into one row, position ids restarting at each
sequence) where the model is a causal LM and the attention keeps the sequences apart without scores over the
whole row, else ``padded``; and how a packed step tells the attention where its sequences start."""

from __future__ import annotations

from typing import Literal

from ...errors import InvalidChoiceError
from ...model_info import ModelInfo
from ...plans.decision import Candidate, Decision
from ..attention.names import TORCH_VARLEN, VARLEN
from ..memory import sdpa_math

#: ``batch_layout=`` as the request hands it on (cudaload.request: case and spaces dropped, None read as "auto"):
#: "auto" or one of :data:`cudaload.plans.training.LAYOUTS`
RequestedLayout = Literal["auto", "packed", "padded"]


def packing_blockers(info: ModelInfo) -> list[str]:
    """Why packed steps would train this model wrongly (empty: they would not)."""
    bad: list[str] = []
    s = info.summary
    if s.is_encoder or not info.can_generate or info.auto_class != "AutoModelForCausalLM":
        bad.append(
            "packing concatenates causal-LM sequences; this model is not trained as a causal LM "
            f"({info.auto_class}), whose inputs are read whole"
        )
    if info.remote_code:
        bad.append("remote code: its attention is not transformers' own, which keeps packed sequences apart")
    if info.attention_classes is not None:
        bad.append(
            "legacy attention classes (the model's *_ATTENTION_CLASSES): no block-diagonal mask from position ids"
        )
    return bad


def packing_costs(info: ModelInfo, attn: str, act_bytes: int) -> list[str]:
    """Why packed steps would be slow with this attention: scores materialised over the whole row."""
    if attn == "eager":
        return [
            "eager attention over a packed row computes every token against every other token of the row "
            "(tokens^2 scores per head and layer), not per sequence"
        ]
    if attn == "sdpa" and sdpa_math(info, act_bytes):
        return ["sdpa runs its math kernel here (fp32 with grouped kv heads): tokens^2 scores over the row"]
    return []


def boundaries_for(attn: str) -> str:
    """How a packed step tells ``attn`` where its sequences start (:data:`cudaload.plans.training.BOUNDARIES`)."""
    return "cu_seq_lens" if attn in VARLEN else "position_ids"


def choose_layout(
    info: ModelInfo, attn: str, act_bytes: int, requested: RequestedLayout = "auto"
) -> Decision:
    """``packed`` where the model is a causal LM and the attention keeps packed sequences apart without scores
    over the whole row, else ``padded``. An explicit ``packed`` is honoured where it trains correctly (its
    cost said), refused with :class:`InvalidChoiceError` where it would not."""
    req = requested
    bad = packing_blockers(info)
    costs = packing_costs(info, attn, act_bytes)
    how = (
        "cudaload_varlen runs torch's own flash kernels (no flash-attn package) over the sequence boundaries "
        "(cu_seq_lens), computed once per step by the collator; no tokens x tokens mask is built"
        if attn == TORCH_VARLEN
        else f"{attn}'s varlen kernels take the sequence boundaries (cu_seq_lens), computed once per step by the "
        "collator"
        if attn in VARLEN
        else f"transformers builds a block-diagonal mask for {attn} from the restarting position ids "
        "(masking_utils.find_packed_sequence_indices)"
    )
    packed_why = (
        f"no padding is computed: each step's sequences are concatenated into one row; {how}. On the H200, "
        "packed steps as planned here trained 3.1-3.4x the tokens/s of the padded, checkpointed recipe (8B LoRA, "
        "flash_attention_4; 2.3-2.4x with sdpa; benchmarks/results/2026-12-03-h200)"
    )
    padded_why = (
        "each sequence padded to the batch's longest (attention mask); padding tokens are computed too"
    )
    cands = (
        Candidate("packed", not bad and not costs, (packed_why, *bad, *costs)),
        Candidate("padded", True, (padded_why,)),
    )
    if req == "packed":
        if bad:
            raise InvalidChoiceError(
                "batch_layout='packed' cannot be used here",
                reasons=bad,
                fix="use batch_layout='auto' (padded here)",
            )
        return Decision("packed", ("requested explicitly", packed_why, *costs), cands, explicit=True)
    if req == "padded":
        return Decision("padded", ("requested explicitly", padded_why), cands, explicit=True)
    if bad or costs:
        return Decision("padded", (f"packing is not right here: {'; '.join(bad + costs)}",), cands)
    return Decision("packed", (packed_why,), cands)


#: the compiled 8B LoRA steps on chat lengths behind :func:`sequences_decision` (H100): in one run
#: (benchmarks/results/2026-12-07-s21/gpu1) the Trainer path's steps of at most 8 sequences (2,407 tokens) took
#: ~0.21 s (median) and the same plan's steps filled to its 6,144-token bound (5,843 tokens, 19.1 sequences)
#: ~0.44 s; in another (2026-12-07-s20/gpu2) 0.302 s against TRL's filled rows' 0.465 s. A step has a fixed part
#: (0.05-0.2 s in these runs) that a short step pays over few tokens
FILL_EVIDENCE = (
    "on an H100 the same 8B LoRA plan on chat lengths, compiled layers, trained 13,454 tokens a second with its "
    "steps filled to the 6,144-token bound (19.1 sequences, 5,843 tokens a step) against 11,249 with at most 8 "
    "sequences (2,407 tokens), 1.20x in the same run, for the memory the plan predicted (54.7 GiB); TRL's filled "
    "rows ran 1.32x (eager) and 1.75x (compiled) the 8-sequence steps in another: a step's fixed part is paid "
    "over more tokens (benchmarks/results/2026-12-07-s21/gpu1, 2026-12-07-s20/gpu2)"
)


def sequences_decision(packed: bool, declared: bool, sequences: int, tokens: int) -> Decision | None:
    """How many sequences a packed step may hold: ``fill`` (as many as the step's token bound takes, what TRL's
    and Axolotl's packing do) where ``batch_size`` was not declared, else ``batch_size`` (at most the declared
    number). A packed step's memory follows its tokens, not its sequences (the memory model counts no
    per-sequence term there), so the plan's fit holds either way. None for a padded layout (a batch is
    ``batch_size`` rows)."""
    if not packed:
        return None
    fewer = (
        f"at most {sequences} sequences a step"
        + (" (declared batch_size)" if declared else " (Trainer's default per_device_train_batch_size)")
        + ": short sequences leave the step's token bound unused"
    )
    fill_why = (
        f"as many sequences as the {tokens:,}-token bound takes: fewer, fuller steps; {FILL_EVIDENCE}; "
        "an epoch has fewer optimizer steps"
    )
    if declared:
        return Decision(
            "batch_size",
            (f"batch_size={sequences} was declared: each step holds at most {sequences} sequences",),
            (
                Candidate("batch_size", True, (fewer,)),
                Candidate(
                    "fill", False, (fill_why, "batch_size was declared (leave it out to fill the steps)")
                ),
            ),
            explicit=True,
        )
    return Decision(
        "fill",
        (
            fill_why,
            "batch_size was not declared; declare it to keep at most that many sequences a step",
        ),
        (Candidate("fill", True, (fill_why,)), Candidate("batch_size", True, (fewer,))),
    )
