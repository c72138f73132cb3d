"""Which GPUs a CUDA process sees, and in what order: a pure emulation over NVML's device list.

NVML enumerates GPUs in PCI bus order (the numbers nvidia-smi shows). CUDA numbers them by
``CUDA_DEVICE_ORDER``: ``PCI_BUS_ID`` matches NVML, while the default ``FASTEST_FIRST`` puts the device its
heuristic rates fastest first. The integers in ``CUDA_VISIBLE_DEVICES`` index CUDA's order, not NVML's.

``CUDA_VISIBLE_DEVICES`` is parsed the way torch's own NVML-based emulation parses it
(``torch.cuda._parse_visible_devices`` / ``_transform_uuid_to_ordinals``), which mirrors the driver:

- unset: every GPU; set but empty: none.
- integers are read like ``strtoul`` (``"1gpu"`` counts as 1); a negative value (``-1``) or an index past
  the last GPU ends the list there, silently, as CUDA does.
- ``GPU-<uuid>`` entries match by prefix; an ambiguous or unknown prefix ends the list there.
- ``MIG-<uuid>`` (and the old ``MIG-GPU-<uuid>/<gi>/<ci>``) select MIG instances.
- the list's form is fixed by its first entry: after an integer, a UUID entry ends the list, and vice versa.
- a repeated device makes the whole set empty.

Nothing here touches NVML or the environment; ``cudaload.detection.nvml`` supplies the device list.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class MigInstance:
    """A MIG device (one GPU instance + compute instance) on a MIG-enabled GPU."""

    uuid: str  # "MIG-<uuid>" (R470+ drivers)
    gpu_instance: int | None = None
    compute_instance: int | None = None
    name: str | None = None  # e.g. "NVIDIA A100-SXM4-80GB MIG 3g.40gb"
    total_memory: int = 0
    free_memory: int | None = None


@dataclass(frozen=True)
class NvmlDevice:
    """One physical GPU as NVML reports it."""

    nvml_index: int
    name: str
    uuid: str  # "GPU-<uuid>"
    pci_bus_id: str
    compute_capability: tuple[int, int]
    total_memory: int
    free_memory: int | None = None
    cuda_cores: int | None = None
    unified_memory: bool = False
    mig_enabled: bool = False
    mig_instances: tuple[MigInstance, ...] = ()


@dataclass(frozen=True)
class Selected:
    """One CUDA device after ``CUDA_VISIBLE_DEVICES``: a whole GPU or one MIG instance of it."""

    device: NvmlDevice
    mig: MigInstance | None = None


@dataclass(frozen=True)
class Visibility:
    """The outcome of applying ``CUDA_DEVICE_ORDER`` and ``CUDA_VISIBLE_DEVICES`` to NVML's list."""

    selected: tuple[Selected, ...]
    order_guessed: bool  # FASTEST_FIRST over different models: CUDA's order is our emulation of a heuristic
    unmatched: tuple[str, ...] = ()  # the entry that ended the list, and everything after it
    duplicate: str | None = None  # the repeated entry that emptied the set
    ambiguous: str | None = None  # a UUID prefix matching more than one device
    lenient: tuple[str, ...] = ()  # entries accepted only by strtoul's leniency ("1gpu" -> 1)
    hidden_all: bool = False  # set to "" or starting with a negative index: deliberately no GPU
    notes: tuple[str, ...] = field(default_factory=tuple)


def _pci_key(d: NvmlDevice) -> str:
    return d.pci_bus_id.lower()


def cuda_order(
    devices: list[NvmlDevice] | tuple[NvmlDevice, ...], order: str | None
) -> tuple[list[NvmlDevice], bool]:
    """Devices in CUDA's enumeration order, and whether that order is a guess.

    ``FASTEST_FIRST`` (the default) is an undocumented heuristic; we rank by compute capability, then
    CUDA core count, then memory, with PCI bus id breaking ties. When every GPU is the same model
    that collapses to PCI order, which is what CUDA does in practice, so the guess only matters (and is
    only reported) on mixed machines.
    """
    by_pci = sorted(devices, key=_pci_key)
    if (order or "FASTEST_FIRST").strip().upper() == "PCI_BUS_ID":
        return by_pci, False
    ranked = sorted(
        by_pci,
        key=lambda d: (
            -d.compute_capability[0],
            -d.compute_capability[1],
            -(d.cuda_cores or 0),
            -d.total_memory,
            _pci_key(d),
        ),
    )
    mixed = len({(d.name, d.compute_capability) for d in devices}) > 1
    return ranked, mixed


def _strtoul(s: str) -> int:
    """``strtoul``-like prefix parse as torch does it: leading digits (with one sign), else -1."""
    s = s.strip()
    end = 0
    for i, c in enumerate(s):
        if c.isdigit() or (i == 0 and c in "+-"):
            end = i + 1
        else:
            break
    digits = s[:end]
    if digits in ("", "+", "-"):
        return -1
    return int(digits)


def _expand(d: NvmlDevice) -> list[Selected]:
    """What one physical GPU contributes to CUDA's list: itself, or its MIG instances when MIG is on."""
    if d.mig_enabled:
        return [Selected(d, m) for m in d.mig_instances]
    return [Selected(d)]


def resolve(
    devices: list[NvmlDevice] | tuple[NvmlDevice, ...],
    visible: str | None,
    order: str | None = None,
) -> Visibility:
    """Apply ``CUDA_DEVICE_ORDER`` and ``CUDA_VISIBLE_DEVICES`` to NVML's devices (pure)."""
    ordered, guessed = cuda_order(devices, order)
    if visible is None:
        return Visibility(
            selected=tuple(s for d in ordered for s in _expand(d)),
            order_guessed=guessed,
        )
    if visible.strip() == "":
        return Visibility(selected=(), order_guessed=guessed, hidden_all=True)
    entries = [e.strip() for e in visible.split(",")]
    first = entries[0]
    if first.startswith(("GPU-", "MIG-")):
        return _resolve_uuids(ordered, entries, guessed)
    return _resolve_indices(ordered, entries, guessed)


def _resolve_indices(ordered: list[NvmlDevice], entries: list[str], guessed: bool) -> Visibility:
    picked: list[int] = []
    lenient: list[str] = []
    for pos, e in enumerate(entries):
        x = _strtoul(e)
        if x < 0 or x >= len(ordered):
            # "-1" (or any negative first entry) is the usual way to hide every GPU: deliberate, not a typo
            hidden = pos == 0 and x < 0 and e.startswith("-")
            return Visibility(
                selected=tuple(s for i in picked for s in _expand(ordered[i])),
                order_guessed=guessed,
                unmatched=() if hidden else tuple(entries[pos:]),
                lenient=tuple(lenient),
                hidden_all=hidden,
            )
        if x in picked:
            return Visibility(selected=(), order_guessed=guessed, duplicate=e, lenient=tuple(lenient))
        if e.lstrip("+") != str(x):
            lenient.append(e)
        picked.append(x)
    return Visibility(
        selected=tuple(s for i in picked for s in _expand(ordered[i])),
        order_guessed=guessed,
        lenient=tuple(lenient),
    )


def _mig_matches(m: MigInstance, d: NvmlDevice, entry: str) -> bool:
    if entry.startswith("MIG-GPU-"):
        # legacy form MIG-GPU-<gpu uuid>/<gpu instance>/<compute instance>
        parts = entry[len("MIG-") :].split("/")
        if len(parts) != 3 or not d.uuid.startswith(parts[0]):
            return False
        try:
            return (m.gpu_instance, m.compute_instance) == (int(parts[1]), int(parts[2]))
        except ValueError:
            return False
    return m.uuid.startswith(entry)


def _resolve_uuids(ordered: list[NvmlDevice], entries: list[str], guessed: bool) -> Visibility:
    picked: list[Selected] = []
    prefix = "GPU-" if entries[0].startswith("GPU-") else "MIG-"
    for pos, e in enumerate(entries):
        rest = tuple(entries[pos:])
        if not e.startswith(prefix):
            return Visibility(selected=tuple(picked), order_guessed=guessed, unmatched=rest)
        if prefix == "GPU-":
            hits = [Selected(d) for d in ordered if d.uuid.startswith(e)]
            # a UUID naming a MIG-enabled GPU: CUDA exposes its MIG instances, not the whole GPU
            hits = [s for h in hits for s in _expand(h.device)] if len(hits) == 1 else hits
            matched_one = len({s.device.uuid for s in hits}) == 1
        else:
            hits = [Selected(d, m) for d in ordered for m in d.mig_instances if _mig_matches(m, d, e)]
            matched_one = len(hits) == 1
        if not hits:
            return Visibility(selected=tuple(picked), order_guessed=guessed, unmatched=rest)
        if not matched_one:
            return Visibility(selected=tuple(picked), order_guessed=guessed, unmatched=rest, ambiguous=e)
        if any(h in picked for h in hits):
            return Visibility(selected=(), order_guessed=guessed, duplicate=e)
        picked.extend(hits)
    return Visibility(selected=tuple(picked), order_guessed=guessed)
