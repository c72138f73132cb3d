"""Whether each decoder layer runs compiled while training (``torch.compile`` per layer, dynamic in the packed
row's length): inductor fuses the layer's elementwise work (norms, rotary, SwiGLU, casts, LoRA's scaling) into a
few kernels, so a short step launches half the kernels and spends less of its time on the host.

Two decisions, both pure:

* at planning (:func:`choose_layer_compile`): ``layers`` where it can run and a record measured it help for this
  intent, layout and attention on this GPU's architecture (:class:`~cudaload.policies.training_facts.
  LayerCompileFacts`); the tokens a run needs to repay the compile (:func:`payback_tokens`) travel with the plan;
* with the data (:func:`layer_compile_for_run`, from :func:`cudaload.training_setup`): compiled where the data
  set's tokens (one epoch) repay the compile, or where the caller asked for it.

The saving is counted per token (the record's per-step saving over its step's tokens): the work inductor fuses,
the elementwise kernels over every token, grows with the step, so steps of another size repay at the same
tokens rather than the same count.

The compile is paid once per process at the first step (seconds to a minute: the record says). Only training
calls run compiled; an evaluation under ``no_grad`` and ``generate()`` run the layers' own forward
(:mod:`cudaload.execute.layer_compile`)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

from ...capabilities import Capabilities
from ...detection.versions import version_tuple
from ...plans.decision import Candidate, Decision
from ..training_facts import LayerCompileFacts, layer_compile_facts_for

#: the oldest torch the compiled layers were measured on (torch 2.11, the H100 record in the priors); an older
#: torch compiles the same layers with another dynamo and inductor, not measured
LAYER_COMPILE_SINCE = (2, 11)

_OFF_WHY = "each layer's kernels launched one by one, as transformers runs them"

#: transformers wraps each decoder layer's forward in its checkpointing from 5.24 on (5.25 modeling_layers.py:83-125,
#: ``forward_with_checkpointing``; 5.22 checkpoints in ``__call__``): with checkpointing on, torch.compile of that
#: forward captured no graph on the CPU (5.24 and 5.25; one graph on 5.17 and 5.22)
CHECKPOINTED_FORWARD_SINCE = (5, 24)


def layer_compile_problems(
    caps: Capabilities,
    *,
    intent: str,
    parallel: bool,
    remote_code: bool = False,
    causal_lm: bool = True,
    moe: bool = False,
    checkpointing: bool = False,
) -> list[str]:
    """Why the decoder layers cannot be compiled for this training here (empty when they can)."""
    bad: list[str] = []
    tv = version_tuple(caps.transformers_version)
    if checkpointing and tv is not None and tv[:2] >= CHECKPOINTED_FORWARD_SINCE:
        bad.append(
            f"transformers {caps.transformers_version} checkpoints inside the layer's forward, which then compiles "
            "nothing (no graph, measured on the CPU with 5.24 and 5.25); without checkpointing the layers compile"
        )
    if not caps.gpus:
        bad.append("no CUDA GPU: inductor's training kernels are Triton kernels")
    v = version_tuple(caps.torch_version)
    if v is None:
        bad.append("torch's version is unknown")
    elif v[:2] < LAYER_COMPILE_SINCE:
        since = ".".join(map(str, LAYER_COMPILE_SINCE))
        bad.append(
            f"torch {caps.torch_version}: compiled layers are measured on torch {since} and later only"
        )
    if intent not in ("lora", "qlora", "training"):
        bad.append(f"intent={intent!r} does not train")
    if parallel:
        bad.append("the step is split across ranks: compiled layers are not measured under DDP, FSDP2 or TP")
    if remote_code:
        bad.append("remote code: its layers are not transformers' decoder layers")
    if not causal_lm:
        bad.append("not a causal LM: compiled layers are measured on causal LMs' decoder layers only")
    if moe:
        bad.append("a mixture-of-experts model: compiled layers are measured on dense decoder layers only")
    return bad


def payback_tokens(facts: LayerCompileFacts) -> int | None:
    """The tokens after which the compiled layers have saved what the compile (cold caches) cost, or None where
    the record measured no saving: the compile's seconds over the saving per token."""
    saved = facts.saved_per_step_s
    if saved <= 0 or facts.tokens_per_step <= 0:
        return None
    steps = round(facts.compile_s / saved, 6)  # 70 / (0.35 - 0.25) is 700 steps, not 700.0000001
    return max(1, math.ceil(steps * facts.tokens_per_step))


def choose_layer_compile(
    caps: Capabilities,
    facts: Sequence[LayerCompileFacts],
    *,
    intent: str,
    layout: str,
    attention: str,
    parallel: bool = False,
    remote_code: bool = False,
    causal_lm: bool = True,
    moe: bool = False,
    checkpointing: bool = False,
) -> tuple[Decision, int | None]:
    """The planned decision (``layers`` or ``off``) and, where ``layers``, the tokens that repay the compile."""
    bad = layer_compile_problems(
        caps,
        intent=intent,
        parallel=parallel,
        remote_code=remote_code,
        causal_lm=causal_lm,
        moe=moe,
        checkpointing=checkpointing,
    )
    f = layer_compile_facts_for(caps, facts, intent=intent, layout=layout, attention=attention)
    payback = payback_tokens(f) if f is not None else None
    if not bad and f is None:
        bad.append(
            f"not measured for {intent} with {layout} steps and {attention} on this GPU's architecture: compiled "
            "layers are taken only where a measurement showed them faster (training_setup(compile_layers=True) "
            "compiles them anyway)"
        )
    elif not bad and payback is None:
        assert f is not None
        bad.append(f"measured no faster on the {f.gpu.split('/')[0]} ({f.step_s:.3f} s a step eager)")
    off = Candidate("off", True, (_OFF_WHY,))
    if bad:
        return Decision("off", (_OFF_WHY, *bad), (Candidate("layers", False, tuple(bad)), off)), None
    assert f is not None and payback is not None
    gpu = f.gpu.split("/")[0]
    borrowed = caps.gpus[0].name != gpu
    measured = (
        f"measured on the {gpu}"
        + (" (the same architecture as this GPU)" if borrowed else "")
        + f": steps of "
        f"~{f.tokens_per_step:,} tokens {f.step_s:.3f} s eager, {f.compiled_step_s:.3f} s compiled "
        f"({f.step_s / f.compiled_step_s:.2f}x), after a compile of ~{f.compile_s:.0f} s with cold caches"
        + (f" (~{f.compile_s_warm:.0f} s with torch's compile caches warm)" if f.compile_s_warm else "")
    )
    why = (
        f"each decoder layer compiled (inductor fuses its elementwise work; half the kernels a step), where the "
        f"run repays the compile: from ~{payback:,} tokens (~{payback // f.tokens_per_step:,} steps of the "
        f"record's); training_setup counts the data set's tokens, one epoch",
        measured + f" ({f.model}, {f.intent})",
    )
    return Decision("layers", why, (Candidate("layers", True, why), off)), payback


def layer_compile_for_run(
    planned: Decision | None, payback: int | None, tokens: int | None, requested: bool | None
) -> Decision:
    """What :func:`cudaload.training_setup` does with the planned decision once it knows the data: ``layers``
    where the caller asked (``requested=True``), or where the plan chose them and the data set's tokens (one
    epoch; None: unknown, taken as repaying) reach ``payback``; else ``off``."""
    if requested is not None:
        choice = "layers" if requested else "off"
        why = f"compile_layers={requested} (requested explicitly)"
        if planned is None:
            return Decision(choice, (why,), (), explicit=True)
        plan_said = f"the plan chose {planned.choice}: " + "; ".join(planned.reasons)
        # the asked-for candidate is the choice, whatever the plan found against it
        cands = tuple(replace(c, ok=True) if c.name == choice else c for c in planned.candidates)
        return Decision(choice, (why, plan_said), cands, explicit=True)
    if planned is None:
        return Decision("off", ("no compile decision in this plan",), ())
    if planned.choice != "layers":
        return Decision("off", planned.reasons, planned.candidates)
    if tokens is not None and payback is not None and tokens < payback:
        short = (
            f"the data set holds {tokens:,} tokens, fewer than the ~{payback:,} that repay the compile: layers "
            "run eager (training_setup(compile_layers=True) compiles them anyway)"
        )
        off = tuple(replace(c, ok=True) if c.name == "off" else c for c in planned.candidates)
        return Decision("off", (short, *planned.reasons), off)
    count = "an unknown number of" if tokens is None else f"{tokens:,}"
    return Decision(
        "layers", (f"the data set holds {count} tokens in one epoch", *planned.reasons), planned.candidates
    )
