"""How the CLI writes numbers: changes with their sign, sizes once each."""

from __future__ import annotations

import pytest

from controlplane.cli.common import signed_percent, unique


@pytest.mark.parametrize(
    ("change", "text"),
    [
        (-0.0001, "+0.0%"),
        (-0.0004999, "+0.0%"),
        (-0.0005001, "-0.1%"),
        (0.0, "+0.0%"),
        (0.123, "+12.3%"),
        (-0.5, "-50.0%"),
    ],
)
def test_a_change_is_signed_and_never_minus_zero(change: float, text: str) -> None:
    assert signed_percent(change) == text


def test_repeats_are_dropped_in_place() -> None:
    assert unique([3, 1, 3, 2, 1]) == [3, 1, 2]
