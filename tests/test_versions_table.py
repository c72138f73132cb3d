"""Per-release facts cudaload tables (issue 41): each table row is checked against the installed transformers
on every test set, and the rows for other releases against the values read from their released wheels."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import pytest

from cudaload.detection.packages import kernels_fix, transformers_accepting
from cudaload.detection.versions import kernels_range_for
from cudaload.hub_kernels.preflight import attention_kernel_version


def _installed() -> tuple[str, str]:
    import torch
    import transformers

    return transformers.__version__, torch.__version__


def test_kernels_window_of_the_installed_release_is_tabled() -> None:
    from transformers.utils import import_utils

    tv, _ = _installed()
    assert kernels_range_for(tv) == (import_utils.KERNELS_MIN_VERSION, import_utils.KERNELS_MAX_VERSION)


def _source_table(torch_newer: bool) -> dict[str, int]:
    """The installed release's FLASH_ATTN_KERNEL_VERSIONS evaluated from its source, for a torch at least 2.10
    (``torch_newer``) or older: the one conditional transformers writes there is on the torch version."""
    spec = importlib.util.find_spec("transformers.modeling_flash_attention_utils")
    assert spec is not None and spec.origin
    tree = ast.parse(Path(spec.origin).read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "FLASH_ATTN_KERNEL_VERSIONS" for t in node.targets
        ):
            assert isinstance(node.value, ast.Dict)
            out: dict[str, int] = {}
            for k, v in zip(node.value.keys, node.value.values, strict=True):
                assert isinstance(k, ast.Constant)
                if isinstance(v, ast.IfExp):
                    test = ast.unparse(v.test)
                    assert (
                        'is_torch_greater_or_equal("2.10"' in test
                        or "is_torch_greater_or_equal('2.10'" in test
                    )
                    v = v.body if torch_newer else v.orelse
                assert isinstance(v, ast.Constant)
                out[str(k.value)] = int(v.value)
            return out
    pytest.skip("this transformers has no FLASH_ATTN_KERNEL_VERSIONS (5.17 matches by name)")


@pytest.mark.parametrize("torch_version", ["2.13.0", "2.9.1"])
def test_attention_kernel_versions_of_the_installed_release_are_tabled(torch_version: str) -> None:
    tv, _ = _installed()
    table = _source_table(torch_newer=torch_version == "2.13.0")
    assert table, "empty table"
    for repo, version in table.items():
        assert attention_kernel_version(repo, tv, torch_version) == version, repo
    assert attention_kernel_version("someone/else", tv, torch_version) == 1


def test_attention_kernel_version_live_on_the_installed_torch() -> None:
    from transformers.integrations import hub_kernels as hk

    tv, torch_v = _installed()
    for repo in (
        "kernels-community/flash-attn2",
        "kernels-community/flash-attn3",
        "kernels-community/flash-attn4",
        "kernels-community/vllm-flash-attn3",
        "x/y",
    ):
        assert attention_kernel_version(repo, tv, torch_v) == hk.get_attn_kernel_version(repo), repo


@pytest.mark.parametrize(
    ("tv", "torch_v", "expected"),
    [
        # from the released wheels' modeling_flash_attention_utils.py (see the table's comment)
        ("5.25.0", "2.13.0", {"flash-attn2": 4, "flash-attn3": 2, "flash-attn4": 1, "vllm-flash-attn3": 1}),
        ("5.25.0", "2.9.1", {"flash-attn2": 4, "flash-attn3": 2, "flash-attn4": 1}),
        ("5.24.0", "2.13.0", {"flash-attn2": 4, "flash-attn3": 1, "flash-attn4": 0}),
        ("5.22.0", "2.9.1", {"flash-attn2": 3, "flash-attn3": 1, "flash-attn4": 0}),
        ("5.21.1", "2.13.0", {"flash-attn2": 3, "flash-attn3": 1, "flash-attn4": 0}),
        ("5.20.0", "2.13.0", {"flash-attn2": 3}),
        ("5.18.0", "2.11.0", {"flash-attn2": 3, "flash-attn4": 0}),
        ("5.17.0", "2.11.0", {"flash-attn2": 3, "flash-attn4": 0, "flash-attn3": 1}),
    ],
)
def test_attention_kernel_versions_per_release(tv: str, torch_v: str, expected: dict[str, int]) -> None:
    for name, version in expected.items():
        assert attention_kernel_version(f"kernels-community/{name}", tv, torch_v) == version, name


@pytest.mark.parametrize(
    ("tv", "window"),
    [
        ("5.25.0", ("0.19.1", "0.20.0")),
        ("5.24.0", ("0.18.2", "0.19.0")),
        ("5.23.0", ("0.18.2", "0.19.0")),
        ("5.22.2", ("0.17.2", "0.18.0")),
        ("5.20.0", ("0.17.2", "0.18.0")),
        ("5.19.0", ("0.17.0", "0.18.0")),
        ("5.18.0", ("0.17.0", "0.18.0")),
        ("5.17.0", ("0.16.0", "0.17.0")),
    ],
)
def test_kernels_window_per_release(tv: str, window: tuple[str, str]) -> None:
    assert kernels_range_for(tv) == window


def test_kernels_fix_upgrades_whichever_side_is_old() -> None:
    # kernels older than the window: upgrade kernels
    assert kernels_fix(">=0.19.1,<0.20.0", "0.18.3") == "pip install -U 'kernels>=0.19.1,<0.20.0'"
    # kernels newer than the window: upgrade transformers to the releases that accept it, never a downgrade first
    fix = kernels_fix(">=0.17.2,<0.18.0", "0.19.1")
    assert fix.startswith("pip install -U 'transformers[kernels]>=5.25,<6'"), fix
    fix = kernels_fix(">=0.17.2,<0.18.0", "0.18.3")
    assert fix.startswith("pip install -U 'transformers[kernels]>=5.23,<5.25'"), fix
    # nothing installed: the window of this transformers
    assert kernels_fix(">=0.16.0,<0.17.0") == "pip install 'kernels>=0.16.0,<0.17.0'"
    assert kernels_fix(None).startswith("pip install 'cudaload[kernels]'")


def test_transformers_accepting() -> None:
    assert transformers_accepting("0.19.1") == ">=5.25,<6"
    assert transformers_accepting("0.18.3") == ">=5.23,<5.25"
    assert transformers_accepting("0.17.2") == ">=5.20,<5.23"
    assert transformers_accepting("0.17.1") == ">=5.18,<5.20"
    assert transformers_accepting("0.16.2") == ">=5.17,<5.18"
    assert transformers_accepting("0.15.0") is None
