"""Whether a checkpoint's tensors cover the model loaded from it, read from transformers' own load report.

transformers loads a checkpoint that lacks a tensor, has one the model has no place for, or has one of
another shape (with ``ignore_mismatched_sizes=True``), and only logs a table: the missing tensors are randomly
initialised and the model runs. cudaload refuses that with :class:`~cudaload.errors.CheckpointCoverageError`
unless the difference is meant, and records what was meant in ``plan.verified["checkpoint"]``.

The input is the report *after* transformers' own adjustments (``_finalize_model_loading``; transformers 5.25
modeling_utils.py:4651-4687, 5.17 the same method), so what transformers itself treats as expected is never
refused: tied weights (``tie_weights`` drops a tied target from the missing keys, 5.25
modeling_utils.py:2628-2630; lm_head tied to the embeddings is not missing), the class's
``_keys_to_ignore_on_load_missing`` / ``_keys_to_ignore_on_load_unexpected`` and the legacy ``rotary_emb.inv_freq``
/ ``position_ids`` buffers (``_adjust_missing_and_unexpected_keys``, 5.25 modeling_utils.py:4993-5025), checkpoint
keys renamed by ``_checkpoint_conversion_mapping`` / the conversion mapping (reported under their new names),
and non-persistent buffers (not in ``state_dict()``, so never missing).

What is accepted without a keyword, and why:

- checkpoint tensors of a part of the model this class does not build (a head it lacks: ``lm_head`` when
  ``AutoModel`` loads a causal-LM checkpoint, BERT's pre-training ``cls.*`` heads, a ``pooler`` the head class
  builds without). transformers' report says of them "can be ignored when loading from different
  task/architecture" (5.25 utils/loading_report.py:125-127), and loading a base model out of a task checkpoint
  is how embeddings are taken. They are recorded as ``unused``. A checkpoint tensor *inside* the architecture
  the class builds (a layer past ``num_hidden_layers``, a ``q_norm`` the config's family lacks) is refused: it
  means config.json and the weights disagree.
- tensors of another shape when ``ignore_mismatched_sizes=True`` is passed: transformers' own explicit opt-in
  to re-initialise them (a classifier with another ``num_labels``). Recorded as ``new_weights``.

What needs ``new_weights=``: a model tensor the checkpoint lacks, including a task head transformers creates
new (``score.weight`` when ``AutoModelForSequenceClassification`` loads a base checkpoint). transformers has no
declaration that tells a head meant to be trained apart from one lost from a fine-tuned checkpoint (a saved
classifier whose head was dropped, the wrong ``model_class`` for the checkpoint): both are reported as the same
MISSING row. Loading either for inference gives random predictions with no error, so the head is accepted only
when the caller says it is new.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Collection, Iterable, Mapping
from typing import Any

from .errors import CheckpointCoverageError, ConfigurationError

#: how many tensor names a message shows of each kind before "and N more"
SHOWN = 5

#: ``new_weights`` once checked: False (nothing new meant), True (anything), or name patterns
NewWeights = bool | tuple[str, ...]


def new_weights_option(value: Any) -> NewWeights:
    """``new_weights=`` checked: None/False, True, one pattern, or a list of patterns (``fnmatch`` globs over
    the tensor names transformers reports, e.g. ``"score.*"``; a module name covers its tensors)."""
    if value is None or value is False:
        return False
    if value is True:
        return True
    example = "new_weights=['score.*']"
    if isinstance(value, str):
        value = [value]
    if isinstance(value, Mapping) or not isinstance(value, Iterable):
        raise ConfigurationError(
            f"new_weights={value!r} is not True or a list of tensor name patterns",
            fix=f"pass e.g. {example}, or new_weights=True to accept any tensor the checkpoint lacks",
        )
    items = tuple(value)
    bad = [v for v in items if not isinstance(v, str) or not v.strip()]
    if bad or not items:
        raise ConfigurationError(
            f"new_weights holds {bad[0]!r}, which is not a tensor name pattern"
            if bad
            else "new_weights=[] names no tensor",
            fix=f"pass name patterns only: {example}, or leave new_weights out",
        )
    return tuple(v.strip() for v in items)


def matches(name: str, new_weights: NewWeights) -> bool:
    """Whether ``new_weights`` covers the tensor ``name``: every name for True; for patterns, a glob match of
    the whole name, or of a module that holds it (``"classifier"`` covers ``classifier.weight``)."""
    if new_weights is True:
        return True
    if not new_weights:
        return False
    return any(fnmatch.fnmatchcase(name, p) or fnmatch.fnmatchcase(name, p + ".*") for p in new_weights)


def architecture_names(model: Any) -> tuple[str | None, frozenset[str]]:
    """(the base model's prefix, the names of the base model's children, parameters and buffers): what a
    checkpoint key must start with, once the prefix is taken off, to lie inside the architecture this class
    builds. ``base_model`` is transformers' own property (the prefix's submodule, or the model itself)."""
    get_base = getattr(model, "get_base_model", None)
    if callable(get_base):
        # a PeftModel (the sharded loader wraps before sharding): the report names the model inside it
        model = get_base()
    base = getattr(model, "base_model", None) or model
    names = {n for n, _ in base.named_children()}
    names |= {n for n, _ in base.named_parameters(recurse=False)}
    names |= {n for n, _ in base.named_buffers(recurse=False)}
    prefix = getattr(model, "base_model_prefix", None) or None
    return prefix, frozenset(names)


def inside_architecture(key: str, prefix: str | None, base_names: Collection[str]) -> bool:
    """Whether the checkpoint key ``key`` (as transformers reports it) names a place inside the base model
    this class builds, rather than a head or part it does not build."""
    if prefix and key.startswith(prefix + "."):
        key = key[len(prefix) + 1 :]
    return key.split(".", 1)[0] in base_names


def _shown(names: list[str]) -> str:
    more = len(names) - SHOWN
    return ", ".join(names[:SHOWN]) + (f" and {more} more" if more > 0 else "")


def _patterns(names: Iterable[str], prefix: str | None, base_names: Collection[str]) -> list[str]:
    """Patterns that cover ``names`` and keep them apart from the rest of the model: one per head (the longest
    module path its tensors share); inside the base model one per layer (``model.layers.1.*``) where several
    of its tensors are named, else the module of the one tensor."""
    heads: dict[str, list[list[str]]] = {}
    inside: dict[str, list[list[str]]] = {}
    for name in names:
        parts = name.split(".")
        if len(parts) == 1:
            heads.setdefault(name, []).append(parts)
        elif inside_architecture(name, prefix, base_names):
            digit = next((i for i, p in enumerate(parts[:-1]) if p.isdigit()), None)
            layer = ".".join(parts[: digit + 1]) if digit is not None else ".".join(parts[:-1])
            inside.setdefault(layer, []).append(parts[:-1])
        else:
            heads.setdefault(parts[0], []).append(parts[:-1])
    out: list[str] = []
    for key, paths in heads.items():
        if paths == [[key]]:  # a tensor at the top: its own name
            out.append(key)
            continue
        common = paths[0]
        for p in paths[1:]:
            n = 0
            while n < min(len(common), len(p)) and common[n] == p[n]:
                n += 1
            common = common[:n]
        out.append(".".join(common) + ".*")
    for layer, paths in inside.items():
        out.append(layer + ".*" if len(paths) > 1 else ".".join(paths[0]) + ".*")
    return list(dict.fromkeys(out))


def _suggestion(names: list[str], prefix: str | None, base_names: Collection[str]) -> str:
    pats = _patterns(names, prefix, base_names)
    return "new_weights=True" if len(pats) > 4 else f"new_weights={pats!r}"


def _shape(s: Any) -> list[int]:
    return [int(x) for x in s]


def coverage_error(
    where: str,
    model_name: str,
    *,
    missing: Collection[str] = (),
    unexpected: Collection[str] = (),
    mismatched: Collection[tuple[str, Any, Any]] = (),
    prefix: str | None = None,
    base_names: Collection[str] = (),
) -> CheckpointCoverageError:
    """The error for tensors the checkpoint and the model do not agree on, each kind named (the first few and
    the count), with the keyword that accepts them on purpose and what to check otherwise."""
    miss = sorted(missing)
    extra = sorted(unexpected)
    mism = sorted((k, _shape(a), _shape(b)) for k, a, b in mismatched)
    reasons: list[str] = []
    if miss:
        reasons.append(
            f"{len(miss)} tensor{'s' * (len(miss) > 1)} of the model not in the checkpoint (they would be "
            f"randomly initialised): {_shown(miss)}"
        )
    if extra:
        reasons.append(
            f"{len(extra)} checkpoint tensor{'s' * (len(extra) > 1)} inside the architecture with no place in "
            f"this model (they would be dropped): {_shown(extra)}"
        )
    if mism:
        shown = [f"{k} (checkpoint {a} vs model {b})" for k, a, b in mism]
        reasons.append(
            f"{len(mism)} tensor{'s' * (len(mism) > 1)} with another shape in the checkpoint than the model "
            f"expects (they would be re-initialised): {_shown(shown)}"
        )
    fixes: list[str] = []
    new = miss + [k for k, _, _ in mism]
    if new:
        fixes.append(
            f"if they are new weights you mean to train (a new task head), pass {_suggestion(new, prefix, base_names)}"
            + (" (or transformers' ignore_mismatched_sizes=True for the reshaped ones)" if mism else "")
        )
    if extra:
        fixes.append(
            f"to leave the extra checkpoint tensors unused on purpose (fewer layers than saved), pass "
            f"{_suggestion(extra, prefix, base_names)}"
        )
    fixes.append(
        "otherwise the checkpoint is incomplete or not this model's: re-download it, and check that config.json "
        "and model_class/task belong to these weights"
    )
    return CheckpointCoverageError(
        f"{where}: the checkpoint's tensors do not cover {model_name}",
        reasons=reasons,
        fix="; ".join(fixes),
        missing=miss,
        unexpected=extra,
        mismatched=[k for k, _, _ in mism],
    )


def check_coverage(
    report: Mapping[str, Any],
    *,
    new_weights: NewWeights,
    ignore_mismatched_sizes: bool,
    prefix: str | None,
    base_names: Collection[str],
    where: str,
    model_name: str,
) -> dict[str, Any]:
    """Refuse a load report whose checkpoint does not cover the model (module docstring says what is
    accepted and why); else what was accepted, for ``plan.verified["checkpoint"]``: ``new_weights`` (model
    tensors not read from the checkpoint, initialised as transformers initialises them), ``mismatched``
    (those of them the checkpoint held in another shape: [name, checkpoint shape, model shape]) and
    ``unused`` (checkpoint tensors left out).

    ``report``: transformers' load report after its adjustments (``missing_keys``, ``unexpected_keys``,
    ``mismatched_keys`` as (name, checkpoint shape, model shape)), as ``from_pretrained(...,
    output_loading_info=True)`` gives it or cudaload's fast loaders keep it in ``model.cudaload_fastload``.
    ``ignore_mismatched_sizes``: whether the caller passed transformers' own opt-in."""
    missing = set(report.get("missing_keys") or ())
    unexpected = set(report.get("unexpected_keys") or ())
    mismatched = [(k, _shape(a), _shape(b)) for k, a, b in report.get("mismatched_keys") or ()]
    bad_missing = {k for k in missing if not matches(k, new_weights)}
    bad_unexpected = {
        k for k in unexpected if inside_architecture(k, prefix, base_names) and not matches(k, new_weights)
    }
    bad_mismatched = [m for m in mismatched if not (ignore_mismatched_sizes or matches(m[0], new_weights))]
    if bad_missing or bad_unexpected or bad_mismatched:
        raise coverage_error(
            where,
            model_name,
            missing=bad_missing,
            unexpected=bad_unexpected,
            mismatched=bad_mismatched,
            prefix=prefix,
            base_names=base_names,
        )
    return {
        "new_weights": sorted(missing | {k for k, _, _ in mismatched}),
        "mismatched": sorted([k, a, b] for k, a, b in mismatched),
        "unused": sorted(unexpected),
    }
