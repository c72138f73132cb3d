"""The plan's LoRA adapters: the LoraConfig and the peft wrap (k-bit preparation for quantized bases), the
adapters' input cast as planned, and gradient checkpointing switched on where the plan trains with it."""

from __future__ import annotations

import contextlib
import inspect
from typing import Any

from ..errors import ConfigurationError, DependencyError, close_names
from ..plans.plan import Plan
from ..request import _warn

#: non-reentrant checkpointing: inputs need not require grad (no enable_input_require_grads hook), and it is what
#: the memory estimate measured (cudaload.train.arguments.memory_arguments passes the same to Trainer)
_CHECKPOINT_KWARGS = {"use_reentrant": False}


#: peft's task types whose PeftModel class assumes a kind of model (peft 0.21.2 peft/mapping.py
#: MODEL_TYPE_TO_PEFT_MODEL_MAPPING: PeftModelForCausalLM, ...ForSequenceClassification...): the model classes of
#: each (transformers' auto mappings), and the class-name ending of those the mapping misses (remote code)
_TASK_MODELS: dict[str, tuple[str, str | None, str]] = {
    "CAUSAL_LM": ("MODEL_FOR_CAUSAL_LM_MAPPING_NAMES", "ForCausalLM", "AutoModelForCausalLM"),
    "SEQ_CLS": (
        "MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES",
        "ForSequenceClassification",
        "AutoModelForSequenceClassification",
    ),
    "TOKEN_CLS": (
        "MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES",
        "ForTokenClassification",
        "AutoModelForTokenClassification",
    ),
    "QUESTION_ANS": (
        "MODEL_FOR_QUESTION_ANSWERING_MAPPING_NAMES",
        "ForQuestionAnswering",
        "AutoModelForQuestionAnswering",
    ),
    "SEQ_2_SEQ_LM": ("MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES", None, "AutoModelForSeq2SeqLM"),
}
#: peft's TaskType values (peft 0.21.2 peft/utils/peft_types.py TaskType)
_TASK_TYPES = ("SEQ_CLS", "SEQ_2_SEQ_LM", "CAUSAL_LM", "TOKEN_CLS", "QUESTION_ANS", "FEATURE_EXTRACTION")
#: peft's word for every linear layer but the output head (peft 0.21.2 utils/constants.py:404
#: INCLUDE_LINEAR_LAYERS_SHORTHAND)
ALL_LINEAR = "all-linear"
#: the texts of peft's "matched no module" errors, for a peft without NoMatchingPeftModuleError (it raised a plain
#: ValueError with these words: peft 0.21.2 tuners/tuners_utils.py:1054-1086 keeps them in the new class)
_NO_MATCH_TEXTS = (
    "not found in the base model",
    "No modules were targeted",
    "All modules were excluded",
    "no `target_parameters` found",
)


#: peft's refusal of a module LoRA has no layer for, a plain ValueError (no class of its own: peft 0.21.2
#: tuners/lora/model.py:558-562), told apart by its text
_UNSUPPORTED_TEXT = "is not supported. Currently, only the following modules are supported"


def lora_config(plan: Plan) -> Any:
    """The plan's LoraConfig (one for the whole-model and the sharded path alike).

    Raises:
        DependencyError: no peft.
        ConfigurationError: peft's LoraConfig refuses the keywords (its message among the reasons).
    """
    try:
        from peft import LoraConfig
    except ImportError as e:
        raise DependencyError(
            f"intent {plan.intent!r} needs peft", reasons=[str(e)], fix="pip install 'cudaload[peft]'"
        ) from None
    kwargs = dict(plan.peft or {"target_modules": ALL_LINEAR})
    task = kwargs.get("task_type")
    if isinstance(task, str) and task not in _TASK_TYPES:
        close = close_names(task, _TASK_TYPES, n=1)
        raise ConfigurationError(
            f"lora['task_type']={task!r} is no peft task type ({', '.join(_TASK_TYPES)})",
            fix=f"pass lora={{'task_type': {(close[0] if close else 'CAUSAL_LM')!r}}}, or leave task_type out "
            "(the plan sets it from the model class)",
        )
    try:
        return LoraConfig(**kwargs)
    except (TypeError, ValueError) as e:
        # LoraConfig.__post_init__ checks combinations request.py cannot see alone (layers_pattern without
        # layers_to_transform, DoRA with other options...): its message says which
        raise ConfigurationError(
            "peft's LoraConfig refused the plan's LoRA keywords", reasons=[str(e)], fix=_lora_fix(kwargs)
        ) from None


def _lora_fix(kwargs: dict[str, Any]) -> str:
    given = ", ".join(f"{k!r}: {v!r}" for k, v in kwargs.items() if k != "lora_dropout")
    return f"correct lora= as peft's message above says (the plan's keywords: {given})"


def _checkpointing(plan: Plan) -> bool:
    """Whether the plan checkpoints any layer (every layer, or every n-th: ``partial``)."""
    return plan.checkpoint_every > 0


def model_task_types(model: Any) -> set[str]:
    """The peft task types ``model``'s class is made for (empty: unknown, e.g. a class no auto mapping holds)."""
    name = type(model).__name__
    auto: Any = None
    with contextlib.suppress(ImportError):  # transformers is there wherever a model is
        from transformers.models.auto import modeling_auto as auto
    out: set[str] = set()
    for task, (mapping, ending, _) in _TASK_MODELS.items():
        classes = getattr(auto, mapping, None) or {}
        if name in classes.values() or (ending is not None and name.endswith(ending)):
            out.add(task)
    return out


def check_task_type(model: Any, config: Any) -> None:
    """Refuses a LoRA ``task_type`` made for another kind of model than ``model`` (``SEQ_CLS`` on a causal LM
    would wrap it in peft's classification model, which trains the language-model loss without a word).

    Raises:
        ConfigurationError: the task type, the model's class and the task type it takes.
    """
    task = getattr(config, "task_type", None)
    task = getattr(task, "value", task)  # peft's TaskType is a str enum
    if task not in _TASK_MODELS:
        return  # None (a plain PeftModel) or FEATURE_EXTRACTION: any model's hidden states
    kinds = model_task_types(model)
    if not kinds or task in kinds:
        return
    if task == "CAUSAL_LM" and callable(getattr(model, "can_generate", None)) and model.can_generate():
        return  # a generating class no mapping lists under causal LMs (a multimodal one): trains as one
    fits = sorted(kinds)
    auto = _TASK_MODELS[task][2]
    raise ConfigurationError(
        f"lora task_type {task!r} is for {auto} models, and {type(model).__name__} is a {' / '.join(fits)} model",
        fix=f"pass lora={{'task_type': {fits[0]!r}}} or leave task_type out (the plan sets it from the model "
        f"class); to train a {task} head, load with model_class={auto!r}",
    )


def _no_match_errors() -> tuple[type[Exception], ...]:
    """peft's "the adapter matched no module" exception class (peft 0.21.2 peft/utils/error.py:20
    NoMatchingPeftModuleError, a ValueError); a peft without it (cudaload takes peft>=0.15) raised a plain
    ValueError there, told apart by its text (:func:`_is_no_match`, the documented fallback)."""
    try:
        from peft.utils.error import NoMatchingPeftModuleError
    except ImportError:
        return (ValueError,)
    return (NoMatchingPeftModuleError,)


def _is_no_match(e: Exception) -> bool:
    name = type(e).__name__
    return name == "NoMatchingPeftModuleError" or any(t in str(e) for t in _NO_MATCH_TEXTS)


def linear_module_names(model: Any) -> list[str]:
    """The leaf names of ``model``'s linear layers (q_proj, k_proj, ...), the output head left out: what
    ``target_modules`` may name (peft matches a name or a dotted suffix), as peft's ``all-linear`` finds them
    (peft 0.21.2 tuners/tuners_utils.py:2430-2484 _maybe_include_all_linear_layers: torch Linear and
    transformers' Conv1D, minus the output embeddings)."""
    import torch

    try:
        from transformers.pytorch_utils import Conv1D

        kinds: tuple[type[Any], ...] = (torch.nn.Linear, Conv1D)
    except ImportError:
        kinds = (torch.nn.Linear,)
    get_head = getattr(model, "get_output_embeddings", None)
    head = get_head() if callable(get_head) else None
    names = {
        name.rsplit(".", 1)[-1]
        for name, module in model.named_modules()
        if name and isinstance(module, kinds) and module is not head
    }
    return sorted(names)


def _names(target: Any) -> list[str] | None:
    """A ``target_modules`` list (set, tuple) as sorted names; None for a regex string or nothing."""
    if isinstance(target, (list, tuple, set, frozenset)) and target:
        return sorted(str(t) for t in target)
    return None


def _missing(model: Any, wanted: list[str]) -> list[str]:
    """The names in ``wanted`` that match no module of ``model``: peft matches a module named so, or ending in
    ``.name`` (peft 0.21.2 tuners/tuners_utils.py:2372-2376 check_target_module_exists)."""
    full = [name for name, _ in model.named_modules() if name]
    leaves = {name.rsplit(".", 1)[-1] for name in full}
    return [t for t in wanted if t not in leaves and not any(n == t or n.endswith(f".{t}") for n in full)]


def no_match_error(model: Any, config: Any, error: Exception) -> ConfigurationError:
    """peft's "matched no module" error as a ConfigurationError naming the model's linear layers, and peft's
    ``"all-linear"`` where that is what ``target_modules`` meant."""
    names = linear_module_names(model)
    target = getattr(config, "target_modules", None)
    shown = ", ".join(names) if names else "none"
    wanted = _names(target)
    what = f"LoRA's target_modules={_shown(target)}"
    if isinstance(target, str) and target.lower().replace("_", "-").replace(" ", "-") == ALL_LINEAR:
        return ConfigurationError(
            f"{what} matches no layer of {type(model).__name__}; did you mean {ALL_LINEAR!r}? (its linear "
            f"layers: {shown})",
            reasons=[str(error)],
            fix=f"pass lora={{'target_modules': {ALL_LINEAR!r}}} (peft's word for every linear layer)",
        )
    missing = _missing(model, wanted) if wanted else []
    if wanted and not missing:
        # every name is there: exclude_modules, layers_to_transform or modules_to_save kept each match out
        layers = getattr(getattr(model, "config", None), "num_hidden_layers", None)
        span = f" (its layers: 0 to {layers - 1})" if isinstance(layers, int) and layers > 0 else ""
        return ConfigurationError(
            f"{what} adapts no layer of {type(model).__name__}: exclude_modules, layers_to_transform or "
            f"modules_to_save leave none of its matches{span}",
            reasons=[str(error)],
            fix="narrow exclude_modules, or pass layers_to_transform within the model's layers",
        )
    if missing and names:
        fixed = {t: (close_names(t, names, n=1) or [t])[0] for t in missing}
        guess = [f"{t!r} -> {f!r}" for t, f in fixed.items() if f != t]
        if guess and wanted:
            corrected = sorted({fixed.get(t, t) for t in wanted})
            return ConfigurationError(
                f"{what} matches no layer of {type(model).__name__} (did you mean {', '.join(guess)}? its "
                f"linear layers: {shown})",
                reasons=[str(error)],
                fix=f"pass lora={{'target_modules': {corrected!r}}}, or {ALL_LINEAR!r} for every linear layer",
            )
    return ConfigurationError(
        f"{what} matches no layer of {type(model).__name__} (its linear layers: {shown})",
        reasons=[str(error)],
        fix=f"name some of them in lora={{'target_modules': [...]}}, or pass {ALL_LINEAR!r} for every linear "
        "layer",
    )


def unsupported_error(model: Any, config: Any, error: Exception) -> ConfigurationError:
    """peft's refusal of a targeted module LoRA has no layer for (a norm, an activation)."""
    names = linear_module_names(model)
    return ConfigurationError(
        f"LoRA's target_modules={_shown(getattr(config, 'target_modules', None))} names a module of "
        f"{type(model).__name__} that LoRA cannot adapt (it adapts linear, embedding and convolution layers; "
        f"the linear ones here: {', '.join(names) or 'none'})",
        reasons=[str(error)],
        fix=f"name linear layers in lora={{'target_modules': [...]}}, or pass {ALL_LINEAR!r}",
    )


def warn_unmatched_targets(model: Any, config: Any) -> None:
    """Warns where some names of a ``target_modules`` list match no module while others do: peft adapts the
    ones that match and says nothing of the rest (where none matches it raises: :func:`no_match_error`)."""
    wanted = _names(getattr(config, "target_modules", None))
    if not wanted:
        return
    missing = _missing(model, wanted)
    if not missing or len(missing) == len(wanted):
        return
    names = linear_module_names(model)
    guesses = [
        f"{t!r} (did you mean {close[0]!r}?)" if (close := close_names(t, names, n=1)) else repr(t)
        for t in missing
    ]
    _warn(
        f"LoRA's target_modules names {', '.join(guesses)}, which match no layer of {type(model).__name__}: "
        f"only the others get adapters (its linear layers: {', '.join(names)}); correct or drop "
        f"{'it' if len(missing) == 1 else 'them'} in lora={{'target_modules': [...]}}"
    )


def _shown(target: Any) -> str:
    if isinstance(target, (set, frozenset)):
        return repr(sorted(target))
    return repr(target)


def get_peft_model_checked(model: Any, config: Any) -> Any:
    """``peft.get_peft_model`` with the model-aware checks first (:func:`check_task_type`) and peft's "matched
    no module" error translated (:func:`no_match_error`).

    Raises:
        ConfigurationError: a task type for another kind of model, or target modules that match no layer.
    """
    from peft import get_peft_model

    check_task_type(model, config)
    warn_unmatched_targets(model, config)
    no_match = _no_match_errors()
    try:
        return get_peft_model(model, config)
    except ValueError as e:  # NoMatchingPeftModuleError is one
        if isinstance(e, no_match) and _is_no_match(e):
            raise no_match_error(model, config, e) from None
        if _UNSUPPORTED_TEXT in str(e):
            raise unsupported_error(model, config, e) from None
        raise


def wrap_peft(model: Any, plan: Plan) -> Any:
    config = lora_config(plan)
    from peft import prepare_model_for_kbit_training

    # refused before prepare_model_for_kbit_training changes the model (it casts, and freezes every parameter)
    check_task_type(model, config)
    if plan.quantization.choice in ("nf4", "int8"):
        t = plan.training
        upcast = t is None or t.kbit_upcast is None or t.kbit_upcast.choice == "fp32"
        if upcast:
            # peft's recipe: the non-k-bit parameters cast to fp32 (the plan says why, fp16 compute); it also
            # turns checkpointing on when asked, so ask exactly what the plan decided (plans made before the
            # training section: peft's default, on). It turns it on for every layer: a partial plan's
            # enable_planned_checkpointing sets every layer's flag again afterwards
            model = prepare_model_for_kbit_training(
                model,
                use_gradient_checkpointing=_checkpointing(plan) if t is not None else True,
                gradient_checkpointing_kwargs=dict(_CHECKPOINT_KWARGS),
            )
        # bf16: the base stays as loaded; get_peft_model freezes it (peft tuners_utils _mark_only_adapters_as_trainable)
    return get_peft_model_checked(model, config)


def apply_adapter_cast(model: Any, plan: Plan) -> int:
    """The plan's ``adapter_cast`` on every LoRA layer of ``model``: ``outside-autocast`` registers a forward
    pre-hook on each that switches PEFT's input cast off under autocast (the result is the same to the bit: see
    cudaload.policies.training.choose_adapter_cast). Returns how many layers were set."""
    t = plan.training
    if t is None or t.adapter_cast is None or t.adapter_cast.choice != "outside-autocast":
        return 0
    try:
        from peft.tuners.lora import LoraLayer
    except ImportError:  # no peft: nothing was wrapped
        return 0
    import torch

    autocast_on = torch.is_autocast_enabled

    def cast_outside_autocast(module: Any, args: tuple[Any, ...]) -> None:
        # a pre-hook on every adapted layer, each forward: PEFT's cast of the input to the adapters' dtype only
        # outside autocast, the rule of PEFT's own bitsandbytes layers (peft 0.21 tuners/lora/bnb.py:543-546);
        # under autocast the cast copy would be cast straight back for the matmul
        if args:  # transformers' layers pass the input positionally; a keyword call keeps PEFT's setting
            module.cast_input_dtype_enabled = not autocast_on(args[0].device.type)

    n = 0
    for module in model.modules():
        if isinstance(module, LoraLayer) and hasattr(module, "cast_input_dtype_enabled"):
            # every concrete LoraLayer is an nn.Module as well (peft's Linear(nn.Module, LoraLayer))
            module.register_forward_pre_hook(cast_outside_autocast)  # type: ignore[attr-defined]
            n += 1
    return n


def enable_planned_checkpointing(model: Any, plan: Plan) -> None:
    """Gradient checkpointing on the model where the plan trains with it -- every layer, or every n-th
    (``partial``: transformers' ``every_n_layers``) -- so a training loop of one's own runs what was planned
    (Trainer switches it on again from training_arguments, with the same ``every_n_layers``, which changes
    nothing). Not under torchrun's multi-process strategies: there the parallelism's settings say how (FSDP
    wraps its own activation checkpointing, fsdp_config), and checkpointing a sharded module from outside breaks
    its recompute.

    Raises:
        ConfigurationError: a partial plan on a transformers whose checkpointing takes no ``every_n_layers``
            (a plan made for another installation).
    """
    par = plan.parallelism
    if par is not None and par.launched:
        return
    every = plan.checkpoint_every
    if plan.intent not in ("training", "lora", "qlora") or every == 0:
        return
    # 5.23 renamed the method (the old one a deprecated alias that warns: transformers 5.24
    # modeling_utils.py:3200-3206); its kwargs argument is renamed with it
    enable = getattr(model, "activation_checkpointing_enable", None)
    kw_name = "activation_checkpointing_kwargs"
    if enable is None:
        enable, kw_name = (
            getattr(model, "gradient_checkpointing_enable", None),
            "gradient_checkpointing_kwargs",
        )
    if enable is None:
        return
    kwargs: dict[str, Any] = {kw_name: dict(_CHECKPOINT_KWARGS)}
    if every > 1:
        if "every_n_layers" not in inspect.signature(enable).parameters:
            raise ConfigurationError(
                f"the plan checkpoints every {every} layers, and {type(model).__name__}.{enable.__name__} takes "
                "no every_n_layers (transformers 5.17 and later have it)",
                fix="plan again on this installation (cudaload.load_model does), or install transformers>=5.17",
            )
        kwargs["every_n_layers"] = every
    enable(**kwargs)
