"""The one version parser the policies share (support, attention, serving)."""

from __future__ import annotations

import pytest

from cudaload.detection.versions import version_tuple


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2.8.3", (2, 8, 3)),
        ("2.8.3.post1", (2, 8, 3)),
        ("5.23.0rc1", (5, 23, 0)),
        ("5.23.0.dev0", (5, 23, 0)),
        ("2.11.0+cu130", (2, 11, 0)),
        ("2.7.4+cu12torch2.6cxx11abiTRUE", (2, 7, 4)),
        ("12", (12,)),
        ("", None),
        (None, None),
        ("dev", None),
    ],
)
def test_version_tuple(text: str | None, expected: tuple[int, ...] | None) -> None:
    assert version_tuple(text) == expected


def test_local_build_suffix_does_not_pass_a_minimum() -> None:
    # the digits of a local suffix are not release numbers: 2.7.2+cu128 is older than 2.7.3
    from cudaload.detection.support import FA2_BLACKWELL_MIN

    v = version_tuple("2.7.2+cu128")
    assert v is not None and v < FA2_BLACKWELL_MIN
