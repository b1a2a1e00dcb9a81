"""The reason a refit gives for publishing nothing reads true at the digits it shows."""

from __future__ import annotations

import pytest

from controlplane.service.refit import shown_below


@pytest.mark.parametrize(
    ("change", "threshold", "shown"),
    [
        (0.0497, 0.05, "0.0497"),  # was "0.050 < change_threshold 0.05"
        (0.049999, 0.05, "0.049999"),
        (0.0123, 0.05, "0.0123"),
        (0.0, 0.05, "0"),
    ],
)
def test_a_change_below_the_threshold_is_shown_below_it(
    change: float, threshold: float, shown: str
) -> None:
    assert shown_below(change, threshold) == shown
    assert float(shown) < threshold
