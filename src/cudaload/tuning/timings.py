"""Looking up measured attention timings: this machine's cache first, then the priors cudaload ships.

A shipped prior is a measurement made on a named GPU with named package versions (benchmarks/
bench_generate.py on the H200), for one model shape and one work. It is used for another model when the
attention signature class matches (head dims, dtype, window / soft-capping / sinks / ALiBi) and for another
work when its bucket is within :data:`MAX_DISTANCE` doublings; on another GPU only when the compute
capability is the same, and the source sentence says which GPU it was. Pure: no torch, no transformers.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from typing import Any, TypeVar

from ..capabilities import Capabilities
from ..model_info import ModelInfo
from ..policies.decode_facts import DecodeFacts
from ..policies.sdpa_dispatch import SDPA_DECODE, SDPA_NO_CUDNN, SdpaFacts
from ..policies.training_facts import LayerCompileFacts, TrainingFacts
from .signature import AttentionSignature, Work, WorkBucket, as_work, bucket, signature
from .store import Entry, TimingCache, gpu_id, package_versions

logger = logging.getLogger(__name__)

#: 2: first-seen ``seconds`` with ``repeated_s`` beside them, and ``sdpa_dispatch`` facts
PRIORS_VERSION = 2
PRIORS_FILE = "priors.json"
#: the farthest a measured bucket may be from the declared one (doublings of batch, prompt and new tokens;
#: padded and unpadded never match): 8 x 2048 + 32 answers 8 x 1024 + 64, not 1 x 512 + 32
MAX_DISTANCE = 2.0


@dataclass(frozen=True)
class Timings:
    """Backend -> seconds of the declared work's generate() call on lengths the process has not met (lower is
    better), the same on repeated lengths (``repeated``), the sentence a plan's reasons show and the date."""

    seconds: Mapping[str, float]
    source: str
    date: str
    kind: str  # "measured" (this machine's cache) or "prior" (shipped)
    work: WorkBucket | None = None
    #: backend -> seconds the first call paid beyond a steady one where it was measured (JIT, torch.compile;
    #: not the import): a measured complement to the policy's first-use table, not a replacement
    first_call_s: Mapping[str, float] = field(default_factory=dict)
    repeated: Mapping[str, float] = field(default_factory=dict)

    @property
    def fastest(self) -> str:
        return min(self.seconds, key=lambda b: self.seconds[b])

    def to_dict(self) -> dict[str, Any]:
        return {
            "seconds": dict(self.seconds),
            "source": self.source,
            "date": self.date,
            "kind": self.kind,
            "work": self.work.to_dict() if self.work else None,
            "first_call_s": dict(self.first_call_s),
            "repeated": dict(self.repeated),
        }


def _work_text(e: Entry) -> str:
    w = e.detail.get("work")
    if isinstance(w, Mapping):
        try:
            return as_work(w).describe()
        except (KeyError, TypeError, ValueError):
            pass
    b = e.work
    return Work(b.batch, b.prompt, b.new_tokens, b.padded).describe()


# -- priors --------------------------------------------------------------------------------------------------


def load_priors(path: str | os.PathLike[str] | None = None) -> list[Entry]:
    """The shipped priors (``cudaload/tuning/priors.json``), or those in ``path``. A file that cannot be read
    is ignored with a warning: priors only ever add information."""
    if path is None:
        return list(_shipped())  # parsed once per process: plan() looks them up on every call
    return _load(path)


@functools.lru_cache(maxsize=1)
def _shipped() -> tuple[Entry, ...]:
    return tuple(_load(None))


def load_sdpa_facts(path: str | os.PathLike[str] | None = None) -> list[SdpaFacts]:
    """What was measured about SDPA's cuDNN dispatch (the priors file's ``sdpa_dispatch`` records), for
    :mod:`cudaload.policies.sdpa_dispatch`. Unreadable records are ignored with a warning."""
    if path is None:
        return list(_shipped_facts())
    return _facts(_document(path))


@functools.lru_cache(maxsize=1)
def _shipped_facts() -> tuple[SdpaFacts, ...]:
    return tuple(_facts(_document(None)))


def _facts(data: Mapping[str, Any] | None) -> list[SdpaFacts]:
    return _records(data, "sdpa_dispatch", SdpaFacts.from_dict, "SDPA dispatch")


_T = TypeVar("_T")


def _records(
    data: Mapping[str, Any] | None, key: str, parse: Callable[[Mapping[str, Any]], _T], what: str
) -> list[_T]:
    """The priors document's ``key`` records, parsed; an unreadable record is ignored with a warning."""
    out = []
    for i, d in enumerate((data or {}).get(key) or []):
        try:
            out.append(parse(d))
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            logger.warning("ignoring %s record #%d: %s", what, i, e)
    return out


def load_training_facts(path: str | os.PathLike[str] | None = None) -> list[TrainingFacts]:
    """Training throughput measured per attention backend (the priors file's ``training`` records), for
    :mod:`cudaload.policies.training_facts`. Unreadable records are ignored with a warning."""
    data = _document(path) if path is not None else _shipped_document()
    return _records(data, "training", TrainingFacts.from_dict, "training")


def load_layer_compile_facts(path: str | os.PathLike[str] | None = None) -> list[LayerCompileFacts]:
    """What compiling the decoder layers did to a training step (the priors file's ``layer_compile`` records),
    for :mod:`cudaload.policies.training.compile`. Unreadable records are ignored with a warning."""
    data = _document(path) if path is not None else _shipped_document()
    return _records(data, "layer_compile", LayerCompileFacts.from_dict, "layer compile")


def load_decode_facts(path: str | os.PathLike[str] | None = None) -> list[DecodeFacts]:
    """Decode measured per GPU (the priors file's ``decode`` records), for :mod:`cudaload.policies.decode`.
    Unreadable records are ignored with a warning."""
    data = _document(path) if path is not None else _shipped_document()
    return _records(data, "decode", DecodeFacts.from_dict, "decode")


@functools.lru_cache(maxsize=1)
def _shipped_document() -> dict[str, Any] | None:
    return _document(None)


def _document(path: str | os.PathLike[str] | None) -> dict[str, Any] | None:
    """The priors document of the current version, or None (with a warning)."""
    try:
        if path is None:
            text = resources.files("cudaload.tuning").joinpath(PRIORS_FILE).read_text(encoding="utf-8")
        else:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        data = json.loads(text)
    except (OSError, ValueError) as e:
        logger.warning("ignoring attention priors %s: %s", path or PRIORS_FILE, e)
        return None
    if not isinstance(data, dict) or data.get("version") != PRIORS_VERSION:
        logger.warning(
            "ignoring attention priors %s: version %r, not %d",
            path or PRIORS_FILE,
            data.get("version") if isinstance(data, dict) else None,
            PRIORS_VERSION,
        )
        return None
    return data


def _load(path: str | os.PathLike[str] | None) -> list[Entry]:
    data = _document(path)
    if data is None:
        return []
    out = []
    for i, d in enumerate(data.get("priors") or []):
        try:
            out.append(prior_entry(d))
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            logger.warning("ignoring attention prior #%d: %s", i, e)
    return out


def prior_entry(d: Mapping[str, Any]) -> Entry:
    """An Entry from one priors.json record (its work exact, bucketed here)."""
    w = as_work(d["work"])
    return Entry(
        gpu=str(d["gpu"]),
        versions={str(k): str(v) for k, v in d["versions"].items()},
        signature=AttentionSignature.from_dict(d["signature"]),
        work=bucket(w),
        seconds={str(k): float(v) for k, v in d["seconds"].items()},
        date=str(d["date"]),
        first_call_s={str(k): float(v) for k, v in (d.get("first_call_s") or {}).items()},
        detail={k: v for k, v in d.items() if k in ("work", "model", "mask", "how", "source", "samples")},
        repeated_s={str(k): float(v) for k, v in (d.get("repeated_s") or {}).items()},
    )


def _sm(gpu: str) -> str | None:
    return gpu.rsplit("/", 1)[1] if "/" in gpu else None


def _describe_gpu(gpu: str) -> str:
    name, _, sm = gpu.rpartition("/")
    return f"{name} ({sm})" if name else gpu


def measured_timings(e: Entry, declared: Work, distance: float) -> Timings:
    """Timings from one of this machine's cache entries, ``distance`` doublings from the declared work."""
    where = "this GPU" if e.gpu != "cpu" else "this machine's CPU"
    near = "" if distance == 0 else f" (nearest to the declared {declared.describe()})"
    return Timings(
        seconds=dict(e.seconds),
        # the seconds themselves are listed by the policy next to this sentence
        source=f"measured on {where} on {e.date[:10]} for {_work_text(e)}{near}",
        date=e.date,
        kind="measured",
        work=e.work,
        first_call_s=dict(e.first_call_s),
        repeated=dict(e.repeated_s),
    )


# -- lookup --------------------------------------------------------------------------------------------------


def _nearest(
    entries: Iterable[Entry],
    want: WorkBucket,
    sig: AttentionSignature,
    rank: Callable[[Entry], tuple[bool, ...]] | None = None,
) -> tuple[Entry, float] | None:
    best: tuple[tuple[float, ...], Entry, float] | None = None
    for e in entries:
        d = want.distance(e.work)
        if d > MAX_DISTANCE:
            continue
        # ties: the closer head counts, then whatever the caller ranks (same GPU name, mask), then the newest
        heads = abs(_log2(e.signature.heads) - _log2(sig.heads)) + abs(
            _log2(e.signature.kv_heads) - _log2(sig.kv_heads)
        )
        k = (d, heads, *(rank(e) if rank else ()), -_date_num(e.date))
        if best is None or k < best[0]:
            best = (k, e, d)
    return (best[1], best[2]) if best else None


def _log2(n: int) -> float:
    import math

    return math.log2(max(1, n))


def _date_num(date: str) -> float:
    try:
        return float(date[:10].replace("-", ""))
    except ValueError:
        return 0.0


def lookup(
    caps: Capabilities,
    info: ModelInfo,
    dtype: str,
    work: Work | tuple[int, int] | Mapping[str, Any] | None,
    *,
    cache: TimingCache | None = None,
    priors: Sequence[Entry] | None = None,
    device_index: int = 0,
) -> Timings | None:
    """Timings for ``info`` (a ModelInfo) in ``dtype`` doing ``work`` on GPU ``device_index`` of ``caps``.

    This machine's cache first (same GPU, same package versions, same signature; the nearest bucket within
    MAX_DISTANCE), then the shipped priors (``priors``: default :func:`load_priors`), else None: the policy's
    rules decide. ``work`` None (nothing declared) returns None: no measurement answers an unknown work.
    """
    if work is None:
        return None
    want = bucket(as_work(work))
    declared = as_work(work).describe()
    sig = signature(info, dtype)
    gpu = gpu_id(caps, device_index)
    versions = package_versions(caps)
    store = cache if cache is not None else TimingCache()
    mine = [
        e
        for e in store.entries()
        if e.gpu == gpu and dict(e.versions) == versions and e.signature.key() == sig.key()
    ]
    hit = _nearest(mine, want, sig)
    if hit:
        return measured_timings(hit[0], as_work(work), hit[1])
    if gpu == "cpu":
        return None
    pool = list(load_priors() if priors is None else priors)
    sm = _sm(gpu)
    fit = [e for e in pool if (e.gpu == gpu or _sm(e.gpu) == sm) and e.signature.klass() == sig.klass()]
    # an unpadded declared work means the tokenizer's all-ones mask; a prior timed without a mask is second
    mask_pref = "left" if want.padded else "ones"
    hit = _nearest(
        fit, want, sig, rank=lambda e: (e.gpu != gpu, e.detail.get("mask", mask_pref) != mask_pref)
    )
    if not hit:
        return None
    e, d = hit
    vers = ", ".join(f"{k} {v}" for k, v in e.versions.items())
    other = "" if e.gpu == gpu else f", same compute capability as this {_describe_gpu(gpu).split(' (')[0]}"
    model = f"{e.detail['model']} shape, " if e.detail.get("model") else ""
    near = "" if d == 0 else f" (nearest to the declared {declared})"
    return Timings(
        seconds=dict(e.seconds),
        source=(
            f"shipped prior: {_describe_gpu(e.gpu)}{other}, {e.date[:10]}, {vers}; "
            f"{model}{_work_text(e)}{near}"
        ),
        date=e.date,
        kind="prior",
        work=e.work,
        first_call_s=dict(e.first_call_s),
        repeated=dict(e.repeated_s),
    )


# -- turning a GPU benchmark into priors ---------------------------------------------------------------------


def priors_from_bench(results: Mapping[str, Any], *, source: str = "") -> dict[str, Any]:
    """A priors.json document from benchmarks/bench_generate.py's results.json: one prior per (shape, work),
    the median first-seen generate() seconds of every backend that has them (``repeated_s`` beside them),
    and the ``sdpa_dispatch`` facts (each SDPA variant against plain sdpa over the works). ``source`` names
    the run (e.g. its results directory); the date and versions come from the results."""
    from cudaload.testing.shapes import FULL_SHAPES

    versions = {k: v for k, v in (results.get("versions") or {}).items() if v}
    keep = {
        k: versions[k]
        for k in ("torch", "transformers", "flash-attn-4", "flash-attn", "flash-attn-3")
        if k in versions
    }
    gpu = results.get("gpu_id") or ""
    date = str(results.get("date", ""))[:10]
    out: list[dict[str, Any]] = []
    #: variant -> [(first-seen ratio, repeated ratio)] of plain sdpa's seconds over the variant's
    ratios: dict[str, list[tuple[float, float]]] = {}
    for sh in results.get("shapes") or []:
        if "rows" not in sh or not gpu:
            continue
        shape = sh["shape"]
        cfg = FULL_SHAPES.get(shape, (None, {}))[1]
        heads = int(cfg.get("num_attention_heads", 0))
        head_dim = int(cfg.get("head_dim") or (cfg.get("hidden_size", 0) // max(1, heads)))
        sig = AttentionSignature(
            heads=heads,
            kv_heads=int(cfg.get("num_key_value_heads", heads)),
            qk_head_dim=head_dim,
            v_head_dim=head_dim,
            dtype=str(sh.get("dtype", "bfloat16")),
        )
        per: dict[str, dict[str, Any]] = {}
        for r in sh["rows"]:
            g = r.get("generate_first_s") or {}
            if not g.get("median"):
                continue
            ws = r["work_shape"]
            rec = per.setdefault(
                r["work"],
                {
                    "gpu": gpu,
                    "date": date,
                    "versions": keep,
                    "model": shape,
                    "signature": sig.to_dict(),
                    "work": {
                        "batch_size": ws["batch"],
                        "prompt_len": ws["prompt"],
                        "new_tokens": ws["new_tokens"],
                        "padded": ws["padding"] == "left",
                    },
                    "mask": ws["padding"],
                    "how": "benchmarks/bench_generate.py: models held at once, generate() interleaved, median; "
                    "seconds on first-seen lengths (a new thread), repeated_s on lengths already run",
                    "source": source or str(results.get("command", "")),
                    "seconds": {},
                    "repeated_s": {},
                    "samples": {},
                    "first_call_s": {},
                },
            )
            rec["seconds"][r["backend"]] = round(float(g["median"]), 4)
            rep = r.get("generate_s") or {}
            if rep.get("median"):
                rec["repeated_s"][r["backend"]] = round(float(rep["median"]), 4)
            rec["samples"][r["backend"]] = int(g.get("n", 0))
            extra = r.get("first_call_extra_s")
            if extra is not None and extra > 0:
                rec["first_call_s"][r["backend"]] = round(float(extra), 3)
        for p in per.values():
            if len(p["seconds"]) < 2:
                continue
            out.append(p)
            for variant, rr in _variant_ratios(p).items():
                ratios.setdefault(variant, []).append(rr)
    facts = _facts_from(
        ratios, _steady_ratios(results), gpu, versions, date, source or str(results.get("command", ""))
    )
    return {"version": PRIORS_VERSION, "priors": out, "sdpa_dispatch": facts, "ratios": ratios}


def _variant_ratios(prior: Mapping[str, Any]) -> dict[str, tuple[float, float]]:
    """One prior's (first-seen, repeated) ratio of plain sdpa's seconds over each SDPA variant's."""
    out: dict[str, tuple[float, float]] = {}
    base, base_rep = prior["seconds"].get("sdpa"), prior["repeated_s"].get("sdpa")
    for variant in (SDPA_DECODE, SDPA_NO_CUDNN):
        v, v_rep = prior["seconds"].get(variant), prior["repeated_s"].get(variant)
        if base and v and base_rep and v_rep:
            out[variant] = (base / v, base_rep / v_rep)
    return out


def prior_key(prior: Mapping[str, Any]) -> tuple[Any, ...]:
    """What makes two priors the same measurement target (as ``python -m cudaload.tuning priors`` merges them)."""
    return (
        prior.get("gpu"),
        prior.get("model"),
        json.dumps(prior.get("work"), sort_keys=True),
        prior.get("mask"),
    )


def _steady_by_work(results: Mapping[str, Any]) -> dict[str, float]:
    """bench_generate.py --steady: per work, the median sdpa / cudaload_sdpa over alternating pairs on lengths
    met before (the repeated state, sampled many times: one repeated call per work is within the host's noise)."""
    st = results.get("steady") or {}
    shape = st.get("shape", "")
    return {
        f"{shape} {w['work']}": float(w["ratio_median"])
        for w in st.get("works") or []
        if w.get("ratio_median")
    }


def _steady_ratios(results: Mapping[str, Any]) -> list[float]:
    return list(_steady_by_work(results).values())


def _facts_from(
    ratios: Mapping[str, Sequence[tuple[float, float]]],
    steady: Sequence[float],
    gpu: str,
    versions: Mapping[str, str],
    date: str,
    source: str,
) -> list[dict[str, Any]]:
    facts = []
    for variant, rs in ratios.items():
        first = sorted(r[0] for r in rs)
        again = sorted(steady) if steady and variant == SDPA_DECODE else sorted(r[1] for r in rs)
        facts.append(
            SdpaFacts(
                gpu=gpu,
                versions={k: v for k, v in versions.items() if k in ("torch", "cudnn", "transformers")},
                date=date,
                variant=variant,
                speedup_first_seen=(first[0], statistics.median(first), first[-1]),
                ratio_repeated=(again[0], statistics.median(again), again[-1]),
                works=len(rs),
                source=source,
                detail={
                    "repeated": "alternating pairs on lengths met before (--steady), per-work medians"
                    if steady and variant == SDPA_DECODE
                    else "one repeated call per work"
                },
            ).to_dict()
        )
    return facts


def sdpa_facts_from_bench(runs: Sequence[Mapping[str, Any]], *, source: str = "") -> list[dict[str, Any]]:
    """The ``sdpa_dispatch`` facts over several bench_generate.py results of one GPU (both shapes, say):
    every work's ratio in one range; the repeated figure from the --steady pairs where a run has them. A work
    measured in several runs counts once, from the last run given that has it (as the priors keep the last)."""
    per_work: dict[tuple[Any, ...], dict[str, tuple[float, float]]] = {}
    steady_by: dict[str, float] = {}
    first = runs[0] if runs else {}
    for r in runs:
        for p in priors_from_bench(r)["priors"]:
            per_work[prior_key(p)] = _variant_ratios(p)
        steady_by.update(_steady_by_work(r))
    ratios: dict[str, list[tuple[float, float]]] = {}
    for vr in per_work.values():
        for variant, rr in vr.items():
            ratios.setdefault(variant, []).append(rr)
    steady = list(steady_by.values())
    versions = {k: v for k, v in (first.get("versions") or {}).items() if v}
    return _facts_from(
        ratios, steady, first.get("gpu_id") or "", versions, str(first.get("date", ""))[:10], source
    )
