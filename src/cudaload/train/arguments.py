"""What a trainer takes from a Plan: ``TrainingArguments`` keywords, the collator, the packed data set.

:func:`training_arguments` merges small, independent pieces (precision, optimizer, memory, the step's layout and
loss); each is a function of the plan alone, so other pieces (distributed settings) compose the same way.
:func:`training_setup` hands over all three for ``Trainer``; :func:`sft_config_arguments` the same plan as
TRL's ``SFTConfig`` options.
"""

from __future__ import annotations

import numbers
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from ..detection.versions import version_tuple
from ..errors import ConfigurationError
from ..execute.layer_compile import compile_layers as compile_decoder_layers
from ..execute.layer_compile import compile_problem, decoder_layers, eager_layers
from ..plans.decision import Decision
from ..plans.plan import Plan
from ..policies.training.compile import layer_compile_for_run
from .data import (
    PackedCollator,
    PackedDataset,
    PaddedCollator,
    as_rows,
    check_ids,
    check_rows,
    checked,
    collator_for,
    pack,
)

#: the only Liger kernel the plan turns on: the fused linear cross-entropy (``loss="liger"``); Liger's RoPE,
#: RMSNorm and SwiGLU are off because they were not what the plan weighed (TrainingArguments.liger_kernel_config
#: is passed to liger_kernel.transformers._apply_liger_kernel_to_instance, transformers 5.17 trainer.py:1452)
LIGER_LOSS_ONLY = {
    "fused_linear_cross_entropy": True,
    "cross_entropy": False,
    "rope": False,
    "rms_norm": False,
    "swiglu": False,
}

#: transformers renamed TrainingArguments.gradient_checkpointing to activation_checkpointing in 5.23 (the old
#: name is a deprecated alias there: transformers 5.23.0 training_args.py:313 and :929 "Deprecated alias of
#: `activation_checkpointing`"; in 5.22.2 activation_checkpointing is only an fsdp_config key)
ACTIVATION_CHECKPOINTING_SINCE = (5, 23)


def _on_gpu(plan: Plan) -> bool:
    return any(d.startswith("cuda") for d in plan.placement.devices)


def precision_arguments(plan: Plan) -> dict[str, Any]:
    """bf16 / fp16 from the plan's dtype; TF32 matmuls on Ampere and later."""
    gpus = plan.hardware.get("gpus", [])
    on_gpu = _on_gpu(plan)
    args: dict[str, Any] = {
        "bf16": plan.dtype.choice == "bfloat16",
        "fp16": plan.dtype.choice == "float16",
    }
    if on_gpu:
        # TF32 matmuls are free speed on Ampere and later and harmless for fine-tuning
        args["tf32"] = bool(gpus) and all(tuple(g["compute_capability"]) >= (8, 0) for g in gpus)
    return args


def optimizer_arguments(plan: Plan) -> dict[str, Any]:
    """``optim``: the plan's optimizer decision (TrainingArguments' names), or the intent's default for plans
    made before optimizers were planned."""
    if plan.optimizer is not None and plan.optimizer.choice:
        return {"optim": plan.optimizer.choice}
    if plan.intent == "qlora":
        # paged 8-bit AdamW keeps optimizer spikes out of OOM territory, the QLoRA paper's recipe
        return {"optim": "paged_adamw_8bit"}
    return {"optim": "adamw_torch_fused" if _on_gpu(plan) else "adamw_torch"}


def memory_arguments(plan: Plan) -> dict[str, Any]:
    """Batch size and gradient checkpointing as planned (the memory estimate assumed exactly these). For a packed
    plan the batch size is its sequences a step, as declared; :func:`training_setup` (whose data set holds whole
    steps) and :func:`sft_config_arguments` (TRL's packing) set 1."""
    every = plan.checkpoint_every
    if plan.gradient_checkpointing is None:  # plans made before checkpointing was planned
        every = int(plan.intent in ("training", "qlora") or plan.seq_len >= 4096)
    gc = every > 0
    new = (version_tuple(plan.hardware.get("transformers")) or (0,)) >= ACTIVATION_CHECKPOINTING_SINCE
    name = "activation_checkpointing" if new else "gradient_checkpointing"
    args: dict[str, Any] = {"per_device_train_batch_size": plan.batch_size, name: gc}
    if gc:
        # non-reentrant checkpointing: no inputs need requires_grad, and it is what the estimate measured
        kwargs: dict[str, Any] = {"use_reentrant": False}
        if every > 1:
            # partial: Trainer re-enables checkpointing at train start and pops every_n_layers from these kwargs
            # into the model's gradient_checkpointing_enable (transformers 5.17 trainer.py:1465-1472, 5.22
            # :1504-1511, 5.24 :1507-1527), so it checkpoints the same layers load_model did
            kwargs["every_n_layers"] = every
        args[f"{name}_kwargs"] = kwargs
    if plan.intent in ("lora", "qlora"):
        # adapters leave most parameters frozen; DDP must not wait for their gradients
        args["ddp_find_unused_parameters"] = False
    return args


def step_arguments(plan: Plan) -> dict[str, Any]:
    """The step's layout and loss: padded batches grouped by length where planned (transformers 5.17
    TrainingArguments.train_sampling_strategy), Liger's fused loss alone where the plan chose it."""
    t = plan.training
    if t is None:
        return {}
    args: dict[str, Any] = {}
    if t.group_by_length:
        args["train_sampling_strategy"] = "group_by_length"
    if t.loss.choice == "liger":
        args["use_liger_kernel"] = True
        args["liger_kernel_config"] = dict(LIGER_LOSS_ONLY)
    return args


def training_arguments(plan: Plan) -> dict[str, Any]:
    """Keywords for ``transformers.TrainingArguments`` matching the plan's dtype, hardware and intent.

    >>> args = TrainingArguments(output_dir="out", **cudaload.training_arguments(model.cudaload_plan))

    Several GPUs: the parallelism's settings (FSDP2 / DDP / DeepSpeed, and the optimizer and checkpointing
    each rank was planned with) are merged in when the plan is for the ranks -- made under torchrun, or for a
    profile. A process planned on this machine outside torchrun runs the plan's own placement (one GPU or a
    layer split); its parallelism only says how to launch N processes, whose own plans then carry them.

    Args:
        plan: a plan for intent ``"training"``, ``"lora"`` or ``"qlora"``, from :func:`cudaload.plan` or a
            loaded model's ``model.cudaload_plan``.

    Returns:
        A dict of ``TrainingArguments`` keywords: ``bf16`` / ``fp16`` (and ``tf32`` on a GPU), ``optim``,
        ``per_device_train_batch_size`` (the plan's sequences a step; a packed plan's memory is for
        :func:`training_setup`'s packed steps, where it is 1),
        ``gradient_checkpointing`` (``activation_checkpointing`` from transformers 5.23) with its kwargs
        (``every_n_layers`` for a partial plan),
        ``ddp_find_unused_parameters`` for adapters, ``train_sampling_strategy="group_by_length"`` for padded
        batches, ``use_liger_kernel`` / ``liger_kernel_config`` where the plan chose Liger's fused loss, and the
        parallelism's settings (``fsdp``, ``fsdp_config``, ``deepspeed``...) where they apply.

    Raises:
        ConfigurationError: not a Plan, or the plan is for inference or serving.
    """
    if not isinstance(plan, Plan):
        raise ConfigurationError(
            f"training_arguments() takes a Plan, not {type(plan).__name__}",
            fix="pass model.cudaload_plan (from load_model) or the result of cudaload.plan(...)",
        )
    if plan.intent in ("inference", "serving"):
        raise ConfigurationError(
            f"this plan is for {plan.intent}", fix="plan or load with intent='training', 'lora' or 'qlora'"
        )
    args = {
        **precision_arguments(plan),
        **optimizer_arguments(plan),
        **memory_arguments(plan),
        **step_arguments(plan),
    }
    par = plan.parallelism
    if par is not None and (par.launched or str(plan.hardware.get("source", "")).startswith("profile:")):
        from ..policies.parallelism import merge_training_arguments

        args = merge_training_arguments(args, plan)
    return args


@dataclass
class TrainingSetup:
    """What ``Trainer`` needs from a plan: ``arguments`` (``TrainingArguments`` keywords), ``data_collator``
    and ``train_dataset`` (packed into steps where the plan packs; as given otherwise), with ``plan``.

    >>> setup = cudaload.training_setup(model, dataset)
    >>> trainer = Trainer(model=model, args=TrainingArguments(output_dir="out", **setup.arguments),
    ...                   train_dataset=setup.train_dataset, data_collator=setup.data_collator)
    """

    plan: Plan
    arguments: dict[str, Any]
    data_collator: (
        PackedCollator | PaddedCollator | None
    )  # None: Trainer's own (a model that is no causal LM)
    train_dataset: Any
    #: whether the decoder layers were compiled, and why (cudaload.policies.training.compile); None: no
    #: training section
    layer_compile: Decision | None = None
    compiled_layers: int = 0

    def describe(self) -> str:
        """What the setup will run: the layout, the step bound, and for packed data how full the steps are."""
        t = self.plan.training
        if t is None:
            return "no training section in this plan"
        head = (
            f"{t.layout.choice} steps filled up to {t.step.tokens:,} tokens"
            if t.fills_steps
            else f"{t.layout.choice} steps of at most {t.step.sequences} sequences and {t.step.tokens:,} tokens"
        )
        if self.compiled_layers:
            head += f", {self.compiled_layers} decoder layers compiled"
        if t.loss.choice != "transformers":
            head += f", the {t.loss.choice} loss (no fp32 logits over the whole step)"
        if not t.causal_lm:
            return head + " (not a causal LM: the data set as given, Trainer's own collator)"
        ds = self.train_dataset
        return head + (f": {ds.summary.describe()}" if isinstance(ds, PackedDataset) else "")


def training_setup(
    model_or_plan: Any,
    train_dataset: Iterable[Mapping[str, Any]] | None = None,
    *,
    truncate: bool = False,
    shuffle: bool = True,
    seed: int = 0,
    compile_layers: bool | None = None,
) -> TrainingSetup:
    """``TrainingArguments`` keywords, the collator and the data set for ``Trainer``, as the plan decided.

    Args:
        model_or_plan: a model from :func:`cudaload.load_model` (its ``cudaload_plan``) or a :class:`Plan`.
        train_dataset: tokenized examples (dicts with ``input_ids``, optionally ``labels`` and
            ``attention_mask``: a ``datasets.Dataset``, a list...). A packed plan groups them into steps of at
            most the plan's tokens, and at most its sequences where ``batch_size`` was declared (else as many as
            fit: the plan's ``sequences_per_step`` decision) (:func:`cudaload.train.data.pack`); a padded plan checks
            their lengths (a list of the rows); a model that is no causal LM gets them as given. None: only the
            arguments and the collator.
            For a causal LM every example is checked in the pass that reads it: integer ``input_ids`` (whole
            floats are refused, not truncated) inside the vocabulary (the model's input embeddings, else its
            config's ``vocab_size``), ``labels`` of the same length (ids or -100) and ``attention_mask`` too, and
            at least one label to learn in the whole set (a warning where a tenth of the examples have none).
            Otherwise the ``input_ids`` alone (:func:`cudaload.train.data.check_ids`).
        truncate: cut sequences longer than the plan's ``seq_len`` to it (default: refuse them, naming the
            longest, since the plan's memory holds up to that length).
        shuffle, seed: the packed steps are made in a random order fixed by ``seed`` (Trainer shuffles the
            steps again every epoch).
        compile_layers: compile each decoder layer of the model in place (``torch.compile``, paid at the first
            step): None (default) where the plan chose it (``plan.training.layer_compile``: measured faster for
            this training on this GPU's architecture) and the data set's steps in one epoch repay the compile
            (no data set: taken as repaying); True or False to decide yourself. The decision and why:
            ``setup.layer_compile``.

    Returns:
        A :class:`TrainingSetup`.

    Raises:
        ConfigurationError: not a plan or a cudaload-loaded model, a plan for inference, keywords of the wrong
            type, a data set that is not one example a row (a ``DatasetDict``, a dict of columns, text), an
            untokenized or malformed example (named by its index and column), no label to learn, a sequence
            longer than the plan's ``seq_len`` without ``truncate``, or ``compile_layers=True`` where nothing
            can be compiled (a Plan instead of the model; no triton).
    """
    plan = model_or_plan if isinstance(model_or_plan, Plan) else getattr(model_or_plan, "cudaload_plan", None)
    if not isinstance(plan, Plan):
        raise ConfigurationError(
            f"training_setup() takes a model from cudaload.load_model or a Plan, not {type(model_or_plan).__name__}",
            fix="load with cudaload.load_model(path, intent='lora') and pass the model",
        )
    _check_options(truncate=truncate, shuffle=shuffle, seed=seed, compile_layers=compile_layers)
    args = training_arguments(plan)
    t = plan.training
    ds: Any = train_dataset
    if t is not None and t.causal_lm and t.packed:
        args["per_device_train_batch_size"] = 1  # each item of the packed data set is a whole step
    vocab = vocab_bound(model_or_plan, plan) if train_dataset is not None else None
    if train_dataset is None:
        pass
    elif t is None or not t.causal_lm:
        # not a causal LM (its own labels: classes, spans, a target sequence): the data set as given, Trainer's
        # collator; only its rows and token ids are checked
        check_rows(train_dataset)
        check_ids(train_dataset, vocab)
    elif t.packed:
        ds = pack(
            train_dataset,
            tokens_per_step=t.step.tokens,
            # a filled step (batch_size not declared): bounded by its tokens alone
            sequences_per_step=t.step.tokens if t.fills_steps else t.step.sequences,
            longest=t.step.longest,
            truncate=truncate,
            shuffle=shuffle,
            seed=seed,
            vocab_size=vocab,
        )
    else:
        # padded steps are planned for sequences up to seq_len too: checked (or cut) the same way
        ds = as_rows(checked(train_dataset, t.step.longest, truncate, vocab)[0])
    # last: a data set refused above leaves the model as it was
    decision, count = _compile(model_or_plan, plan, ds if train_dataset is not None else None, compile_layers)
    return TrainingSetup(
        plan=plan,
        arguments=args,
        data_collator=collator_for(plan),
        train_dataset=ds,
        layer_compile=decision,
        compiled_layers=count,
    )


def _epoch_tokens(ds: Any) -> int | None:
    """The tokens one epoch of ``ds`` trains on: a packed set's count, the rows' ``input_ids`` of the padded
    plan's checked rows (a list); None for a data set passed on as given (not a causal LM), whose rows are not
    read here."""
    if isinstance(ds, PackedDataset):
        return ds.summary.tokens
    if isinstance(ds, list):
        return sum(len(row.get("input_ids") or ()) for row in ds if isinstance(row, Mapping))
    return None


def _compile(model_or_plan: Any, plan: Plan, ds: Any, requested: bool | None) -> tuple[Decision | None, int]:
    """The plan's compiled-layers decision with the data's tokens (cudaload.policies.training.compile), carried
    out on the model: compiled, or left eager (layers an earlier call compiled are put back to eager)."""
    t = plan.training
    if t is None:
        return None, 0
    tokens = _epoch_tokens(ds) if ds is not None else None
    d = layer_compile_for_run(t.layer_compile, t.layer_compile_payback_tokens, tokens, requested)
    model = None if isinstance(model_or_plan, Plan) else model_or_plan
    if d.choice != "layers":
        if model is not None:
            eager_layers(model)  # an earlier training_setup(compile_layers=True) on the same model
        return d, 0
    problem, fix = None, ""
    if model is None:
        problem = "training_setup() was given a Plan, not the model: nothing to compile"
        fix = "pass the model from cudaload.load_model, or compile_layers=None"
    else:
        problem = compile_problem(model)
        fix = "pip install triton (torch's CUDA wheels bring it), or compile_layers=False"
        if problem is None and not decoder_layers(model):
            problem = "no decoder layers found in this model (no ModuleList of one decoder layer class)"
            fix = "compile_layers=False, or compile the model's own blocks yourself"
    if problem:
        if requested:
            raise ConfigurationError(f"compile_layers=True: {problem}", fix=fix)
        return replace(d, choice="off", reasons=(problem, *d.reasons)), 0
    return d, compile_decoder_layers(model)


def _check_options(*, truncate: Any, shuffle: Any, seed: Any, compile_layers: Any) -> None:
    """training_setup's own keywords: ``truncate="yes"`` would be true and ``seed="abc"`` would reach
    random.Random, which seeds from any string, without a word."""
    for name, value in (("truncate", truncate), ("shuffle", shuffle)):
        if not isinstance(value, bool):
            raise ConfigurationError(
                f"training_setup({name}={value!r}): {name} is True or False, not {type(value).__name__}",
                fix=f"pass {name}=True or {name}=False",
            )
    if compile_layers is not None and not isinstance(compile_layers, bool):
        raise ConfigurationError(
            f"training_setup(compile_layers={compile_layers!r}): None, True or False, not "
            f"{type(compile_layers).__name__}",
            fix="pass compile_layers=None (the plan decides), True or False",
        )
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
        raise ConfigurationError(
            f"training_setup(seed={seed!r}): the seed is a whole number, not {type(seed).__name__}",
            fix="pass seed=0 (any int)",
        )


def vocab_bound(model_or_plan: Any, plan: Plan) -> int | None:
    """The bound token ids must stay below: a model's input embedding rows (what the lookup indexes; it differs
    from the config's ``vocab_size`` after ``resize_token_embeddings`` or where the config is padded), else its
    config's ``vocab_size``, else the plan's. None where none is known."""
    if not isinstance(model_or_plan, Plan):
        try:
            n = model_or_plan.get_input_embeddings().num_embeddings
        except (AttributeError, NotImplementedError, TypeError):
            n = None
        if isinstance(n, int) and not isinstance(n, bool) and n > 0:
            return n
        config = getattr(model_or_plan, "config", None)
        get_text = getattr(config, "get_text_config", None)
        text = get_text() if callable(get_text) else config
        n = getattr(text, "vocab_size", None)
        if isinstance(n, int) and not isinstance(n, bool) and n > 0:
            return n
    return plan.model.vocab_size or None


def sft_config_arguments(plan: Plan) -> dict[str, Any]:
    """Keywords for TRL's ``SFTConfig`` (``SFTTrainer``) carrying the same plan through TRL's own options.

    A packed plan becomes TRL's best-fit-decreasing packing (``packing=True, packing_strategy="bfd"``) into rows
    of the plan's ``tokens_per_step`` tokens, one row a step, padding-free: TRL fills each step to about the
    bound (not at most ``batch_size`` sequences, as :func:`training_setup` does), so a step holds more sequences
    and the memory the plan was made for is used. A padded plan keeps TRL's padding with ``max_length`` at the
    plan's ``seq_len``. TRL (trl 1.x sft_config.py: ``packing``, ``packing_strategy``, ``padding_free``,
    ``max_length``) pads or packs the data itself: pass your data set to ``SFTTrainer`` unchanged.

    Raises:
        ConfigurationError: not a Plan, or a plan for inference or serving.
    """
    args = training_arguments(plan)
    # TRL's SFTTrainer computes the loss through its own fused, chunked LM head and refuses Liger's fused
    # linear cross-entropy (trl 1.16 sft_trainer.py:1135-1147, 1.15 :1128-1140): where the plan chose Liger's
    # loss, TRL's own head does that job, so neither Liger keyword is passed on
    args.pop("use_liger_kernel", None)
    args.pop("liger_kernel_config", None)
    t = plan.training
    if t is not None and t.packed:
        args.update(
            packing=True,
            packing_strategy="bfd",
            padding_free=True,
            max_length=t.step.tokens,
            per_device_train_batch_size=1,  # one packed row of the bound a step
        )
    else:
        args.update(packing=False, max_length=plan.seq_len)
    return args
