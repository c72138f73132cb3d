"""Options that are each valid and cannot work together, and what the machine planned for cannot do: refused in the
order :func:`check_together` lists them (the first refusal is the one a caller sees)."""

from __future__ import annotations

from .. import _env
from ..errors import ConfigurationError, InvalidChoiceError
from .fields import RequestFields
from .options import TRAINING_INTENTS, lowered_or_auto
from .placement import check_devices


def check_together(req: RequestFields) -> None:
    """Options that are each valid and cannot work together."""
    _check_work(req)
    _check_quantization(req)
    _check_what_loads(req)
    _check_training_options(req)
    _check_tune(req)
    check_machine(req)


def _check_work(req: RequestFields) -> None:
    """The declared work, and the decode options only inference plans."""
    intent = req.intent
    if req.new_tokens is not None and req.seq_len is not None and req.new_tokens >= req.seq_len:
        raise ConfigurationError(
            f"new_tokens={req.new_tokens} leaves no prompt in seq_len={req.seq_len} (seq_len counts the prompt "
            "and the new tokens)",
            fix=f"pass seq_len={req.seq_len + req.new_tokens} (or new_tokens= below seq_len)",
        )
    if req.generate_calls is not None and req.new_tokens is None:
        raise ConfigurationError(
            f"generate_calls={req.generate_calls} counts generate() calls of new_tokens= new tokens each, and "
            "new_tokens= is not given",
            fix="pass new_tokens= too (each call's new tokens, e.g. new_tokens=256)",
        )
    if intent != "inference":
        asked = {"decode": req.decode != "auto", "generate_calls": req.generate_calls is not None}
        for name in (n for n, on in asked.items() if on):
            raise ConfigurationError(
                f"{name}={getattr(req, name)!r} plans generate()'s decode steps, and intent={intent!r} "
                + (
                    "serves with continuous batching (its serving section decides the decode)"
                    if intent == "serving"
                    else "trains"
                ),
                fix=f"drop {name}=, or use intent='inference'",
            )


def _check_quantization(req: RequestFields) -> None:
    """A quantization the intent cannot train with."""
    intent = req.intent
    q = (req.quantization or "auto").strip().lower()
    if intent == "training" and q in ("int8", "nf4"):
        raise InvalidChoiceError(
            f"quantization={q} with intent=training: quantized weights cannot be trained",
            fix="use intent='qlora' (frozen nf4 base + LoRA adapters), or quantization='none'",
        )
    if intent == "qlora" and q in ("none", "no", "off", "int8"):
        raise InvalidChoiceError(
            f"quantization={q} with intent=qlora: QLoRA is an nf4 base",
            fix="use quantization='auto' or 'nf4', or intent='lora'",
        )


def _check_what_loads(req: RequestFields) -> None:
    """Two names for the class to load, and adapters for an intent that trains none."""
    intent = req.intent
    if req.task and req.model_class:
        raise ConfigurationError(
            f"task={req.task!r} and model_class={req.model_class!r} both name the class to load",
            fix="drop task= (model_class= names the class itself)",
        )
    if req.lora is not None and intent not in ("lora", "qlora"):
        raise ConfigurationError(
            f"lora= configures LoRA adapters, and intent={intent!r} trains none",
            fix="use intent='lora' (or 'qlora'), or drop lora=",
        )


def _check_training_options(req: RequestFields) -> None:
    """Training options without training, inference options with it, and a batch described two ways."""
    intent, training = req.intent, req.intent in TRAINING_INTENTS
    if not training:
        asked = {
            "optimizer": (req.optimizer or "auto").strip().lower() != "auto",
            "gradient_checkpointing": req.gradient_checkpointing is not None,
            "batch_layout": lowered_or_auto(req.batch_layout) != "auto",
            "tokens_per_step": req.tokens_per_step is not None,
            "loss": lowered_or_auto(req.loss) != "auto",
        }
        for name in (n for n, on in asked.items() if on):
            raise ConfigurationError(
                f"{name}={getattr(req, name)!r} is a training option, and intent={intent!r} does not train",
                fix=f"drop {name}=, or use intent='training', 'lora' or 'qlora'",
            )
    elif req.lower_latency:
        raise ConfigurationError(
            f"lower_latency=True picks tensor parallelism for inference; intent={intent!r} trains",
            fix="drop lower_latency=",
        )
    packed = lowered_or_auto(req.batch_layout) == "packed"
    if req.padded and packed:
        raise ConfigurationError(
            "padded=True and batch_layout='packed' describe different batches",
            fix="drop padded= (a packed batch has no padding), or use batch_layout='padded'",
        )
    if packed and req.tokens_per_step is not None and req.seq_len and req.tokens_per_step < req.seq_len:
        # policies.training.plan_step refuses it too, after reading the model
        raise ConfigurationError(
            f"tokens_per_step={req.tokens_per_step} is shorter than seq_len={req.seq_len}: a packed step must "
            "hold the longest sequence",
            fix=f"pass tokens_per_step={req.seq_len} or more, or a shorter seq_len",
        )


def _check_tune(req: RequestFields) -> None:
    """Measuring needs the work to measure, and somewhere to keep what it measured."""
    if req.tune and not req.declares_work:
        raise ConfigurationError(
            "tune=True needs the work to measure", fix="pass batch_size= and seq_len= (and new_tokens=)"
        )
    if req.entry == "tune" and req.seq_len is not None and req.new_tokens is None:
        raise ConfigurationError(
            "cudaload tune counts seq_len as the prompt and the new tokens: it needs new_tokens= with it",
            fix="pass new_tokens= too (e.g. new_tokens=32)",
        )
    if req.entry == "tune":
        unwritable = _env.cache_unwritable(req.env)
        if unwritable:
            raise ConfigurationError(
                f"cudaload tune stores what it measures under CUDALOAD_CACHE, and {unwritable}",
                fix="set CUDALOAD_CACHE to a folder you can write (it is created when needed), or unset it",
            )


def check_machine(req: RequestFields) -> None:
    """What the machine planned for cannot do, where its snapshot (or a cheap look at this one) says so."""
    caps = req.hardware
    q = lowered_or_auto(req.quantization)
    profile = (
        caps.source.removeprefix("profile:")
        if caps is not None and caps.source.startswith("profile:")
        else None
    )
    mentioned = {p.name for p in caps.packages} if caps is not None else set()
    if (
        profile is not None
        and (req.intent == "qlora" or q in ("int8", "nf4"))
        and "bitsandbytes" not in {*mentioned, *req.assume_installed, *req.assume_missing}
    ):
        # a profile lists no optional packages (profiles.py): the fit ladder would refuse every quantized rung
        # and suggest something else, where the plan asked for only needs the packages assumed
        need = ["bitsandbytes", "peft"] if req.intent == "qlora" else ["bitsandbytes"]
        asked = "intent='qlora'" if req.intent == "qlora" else f"quantization={req.quantization!r}"
        raise InvalidChoiceError(
            f"{asked} needs bitsandbytes, and hardware={profile!r} is a profile, which lists no optional packages",
            fix=f"plan as if they were installed: assume_installed={need!r}"
            + (", or use intent='lora' (a bf16 base, no bitsandbytes)" if req.intent == "qlora" else ""),
        )
    if caps is not None:
        check_devices(req, caps)
