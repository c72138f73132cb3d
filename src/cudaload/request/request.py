"""The :class:`Request` itself: its fields, :meth:`Request.build` from an entry's keywords, the checks run at
construction (each option, then the options together, then the warnings), and the keywords of each entry given back
(:meth:`Request.plan_kwargs`, :meth:`Request.load_kwargs`, :meth:`Request.tune_kwargs`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

from .. import _env
from ..errors import ConfigurationError, close_names
from ..plans.plan import INTENTS
from .lora import check_lora
from .machine import check_hardware
from .model import check_model
from .options import (
    BATCH_LAYOUTS,
    DECODES,
    ENTRIES,
    TRAINING_LOSSES,
    attention_name,
    check_dtype,
    check_model_class,
    check_optimizer,
    check_parallelism,
    check_prefetch,
    check_quantization,
    check_revision,
    check_task,
    check_timings,
    check_trust_kernels,
    choice,
    flag,
    lowercase_choice,
    lowered_or_auto,
    package_names,
    positive_int,
    positive_seconds,
    quantization_name,
    tristate,
)
from .passed_on import absorb_aliases, check_from_pretrained_kwargs, misspelt_option
from .placement import check_device_map, check_max_memory
from .suspicious import warn_suspicious
from .together import check_together
from .warn import warn

if TYPE_CHECKING:
    from ..policies.decode import RequestedDecode
    from ..policies.optimizer_ladder import RequestedOptimizer
    from ..policies.parallelism import RequestedParallelism
    from ..policies.quant_methods import RequestedQuantization
    from ..policies.training import RequestedLayout, RequestedLoss

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
    """Everything a caller asked for, checked (the package docstring). Make one with :meth:`build`; a direct
    ``Request(...)`` or ``dataclasses.replace`` is checked the same way.

    The fields mean what the keywords of ``cudaload.plan`` / ``cudaload.load_model`` mean (docs/api.md), with
    these readings: ``hardware`` is the resolved snapshot (None: detect this machine when planning);
    ``trust_kernels``, ``assume_installed`` and ``assume_missing`` are tuples; ``dtype`` is its name;
    ``quantization``, ``decode``, ``batch_layout``, ``loss``, ``optimizer`` and ``parallelism`` are the names the
    policies read (``Requested*`` types, e.g. :data:`~cudaload.policies.quant_methods.RequestedQuantization`),
    whatever spelling was passed;
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
    decode: RequestedDecode = "auto"
    padded: bool = False
    attn: str = "auto"
    dtype: str = "auto"
    quantization: RequestedQuantization = "auto"
    device_map: Any = None
    max_memory: Mapping[Any, Any] | None = None
    allow_offload: bool = False
    kernels: bool | None = None
    trust_kernels: tuple[str, ...] = ()
    model_class: str | None = None
    task: str | None = None
    revision: str | None = None
    fast: bool | None = None
    optimizer: RequestedOptimizer = "auto"
    gradient_checkpointing: bool | None = None
    parallelism: RequestedParallelism = "auto"
    lower_latency: bool = False
    assume_installed: tuple[str, ...] = ()
    assume_missing: tuple[str, ...] = ()
    prefetch: bool | str = True
    warmup: bool = False
    tune: bool = False
    tune_budget_s: float | None = None
    batch_layout: RequestedLayout = "auto"
    tokens_per_step: int | None = None
    lora: Mapping[str, Any] | None = None
    loss: RequestedLoss = "auto"
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
            absorb_aliases(given, extra)
            for key in extra:
                meant = misspelt_option(key, names)
                if meant:
                    warn(
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
            warn(note)
        if self.entry == "plan" and self.from_pretrained_kwargs:
            # what load_model() makes of the same keywords (Request.build): torch_dtype / attn_implementation
            # read as dtype= / attn=, the others cudaload decides refused; a plan must not differ from its load
            passed, own = (
                dict(check_from_pretrained_kwargs(self.from_pretrained_kwargs)),
                {"dtype": self.dtype, "attn": self.attn},
            )
            absorb_aliases(own, passed, entry="plan")
            set_("dtype", own["dtype"])
            set_("attn", own["attn"])
            set_("from_pretrained_kwargs", passed)
        self._only_the_entry_options()
        set_("intent", choice("intent", self.intent, INTENTS))
        for name in ("seq_len", "batch_size", "new_tokens", "generate_calls", "tokens_per_step"):
            set_(name, positive_int(name, getattr(self, name)))
        for name in ("padded", "allow_offload", "lower_latency", "warmup", "tune"):
            set_(name, flag(name, getattr(self, name)))
        for name in ("kernels", "fast", "gradient_checkpointing"):
            set_(name, tristate(name, getattr(self, name)))
        set_("attn", attention_name(self.attn))
        set_("dtype", check_dtype(self.dtype))
        set_("quantization", check_quantization(self.quantization))
        set_("optimizer", check_optimizer(self.optimizer))
        set_("parallelism", check_parallelism(self.parallelism))
        set_("batch_layout", lowercase_choice("batch_layout", self.batch_layout, BATCH_LAYOUTS))
        set_("loss", lowercase_choice("loss", self.loss, TRAINING_LOSSES))
        set_("decode", lowered_or_auto(lowercase_choice("decode", self.decode, DECODES)))
        set_("trust_kernels", check_trust_kernels(self.trust_kernels))
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
        set_("model_class", check_model_class(self.model_class))
        set_("task", check_task(self.task))
        set_("revision", check_revision(self.revision))
        set_("prefetch", check_prefetch(self.prefetch))
        set_("tune_budget_s", positive_seconds("tune_budget_s", self.tune_budget_s))
        set_("lora", check_lora(self.lora))
        from ..checkpoint_coverage import new_weights_option  # pure: errors and the standard library only

        set_("new_weights", new_weights_option(self.new_weights))
        set_("from_pretrained_kwargs", check_from_pretrained_kwargs(self.from_pretrained_kwargs))
        set_("max_memory", check_max_memory(self.max_memory))
        set_("device_map", check_device_map(self.device_map))
        set_("timings", check_timings(self.timings))
        set_("hardware", check_hardware(self.hardware, self.entry))
        config = check_model(self.model, self.entry, str(self.from_pretrained_kwargs.get("subfolder") or ""))
        check_together(self)
        warn_suspicious(self, config)
        # checked, and quoted as written by the messages above: from here on the names the policies read
        set_("quantization", quantization_name(self.quantization))
        set_("batch_layout", lowered_or_auto(self.batch_layout))
        set_("loss", lowered_or_auto(self.loss))
        set_("optimizer", lowered_or_auto(self.optimizer))

    @property
    def declares_work(self) -> bool:
        """Whether the caller declared the work: ``batch_size`` and ``seq_len`` both, the one generate() call that
        measured timings, the decode decision and ``tune=True`` are about (``new_tokens``, ``generate_calls`` and
        ``padded`` count only with them). Decided here alone; the planner's work value carries it
        (:class:`cudaload.planner.work.WorkSize`)."""
        return self.batch_size is not None and self.seq_len is not None

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
        """``cudaload.execute.measure.tune(self.model, **kwargs)``'s keywords for the work given: tune() takes the prompt's
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
