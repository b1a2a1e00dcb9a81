"""``kvwise demo``'s final shadow summary at 80 columns: each caption starts its own
line, so the refit guard's verdict is not glued to the hit-ratio caption."""

from __future__ import annotations

import io

from rich.console import Console

from controlplane.cli.demo_cmd import print_shadow_summary

POINT = {"multiple": 1.0, "capacity": 100, "hit_ratio": 0.5, "ci_low": 0.4, "ci_high": 0.6}
SHADOW = {
    "enabled": True,
    "rate": 0.05,
    "ladder": [1.0],
    "groups": [
        {
            "capacity": 100,
            "sampled_accesses": 1000,
            "observed_hit_ratio": 0.5,
            "sampled_observed_hit_ratio": 0.5,
            "curves": [{"policy": "lru", "points": [POINT]}],
        }
    ],
    "guard": {"reason": "passed: candidate's shadow hit ratio 0.51 against 0.50"},
}


def test_each_caption_starts_a_line() -> None:
    out = io.StringIO()
    print_shadow_summary(SHADOW, Console(file=out, width=80))
    lines = [line.rstrip() for line in out.getvalue().splitlines()]
    assert max(len(line) for line in lines) <= 80
    assert any(line.startswith("the workers' own hit ratio 0.500") for line in lines)
    assert any(line.startswith("refit guard: passed:") for line in lines), lines
