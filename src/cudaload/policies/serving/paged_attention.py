"""Which paged attention continuous batching runs, and the name the installed transformers takes for it.

The attention decision weighs one ``generate()`` batch; continuous batching attends per request with flash and
through one dense mask with sdpa/eager, so a usable paged flash form is preferred (see
:func:`choose_paged_attention`). Names: transformers 5.17 registers ``paged|flash_attention_{2,3,4}``,
``paged|sdpa`` and ``paged|eager``; from 5.19 the prefix is dropped except for ``paged|eager``
(:func:`transformers_name`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

from ...detection.versions import version_tuple as _version
from ...plans.decision import Candidate, Decision

#: the first transformers version whose flash/sdpa paged forms drop the "paged|" prefix: 5.19.0
#: modeling_utils.py:1737-1749 strips it with a FutureWarning announcing its removal in 5.23 (5.22.2 :1732-1744 and
#: 5.24.0 :1733-1745 still strip it), and its manager accepts "sdpa" and flash names as they are (5.19.0
#: continuous_api.py:770-775); 5.18 registers the prefixed names (modeling_utils.py:5125-5129)
PLAIN_NAMES_FROM = (5, 19)

_PAGED = {
    "flash_attention_2": "paged|flash_attention_2",
    "flash_attention_3": "paged|flash_attention_3",
    "flash_attention_4": "paged|flash_attention_4",
    "sdpa": "paged|sdpa",
    "eager": "paged|eager",
}
_MASKED = frozenset({"paged|sdpa", "paged|eager"})
#: FA2/FA3 have transformers' decode fast path (block table + flash_attn_with_kvcache, initialization.py:122)
_FAST_DECODE = frozenset({"paged|flash_attention_2", "paged|flash_attention_3"})


def transformers_name(paged: str, transformers_version: str | None) -> str:
    """The ``attn_implementation`` string the installed transformers wants for a paged implementation."""
    v = _version(transformers_version)
    if v is not None and v[:2] >= PLAIN_NAMES_FROM and paged != "paged|eager":
        return paged.removeprefix("paged|")
    return paged


#: the first transformers version whose paged flash path calls the varlen kernel with keywords: 5.19.0 strips the
#: "paged|" prefix (modeling_utils.py:5135-5140), so continuous batching runs the plain flash_attention_forward
#: (integrations/flash_attention.py:59-88, the paged cache updated there) -> modeling_flash_attention_utils.py
#: :828-847, ``cu_seqlens_q=...`` (same in 5.22.2 :840-859, 5.24.0 :842-861). 5.17 (flash_paged.py:72-79) and 5.18
#: (flash_paged.py:75-82, registered for "paged|flash_attention_4" and for a Hub kernel's "paged|<repo>",
#: 5.17 modeling_flash_attention_utils.py:279-282) pass ``cu_seq_lens_q`` 4th by position, where flash-attn-4
#: 4.0.0b36 takes ``qv`` (flash_attn/cute/interface.py:4214-4222): every request failed with
#: "'int' object has no attribute 'shape'" on the H200 (benchmarks/results/2026-12-01-h200/run9-serving-fa4-t517)
FA4_PAGED_FROM = (5, 19)
#: measured on the H200 (transformers 5.22.2, flash-attn-4 4.0.0b36, torch 2.11; 64 requests, prompts 128-2048,
#: 128-256 new tokens; benchmarks/results/2026-12-01-h200/run10-serving-fa4-t522)
MEASURED_FA4_PAGED = (
    "paged flash_attention_4 against paged sdpa with the same cache settings, H200, 64 requests: 1,617 vs 467 "
    "tok/s (Qwen3-0.6B shape, 11.6 vs 90 ms a decode step) and 1,489 vs 283 (8B, 19 vs 143 ms); "
    "benchmarks/results/2026-12-01-h200/run10-serving-fa4-t522"
)
#: paged eager against paged sdpa, cudaload's serving settings for attn="eager" in both (the named attention is
#: kept: a user may need eager's outputs; this says what it costs when the model also supports sdpa)
MEASURED_EAGER_PAGED = (
    "paged eager against paged sdpa with the same cache settings, H200, 64 requests (Qwen3-0.6B shape): 346 vs "
    "549 tok/s at 84 vs 25 GiB peak (benchmarks/results/2026-12-01-h200/run15-memtrain-servingeager): for "
    "serving pass attn='sdpa' or 'auto' unless you need eager"
)
#: the order cudaload prefers paged flash forms in when the attention decision chose none of them: transformers'
#: own order for continuous batching (FA3, then FA2: continuous_api.py:662-668, both with the decode fast path),
#: then FA4 (varlen only: flash_attn_with_kvcache is None for it, modeling_flash_attention_utils.py:178-181)
_FLASH_ORDER = ("flash_attention_3", "flash_attention_2", "flash_attention_4")


def _paged_blocker(impl: str, transformers_version: str | None) -> str | None:
    """Why transformers cannot run ``impl``'s paged form at this version (None: it can)."""
    v = _version(transformers_version) if transformers_version else None
    if impl == "flash_attention_4" and v is not None and v[:2] < FA4_PAGED_FROM:
        return (
            f"transformers {transformers_version} passes cu_seq_lens_q by position into flash-attn-4's qv argument "
            "(5.17 integrations/flash_paged.py:72-79, flash-attn-4 4.0.0b36 cute/interface.py:4214-4222): every "
            "request failed on the H200 (run9-serving-fa4-t517); transformers >= 5.19 passes keywords: upgrade "
            "transformers to serve with it"
        )
    return None


def choose_paged_attention(
    attention_choice: str,
    *,
    supports_sdpa: bool = True,
    usable: Iterable[str] | None = None,
    transformers_version: str | None = None,
) -> Decision:
    """The paged implementation continuous batching runs.

    ``usable``: every attention implementation the attention decision accepted (its ok candidates) when it chose
    automatically; a paged flash form among them is preferred over the attention decision's own choice, because
    that choice is made for one ``generate()`` batch, where masks and padding decide, while serving pages many
    requests, where sdpa and eager need a dense mask over every key the batch reads and flash attends per
    request. None: the caller named the attention; its paged form is used (where transformers can run it)."""
    asked = _Asked.of(attention_choice, supports_sdpa, usable, transformers_version)
    cands = [_candidate(asked, impl, paged) for impl, paged in _PAGED.items()]
    cands.append(
        Candidate(
            "flex_attention",
            False,
            (
                "no paged form: transformers 5.17 registers paged flash/sdpa/eager only (modeling_utils.py:5082-5086)",
            ),
        )
    )
    choice, reasons, hub = _choice(asked)
    if hub is not None:
        cands.insert(0, hub)
    return Decision(choice, tuple(reasons), tuple(cands))


@dataclass(frozen=True)
class _Asked:
    """What :func:`choose_paged_attention` was asked: the attention decision's choice and the implementation
    behind it (``base``: a Hub kernel's repo mapped to its attn_implementation), the paged implementations usable
    here (``ok``), whether the attention was chosen automatically (``usable`` given), and the facts the blockers
    read."""

    choice: str
    base: str
    ok: frozenset[str]
    automatic: bool
    supports_sdpa: bool
    transformers_version: str | None

    @classmethod
    def of(
        cls, choice: str, supports_sdpa: bool, usable: Iterable[str] | None, transformers_version: str | None
    ) -> _Asked:
        base = choice
        if base.startswith("kernels-community/"):
            from ..attention.names import _KERNEL_TO_IMPL

            base = _KERNEL_TO_IMPL.get(base, base)
        ok = frozenset(i for i in {base} | set(usable or ()) if i in _PAGED)
        return cls(choice, base, ok, usable is not None, supports_sdpa, transformers_version)

    def blocker(self, impl: str) -> str | None:
        return _paged_blocker(impl, self.transformers_version)

    @property
    def fallback(self) -> str:
        """Where a choice without a paged form goes: sdpa, or eager for models without sdpa."""
        return "paged|sdpa" if self.supports_sdpa else "paged|eager"


def _candidate(a: _Asked, impl: str, paged: str) -> Candidate:
    """One paged implementation, valid or rejected, with every reason."""
    why: list[str] = []
    ok = True
    if impl == a.base:
        why.append(f"the attention decision chose {a.choice}")
    if paged in _MASKED:
        why.append(
            "needs a dense block-diagonal mask over every key the batch reads (continuous_batching/utils.py:54)"
        )
    else:
        why.append("no mask: attends per request (varlen)")
    if paged in _FAST_DECODE:
        why.append("decode fast path with a block table (initialization.py:114-146)")
    if impl == "flash_attention_4":
        why.append(MEASURED_FA4_PAGED)
    blocker = a.blocker(impl)
    if impl.startswith("flash") and impl not in a.ok:
        ok = False
        why.append(
            "not usable here: see the attention decision"
            if a.automatic
            else f"not the attention decision's choice ({a.choice}): not installed or not supported"
        )
    elif blocker is not None:
        ok = False
        why.append(blocker)
    if impl == "sdpa" and not a.supports_sdpa:
        ok = False
        why.append("the model does not support sdpa")
    if impl == "eager" and a.base != "eager":
        why.append("materialises the scores of every head over the batch's keys: last resort")
    return Candidate(paged, ok, tuple(why))


def _preferred_flash(a: _Asked) -> str | None:
    """With an automatic attention choice: the first usable flash implementation transformers can page here (the
    attention decision's own first when it is flash, then :data:`_FLASH_ORDER`)."""
    if not a.automatic:
        return None
    order = ([a.base] if a.base.startswith("flash") else []) + [f for f in _FLASH_ORDER if f != a.base]
    return next((f for f in order if f in a.ok and a.blocker(f) is None), None)


def _choice(a: _Asked) -> tuple[str, list[str], Candidate | None]:
    """The paged name, its reasons, and the Hub kernel's own paged candidate when that is the choice."""
    preferred = _preferred_flash(a)
    if preferred is not None and preferred != a.base:
        return (
            _PAGED[preferred],
            [
                f"{preferred} is usable here and its paged form attends per request without a mask; the attention "
                f"decision's {a.choice} was chosen for one generate() batch",
                MEASURED_FA4_PAGED
                if preferred == "flash_attention_4"
                else "not measured here; transformers' own first choice for continuous batching",
            ],
            None,
        )
    blocker = a.blocker(a.base) if a.base in _PAGED else None
    if blocker is not None:
        # before the Hub-kernel branch: a Hub FA4 build goes through the same positional call (FA4_PAGED_FROM)
        return a.fallback, [f"{a.choice} cannot serve paged here: {blocker}; {a.fallback} instead"], None
    if a.choice.startswith("kernels-community/") and a.base in _PAGED:
        # the Hub kernel itself, paged: transformers registers "paged|<repo>" when it loads the kernel
        # (modeling_flash_attention_utils.py:188-189)
        choice = f"paged|{a.choice}"
        hub = Candidate(choice, True, (f"the Hub kernel {a.choice} provides {a.base}",))
        return choice, [f"paged form of the attention decision's {a.choice}"], hub
    if a.base in _PAGED:
        return _PAGED[a.base], _own_form_reasons(a), None
    # flex_attention or an unknown kernel string: sdpa, or eager for models without sdpa
    return a.fallback, [f"{a.choice} has no paged form in transformers: {a.fallback}"], None


def _own_form_reasons(a: _Asked) -> list[str]:
    """Why the attention decision's own implementation serves paged, and what the alternatives would cost."""
    reasons = [f"paged form of the attention decision's {a.choice}"]
    if a.base == "flash_attention_4":
        reasons.append(MEASURED_FA4_PAGED)
    if a.base == "eager" and a.supports_sdpa:
        reasons.append(MEASURED_EAGER_PAGED)
    # a flash implementation usable here whose paged form this transformers cannot run: say what it costs
    reasons += [
        f"{f} is usable here but cannot serve paged: {a.blocker(f)}"
        + (f" ({MEASURED_FA4_PAGED})" if f == "flash_attention_4" else "")
        for f in _FLASH_ORDER
        if a.automatic and f in a.ok and f != a.base and a.blocker(f)
    ]
    return reasons


def _kind(paged: str) -> str:
    """The implementation behind a paged name: "paged|kernels-community/flash-attn3" -> "flash_attention_3"."""
    name = paged.removeprefix("paged|")
    if name.startswith("kernels-community/"):
        from ..attention.names import _KERNEL_TO_IMPL

        return _KERNEL_TO_IMPL.get(name, name)
    return name


def _eager_to_sdpa(att: Decision, why: str) -> Decision:
    """The attention decision after paged|eager is rejected for memory: paged|sdpa, with the reason recorded."""
    cands = tuple(
        replace(c, ok=False, reasons=(*c.reasons, f"rejected: {why}")) if c.name == "paged|eager" else c
        for c in att.candidates
    )
    return Decision(
        "paged|sdpa",
        (
            f"paged|eager (the attention decision's eager, paged) does not fit: {why}; paged|sdpa computes the "
            "same masked attention in a fused kernel that holds no scores",
        ),
        cands,
    )
