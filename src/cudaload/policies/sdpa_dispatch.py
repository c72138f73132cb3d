"""SDPA without cuDNN in decode: when torch's own dispatch makes ``sdpa`` slow, and what cudaload runs instead.

torch sends ``scaled_dot_product_attention`` to the first backend in its priority order that accepts the call.
On sm90 and sm100 (minor 0) with cuDNN >= 9.9 that order starts with cuDNN (torch
``aten/src/ATen/native/transformers/cuda/sdp_utils.cpp``, ``check_prefer_cudnn_attention()`` and
``priority_order()``; ``TORCH_CUDNN_SDPA_PREFERRED=0`` turns it off, and newer releases name the switch
``TORCH_CUDNN_SDPA_DEPRIORITIZED``). cuDNN builds an execution graph for every new problem, keyed among other
things by the batch and the key length (``aten/src/ATen/native/cudnn/MHA.cpp``, ``MHAParams`` and the
thread-local ``getMHAGraphCache_()``). A decode step has a new key length every token, so generate() pays a
graph build per token on lengths the process has not met: 40-60 ms each on the H200 (torch 2.11), where
the step itself takes well under a millisecond.

cudaload registers two attention functions with transformers' own extension point (``AttentionInterface``;
:mod:`cudaload.execute.runtime.sdpa_decode` holds the code) that keep sdpa's semantics and masks:

- :data:`SDPA_DECODE` (``cudaload_sdpa``): cuDNN only for problem shapes that recur enough to repay its build
  (:func:`recur_threshold`: prompts from the third meeting, padded decode steps from the 65th, unpadded decode
  steps never). A call whose shape this
  layer has met in fewer than :data:`RECUR` earlier calls on the thread goes to the flash or memory-efficient
  kernels, which need no per-shape plan; a shape that keeps recurring goes to cuDNN, which then builds its
  graph once and is equal or faster from there on (measured on the H200: up to 10% in prefill and up to
  1.5x in padded decode on lengths already met). In generate() every decode step is a new length the first
  times a process meets it: those steps skip the build.
- :data:`SDPA_NO_CUDNN` (``cudaload_sdpa_nocudnn``): cuDNN is left out of every call (chosen only from
  measurements).

This module is pure: it predicts from a :class:`~cudaload.capabilities.Capabilities` whether cuDNN takes
decode calls, and it weighs the measured facts (:class:`SdpaFacts`, shipped in the priors or measured by
``cudaload tune``) that say whether leaving it out is faster. ``load_model`` confirms the prediction on the
real GPU (``cudaload.execute.runtime.sdpa_decode.decode_backend``) and keeps plain sdpa where cuDNN is not chosen.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..capabilities import Capabilities
from ..detection.versions import version_tuple
from ..plans.decision import Candidate

SDPA_DECODE = "cudaload_sdpa"
SDPA_NO_CUDNN = "cudaload_sdpa_nocudnn"
NAMES = (SDPA_DECODE, SDPA_NO_CUDNN)
#: earlier meetings of a shape (same layer, same thread) before cuDNN takes it: its graph build (40-60 ms)
#: pays only on shapes that recur; 2 is a judgement, not tuned (benchmarks/results/2026-12-02-h200/README.md)
RECUR = 2
#: a decode step's shape (one query per sequence) with a padding mask: sdpa repeats the key/value heads and runs
#: the memory-efficient kernel, which cuDNN beats by ~31 us a layer at 1,024 slots (13.5 against 44.5 us, H200,
#: benchmarks/results/2026-12-03-h200/README.md): a 40-60 ms graph build pays back after ~45 more meetings of
#: the shape, so cuDNN only from this many: a judgement from those kernel timings, not measured through
#: generate(). RECUR alone is too few here: the third generate() of one prompt length would pay a build on every
#: decode step (85 ms a token against 36 for a short job in fresh processes, 45 with this threshold; same README).
RECUR_MASKED_DECODE = 64
#: an unmasked decode step runs flash with GQA, which cuDNN beats by only 1.6-7 us a layer (7.7 against 9.3 us at
#: 682 keys, 11 against 18 at 5,461; same README): a build pays back after 160-1,000 meetings of one length, more than a
#: job meets. Never cuDNN there.


#: the revision of the code cudaload's variants run inside a compiled decode step (2: the grouped decode attention,
#: cudaload.execute.runtime.sdpa_decode.grouped_decode_attention). Part of the compile cache's key
#: (cudaload.policies.decode.decode_cache_key): torch would not reuse a saved graph of the old code anyway, but
#: the plan would count its artifact as a warm compile. Raise it whenever that code changes.
COMPILED_STEP_REVISION = 2


def recur_threshold(queries: int, masked: bool) -> int | None:
    """How many earlier meetings of a problem shape send it to cuDNN: :data:`RECUR` for prefill (more than one
    query), :data:`RECUR_MASKED_DECODE` for a padded decode step, ``None`` (never) for an unmasked one."""
    if queries > 1:
        return RECUR
    return RECUR_MASKED_DECODE if masked else None


#: torch releases whose CUDA builds carry cuDNN attention in SDPA's dispatch: read from an untagged source (no
#: line cited), confirmed on torch 2.11 only (benchmarks/results/2026-12-02-h200/README.md)
_TORCH_MIN = (2, 5)
#: the cuDNN release from which torch puts cuDNN first (sdp_utils.cpp ``check_prefer_cudnn_attention``:
#: ``CUDNN_VERSION >= 90900``; newer releases ask more, and load_model's GPU check is the authority)
_CUDNN_MIN = (9, 9)
#: the median measured work keeps at least this share of plain sdpa's speed where lengths repeat (issue 28);
#: the median, not each work: runs differ by a few percent (benchmarks/results/2026-12-02-h200/README.md)
REPEATED_FLOOR = 0.97
#: ... and no measured work below this: a loss beyond what that noise explains
REPEATED_WORST = 0.90


@dataclass(frozen=True)
class SdpaFacts:
    """What was measured about SDPA's cuDNN dispatch on one GPU model: whole generate() calls, the variant
    against plain sdpa, both on lengths the process had not met (``first_seen``) and on repeated ones.

    ``speedup_first_seen`` / ``ratio_repeated``: plain sdpa's seconds over the variant's (above 1: the
    variant is faster), as (lowest, median, highest) over the measured works."""

    gpu: str  # "NVIDIA H200/sm90"
    versions: Mapping[str, str]
    date: str
    speedup_first_seen: tuple[float, float, float]
    ratio_repeated: tuple[float, float, float]
    works: int
    source: str
    #: the variant measured (SDPA_DECODE or SDPA_NO_CUDNN)
    variant: str = SDPA_DECODE
    detail: Mapping[str, Any] = field(default_factory=dict)

    @property
    def sm(self) -> str | None:
        return self.gpu.rsplit("/", 1)[1] if "/" in self.gpu else None

    @property
    def helps(self) -> bool:
        """Faster on first-seen lengths (median over works); where lengths repeat, the median work at least
        :data:`REPEATED_FLOOR` of plain sdpa's speed and none below :data:`REPEATED_WORST`."""
        lo, med, _hi = self.ratio_repeated
        return self.speedup_first_seen[1] > 1.0 and med >= REPEATED_FLOOR and lo >= REPEATED_WORST

    def describe(self) -> str:
        lo, med, hi = self.speedup_first_seen
        rlo, _rmed, rhi = self.ratio_repeated
        vers = ", ".join(f"{k} {v}" for k, v in self.versions.items())
        return (
            f"measured on {self.gpu.replace('/', ' (') + ')' if '/' in self.gpu else self.gpu}, "
            f"{self.date[:10]}, {vers}: generate() {lo:.2f}-{hi:.2f}x plain sdpa (median {med:.2f}x) on "
            f"first-seen lengths, {rlo:.2f}-{rhi:.2f}x on repeated ones, {self.works} works ({self.source})"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "gpu": self.gpu,
            "versions": dict(self.versions),
            "date": self.date,
            "variant": self.variant,
            "speedup_first_seen": list(self.speedup_first_seen),
            "ratio_repeated": list(self.ratio_repeated),
            "works": self.works,
            "source": self.source,
            "detail": dict(self.detail),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> SdpaFacts:
        def three(x: Any) -> tuple[float, float, float]:
            a, b, c = (float(v) for v in x)
            return (a, b, c)

        return cls(
            gpu=str(d["gpu"]),
            versions={str(k): str(v) for k, v in d["versions"].items()},
            date=str(d["date"]),
            variant=str(d.get("variant", SDPA_DECODE)),
            speedup_first_seen=three(d["speedup_first_seen"]),
            ratio_repeated=three(d["ratio_repeated"]),
            works=int(d["works"]),
            source=str(d.get("source", "")),
            detail=dict(d.get("detail") or {}),
        )


def cudnn_takes_decode(caps: Capabilities) -> tuple[bool, str]:
    """Whether torch's SDPA would send decode calls to cuDNN on the first GPU of ``caps``, and why.

    A prediction from the facts a snapshot holds (GPU, torch build, cuDNN release, the environment); a
    profile, which names no torch, is predicted for a current CUDA build. ``load_model`` checks it on the
    real device before the model is used."""
    if not caps.gpus:
        return False, "no GPU: SDPA runs torch's CPU kernels, which have no cuDNN backend"
    gpu = caps.gpus[0]
    cc = gpu.compute_capability
    where = "sdp_utils.cpp check_prefer_cudnn_attention()"
    if cc not in ((9, 0), (10, 0)):
        return False, (
            f"{gpu.name} is sm{gpu.sm}: torch puts cuDNN first only on sm90 and sm100 ({where}), so decode "
            "goes to flash / memory-efficient attention already"
        )
    env = caps.env_dict
    if env.get("TORCH_CUDNN_SDPA_PREFERRED", "").strip() in ("0", "false", "False", "OFF", "off"):
        return (
            False,
            f"TORCH_CUDNN_SDPA_PREFERRED={env['TORCH_CUDNN_SDPA_PREFERRED']} keeps cuDNN out of first place",
        )
    if env.get("TORCH_CUDNN_SDPA_DEPRIORITIZED", "").strip() not in ("", "0", "false", "False"):
        return False, "TORCH_CUDNN_SDPA_DEPRIORITIZED is set: torch keeps cuDNN out of first place"
    if caps.torch_version is not None:
        tv = version_tuple(caps.torch_version) or (0,)
        if caps.torch_cuda_version is None:
            return False, f"torch {caps.torch_version} is a CPU build: no cuDNN attention"
        if tv[:2] < _TORCH_MIN:
            return False, f"torch {caps.torch_version} predates cuDNN attention in SDPA's dispatch (2.5)"
    cudnn = caps.cudnn_version
    if cudnn is not None and (version_tuple(cudnn) or (0,))[:2] < _CUDNN_MIN:
        return False, f"cuDNN {cudnn} < 9.9: torch does not put cuDNN first ({where})"
    torch_text = f"torch {caps.torch_version}" if caps.torch_version else "a current CUDA torch build"
    cudnn_text = f"cuDNN {cudnn}" if cudnn else "its cuDNN"
    return True, (
        f"{torch_text} with {cudnn_text} puts cuDNN first on sm{gpu.sm} ({where}); cuDNN builds a graph for "
        "every new key length (MHA.cpp's per-thread graph cache), so each decode step of a new length pays one"
    )


def facts_for(caps: Capabilities, facts: Sequence[SdpaFacts], variant: str = SDPA_DECODE) -> SdpaFacts | None:
    """The measurement that speaks for this GPU: the same GPU name first, else the same compute capability;
    the newest of those."""
    if not caps.gpus:
        return None
    gpu = caps.gpus[0]
    sm = f"sm{gpu.sm}"
    fit = [f for f in facts if f.variant == variant and f.sm == sm]
    if not fit:
        return None
    return max(fit, key=lambda f: (f.gpu.split("/")[0] == gpu.name, f.date))


def candidates(
    caps: Capabilities, sdpa: Candidate, facts: Sequence[SdpaFacts], dtype: str = "bfloat16"
) -> list[Candidate]:
    """The two variants as attention candidates: valid where sdpa is and cuDNN is predicted to take decode."""
    out: list[Candidate] = []
    takes, why = cudnn_takes_decode(caps)
    if takes and dtype not in ("bfloat16", "float16"):
        # sdp_utils.cpp check_dtypes_low_precision: cuDNN attention takes fp16 / bf16 only
        takes, why = False, f"cuDNN attention runs float16 / bfloat16 only; the plan's dtype is {dtype}"
    for name, what in (
        (
            SDPA_DECODE,
            f"sdpa with cuDNN only for prompt shapes met {RECUR}+ times before and padded decode steps met "
            f"{RECUR_MASKED_DECODE}+ times (no graph build per new length)",
        ),
        (SDPA_NO_CUDNN, "sdpa with cuDNN left out of every call"),
    ):
        if not sdpa.ok:
            out.append(Candidate(name, False, ("runs sdpa, which is not valid here", *sdpa.reasons)))
            continue
        if not takes:
            out.append(Candidate(name, False, (f"would run exactly what sdpa runs: {why}",)))
            continue
        f = facts_for(caps, facts, name)
        measured = f.describe() if f else f"not measured on sm{caps.gpus[0].sm} (`cudaload tune` measures it)"
        out.append(Candidate(name, True, (f"{what}: {why}", measured)))
    return out
