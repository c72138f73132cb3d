"""What a user asked for, checked once: :class:`Request`.

``cudaload.load_model``, ``cudaload.plan``, ``cudaload tune`` and the ``cudaload`` command take the same
wishes (the model, the intent, the work's sizes, attention / dtype / quantization / placement, training
options). A :class:`Request` holds all of them and checks them when it is made: types (``True`` is not a
batch size), ranges, names (with the closest valid one), combinations that cannot work together, and every
environment variable cudaload reads (:func:`cudaload._env.check_all`). A refusal is a cudaload error whose
``fix`` works when followed; a legal input that is probably a mistake warns once
(:class:`~cudaload.errors.CudaloadWarning`).

``Request.build(model, entry="plan", **options)`` makes one from the keywords of ``entry`` (``"plan"``,
``"load_model"`` or ``"tune"``); :meth:`Request.plan_kwargs`, :meth:`Request.load_kwargs` and
:meth:`Request.tune_kwargs` give back exactly the keywords those functions take.

Nothing here imports torch or transformers: the ``cudaload`` command refuses a bad value before either is
imported. Facts about the machine or the model are used only where they are cheap (a snapshot given as
``hardware``, a local ``config.json``); everything else is the planner's.
"""

from __future__ import annotations

import json
import math
import numbers
import os
import re
import sys
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from . import _env
from .decode_plan import DECODE_MODES
from .errors import (
    SYNONYMS,
    CheckpointError,
    ConfigurationError,
    CudaloadWarning,
    InvalidChoiceError,
    ModelNotFoundError,
    close_names,
)
from .plans import INTENTS
from .training_plan import LAYOUTS, LOSSES

ENTRIES = ("plan", "load_model", "tune")
TRAINING_INTENTS = ("training", "lora", "qlora")
BATCH_LAYOUTS = ("auto", *LAYOUTS)
TRAINING_LOSSES = ("auto", *LOSSES)
#: how generate() decodes (cudaload.policies.decode): decided from the declared work, or asked for
DECODES = ("auto", *DECODE_MODES)
#: what policies.quantization._methods accepts (case-insensitive; "no" / "off" mean "none")
QUANTIZATIONS = ("auto", "none", "int8", "nf4")
_QUANTIZATION_SPELLINGS = (*QUANTIZATIONS, "no", "off")
#: dtype names policies.dtype.normalize_dtype accepts, shown when one is not
_DTYPE_NAMES = ("auto", "bfloat16", "bf16", "float16", "fp16", "float32", "fp32")
#: a Hub repo id: "name" or "org/name" (huggingface_hub's validate_repo_id allows these characters)
_REPO_ID = re.compile(r"^[\w.-]+(/[\w.-]+)?$")
_CLASS_NAME = re.compile(r"^[A-Za-z_]\w*$")
_DEVICE = re.compile(r"^cuda(:\d+)?$")
#: a max_memory entry below this is bytes meant as MiB or GiB, most likely
_TINY_BYTES = 1 << 20

#: LoraConfig's keywords (peft 0.21.2 peft/tuners/lora/config.py, dataclass fields) a caller may set
LORA_KEYS = (
    "r",
    "lora_alpha",
    "lora_dropout",
    "target_modules",
    "exclude_modules",
    "fan_in_fan_out",
    "bias",
    "use_rslora",
    "use_dora",
    "modules_to_save",
    "init_lora_weights",
    "layers_to_transform",
    "layers_pattern",
    "rank_pattern",
    "alpha_pattern",
    "megatron_config",
    "megatron_core",
    "trainable_token_indices",
    "loftq_config",
    "eva_config",
    "corda_config",
    "lora_ga_config",
    "velora_config",
    "alora_invocation_tokens",
    "use_qalora",
    "qalora_group_size",
    "monteclora_config",
    "layer_replication",
    "runtime_config",
    "lora_bias",
    "target_parameters",
    "use_bdlora",
    "arrow_config",
    "kasa_config",
    "ensure_weight_tying",
    "task_type",
)
#: LoraConfig fields peft fills in itself
_LORA_BOOKKEEPING = (
    "peft_type",
    "auto_mapping",
    "peft_version",
    "base_model_name_or_path",
    "revision",
    "inference_mode",
)
_LORA_BOOLS = ("fan_in_fan_out", "use_rslora", "use_dora", "use_qalora", "lora_bias", "ensure_weight_tying")
_LORA_BIAS = ("none", "all", "lora_only")
_LORA_INITS = ("gaussian", "eva", "olora", "pissa", "corda", "loftq", "orthogonal", "mica")

#: options only one function takes; the others would drop them without a word
_PLAN_ONLY = frozenset(
    {
        "assume_installed",
        "assume_missing",
        "optimizer",
        "gradient_checkpointing",
        "parallelism",
        "lower_latency",
        "timings",
    }
)
_LOAD_ONLY = frozenset({"task", "warmup", "prefetch", "tune", "new_weights"})
_TUNE_OPTIONS = frozenset({"hardware", "batch_size", "seq_len", "new_tokens", "padded", "tune_budget_s"})


@dataclass(frozen=True)
class Request:
    """Everything a caller asked for, checked (module docstring). Make one with :meth:`build`; a direct
    ``Request(...)`` or ``dataclasses.replace`` is checked the same way.

    The fields mean what the keywords of ``cudaload.plan`` / ``cudaload.load_model`` mean (docs/api.md), with
    these readings: ``hardware`` is the resolved snapshot (None: detect this machine when planning);
    ``trust_kernels``, ``assume_installed`` and ``assume_missing`` are tuples; ``dtype`` is its name;
    ``from_pretrained_kwargs`` are the keywords ``load_model`` passes on (``revision`` among them).
    ``entry`` is the function the request is for: ``"plan"``, ``"load_model"`` or ``"tune"``."""

    model: Any
    entry: str = "plan"
    hardware: Any = None
    intent: str = "inference"
    seq_len: int | None = None
    batch_size: int | None = None
    new_tokens: int | None = None
    generate_calls: int | None = None
    decode: str | None = "auto"
    padded: bool = False
    attn: str = "auto"
    dtype: str = "auto"
    quantization: str | None = "auto"
    device_map: Any = None
    max_memory: Mapping[Any, Any] | None = None
    allow_offload: bool = False
    kernels: bool | None = None
    trust_kernels: tuple[str, ...] = ()
    model_class: str | None = None
    task: str | None = None
    revision: str | None = None
    fast: bool | None = None
    optimizer: str | None = "auto"
    gradient_checkpointing: bool | None = None
    parallelism: str = "auto"
    lower_latency: bool = False
    assume_installed: tuple[str, ...] = ()
    assume_missing: tuple[str, ...] = ()
    prefetch: bool | str = True
    warmup: bool = False
    tune: bool = False
    tune_budget_s: float | None = None
    batch_layout: str | None = "auto"
    tokens_per_step: int | None = None
    lora: Mapping[str, Any] | None = None
    loss: str | None = "auto"
    #: checked by cudaload.checkpoint_coverage.new_weights_option: False, True or name patterns
    new_weights: bool | tuple[str, ...] = False
    timings: Any = None
    from_pretrained_kwargs: Mapping[str, Any] = field(default_factory=dict)
    #: the environment checked (None: ``os.environ``); not a wish, so not compared or shown
    env: Mapping[str, str] | None = field(default=None, repr=False, compare=False)

    # -- construction --------------------------------------------------------------------------------------

    @classmethod
    def build(
        cls, model: Any, *, entry: str = "plan", env: Mapping[str, str] | None = None, **options: Any
    ) -> Request:
        """The request for ``entry(model, **options)``: ``options`` are that function's keywords (for
        ``load_model``, every keyword that is not cudaload's goes to ``from_pretrained``, as there). ``env``:
        the environment to check (default ``os.environ``); every variable cudaload reads is checked now.

        Raises a cudaload error (:mod:`cudaload.errors`) for anything that cannot work, with the fix; warns
        (:class:`~cudaload.errors.CudaloadWarning`) for what works but is probably not what was meant."""
        if entry not in ENTRIES:
            raise ConfigurationError(
                f"entry={entry!r} is not one of {', '.join(ENTRIES)}",
                fix="use entry='plan', 'load_model' or 'tune'",
            )
        names = {f.name for f in fields(cls)} - {"model", "entry", "env"}
        given = {k: v for k, v in options.items() if k in names}
        extra = {k: v for k, v in options.items() if k not in names}
        if entry == "load_model":
            if "from_pretrained_kwargs" in given:
                raise ConfigurationError(
                    "load_model() takes from_pretrained's keywords directly, not as from_pretrained_kwargs=",
                    fix="pass them as keywords: load_model(path, revision='main', token=...)",
                )
            if "revision" in given:  # from_pretrained's keyword there
                extra["revision"] = given.pop("revision")
            _absorb_aliases(given, extra)
            for key in extra:
                meant = _misspelt_option(key, names)
                if meant:
                    _warn(
                        f"{key}= is not a cudaload option: it goes to from_pretrained (which sets unknown keywords "
                        f"on the model's config); if you meant cudaload's {meant}=, pass {meant}= instead"
                    )
            given["from_pretrained_kwargs"] = extra
            given["revision"] = extra.get("revision")
        elif extra:
            key = next(iter(extra))
            allowed = sorted(_allowed(entry))
            close = close_names(key, allowed, n=1)
            raise ConfigurationError(
                f"{entry}() has no option {key}=" + (f"; did you mean {close[0]}=?" if close else ""),
                fix=(f"use {close[0]}= instead" if close else f"drop {key}=")
                + f" ({entry}'s options: {', '.join(allowed)})",
            )
        return cls(model, entry=entry, env=env, **given)

    def __post_init__(self) -> None:
        set_ = self._set  # frozen: normalised values are written once, here
        if self.entry not in ENTRIES:
            raise ConfigurationError(
                f"entry={self.entry!r} is not one of {', '.join(ENTRIES)}",
                fix="use entry='plan', 'load_model' or 'tune'",
            )
        for note in _env.check_all(self.env).notes:
            _warn(note)
        if self.entry == "plan" and self.from_pretrained_kwargs:
            # what load_model() makes of the same keywords (Request.build): torch_dtype / attn_implementation
            # read as dtype= / attn=, the others cudaload decides refused; a plan must not differ from its load
            passed, own = (
                dict(_passed_on(self.from_pretrained_kwargs)),
                {"dtype": self.dtype, "attn": self.attn},
            )
            _absorb_aliases(own, passed, entry="plan")
            set_("dtype", own["dtype"])
            set_("attn", own["attn"])
            set_("from_pretrained_kwargs", passed)
        self._only_the_entry_options()
        set_("intent", _choice("intent", self.intent, INTENTS))
        for name in ("seq_len", "batch_size", "new_tokens", "generate_calls", "tokens_per_step"):
            set_(name, _positive_int(name, getattr(self, name)))
        for name in ("padded", "allow_offload", "lower_latency", "warmup", "tune"):
            set_(name, _flag(name, getattr(self, name)))
        for name in ("kernels", "fast", "gradient_checkpointing"):
            set_(name, _tristate(name, getattr(self, name)))
        set_("attn", attention_name(self.attn))
        set_("dtype", _dtype(self.dtype))
        set_("quantization", _quantization(self.quantization))
        set_("optimizer", _optimizer(self.optimizer))
        set_("parallelism", _parallelism(self.parallelism))
        set_("batch_layout", _lowercase_choice("batch_layout", self.batch_layout, BATCH_LAYOUTS))
        set_("loss", _lowercase_choice("loss", self.loss, TRAINING_LOSSES))
        set_("decode", _auto(_lowercase_choice("decode", self.decode, DECODES)))
        set_("trust_kernels", _trust(self.trust_kernels))
        installed = package_names("assume_installed", self.assume_installed)
        missing = package_names("assume_missing", self.assume_missing)
        both = sorted(set(installed) & set(missing))
        if both:
            raise ConfigurationError(
                f"{', '.join(both)} assumed both installed and missing",
                fix=f"name {both[0]} in one of assume_installed= and assume_missing=",
            )
        set_("assume_installed", tuple(installed))
        set_("assume_missing", tuple(missing))
        set_("model_class", _model_class(self.model_class))
        set_("task", _task(self.task))
        set_("revision", _revision(self.revision))
        set_("prefetch", _prefetch(self.prefetch))
        set_("tune_budget_s", _seconds("tune_budget_s", self.tune_budget_s))
        set_("lora", _lora(self.lora))
        from .checkpoint_coverage import new_weights_option  # pure: errors and the standard library only

        set_("new_weights", new_weights_option(self.new_weights))
        set_("from_pretrained_kwargs", _passed_on(self.from_pretrained_kwargs))
        set_("max_memory", _max_memory(self.max_memory))
        set_("device_map", _device_map(self.device_map))
        set_("timings", _timings(self.timings))
        set_("hardware", _hardware(self.hardware, self.entry))
        config = _model(self.model, self.entry, str(self.from_pretrained_kwargs.get("subfolder") or ""))
        self._check_together()
        self._warn_suspicious(config)

    def _set(self, name: str, value: Any) -> None:
        object.__setattr__(self, name, value)

    def _only_the_entry_options(self) -> None:
        """An option the entry does not take would be dropped without a word: refused."""
        allowed = _allowed(self.entry)
        for f in fields(self):
            if f.name in ("model", "entry", "env") or f.name in allowed:
                continue
            if f.name == "revision" and self.entry == "load_model":
                continue  # taken from from_pretrained_kwargs
            if not _differs(self, f.name):
                continue
            takers = [e for e in ENTRIES if f.name in _allowed(e)]
            raise ConfigurationError(
                f"{self.entry}() does not take {f.name}="
                + (f" (only {', '.join(takers)}() does)" if takers else ""),
                fix=f"drop {f.name}=" + (f", or call {takers[0]}()" if takers else ""),
            )

    def _check_together(self) -> None:
        """Options that are each valid and cannot work together."""
        intent, training = self.intent, self.intent in TRAINING_INTENTS
        if self.new_tokens is not None and self.seq_len is not None and self.new_tokens >= self.seq_len:
            raise ConfigurationError(
                f"new_tokens={self.new_tokens} leaves no prompt in seq_len={self.seq_len} (seq_len counts the prompt "
                "and the new tokens)",
                fix=f"pass seq_len={self.seq_len + self.new_tokens} (or new_tokens= below seq_len)",
            )
        if self.generate_calls is not None and self.new_tokens is None:
            raise ConfigurationError(
                f"generate_calls={self.generate_calls} counts generate() calls of new_tokens= new tokens each, and "
                "new_tokens= is not given",
                fix="pass new_tokens= too (each call's new tokens, e.g. new_tokens=256)",
            )
        if intent != "inference":
            asked = {"decode": self.decode != "auto", "generate_calls": self.generate_calls is not None}
            for name in (n for n, on in asked.items() if on):
                raise ConfigurationError(
                    f"{name}={getattr(self, name)!r} plans generate()'s decode steps, and intent={intent!r} "
                    + (
                        "serves with continuous batching (its serving section decides the decode)"
                        if intent == "serving"
                        else "trains"
                    ),
                    fix=f"drop {name}=, or use intent='inference'",
                )
        q = (self.quantization or "auto").strip().lower()
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
        if self.task and self.model_class:
            raise ConfigurationError(
                f"task={self.task!r} and model_class={self.model_class!r} both name the class to load",
                fix="drop task= (model_class= names the class itself)",
            )
        if self.lora is not None and intent not in ("lora", "qlora"):
            raise ConfigurationError(
                f"lora= configures LoRA adapters, and intent={intent!r} trains none",
                fix="use intent='lora' (or 'qlora'), or drop lora=",
            )
        if not training:
            asked = {
                "optimizer": (self.optimizer or "auto").strip().lower() != "auto",
                "gradient_checkpointing": self.gradient_checkpointing is not None,
                "batch_layout": _auto(self.batch_layout) != "auto",
                "tokens_per_step": self.tokens_per_step is not None,
                "loss": _auto(self.loss) != "auto",
            }
            for name in (n for n, on in asked.items() if on):
                raise ConfigurationError(
                    f"{name}={getattr(self, name)!r} is a training option, and intent={intent!r} does not train",
                    fix=f"drop {name}=, or use intent='training', 'lora' or 'qlora'",
                )
        elif self.lower_latency:
            raise ConfigurationError(
                f"lower_latency=True picks tensor parallelism for inference; intent={intent!r} trains",
                fix="drop lower_latency=",
            )
        packed = _auto(self.batch_layout) == "packed"
        if self.padded and packed:
            raise ConfigurationError(
                "padded=True and batch_layout='packed' describe different batches",
                fix="drop padded= (a packed batch has no padding), or use batch_layout='padded'",
            )
        if (
            packed
            and self.tokens_per_step is not None
            and self.seq_len
            and self.tokens_per_step < self.seq_len
        ):
            # policies.training.plan_step refuses it too, after reading the model
            raise ConfigurationError(
                f"tokens_per_step={self.tokens_per_step} is shorter than seq_len={self.seq_len}: a packed step must "
                "hold the longest sequence",
                fix=f"pass tokens_per_step={self.seq_len} or more, or a shorter seq_len",
            )
        if self.tune and (self.batch_size is None or self.seq_len is None):
            raise ConfigurationError(
                "tune=True needs the work to measure", fix="pass batch_size= and seq_len= (and new_tokens=)"
            )
        if self.entry == "tune" and self.seq_len is not None and self.new_tokens is None:
            raise ConfigurationError(
                "cudaload tune counts seq_len as the prompt and the new tokens: it needs new_tokens= with it",
                fix="pass new_tokens= too (e.g. new_tokens=32)",
            )
        if self.entry == "tune":
            unwritable = _env.cache_unwritable(self.env)
            if unwritable:
                raise ConfigurationError(
                    f"cudaload tune stores what it measures under CUDALOAD_CACHE, and {unwritable}",
                    fix="set CUDALOAD_CACHE to a folder you can write (it is created when needed), or unset it",
                )
        self._check_machine()

    def _check_machine(self) -> None:
        """What the machine planned for cannot do, where its snapshot (or a cheap look at this one) says so."""
        caps = self.hardware
        q = _auto(self.quantization)
        profile = (
            caps.source.removeprefix("profile:")
            if caps is not None and caps.source.startswith("profile:")
            else None
        )
        mentioned = {p.name for p in caps.packages} if caps is not None else set()
        if (
            profile is not None
            and (self.intent == "qlora" or q in ("int8", "nf4"))
            and "bitsandbytes" not in {*mentioned, *self.assume_installed, *self.assume_missing}
        ):
            # a profile lists no optional packages (profiles.py): the fit ladder would refuse every quantized rung
            # and suggest something else, where the plan asked for only needs the packages assumed
            need = ["bitsandbytes", "peft"] if self.intent == "qlora" else ["bitsandbytes"]
            asked = "intent='qlora'" if self.intent == "qlora" else f"quantization={self.quantization!r}"
            raise InvalidChoiceError(
                f"{asked} needs bitsandbytes, and hardware={profile!r} is a profile, which lists no optional packages",
                fix=f"plan as if they were installed: assume_installed={need!r}"
                + (", or use intent='lora' (a bf16 base, no bitsandbytes)" if self.intent == "qlora" else ""),
            )
        if caps is not None:
            check_devices(self, caps)

    def _warn_suspicious(self, config: Mapping[str, Any] | None) -> None:
        """Legal, and probably not what was meant: each warned once (module docstring)."""
        declared = self.batch_size is not None and self.seq_len is not None
        if self.intent in TRAINING_INTENTS and (self.new_tokens is not None or self.padded):
            _warn(
                f"new_tokens= and padded= describe generate() calls; intent={self.intent!r} trains and ignores them: "
                "drop them"
            )
        elif self.entry != "tune" and not declared and (self.new_tokens is not None or self.padded):
            _warn(
                "new_tokens= and padded= count only with both batch_size= and seq_len= (the declared work: the "
                "measured attention timings, and the decode plan's longest sequence and batch): pass both, or "
                "drop them"
            )
        if self.tune_budget_s is not None and self.entry == "load_model" and not self.tune:
            _warn("tune_budget_s= has no effect without tune=True: pass tune=True, or drop tune_budget_s=")
        if self.tune and (self.attn != "auto" or self.intent != "inference"):
            _warn(
                "tune=True measures attention for inference with attn='auto'; with "
                f"attn={self.attn!r}, intent={self.intent!r} nothing is measured: drop tune=True"
            )
        if (
            self.tokens_per_step is not None
            and self.seq_len is not None
            and self.tokens_per_step < self.seq_len
        ):
            _warn(
                f"tokens_per_step={self.tokens_per_step} is fewer tokens than one sequence (seq_len={self.seq_len}): "
                f"a packed step must hold the longest sequence; pass tokens_per_step={self.seq_len} or more"
            )
        if "*" in self.trust_kernels:
            _warn(
                "trust_kernels=['*'] lets code from every Hub kernel publisher run in this process: name the "
                "publishers (trust_kernels=['kernels-community/*'])"
            )
        limit = _context(config)
        if limit is not None and self.seq_len is not None and self.seq_len > limit:
            _warn(
                f"seq_len={self.seq_len} is longer than the model's context (max_position_embeddings {limit}): "
                f"positions past it were never trained; pass seq_len={limit} or less"
            )
        if _names_cuda(self.device_map) and self.device_map != "cpu" and _no_gpu(self.hardware, self.env):
            _warn(
                f"device_map={self.device_map!r} names a GPU, and this machine has none: the model loads on the "
                "CPU; pass device_map='cpu' to say so, or run where a GPU is visible"
            )
        self._warn_machine(config)
        for key, size in _sizes(self.max_memory).items():
            if 0 < size < _TINY_BYTES:
                _warn(
                    f"max_memory[{key!r}] is {size} bytes, less than 1 MiB: sizes without a unit are bytes; "
                    f"write the unit ({size!r} -> '{size}GiB' or '{size}MiB')"
                )

    def _warn_machine(self, config: Mapping[str, Any] | None) -> None:
        """Options with no effect on the machine planned for, and this machine's variables that point nowhere."""
        here = self.hardware is None  # this machine, detected when planning
        cvd = _env.cuda_visible_devices(self.env)
        if (
            here
            and cvd
            and cvd.strip()
            and not cvd.strip().startswith("-")
            and _this_machine_has_no_gpu(self.env)
        ):
            # detection finds the same (cvd-no-gpu) and the plan lists it among its warnings, which nobody sees
            _warn(
                f"CUDA_VISIBLE_DEVICES={cvd!r} selects GPUs, and this machine has no NVIDIA GPU (no NVIDIA driver is "
                "loaded): the model loads on the CPU; unset CUDA_VISIBLE_DEVICES (or set it empty) to run on the "
                "CPU, or run where a GPU is visible"
            )
        no_gpu = _no_gpu(self.hardware, self.env)
        machine = "this machine" if here else f"hardware={self.hardware.source.split(':', 1)[-1]!r}"
        if self.kernels is True and no_gpu:
            _warn(
                f"kernels=True: Hub layer kernels run on CUDA GPUs, and {machine} has none, so none is used; drop "
                "kernels=, or plan for a GPU (hardware='H100')"
            )
        if self.tune and here and no_gpu:
            _warn(
                "tune=True times attention backends on a CUDA GPU, and this machine has none: nothing is measured "
                "and the plan follows its rules; drop tune=True"
            )
        launch = _env.launch(self.env)
        if here and (launch.local_rank is not None or (launch.world_size or 0) > 1) and no_gpu:
            name = "LOCAL_RANK" if launch.local_rank is not None else "WORLD_SIZE"
            _warn(
                f"{name}={getattr(launch, name.lower())} makes this process a rank, and this machine has no GPU: "
                "every rank loads its own whole copy on the CPU; run where each rank has a GPU, or unset "
                "LOCAL_RANK and WORLD_SIZE for one process"
            )
        if self.revision is not None and self.entry != "tune" and _local(self.model):
            _warn(
                f"revision={self.revision!r} has no effect: model= is read from the local disk as it is; drop "
                "revision=, or pass the Hub id (model='org/name') to read that revision"
            )
        if self.intent == "serving" and self.batch_size is not None:
            from .policies.serving.kv_cache import TF_MAX_REQUESTS

            if self.batch_size > TF_MAX_REQUESTS:
                _warn(
                    f"batch_size={self.batch_size} concurrent requests: transformers' continuous batching runs at "
                    f"most {TF_MAX_REQUESTS} at once (transformers continuous_batching/initialization.py:32; max_batch_tokens "
                    f"caps them further) and queues the rest; declare the requests served at once "
                    f"(batch_size={TF_MAX_REQUESTS} or fewer)"
                )

    # -- the keywords of each entry ----------------------------------------------------------------------------

    def _shared_kwargs(self) -> dict[str, Any]:
        """The keywords plan() and load_model() both take, with the same meaning."""
        return {
            "hardware": self.hardware,
            "intent": self.intent,
            "seq_len": self.seq_len,
            "batch_size": self.batch_size,
            "attn": self.attn,
            "dtype": self.dtype,
            "quantization": self.quantization,
            "device_map": self.device_map,
            "max_memory": self.max_memory,
            "allow_offload": self.allow_offload,
            "kernels": self.kernels,
            "trust_kernels": self.trust_kernels,
            "model_class": self.model_class,
            "fast": self.fast,
            "new_tokens": self.new_tokens,
            "generate_calls": self.generate_calls,
            "decode": self.decode,
            "padded": self.padded,
            "batch_layout": self.batch_layout,
            "tokens_per_step": self.tokens_per_step,
            "lora": None if self.lora is None else dict(self.lora),
            "loss": self.loss,
        }

    def plan_kwargs(self) -> dict[str, Any]:
        """``cudaload.plan(self.model, **kwargs)``'s keywords: every option of plan(), the training options
        (``batch_layout``, ``tokens_per_step``, ``lora``, ``loss``) included."""
        return {
            **self._shared_kwargs(),
            "assume_installed": self.assume_installed,
            "assume_missing": self.assume_missing,
            "revision": self.revision,
            "timings": self.timings,
            "from_pretrained_kwargs": dict(self.from_pretrained_kwargs) or None,
            "optimizer": self.optimizer,
            "gradient_checkpointing": self.gradient_checkpointing,
            "parallelism": self.parallelism,
            "lower_latency": self.lower_latency,
        }

    def load_kwargs(self) -> dict[str, Any]:
        """``cudaload.load_model(self.model, **kwargs)``'s keywords, ``from_pretrained``'s among them. Refused
        for a request that holds an option load_model does not take (it would be dropped)."""
        dropped = sorted(k for k in _PLAN_ONLY if _differs(self, k))
        if dropped:
            raise ConfigurationError(
                f"load_model() does not take {', '.join(k + '=' for k in dropped)}",
                fix="use cudaload.plan() for those, or drop them",
            )
        return {
            **self._shared_kwargs(),
            "task": self.task,
            "warmup": self.warmup,
            "prefetch": self.prefetch,
            "tune": self.tune,
            "tune_budget_s": self.tune_budget_s,
            "new_weights": self.new_weights,
            **self.from_pretrained_kwargs,
        }

    def tune_kwargs(self) -> dict[str, Any]:
        """``cudaload.tuning.tune(self.model, **kwargs)``'s keywords for the work given: tune() takes the prompt's
        length, and ``seq_len`` here counts the prompt and the new tokens, as plan() does."""
        out: dict[str, Any] = {"padded": self.padded}
        if self.batch_size is not None:
            out["batch_size"] = self.batch_size
        if self.new_tokens is not None:
            out["new_tokens"] = self.new_tokens
        if self.seq_len is not None and self.new_tokens is not None:
            out["seq_len"] = self.seq_len - self.new_tokens
        if self.tune_budget_s is not None:
            out["budget_s"] = self.tune_budget_s
        if self.hardware is not None:
            out["hardware"] = self.hardware
        return out


# -- which options each entry takes ------------------------------------------------------------------------------


def _allowed(entry: str) -> frozenset[str]:
    every = frozenset(f.name for f in fields(Request)) - {"model", "entry", "env"}
    if entry == "tune":
        return _TUNE_OPTIONS
    if entry == "load_model":
        return every - _PLAN_ONLY - {"revision"}
    return every - _LOAD_ONLY - {"tune_budget_s"}


def _differs(req: Request, name: str) -> bool:
    """Whether ``name`` holds something other than its default (an empty list counts as the empty default)."""
    f = next(f for f in fields(req) if f.name == name)
    default = f.default_factory() if callable(f.default_factory) else f.default
    value = getattr(req, name)
    if value is default or (type(value) is type(default) and value == default):
        return False
    empty = isinstance(default, (tuple, dict)) and not default
    return not (empty and isinstance(value, (list, tuple, Mapping)) and not value)


def _misspelt_option(key: str, options: set[str]) -> str | None:
    """The cudaload option ``key`` (a keyword load_model passes to from_pretrained) is most likely a misspelling
    of: a close spelling (difflib ratio >= 0.8: seqlen, batchsize), never a keyword from_pretrained takes."""
    import difflib

    if key in _PASSED_ON:
        return None
    hits = difflib.get_close_matches(key, sorted(options), n=1, cutoff=0.8)
    return hits[0] if hits else None


#: keywords from_pretrained itself takes: never taken for a misspelt cudaload option
_PASSED_ON = frozenset(
    {
        "revision",
        "token",
        "subfolder",
        "variant",
        "trust_remote_code",
        "cache_dir",
        "local_files_only",
        "config",
        "quantization_config",
        "low_cpu_mem_usage",
        "use_safetensors",
        "tp_plan",
        "tp_size",
        "key_mapping",
        "offload_folder",
        "gguf_file",
    }
)


def _absorb_aliases(given: dict[str, Any], fp: dict[str, Any], entry: str = "load_model") -> None:
    """load_model's reading of ``torch_dtype`` / ``attn_implementation`` while ``dtype`` / ``attn`` are auto,
    and its refusal of the other keywords cudaload decides (execute/load.py, load_model's first lines); plan()'s
    ``from_pretrained_kwargs`` the same way, so a plan is the plan of its load."""
    from .auto_classes import DECIDED_KWARGS as _DECIDED

    clash = sorted(_DECIDED & fp.keys())
    if "torch_dtype" in fp and given.get("dtype", "auto") == "auto":
        given["dtype"] = str(fp.pop("torch_dtype")).replace("torch.", "")
        clash.remove("torch_dtype")
    if "attn_implementation" in fp and given.get("attn", "auto") == "auto":
        given["attn"] = str(fp.pop("attn_implementation"))
        clash.remove("attn_implementation")
    if clash:
        own = {"torch_dtype": "dtype", "attn_implementation": "attn", "use_kernels": "kernels"}
        example = ", ".join(f"{own.get(k, k)}={fp[k]!r}" for k in clash if own.get(k, k) != "kernel_config")
        where = (
            "from_pretrained_kwargs" if entry == "plan" else f"{entry}() keywords passed to from_pretrained"
        )
        raise ConfigurationError(
            f"{', '.join(clash)} in {where} {'is' if len(clash) == 1 else 'are'} decided by cudaload",
            fix=f"use {entry}'s own options instead"
            + (f": {entry}(model, {example})" if example else "")
            + " (dtype=, attn=, device_map=, max_memory=, kernels=)",
        )


# -- warnings -----------------------------------------------------------------------------------------------------

_HERE = os.path.dirname(os.path.abspath(__file__))


def _warn(message: str) -> None:
    """A :class:`CudaloadWarning` pointed at the caller's line, past cudaload's own frames (and the dataclass'
    generated ``__init__``), so the default filter shows each once per calling line."""
    level, frame = 1, sys._getframe(0)
    while frame is not None and (
        frame.f_code.co_filename.startswith(_HERE) or frame.f_code.co_filename == "<string>"
    ):
        frame = frame.f_back  # type: ignore[assignment]
        level += 1
    warnings.warn(message, CudaloadWarning, stacklevel=level)


# -- one option each ----------------------------------------------------------------------------------------------


def _closest(word: str, names: tuple[str, ...] | list[str]) -> list[str]:
    """The names closest to ``word``, best first: :func:`~cudaload.errors.close_names`, else a looser match on
    the letters and digits alone ("flash3" -> flash_attention_3)."""
    close = close_names(word, names, n=3)
    if close:
        return close
    import difflib

    def bare(s: str) -> str:
        return re.sub(r"[^a-z0-9]", "", s.lower())

    scored = sorted(
        ((difflib.SequenceMatcher(None, bare(word), bare(n)).ratio(), n) for n in names), key=lambda t: -t[0]
    )
    return [n for score, n in scored[:3] if score >= 0.4]


def _unknown(
    name: str,
    value: Any,
    names: tuple[str, ...],
    what: str,
    error: type[ConfigurationError] = ConfigurationError,
) -> ConfigurationError:
    close = _closest(str(value), names)
    # a word with two meanings ("finetune": a full fine-tune or adapters) names both
    meant = [s for s in SYNONYMS.get(str(value).strip().lower(), ()) if s in names]
    if len(meant) > 1:
        options = " or ".join(f"{name}={m!r}" for m in meant)
        return error(
            f"{name}={value!r} is not {what}; did you mean {' or '.join(repr(m) for m in meant)}?",
            fix=f"use {options} (one of: {', '.join(names)})",
        )
    hint = f"; did you mean {close[0]!r}?" if close else ""
    first = close[0] if close else names[0]
    return error(
        f"{name}={value!r} is not {what}{hint}",
        fix=f"use {name}={first!r} (one of: {', '.join(names)})",
    )


def _choice(
    name: str, value: Any, names: tuple[str, ...], *, error: type[ConfigurationError] = ConfigurationError
) -> str:
    if not isinstance(value, str):
        raise error(
            f"{name}={value!r} is not a name", fix=f"use {name}={names[0]!r} (one of: {', '.join(names)})"
        )
    if value not in names:
        raise _unknown(name, value, names, f"a valid {name}", error)
    return value


def _auto(value: str | None) -> str:
    return (value or "auto").strip().lower()


def _lowercase_choice(name: str, value: Any, names: tuple[str, ...]) -> str | None:
    """A name read as policies.training reads it: None is "auto", case and spaces do not count."""
    if value is None or (isinstance(value, str) and _auto(value) in names):
        return value  # type: ignore[no-any-return]
    raise _unknown(name, value, names, f"a {name} cudaload plans")


def _positive_int(name: str, value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        if int(value) >= 1:
            return int(value)
        raise ConfigurationError(
            f"{name}={value!r} must be 1 or more", fix=f"pass {name}=1 or more (or leave it out)"
        )
    example, note = _EXAMPLES.get(name, 1), ""
    if isinstance(value, bool):
        example = 1  # True is 1 to Python: that is what was meant, if anything
    elif (isinstance(value, float) and math.isfinite(value) and value >= 1) or (
        isinstance(value, str) and value.strip().isdigit() and int(value) >= 1
    ):
        example = int(value)
    elif isinstance(value, str) and _SHORTHAND.match(value):
        # "2k" is 2000 to some and 2048 to others: not read either way, the fix says both
        m = _SHORTHAND.match(value)
        assert m is not None
        n, unit = float(m.group(1)), m.group(2).lower()
        scale = {"k": (1000, 1024), "m": (1000**2, 1024**2)}[unit]
        example = int(n * scale[1])
        note = f" ({value!r} could be {int(n * scale[0])} or {example}: write the number)"
    what = {"seq_len": "tokens", "new_tokens": "tokens", "tokens_per_step": "tokens"}.get(name, "")
    raise ConfigurationError(
        f"{name}={value!r} must be a whole number"
        + (f" of {what}" if what else "")
        + (" (True is not a number here)" if isinstance(value, bool) else "")
        + note,
        fix=f"pass an integer{f' number of {what}' if what else ''}, 1 or more: e.g. {name}={example}; or leave "
        "it out",
    )


#: what the fix of a number that is not one shows, per option: a value a caller would write
_EXAMPLES = {
    "seq_len": 2048,
    "batch_size": 1,
    "new_tokens": 256,
    "generate_calls": 1,
    "tokens_per_step": 16384,
}
#: "2k", "4K", "1.5k", "1m": a size in shorthand
_SHORTHAND = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kKmM])\s*$")


def _flag(name: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if type(value).__name__ == "bool_":  # numpy's
        return bool(value)
    raise ConfigurationError(
        f"{name}={value!r} must be True or False", fix=f"pass {name}=True or {name}=False"
    )


def _tristate(name: str, value: Any) -> bool | None:
    if value is None or isinstance(value, bool):
        return value
    raise ConfigurationError(
        f"{name}={value!r} must be True, False or None (auto)",
        fix=f"pass {name}=True, {name}=False, or {name}=None to let cudaload decide",
    )


def attention_name(value: Any) -> str:
    """``value`` as an ``attn=`` name cudaload plans ("auto" or an attention implementation), stripped; an
    :class:`~cudaload.errors.InvalidChoiceError` naming the closest one otherwise."""
    from .policies.attention.names import ALL_NAMES

    names = ("auto", *ALL_NAMES)
    if not isinstance(value, str):
        raise InvalidChoiceError(
            f"attn={value!r} is not a name", fix=f"use attn='auto' or one of: {', '.join(ALL_NAMES)}"
        )
    name = value.strip()
    if name not in names:
        close = _closest(name, names)
        raise InvalidChoiceError(
            f"attn={value!r} is not an attention implementation cudaload plans"
            + (f"; did you mean {close[0]!r}?" if close else ""),
            fix="use attn='auto' (cudaload picks)"
            + (f" or attn={close[0]!r}" if close else "")
            + f" (one of: {', '.join(ALL_NAMES)})",
        )
    return name


def _dtype(value: Any) -> str:
    text = str(value)
    if isinstance(value, str) and text.strip().lower() == "auto":
        return "auto"
    from .policies.dtype import normalize_dtype

    try:
        normalize_dtype(text)
    except InvalidChoiceError:
        raise _unknown(
            "dtype", value, _DTYPE_NAMES, "a dtype cudaload loads in", InvalidChoiceError
        ) from None
    return text


def _quantization(value: Any) -> str | None:
    if value is None:
        return None  # policies.quantization reads None as "auto"
    if isinstance(value, str) and value.strip().lower() in _QUANTIZATION_SPELLINGS:
        return value
    four_bit = isinstance(value, str) and "4" in value
    close = _closest(str(value), QUANTIZATIONS) if isinstance(value, str) and not four_bit else []
    raise InvalidChoiceError(
        f"quantization={value!r} is not one cudaload plans"
        + (f"; did you mean {close[0]!r}?" if close else "")
        + ("; its 4-bit form is 'nf4' (bitsandbytes NF4, double quantization)" if four_bit else ""),
        fix="use quantization='auto', 'none', 'int8' or 'nf4'",
    )


def _optimizer(value: Any) -> str | None:
    if value is None:
        return None  # read as "auto" (policies.quantization.training_ladder)
    from .policies.memory import OPTIMIZERS

    names = ("auto", *OPTIMIZERS)
    if not isinstance(value, str) or value.strip().lower() not in names:
        raise _unknown("optimizer", value, names, "an optimizer cudaload plans", InvalidChoiceError)
    return value


def _parallelism(value: Any) -> str:
    from .policies.parallelism import REQUESTS

    return _choice("parallelism", value, tuple(REQUESTS))


def _names(name: str, value: Any, example: str) -> tuple[str, ...]:
    """A sequence of names. One string is refused: iterated, it is one name per character."""
    if value is None:
        return ()
    if isinstance(value, str):
        parts = [p.strip() for p in value.split(",") if p.strip()]
        raise ConfigurationError(
            f"{name}={value!r} is one string, not a list of names: it would be read character by character",
            fix=f"pass a list: {name}={parts or [example]!r}",
        )
    if isinstance(value, Mapping) or not hasattr(value, "__iter__"):
        raise ConfigurationError(
            f"{name}={value!r} is not a list of names", fix=f"pass a list: {name}=[{example!r}]"
        )
    items = tuple(value)
    bad = [v for v in items if not isinstance(v, str) or not v.strip()]
    if bad:
        raise ConfigurationError(
            f"{name} holds {bad[0]!r}, which is not a name", fix=f"pass names only: {name}=[{example!r}]"
        )
    return items


def _trust(value: Any) -> tuple[str, ...]:
    entries = tuple(e.strip() for e in _names("trust_kernels", value, "kernels-community/*"))
    for e in entries:
        if not _env.trust_entry_ok(e):
            raise ConfigurationError(
                f"trust_kernels entry {e!r} is not a Hub kernel repo (org/name), a publisher (org/*) or '*'",
                fix="pass e.g. trust_kernels=['kernels-community/*'] or ['kernels-community/flash-attn2']",
            )
    return entries


#: packages the policies read that detection does not probe (policies/parallelism/per_gpu.py reads
#: caps.usable("deepspeed")): assumable, never found
_READ_NOT_PROBED = ("deepspeed",)


def package_names(name: str, value: Any) -> list[str]:
    """``assume_installed`` / ``assume_missing`` as cudaload's package names. A name no policy reads would
    change nothing without a word (``flash-atn``): refused with the close ones."""
    from .detection.packages import check_names

    out = []
    for raw in _names(name, value, "bitsandbytes"):
        key = raw.strip().lower()
        out.extend([key] if key in _READ_NOT_PROBED else check_names([raw]))
    return list(dict.fromkeys(out))


def _model_class(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, type):
        raise ConfigurationError(
            f"model_class={value.__name__} is a class; cudaload takes its name",
            fix=f"pass model_class={value.__name__!r}",
        )
    if not isinstance(value, str) or not _CLASS_NAME.match(value):
        raise ConfigurationError(
            f"model_class={value!r} is not a transformers class name",
            fix="pass a name such as model_class='AutoModelForCausalLM'",
        )
    return value


def _task(value: Any) -> str | None:
    if value is None:
        return None
    from .auto_classes import AUTO_CLASSES

    return _choice("task", value, tuple(sorted(AUTO_CLASSES)))


def _revision(value: Any) -> str | None:
    if value is None or (isinstance(value, str) and value.strip()):
        return value
    raise ConfigurationError(
        f"revision={value!r} is not a branch, tag or commit",
        fix="pass revision='main' (or a commit hash), or leave it out",
    )


def _prefetch(value: Any) -> bool | str:
    from .prefetch import MODES, REMOVED_MODES

    if value is True or value is False or (isinstance(value, str) and value in MODES):
        return value  # type: ignore[no-any-return]
    removed = REMOVED_MODES.get(value) if isinstance(value, str) else None
    raise ConfigurationError(
        f"prefetch={value!r} is not a prefetch mode" + (f": {removed}" if removed else ""),
        fix=f"use prefetch=True (reads the files), False or one of {', '.join(repr(m) for m in MODES)}",
    )


def _seconds(name: str, value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        seconds = float(value)
        if math.isfinite(seconds) and seconds > 0:
            return seconds
    raise ConfigurationError(
        f"{name}={value!r} must be a number of seconds above 0",
        fix=f"pass {name}=120 (seconds), or leave it out",
    )


def _lora(value: Any) -> Mapping[str, Any] | None:
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise ConfigurationError(
            f"lora={type(value).__name__} is not a dict of LoraConfig keywords",
            fix="pass a dict: lora={'r': 16, 'lora_alpha': 32}",
        )
    out = dict(value)
    for key, v in out.items():
        if key in _LORA_BOOKKEEPING:
            raise ConfigurationError(f"lora[{key!r}] is filled in by peft", fix=f"drop {key!r} from lora=")
        if key not in LORA_KEYS:
            close = _closest(str(key), LORA_KEYS)
            shown = repr(v) if close and isinstance(v, (int, float, str, list, tuple)) else "..."
            raise ConfigurationError(
                f"lora[{key!r}] is not a LoraConfig keyword"
                + (f"; did you mean {close[0]!r}?" if close else ""),
                fix=f"use lora={{{(close[0] if close else 'r')!r}: {shown}}} (LoraConfig's keywords)",
            )
        _lora_value(key, v)
    return out


def _lora_value(key: str, v: Any) -> None:
    is_num = isinstance(v, numbers.Real) and not isinstance(v, bool)
    bad: str | None = None
    if key == "r" and not (isinstance(v, numbers.Integral) and not isinstance(v, bool) and int(v) >= 1):
        bad, fix = "a whole number, 1 or more", "lora={'r': 16}"
    elif key == "lora_alpha" and not (is_num and math.isfinite(v) and v > 0):
        bad, fix = "a number above 0", "lora={'lora_alpha': 32}"
    elif key == "lora_dropout" and not (is_num and 0 <= v < 1):
        bad, fix = "a fraction from 0 up to (not including) 1", "lora={'lora_dropout': 0.05}"
    elif key in _LORA_BOOLS and not isinstance(v, bool):
        bad, fix = "True or False", f"lora={{{key!r}: True}}"
    elif key == "bias" and v not in _LORA_BIAS:
        bad, fix = f"one of {', '.join(_LORA_BIAS)}", "lora={'bias': 'none'}"
    elif key in ("target_modules", "exclude_modules", "layers_pattern") and not _str_or_names(v):
        bad, fix = "a module name, a regex or a list of names", f"lora={{{key!r}: ['q_proj', 'v_proj']}}"
    elif key in ("modules_to_save", "target_parameters") and not (v is None or _str_or_names(v, one=False)):
        bad, fix = "a list of names", f"lora={{{key!r}: ['lm_head']}}"
    elif key == "layers_to_transform" and not _ints(v):
        bad, fix = "a layer index or a list of them", "lora={'layers_to_transform': [0, 1]}"
    elif key in ("rank_pattern", "alpha_pattern") and not isinstance(v, Mapping):
        bad, fix = "a dict of module pattern -> value", f"lora={{{key!r}: {{'q_proj': 8}}}}"
    elif key == "init_lora_weights" and not (
        isinstance(v, bool) or (isinstance(v, str) and (v in _LORA_INITS or v.startswith("pissa_niter_")))
    ):
        bad, fix = f"True, False or one of {', '.join(_LORA_INITS)}", "lora={'init_lora_weights': True}"
    if bad is not None:
        raise ConfigurationError(f"lora[{key!r}]={v!r} must be {bad}", fix=f"pass {fix}")


def _str_or_names(v: Any, one: bool = True) -> bool:
    if isinstance(v, str):
        return one and bool(v.strip())
    if isinstance(v, Mapping) or not hasattr(v, "__iter__"):
        return False
    items = list(v)
    return bool(items) and all(isinstance(i, str) and i.strip() for i in items)


def _ints(v: Any) -> bool:
    def ok(i: Any) -> bool:
        return isinstance(i, numbers.Integral) and not isinstance(i, bool) and int(i) >= 0

    if ok(v):
        return True
    return isinstance(v, (list, tuple)) and bool(v) and all(ok(i) for i in v)


def _passed_on(value: Any) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
        raise ConfigurationError(
            "from_pretrained_kwargs must be a dict of from_pretrained keywords",
            fix="pass a dict: from_pretrained_kwargs={'revision': 'main'}",
        )
    return dict(value)


# -- placement --------------------------------------------------------------------------------------------------


def _size(key: Any, value: Any) -> int:
    """Bytes of a max_memory value, as policies.placement.parse_size reads them (numpy ints taken as ints)."""
    from .policies.placement import parse_size

    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        value = int(value)
    if isinstance(value, (int, float, str)) and not isinstance(value, bool):
        try:
            return parse_size(value)
        except ConfigurationError:
            pass
    raise ConfigurationError(
        f"max_memory[{key!r}]={value!r} is not a size",
        fix=f"give bytes or a size with a unit: max_memory={{{key!r}: '20GiB'}}",
    )


def _memory_key(key: Any) -> str:
    if isinstance(key, numbers.Integral) and not isinstance(key, bool) and int(key) >= 0:
        return f"cuda:{int(key)}"
    if isinstance(key, str):
        k = key.strip()
        if k.isdigit():
            return f"cuda:{k}"
        if k in ("cpu", "disk") or re.fullmatch(r"cuda:\d+", k):
            return k
    raise ConfigurationError(
        f"max_memory key {key!r} is not a device",
        fix="key it by GPU index, 'cpu' or 'disk': max_memory={0: '20GiB', 'cpu': '64GiB'}",
    )


def _max_memory(value: Any) -> Mapping[Any, Any] | None:
    if value is None:
        return None
    if not isinstance(value, Mapping):
        try:
            _size(0, value)
            example = f"{{0: {value!r}}}"  # a size for one GPU: keyed by its index
        except ConfigurationError:
            example = "{0: '20GiB'}"
        raise ConfigurationError(
            f"max_memory={value!r} is not a dict of device -> size",
            fix=f"pass max_memory={example} (GPU index or 'cpu' -> bytes or '20GiB')",
        )
    for k, v in value.items():
        _memory_key(k)
        _size(k, v)
    return dict(value)


def _sizes(max_memory: Mapping[Any, Any] | None) -> dict[Any, int]:
    return {k: _size(k, v) for k, v in (max_memory or {}).items()}


def _device(where: str, value: Any) -> None:
    """One device of a device_map: a GPU index, 'cuda' / 'cuda:N', 'cpu', 'disk' or a torch.device."""
    if isinstance(value, numbers.Integral) and not isinstance(value, bool) and int(value) >= 0:
        return
    text = str(value) if type(value).__name__ == "device" else value  # torch.device, without importing torch
    if isinstance(text, str) and (text in ("cpu", "disk", "meta") or _DEVICE.match(text)):
        return
    raise ConfigurationError(
        f"{where}={value!r} is not a device cudaload places on",
        fix="use a GPU index (0), 'cuda:0', 'cpu' or 'disk'",
    )


def _device_map(value: Any) -> Any:
    if value is None:
        return None
    if isinstance(value, str):
        from .policies.placement import SPLIT_MAPS

        if value in SPLIT_MAPS or value in ("cpu", "cuda") or _DEVICE.match(value):
            return value
        names = (*SPLIT_MAPS, "cpu", "cuda")
        index = re.search(r"\d+", value)
        # "gpu", "GPU:1", "cuda1": a GPU meant, whatever the letters' distance to "cpu"
        meant = f"cuda:{index.group()}" if index else "cuda" if re.search(r"gpu|cuda", value, re.I) else None
        close = [meant] if meant else close_names(value, names, n=1)
        raise ConfigurationError(
            f"device_map={value!r} is not a device map cudaload plans"
            + (f"; did you mean {close[0]!r}?" if close else ""),
            fix=f"use device_map={(close or ['auto'])[0]!r} (a GPU 'cuda:N', 'cpu', or one of: {', '.join(SPLIT_MAPS)})",
        )
    if isinstance(value, Mapping):
        for k, v in value.items():
            if not isinstance(k, str):
                raise ConfigurationError(
                    f"device_map key {k!r} is not a module name",
                    fix="key it by module name: device_map={'': 0}",
                )
            _device(f"device_map[{k!r}]", v)
        return dict(value)
    _device("device_map", value)
    return value


def _names_cuda(device_map: Any) -> bool:
    if device_map is None:
        return False
    values = device_map.values() if isinstance(device_map, Mapping) else [device_map]
    for v in values:
        if isinstance(v, numbers.Integral) and not isinstance(v, bool):
            return True
        if str(v).startswith("cuda"):
            return True
    return False


def check_devices(req: Request, caps: Any) -> None:
    """The GPUs ``req``'s device_map and max_memory name, against the machine ``caps`` it is planned for: an index
    it lacks, or a GPU on a machine with none, refused with the indices it has (the request checks a snapshot it
    was given; the planner the machine it detected)."""
    named = _gpu_indices(req.device_map) | {
        i for k, size in _sizes(req.max_memory).items() if size > 0 for i in _gpu_indices(_memory_key(k))
    }
    if not named:
        return
    from .errors import DeviceSelectionError

    where = "max_memory" if not _gpu_indices(req.device_map) else f"device_map={req.device_map!r}"
    machine = "this machine" if caps.source == "detected" else f"hardware={caps.source.split(':', 1)[-1]!r}"
    if caps.gpus:
        have = sorted(g.index for g in caps.gpus)
        lacking = sorted(named - set(have))
        if not lacking:
            return
        span = f"cuda:{have[0]}" if len(have) == 1 else f"cuda:{have[0]}..cuda:{have[-1]}"
        profile = caps.source.removeprefix("profile:") if caps.source.startswith("profile:") else None
        card = re.sub(r"^\d+x", "", profile) if profile else None
        cvd = _env.cuda_visible_devices(req.env) if caps.source == "detected" else None
        raise DeviceSelectionError(
            f"{where} names cuda:{lacking[0]}, and {machine} has {len(have)} GPU{'s' if len(have) > 1 else ''} "
            f"({span})",
            fix=f"use {span}"
            + (f", or plan for {lacking[-1] + 1} GPUs: hardware='{lacking[-1] + 1}x{card}'" if card else "")
            # torch numbers the GPUs CUDA_VISIBLE_DEVICES lets through from 0: the others are hidden, not absent
            + (f", or let more GPUs through CUDA_VISIBLE_DEVICES={cvd!r}" if cvd else ""),
        )
    if where == "max_memory":
        # placement refuses a GPU key here, and its "use the indices torch sees" led back to the same error; a
        # device_map naming a GPU only warns (the model loads on the CPU: Request._warn_suspicious)
        rest = {k: v for k, v in (req.max_memory or {}).items() if not _gpu_indices(_memory_key(k))}
        raise DeviceSelectionError(
            f"max_memory names cuda:{min(named)}, and {machine} has no GPU",
            fix=(f"drop the GPU entries: max_memory={rest!r}" if rest else "leave max_memory out")
            + " (the model loads on the CPU), or plan for a GPU: hardware='H100'",
        )


def _gpu_indices(device_map: Any) -> set[int]:
    """The GPU indices a device_map (or one max_memory key, as _memory_key spells it) names: ``cuda`` is 0."""
    if device_map is None:
        return set()
    values = device_map.values() if isinstance(device_map, Mapping) else [device_map]
    out: set[int] = set()
    for v in values:
        if isinstance(v, numbers.Integral) and not isinstance(v, bool):
            out.add(int(v))
            continue
        m = re.fullmatch(r"cuda(?::(\d+))?", str(v))
        if m:
            out.add(int(m.group(1) or 0))
    return out


def _this_machine_has_no_gpu(env: Mapping[str, str] | None) -> bool:
    """No NVIDIA driver here (two stats): :func:`_no_gpu` for this machine, whatever CUDA_VISIBLE_DEVICES says."""
    from .detection.nvml import driver_absent

    return driver_absent()


def _no_gpu(hardware: Any, env: Mapping[str, str] | None) -> bool:
    """Whether the machine planned for certainly has no GPU, where that is cheap to know."""
    if hardware is not None:
        return not hardware.gpus
    cvd = _env.cuda_visible_devices(env)
    if cvd is not None and (cvd.strip() == "" or cvd.strip().startswith("-")):
        return True
    from .detection.nvml import driver_absent

    return driver_absent()


# -- the machine and the model ------------------------------------------------------------------------------------


def _hardware(value: Any, entry: str) -> Any:
    """The snapshot ``hardware`` names (None: this machine, detected when planning)."""
    from .capabilities import Capabilities

    if value is None:
        return None
    # _snapshot refuses what is neither a name nor a path, with the form that was meant
    caps = value if isinstance(value, Capabilities) else _snapshot(value)
    if entry != "plan" and caps.source.startswith("profile:"):
        raise ConfigurationError(
            f"{entry}() runs on this machine, not on {caps.source}",
            fix="use cudaload.plan(..., hardware=...) to plan for other hardware, or leave hardware= out",
        )
    return caps


def _snapshot(spec: str | os.PathLike[str]) -> Any:
    """A profile name or a ``cudaload env --json`` file, as ``cudaload.hardware`` reads and checks it."""
    from .profiles import hardware

    return hardware(spec)


def _model(model: Any, entry: str, subfolder: str) -> Mapping[str, Any] | None:
    """Check ``model``; its config as a dict where that is cheap (a dict, a config object, a local
    ``config.json``), else None (a Hub id: model_info reads the cache)."""
    if isinstance(model, Mapping):
        if entry != "plan":
            raise ConfigurationError(
                f"{entry}() needs a model folder or a Hub id; a config dict can only be planned",
                fix="save the model (model.save_pretrained('folder')) and pass its folder, or use cudaload.plan(config)",
            )
        if "model_type" not in model:
            raise CheckpointError("config dict has no model_type", fix="pass a full config.json dict")
        from .model_info.config import check_values

        check_values(model, "the config dict")
        return model
    tf = sys.modules.get("transformers")
    config_class = getattr(tf, "PretrainedConfig", None) if tf is not None else None
    if config_class is not None and isinstance(model, config_class):
        if entry != "plan":
            raise ConfigurationError(
                f"{entry}() needs a model folder or a Hub id; a config object can only be planned",
                fix="pass the folder the model was saved to, or use cudaload.plan(config)",
            )
        return dict(model.to_dict())
    if not isinstance(model, (str, os.PathLike)):
        raise ConfigurationError(
            f"model={model!r} ({type(model).__name__}) is not a model",
            fix="pass a model folder, a config.json path or a Hub id as a string: model='./Qwen3-8B'",
        )
    text = os.fspath(model)
    if not isinstance(text, str) or not text.strip():
        raise ModelNotFoundError("model is empty", fix="pass a model folder or a Hub id: model='./Qwen3-8B'")
    path = Path(text).expanduser()
    try:
        is_dir, is_file = path.is_dir(), path.is_file()
    except OSError as e:  # a folder on the way that may not be entered
        raise _unreadable(path, e) from None
    if is_file:
        return _model_file(path, entry)
    if is_dir:
        return _model_dir(path / subfolder if subfolder else path, path)
    if text.count("/") > 1 or text.startswith((".", "/", "~")) or not _REPO_ID.match(text):
        raise ModelNotFoundError(
            f"model path {text!r} does not exist",
            fix="check the path (a folder saved by save_pretrained), or pass a Hub id such as 'Qwen/Qwen3-8B'",
        )
    return None  # a Hub id: model_info finds it in the cache, or says how to download it


def _local(model: Any) -> bool:
    """Whether ``model`` is read from this disk (a folder, a file, a config dict or object): no Hub revision."""
    if not isinstance(model, (str, os.PathLike)):
        return True
    try:
        return Path(os.fspath(model)).expanduser().exists()
    except (OSError, TypeError):
        return False


def _unreadable(path: Path, e: OSError) -> ModelNotFoundError:
    return ModelNotFoundError(
        f"model folder {str(path)!r} cannot be read by this user ({e.strerror or e})",
        fix=f"make it readable (chmod -R a+rX {str(path)!r}), or run as the user who owns it",
    )


def _model_file(path: Path, entry: str) -> Mapping[str, Any]:
    from .model_info.config import refuse_weights_file

    refuse_weights_file(path)
    if entry != "plan":
        raise ConfigurationError(
            f"{entry}() needs the model folder, not a file ({path.name})",
            fix=f"pass model={str(path.parent)!r}"
            if path.name == "config.json"
            else "pass the model's folder",
        )
    return _read_config(path)


def _model_dir(folder: Path, given: Path) -> Mapping[str, Any]:
    if not os.access(given, os.R_OK | os.X_OK) or not os.access(folder, os.R_OK | os.X_OK):
        raise _unreadable(given, PermissionError(13, "permission denied"))
    config = folder / "config.json"
    if not config.is_file():
        raise ModelNotFoundError(
            f"{folder} has no config.json", fix="point at a model directory saved by save_pretrained"
        )
    return _read_config(config)


def _read_config(path: Path) -> Mapping[str, Any]:
    try:
        data = json.loads(path.read_text())
    except PermissionError as e:
        raise _unreadable(path, e) from None
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise CheckpointError(
            f"cannot read {path}: {e}", fix="check that the file is a complete config.json"
        ) from None
    if not isinstance(data, dict) or "model_type" not in data:
        raise CheckpointError(f"{path} has no model_type", fix="point at a transformers config.json")
    from .model_info.config import check_values

    check_values(data, str(path))  # before torch or transformers sees a value they would fail on
    return data


def _context(config: Mapping[str, Any] | None) -> int | None:
    """The model's max_position_embeddings, from its text config when it has one (as model_info reads it)."""
    if config is None:
        return None
    text = config.get("text_config")
    value = (text if isinstance(text, Mapping) else config).get("max_position_embeddings")
    return int(value) if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _timings(value: Any) -> Any:
    if value is None:
        return None
    from .tuning.timings import Timings

    if not isinstance(value, Timings):
        raise ConfigurationError(
            f"timings={type(value).__name__} is not a cudaload.tuning.Timings",
            fix="pass a measurement from cudaload.tuning.lookup() or tune(), or leave timings= out",
        )
    return value
