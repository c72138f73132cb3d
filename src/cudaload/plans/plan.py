"""The Plan: what cudaload decided for one model on one machine, and why.

Pure data. ``cudaload.plan()`` (in :mod:`cudaload.planner`) builds it without reading weights or touching a
GPU; ``cudaload.load_model()`` (in :mod:`cudaload.execute`) carries it out and records what it verified.
``to_json()`` is the stable schema documented in docs/plan-schema.md.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from typing import Any

from ..errors import ConfigurationError
from ..model_info.summary import ModelSummary
from ..units import byte_size, param_count
from .decision import Decision
from .decode import DecodePlan
from .serving import ServingPlan
from .training import TrainingPlan
from .verified_text import verified_lines

# Plan data sits below every policy: this module imports none (the policies import it), so a plan read back from
# JSON needs no policy, and explain() renders each section from its own data (each section's explain_lines()).

PLAN_SCHEMA_VERSION = 1
#: the sections every plan has (the rest are optional, added by later versions)
_REQUIRED = (
    "model",
    "hardware",
    "intent",
    "seq_len",
    "batch_size",
    "dtype",
    "attention",
    "quantization",
    "placement",
    "memory",
    "load_path",
)
_FROM_JSON_FIX = "pass the text of plan.to_json() (or of `cudaload plan --json`)"
INTENTS = ("inference", "training", "lora", "qlora", "serving")
_GiB = 1 << 30


@dataclass(frozen=True)
class Placement:
    """Where the weights go. ``device_map`` is what ``from_pretrained`` receives."""

    device_map: str | dict[str, Any]
    devices: tuple[str, ...]
    offload: bool = False
    max_memory: dict[str, int] | None = None
    reasons: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "device_map": self.device_map,
            "devices": list(self.devices),
            "offload": self.offload,
            "max_memory": self.max_memory,
            "reasons": list(self.reasons),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Placement:
        return cls(
            device_map=d["device_map"],
            devices=tuple(d.get("devices", ())),
            offload=bool(d.get("offload", False)),
            max_memory=d.get("max_memory"),
            reasons=tuple(d.get("reasons", ())),
        )

    def explain_lines(self) -> list[str]:
        """The placement section of ``Plan.explain()``: the device map, the devices, why, the memory caps."""
        lines = [
            f"placement: device_map={self.device_map!r} on {', '.join(self.devices)}"
            + ("  (offload)" if self.offload else "")
        ]
        lines.extend(f"    {r}" for r in self.reasons)
        if self.max_memory:
            lines.append(
                "    max_memory: " + ", ".join(f"{k}={byte_size(v)}" for k, v in self.max_memory.items())
            )
        return lines


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes, term by term (``weights``, ``kv_cache``, ``activations``, ``gradients``, ``optimizer``,
    ``adapters``, ``cuda_context``...), the total, and per device: what is planned there and its budget."""

    terms: dict[str, int] = field(default_factory=dict)
    total: int = 0
    per_device: dict[str, int] = field(default_factory=dict)
    budget: dict[str, int] = field(default_factory=dict)
    notes: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "terms": dict(self.terms),
            "total": self.total,
            "per_device": dict(self.per_device),
            "budget": dict(self.budget),
            "notes": list(self.notes),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> MemoryEstimate:
        return cls(
            terms=dict(d.get("terms", {})),
            total=int(d.get("total", 0)),
            per_device=dict(d.get("per_device", {})),
            budget=dict(d.get("budget", {})),
            notes=tuple(d.get("notes", ())),
        )

    def explain_lines(self) -> list[str]:
        """The memory section of ``Plan.explain()``: each term that is not zero, the total, each device's share
        of its budget, the notes."""
        lines = ["memory (estimated before loading):"]
        lines.extend(f"    {k:<24}{byte_size(v):>12}" for k, v in self.terms.items() if v)
        lines.append(f"    {'total':<24}{byte_size(self.total):>12}")
        for d, v in self.per_device.items():
            b = self.budget.get(d)
            lines.append(
                f"    on {d:<21}{byte_size(v):>12}" + (f" of {byte_size(b)}" if b is not None else "")
            )
        lines.extend(f"    note: {n}" for n in self.notes)
        return lines


@dataclass(frozen=True)
class Parallelism:
    """How several GPUs share the work (cudaload.policies.parallelism): the decision, how many processes
    (``world_size``), each candidate's per-GPU bytes term by term (``per_gpu[name]["total"]``), the launch
    command, and the settings the choice needs (FSDP2 / DDP / DeepSpeed / tensor-parallel keywords)."""

    decision: Decision
    world_size: int
    per_gpu: dict[str, dict[str, int]] = field(default_factory=dict)
    budget_per_gpu: int | None = None
    launched: bool = False  # this process already runs under torchrun with world_size ranks
    launch: str | None = None
    config: dict[str, Any] = field(default_factory=dict)

    @property
    def choice(self) -> str | None:
        return self.decision.choice

    def per_gpu_bytes(self, name: str | None = None) -> int | None:
        """Planned bytes on each GPU for ``name`` (default: the choice)."""
        terms = self.per_gpu.get(name or self.choice or "")
        return None if terms is None else terms.get("total")

    def to_dict(self) -> dict[str, Any]:
        d = self.decision.to_dict()
        for c in d["candidates"]:
            terms = self.per_gpu.get(c["name"])
            c["per_gpu_bytes"] = None if terms is None else terms.get("total")
            c["per_gpu_terms"] = None if terms is None else dict(terms)
        return {
            **d,
            "world_size": self.world_size,
            "budget_per_gpu": self.budget_per_gpu,
            "launched": self.launched,
            "launch": self.launch,
            "config": self.config,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Parallelism:
        per_gpu = {
            c["name"]: dict(c["per_gpu_terms"]) for c in d.get("candidates", ()) if c.get("per_gpu_terms")
        }
        return cls(
            decision=Decision.from_dict(d),
            world_size=int(d["world_size"]),
            per_gpu=per_gpu,
            budget_per_gpu=d.get("budget_per_gpu"),
            launched=bool(d.get("launched", False)),
            launch=d.get("launch"),
            config=dict(d.get("config") or {}),
        )

    def explain_lines(self) -> list[str]:
        """The parallelism section of ``Plan.explain()``: the choice, every candidate's per-GPU bytes, the launch
        command and the settings the choice needs."""
        d = self.decision
        head = f"parallelism: {d.choice or 'none (no multi-process strategy fits)'} ({self.world_size} GPUs"
        head += ", launched under torchrun)" if self.launched else ")"
        lines = [head + ("  (explicit)" if d.explicit else "")]
        lines.extend(f"    because {r}" for r in d.reasons)
        for c in d.candidates:
            need = self.per_gpu_bytes(c.name)
            size = f" {need / _GiB:.1f} GiB/GPU" if need is not None else ""
            mark = "*  " if c.name == d.choice else ("ok " if c.ok else "no ")
            lines.append(
                f"  - {mark}{c.name}:{size}: {'; '.join(c.reasons[1:]) if len(c.reasons) > 1 else ''}".rstrip(
                    ": "
                )
            )
        chosen = self.per_gpu.get(d.choice or "")
        if chosen:
            lines.append(
                "    per GPU: "
                + ", ".join(f"{k} {v / _GiB:.2f} GiB" for k, v in chosen.items() if k != "total")
                + f"; total {chosen['total'] / _GiB:.2f} GiB"
                + (f" of {self.budget_per_gpu / _GiB:.1f} GiB" if self.budget_per_gpu else "")
            )
        if self.launch:
            lines.append(f"    launch: {self.launch}")
        ta = self.config.get("training_arguments")
        if ta:
            lines.append("    TrainingArguments: " + ", ".join(f"{k}={v!r}" for k, v in ta.items()))
        fp = self.config.get("from_pretrained")
        if fp:
            lines.append("    from_pretrained: " + ", ".join(f"{k}={v!r}" for k, v in fp.items()))
        alt = self.config.get("deepspeed_alternative")
        if alt:
            lines.append(
                f"    DeepSpeed instead ({alt['strategy']}): TrainingArguments(deepspeed={alt['config']!r})"
            )
        ds = self.config.get("deepspeed_config")
        if ds:
            lines.append(f"    DeepSpeed config: {ds!r}")
        if self.config.get("quantization_config"):
            lines.append(f"    quantization_config: {self.config['quantization_config']!r}")
        return lines


@dataclass(frozen=True)
class Plan:
    """One model on one machine: every decision with its candidates and reasons."""

    model: ModelSummary
    hardware: dict[str, Any]  # summary of the Capabilities planned against (source, gpus, key versions)
    intent: str
    seq_len: int
    batch_size: int
    dtype: Decision
    attention: Decision
    quantization: Decision  # choice None, "int8" or "nf4"
    placement: Placement
    memory: MemoryEstimate
    load_path: Decision  # "fast" or "from_pretrained"
    kernels: dict[str, Any] = field(default_factory=dict)  # KernelConfig plan (see cudaload.hub_kernels)
    quantization_config: dict[str, Any] | None = None  # BitsAndBytesConfig kwargs, explicit (no fp4 default)
    peft: dict[str, Any] | None = None  # LoraConfig kwargs for lora / qlora
    warnings: tuple[str, ...] = ()
    verified: dict[str, Any] | None = None  # filled in by load_model()
    # intent "serving": transformers' continuous-batching settings (cudaload.plans.serving.ServingPlan, decided by
    # cudaload.policies.serving)
    serving: ServingPlan | None = None
    # training intents: the optimizer (TrainingArguments optim name) and gradient checkpointing ("on", "off", or
    # "partial": every n-th layer, n in training.step.checkpoint_every; read through checkpoint_every)
    optimizer: Decision | None = None
    gradient_checkpointing: Decision | None = None
    parallelism: Parallelism | None = None  # several GPUs: DDP / FSDP2 / TP / layer split (None: one GPU)
    # training intents: the batch layout, tokens per step, loss and adapter settings (cudaload.plans.training,
    # decided by cudaload.policies.training)
    training: TrainingPlan | None = None
    # the attention implementations load_model falls back to, in order, where the choice fails its one-step
    # forward (none for an explicit choice, which is refused instead): decided with the attention, not at load
    attention_fallbacks: tuple[str, ...] = ()
    # intent "inference" of a model that generates: how generate() decodes, dynamic or a compiled static cache
    # (cudaload.plans.decode.DecodePlan, decided by cudaload.policies.decode)
    decode: DecodePlan | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": PLAN_SCHEMA_VERSION,
            "model": self.model.to_dict(),
            "hardware": self.hardware,
            "intent": self.intent,
            "seq_len": self.seq_len,
            "batch_size": self.batch_size,
            "dtype": self.dtype.to_dict(),
            "attention": self.attention.to_dict(),
            "quantization": {
                **self.quantization.to_dict(),
                "method": self.quantization.choice,
                "config": self.quantization_config,
            },
            "placement": self.placement.to_dict(),
            "memory": self.memory.to_dict(),
            "load_path": self.load_path.to_dict(),
            "kernels": self.kernels,
            "peft": self.peft,
            "warnings": list(self.warnings),
            "verified": self.verified,
            "serving": self.serving.to_dict() if self.serving is not None else None,
            "optimizer": self.optimizer.to_dict() if self.optimizer else None,
            "gradient_checkpointing": (
                self.gradient_checkpointing.to_dict() if self.gradient_checkpointing else None
            ),
            "parallelism": self.parallelism.to_dict() if self.parallelism is not None else None,
            "training": self.training.to_dict() if self.training is not None else None,
            "attention_fallbacks": list(self.attention_fallbacks),
            "decode": self.decode.to_dict() if self.decode is not None else None,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Plan:
        """The plan ``to_dict()`` wrote. Raises :class:`ConfigurationError` for anything else (not a dict, a
        section missing, a schema newer than this cudaload reads, a damaged section)."""
        if not isinstance(d, dict):
            raise ConfigurationError(f"not a cudaload plan: a {type(d).__name__}", fix=_FROM_JSON_FIX)
        missing = [k for k in _REQUIRED if k not in d]
        if missing:
            raise ConfigurationError(f"not a cudaload plan: no {', '.join(missing)}", fix=_FROM_JSON_FIX)
        schema = d.get("schema", PLAN_SCHEMA_VERSION)
        if not isinstance(schema, int) or schema > PLAN_SCHEMA_VERSION:
            raise ConfigurationError(
                f"plan schema {schema!r} is newer than this cudaload reads ({PLAN_SCHEMA_VERSION})",
                fix="upgrade cudaload to read it, or make the plan again with this version",
            )
        try:
            return cls._from_dict(d)
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise ConfigurationError(
                f"damaged cudaload plan: {type(e).__name__}: {e}", fix=_FROM_JSON_FIX
            ) from None

    @classmethod
    def _from_dict(cls, d: dict[str, Any]) -> Plan:
        q = dict(d["quantization"])
        qcfg = q.pop("config", None)
        q.pop("method", None)
        return cls(
            model=ModelSummary.from_dict(d["model"]),
            hardware=d["hardware"],
            intent=d["intent"],
            seq_len=int(d["seq_len"]),
            batch_size=int(d["batch_size"]),
            dtype=Decision.from_dict(d["dtype"]),
            attention=Decision.from_dict(d["attention"]),
            quantization=Decision.from_dict(q),
            quantization_config=qcfg,
            placement=Placement.from_dict(d["placement"]),
            memory=MemoryEstimate.from_dict(d["memory"]),
            load_path=Decision.from_dict(d["load_path"]),
            kernels=d.get("kernels", {}),
            peft=d.get("peft"),
            warnings=tuple(d.get("warnings", ())),
            verified=d.get("verified"),
            serving=_serving_from(d.get("serving")),
            optimizer=Decision.from_dict(d["optimizer"]) if d.get("optimizer") else None,
            gradient_checkpointing=(
                Decision.from_dict(d["gradient_checkpointing"]) if d.get("gradient_checkpointing") else None
            ),
            parallelism=Parallelism.from_dict(d["parallelism"]) if d.get("parallelism") else None,
            training=TrainingPlan.from_dict(d["training"]) if d.get("training") else None,
            attention_fallbacks=tuple(d.get("attention_fallbacks") or ()),
            decode=DecodePlan.from_dict(d["decode"]) if d.get("decode") else None,
        )

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    @classmethod
    def from_json(cls, text: str) -> Plan:
        """The plan ``to_json()`` wrote; :class:`ConfigurationError` for any other text."""
        try:
            data = json.loads(text)
        except (TypeError, ValueError) as e:
            raise ConfigurationError(f"not a cudaload plan: {e}", fix=_FROM_JSON_FIX) from None
        return cls.from_dict(data)

    @property
    def checkpoint_every(self) -> int:
        """Which decoder layers the plan checkpoints: 0 none (``off``, or no decision: a plan made before
        checkpointing was planned, which cudaload.train.arguments.memory_arguments reads by its own rule), 1 every layer
        (``on``), n >= 2 every n-th layer (``partial``, n from the training section's step)."""
        gc = self.gradient_checkpointing
        if gc is None or gc.choice == "off":
            return 0
        if gc.choice == "partial":
            n = self.training.step.checkpoint_every if self.training is not None else 1
            return max(n, 1)
        return 1

    def with_verified(self, verified: dict[str, Any]) -> Plan:
        return replace(self, verified=verified)

    def explain(self) -> str:
        """The plan as text a person reads: each choice and why, each rejected option and why, the memory terms,
        the warnings, and what loading verified."""
        out = self._header_lines()
        out.append("")
        out += self.dtype.explain_lines("dtype")
        out += self.attention.explain_lines("attention")
        out += self.quantization.explain_lines("quantization")
        if self.quantization_config:
            out.append(
                f"    BitsAndBytesConfig({', '.join(f'{k}={v!r}' for k, v in self.quantization_config.items())})"
            )
        out += self.placement.explain_lines()
        out += self.load_path.explain_lines("load path")
        if self.decode is not None:
            out += self.decode.explain_lines()
        if self.optimizer is not None:
            out += self.optimizer.explain_lines("optimizer")
        if self.gradient_checkpointing is not None:
            gc_lines = self.gradient_checkpointing.explain_lines("gradient checkpointing")
            if self.checkpoint_every > 1:  # the choice with its n: "partial (every 2 layers)"
                gc_lines[0] = gc_lines[0].replace(
                    ": partial", f": partial (every {self.checkpoint_every} layers)", 1
                )
            out += gc_lines
        if self.training is not None:
            out += self.training.explain_lines()
        out += self.memory.explain_lines()
        if self.peft:
            out.append(f"LoRA: {', '.join(f'{k}={v!r}' for k, v in self.peft.items())}")
        if self.kernels:
            out += _kernels_lines(self.kernels)
        if self.warnings:
            out.append("warnings:")
            out.extend(f"  ! {w}" for w in self.warnings)
        if self.verified:
            out += verified_lines(self.verified)
        text = "\n".join(out)
        if self.serving is not None:
            text = text.rstrip("\n") + "\n" + "\n".join(self.serving.explain_lines()) + "\n"
        if self.parallelism is not None:
            text += "\n" + "\n".join(self.parallelism.explain_lines())
        return text

    def _header_lines(self) -> list[str]:
        """The model, the machine, the intent and work size, and the ranks that planned alike."""
        m = self.model
        hw = self.hardware
        machine = (
            ", ".join(
                f"cuda:{g['index']} {g['name']} (sm{g['compute_capability'][0]}{g['compute_capability'][1]})"
                for g in hw.get("gpus") or []
            )
            or "CPU only"
        )
        out = [
            f"Plan for {m.name} ({m.type}, {m.architecture or '?'}, {param_count(m.params)} params, "
            f"{m.layers} layers, head_dim {m.head_dim}, weights from {m.weights_source})",
            f"Machine: {machine} [{hw.get('source')}]"
            + "".join(f"; {k} {hw[k]}" for k in ("torch", "transformers") if hw.get(k)),
            f"Intent: {self.intent}, seq_len {self.seq_len} x batch {self.batch_size}"
            + (
                # a filled step holds as many sequences as its token bound takes, not the assumed batch
                f" (packed steps filled up to {self.training.step.tokens:,} tokens)"
                if self.training is not None and self.training.fills_steps
                else ""
            ),
        ]
        ranks = (hw.get("distributed") or {}).get("ranks") or []
        if ranks:
            hosts = sorted({r["host"] for r in ranks})
            frees = [r for r in ranks if r.get("free_memory") is not None]
            gpu = ranks[0].get("name") or "no GPU"  # CPU ranks (gloo) agree too
            line = f"Ranks: {len(ranks)} on {len(hosts)} host{'s' if len(hosts) > 1 else ''}, {gpu} each"
            if frees:
                low = min(frees, key=lambda r: (r["free_memory"], r["rank"]))
                high = max(r["free_memory"] for r in frees)
                line += (
                    f"; planned alike on every rank from the most free memory any rank's GPU had "
                    f"({byte_size(high)}), the least: rank {low['rank']} ({byte_size(low['free_memory'])})"
                )
            out.append(line)
        return out


def _kernels_lines(kp: dict[str, Any]) -> list[str]:
    """The Hub kernels section of ``Plan.explain()``: on or off, why, and each layer's kernel with why it passed
    or not."""
    lines = [f"Hub kernels: {'on' if kp.get('enabled') or kp.get('use_kernels') else 'off'}"]
    lines.extend(f"    {r}" for r in kp.get("reasons", []) or [])
    for e in kp.get("entries", []) or []:
        mark = "ok " if e.get("ok") else "no "
        why = "; ".join(e.get("reasons") or []) or "-"
        lines.append(f"  - {mark}{e.get('layer')} <- {e.get('repo')}:{e.get('layer_name')}: {why}")
    return lines


def _serving_from(d: dict[str, Any] | None) -> ServingPlan | None:
    return ServingPlan.from_dict(d) if d else None
