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


def test_the_family_selection_says_when_it_first_judges_then_its_reason() -> None:
    waiting = io.StringIO()
    print_shadow_summary({**SHADOW, "window_s": 3600.0}, Console(file=waiting, width=80))
    words = " ".join(waiting.getvalue().split())
    assert "evictor family: not judged yet" in words
    assert "follows a full shadow window, 3600 s)" in words
    reason = "wa holds: best other lru 0.4900 vs 0.5000"
    judged = io.StringIO()
    selection = {"reason": reason, "chosen": "wa"}
    print_shadow_summary({**SHADOW, "selection": selection}, Console(file=judged, width=80))
    assert f"evictor family: {reason}" in judged.getvalue()
