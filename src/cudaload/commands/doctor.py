"""``cudaload doctor``: verdicts, not a dump. Per GPU what works, what is misconfigured, and the fix.

Pure over a :class:`~cudaload.capabilities.Capabilities` (live or recorded), so a snapshot from another
machine can be diagnosed here. Architecture facts come from :mod:`cudaload.detection.support`, the same
place the attention and quantization policies read them.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..capabilities import GPU, Capabilities
from ..detection.packages import kernels_fix
from ..detection.support import FLASH_PACKAGES, bitsandbytes_support, flash_support

__all__ = ["Report", "Verdict", "diagnose", "kernels_fix"]

STATUSES = ("ok", "warn", "fail", "info")
_MARK = {"ok": "ok  ", "warn": "WARN", "fail": "FAIL", "info": "info"}


@dataclass(frozen=True)
class Verdict:
    subject: str  # "cuda:0", "environment", "packages", "hub"
    status: str  # "ok", "warn", "fail" or "info"
    message: str
    fix: str | None = None
    code: str | None = None  # a stable key (finding code or check name) for tests and tooling


@dataclass(frozen=True)
class Report:
    verdicts: tuple[Verdict, ...]
    source: str = "detected"

    @property
    def ok(self) -> bool:
        """False when something is broken (any "fail" verdict)."""
        return not any(v.status == "fail" for v in self.verdicts)

    def by_code(self, code: str) -> tuple[Verdict, ...]:
        return tuple(v for v in self.verdicts if v.code == code)

    def render(self) -> str:
        lines = [f"cudaload doctor ({self.source})"]
        subject = None
        for v in self.verdicts:
            if v.subject != subject:
                subject = v.subject
                lines.append(f"{subject}:")
            lines.append(f"  [{_MARK[v.status]}] {v.message}")
            if v.fix and v.status in ("warn", "fail"):
                lines.append(f"         fix: {v.fix}")
        fails = sum(v.status == "fail" for v in self.verdicts)
        warns = sum(v.status == "warn" for v in self.verdicts)
        lines.append(f"{'OK' if self.ok else 'BROKEN'}: {fails} failure(s), {warns} warning(s)")
        return "\n".join(lines)


def _absent(caps: Capabilities, pkg: str) -> str:
    """Why a package counts as absent: on a profile (hardware only) it is not assumed, which says nothing
    about what is installed on this machine or the one the profile stands for."""
    if caps.source.startswith("profile:") and not caps.package(pkg).assumed:
        return f"is not assumed on a profile (`cudaload plan --assume-installed {pkg}` plans with it)"
    return "is not installed"


def _gpu_verdicts(caps: Capabilities, g: GPU) -> list[Verdict]:
    s = f"cuda:{g.index}"
    out: list[Verdict] = []
    head = f"{g.name}, sm{g.sm} {g.architecture}, {g.total_memory / 2**30:.1f} GiB"
    if g.mig:
        head += " (MIG instance)"
    if g.unified_memory:
        head += " (unified CPU/GPU memory)"
    out.append(Verdict(s, "info", head, code="gpu"))
    if g.bf16_native:
        out.append(Verdict(s, "ok", "native bf16", code="bf16"))
    else:
        out.append(
            Verdict(
                s,
                "info",
                "no native bf16 (pre-Ampere): fp16 is the fast dtype; bf16 would be emulated",
                code="bf16",
            )
        )
    out += _flash_verdicts(caps, g, s)
    out.append(_bitsandbytes_verdict(caps, g, s))
    return out


def _flash_verdicts(caps: Capabilities, g: GPU, s: str) -> list[Verdict]:
    """Each flash package on this GPU: not for it, usable, installed but broken, or not installed."""
    out: list[Verdict] = []
    for pkg, (impl, _module) in FLASH_PACKAGES.items():
        info = caps.package(pkg)
        # the installed release matters too: flash-attn < 2.7.3 has no sm100 / sm120 kernels
        arch_ok, why = flash_support(pkg, g.compute_capability, info.version if info.installed else None)
        code = impl
        if not arch_ok:
            if info.installed:
                # transformers does not check the GPU when the package is installed: an explicit
                # attn_implementation fails only at the first forward pass
                out.append(
                    Verdict(
                        s,
                        "warn",
                        f"{pkg} {info.version} is installed but {why}; "
                        f"attn_implementation={impl!r} would fail at run time",
                        f"do not request {impl} here (cudaload will not pick it), or uninstall {pkg}",
                        code=code,
                    )
                )
            else:
                out.append(Verdict(s, "info", f"{impl}: not for this GPU ({why})", code=code))
        elif info.usable:
            # the support sentence carries caveats (flash-attn-4 on sm8x: inference only)
            out.append(
                Verdict(
                    s,
                    "ok",
                    f"{impl} usable ({pkg} {info.version or ''})".replace(" )", ")") + f": {why}",
                    code=code,
                )
            )
        elif info.installed:
            out.append(
                Verdict(
                    s,
                    "fail",
                    f"{impl}: {pkg} {info.version} is installed but broken: {info.reason}",
                    f"reinstall {pkg} built for this torch/CUDA",
                    code=code,
                )
            )
        else:
            out.append(
                Verdict(
                    s,
                    "info",
                    f"{impl} would run here ({why}) but {pkg} {_absent(caps, pkg)}",
                    f"pip install {pkg}",
                    code=code,
                )
            )
    return out


def _bitsandbytes_verdict(caps: Capabilities, g: GPU, s: str) -> Verdict:
    """bitsandbytes on this GPU: not for it, its native library loads, dead, or not installed."""
    bnb_ok, why = bitsandbytes_support(g.compute_capability, caps.cpu_arch)
    bnb = caps.package("bitsandbytes")
    if not bnb_ok:
        return Verdict(
            s,
            "info" if not bnb.installed else "warn",
            f"bitsandbytes: {why}",
            "use fp16/bf16 weights here" if bnb.installed else None,
            code="bitsandbytes",
        )
    if bnb.usable:
        return Verdict(
            s, "ok", f"bitsandbytes {bnb.version} native library loads ({why})", code="bitsandbytes"
        )
    if bnb.installed:
        return Verdict(
            s,
            "fail",
            f"bitsandbytes {bnb.version} installed but its CUDA library is dead: {bnb.reason}",
            "pip install -U bitsandbytes for this torch's CUDA, or set BNB_CUDA_VERSION",
            code="bitsandbytes",
        )
    return Verdict(
        s,
        "info",
        f"int8/nf4 off: bitsandbytes {_absent(caps, 'bitsandbytes')}",
        "pip install 'cudaload[quant]'",
        code="bitsandbytes",
    )


def _kernels_verdict(caps: Capabilities) -> Verdict:
    k = caps.package("kernels")
    cached = len(caps.hub.cached_kernels)
    if not k.installed:
        return Verdict(
            "hub kernels",
            "info",
            f"kernels {_absent(caps, 'kernels')}: Hub kernels are off",
            kernels_fix(k.accepted, k.version if k.installed else None),
            code="kernels",
        )
    if k.in_range is False:
        return Verdict(
            "hub kernels",
            "warn",
            f"kernels {k.version} is outside the range this transformers accepts "
            f"({k.accepted}); transformers treats kernels as unavailable",
            kernels_fix(k.accepted, k.version if k.installed else None),
            code="kernels-out-of-range",
        )
    if not k.usable:
        return Verdict(
            "hub kernels",
            "fail",
            f"kernels {k.version} is broken: {k.reason}",
            "pip install --force-reinstall kernels",
            code="kernels",
        )
    if caps.hub.usable and caps.hub.reachable:
        return Verdict(
            "hub kernels",
            "ok",
            f"kernels {k.version}; the Hub is reachable ({cached} repo(s) cached)",
            code="kernels",
        )
    if cached:
        return Verdict(
            "hub kernels",
            "ok",
            f"kernels {k.version}; Hub not used, {cached} kernel repo(s) cached",
            code="kernels",
        )
    if caps.hub.reachable is None and not caps.hub.offline:
        return Verdict(
            "hub kernels", "info", f"kernels {k.version}; Hub reachability not probed", code="kernels"
        )
    return Verdict(
        "hub kernels",
        "warn",
        f"kernels {k.version} but the Hub is "
        f"{'offline' if caps.hub.offline else 'unreachable'} and no kernel is cached: "
        "use_kernels would fail",
        "fetch kernels once online, or load without Hub kernels",
        code="kernels",
    )


def diagnose(caps: Capabilities) -> Report:
    """Verdicts over a snapshot: what works, what is misconfigured, and the fix (``cudaload doctor``).

    Pure: reads the snapshot only, so a recorded machine or a profile is diagnosed the same way.

    Args:
        caps: the snapshot to judge: :func:`cudaload.detect` for this machine, or :func:`cudaload.hardware`.

    Returns:
        A :class:`Report`: ``verdicts`` (each a :class:`Verdict` with ``subject``, ``status`` ``"ok"`` /
        ``"warn"`` / ``"fail"`` / ``"info"``, ``message``, ``fix`` and a stable ``code``), ``ok`` (False when
        any verdict fails), ``by_code(code)`` and ``render()`` (the text ``cudaload doctor`` prints).

    Raises nothing of its own: what is wrong with the machine is a verdict.
    """
    out: list[Verdict] = []
    if not caps.gpus:
        out.append(Verdict("machine", "info", "no GPU visible: models load on the CPU", code="no-gpu"))
    for g in caps.gpus:
        out.extend(_gpu_verdicts(caps, g))
    if caps.gpus:
        out.append(_kernels_verdict(caps))
    handled = {
        "kernels-out-of-range",
        "bitsandbytes-native",
        "flash-attn-broken",
        "flash-attn-3-broken",
        "flash-attn-4-broken",
    }
    for f in caps.findings:
        if f.code in handled and caps.gpus:
            continue  # already a per-GPU or kernels verdict
        k = caps.package("kernels")
        fix = kernels_fix(k.accepted, k.version) if f.code == "kernels-out-of-range" else f.fix
        # the installation's bytecode is not a device or launch setting: kept apart so that it does not hide
        # the verdict that those look right
        subject = "environment" if f.code == "bytecode-uncached" else "configuration"
        out.append(Verdict(subject, "fail" if f.severity == "error" else "warn", f.message, fix, code=f.code))
    if caps.gpus and not any(v.subject == "configuration" for v in out):
        out.append(
            Verdict(
                "configuration",
                "ok",
                "device order, CUDA_VISIBLE_DEVICES and CUDA state look right",
                code="configuration",
            )
        )
    return Report(verdicts=tuple(out), source=caps.source)
