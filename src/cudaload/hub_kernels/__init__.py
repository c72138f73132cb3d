"""Hub kernels: what is cached, whether a kernel can run here, and the KernelConfig plan.

Layers, in the architecture's order, one module each:

* ``cache`` - :func:`scan_cache` (filesystem only, used by ``detect()``): the Hub kernel repos in the local cache, their
  build variants and declared CUDA archs.
* ``preflight`` and ``planning`` - pure from a :class:`~cudaload.capabilities.Capabilities`:
  :func:`check_attention_kernel` (the attention policy's Hub-kernel candidates) and :func:`plan_kernels` (the
  ``use_kernels`` mapping that goes into ``Plan.kernels``). No network, no torch: what ``kernels`` would reject at load time (no build variant,
  an arch the GPU is not, a revision absent while offline, kernels out of transformers' range, an untrusted
  repo) is rejected here with its reason instead.
* ``applying`` - :func:`build_kernel_config` / :func:`kernel_mapping` / :func:`apply_kernels`: turn the plan
  into live ``transformers.KernelConfig`` / ``kernels`` objects, fresh each call.
* ``lock`` - :func:`write_lock` / :func:`read_lock`: pin the plan's kernels to commits.

Trust: no Hub code runs unless the user allowed the repo (``org/name``) or its publisher (``org/*``), through
``trust=`` or ``CUDALOAD_TRUST_KERNELS``. Local kernels (a directory the user names) are the user's own code.

Every public name stays importable from ``cudaload.hub_kernels``.
"""

from .applying import apply_kernels, build_kernel_config, kernel_mapping
from .cache import scan_cache
from .lock import read_lock, write_lock
from .planning import (
    DEFAULT_CUDA_KERNELS,
    KERNELS_PLAN_VERSION,
    KernelSpec,
    plan_kernels,
    registered_layers,
)
from .preflight import (
    _target,
    archs_cover,
    attention_kernel_version,
    check_attention_kernel,
    check_variant,
    is_local_kernel,
    kernels_device,
    kernels_package_reasons,
    needs_hub_answer,
    preflight_hub_kernel,
    trusted,
)

__all__ = [
    "DEFAULT_CUDA_KERNELS",
    "KERNELS_PLAN_VERSION",
    "KernelSpec",
    "_target",
    "apply_kernels",
    "archs_cover",
    "attention_kernel_version",
    "build_kernel_config",
    "check_attention_kernel",
    "check_variant",
    "is_local_kernel",
    "kernel_mapping",
    "kernels_device",
    "kernels_package_reasons",
    "needs_hub_answer",
    "plan_kernels",
    "preflight_hub_kernel",
    "read_lock",
    "registered_layers",
    "scan_cache",
    "trusted",
    "write_lock",
]
