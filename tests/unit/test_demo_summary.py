"""``kvwise demo``'s output at 80 columns: the final summary (each shadow caption starts
its own line, so the refit guard's verdict is not glued to the hit-ratio caption) and
the live frame, which fits the terminal's height with the fitted parameters first."""

from __future__ import annotations

import io
from typing import Any

import pytest
from rich.console import Console

from controlplane.cli.demo_cmd import _categories_table, _render, print_summary

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
    print_summary(_snapshot(), Console(file=out, width=80))
    lines = [line.rstrip() for line in out.getvalue().splitlines()]
    assert max(len(line) for line in lines) <= 80
    assert any(line.startswith("the workers' own hit ratio 0.500") for line in lines)
    assert any(line.startswith("refit guard: passed:") for line in lines), lines


def test_the_family_selection_says_when_it_first_judges_then_its_reason() -> None:
    waiting = io.StringIO()
    print_summary(_snapshot({**SHADOW, "window_s": 3600.0}), Console(file=waiting, width=80))
    words = " ".join(waiting.getvalue().split())
    assert "evictor family: not judged yet" in words
    assert "needs a full shadow window (3,600 s of traffic; KVWISE_SHADOW_WINDOW_S" in words
    reason = "wa holds: best other lru 0.4900 vs 0.5000"
    judged = io.StringIO()
    selection = {"reason": reason, "chosen": "wa"}
    print_summary(_snapshot({**SHADOW, "selection": selection}), Console(file=judged, width=80))
    assert f"evictor family: {reason}" in judged.getvalue()


def _snapshot(shadow: dict[str, Any] = SHADOW) -> dict[str, Any]:
    agent = {"applied_version": 3, "hit_ratio": 0.41, "events_sent": 1000, "events_dropped": 0}
    params = {"p_reuse": 0.8, "rate": 0.05, "life_s": 30.0, "source": "fit"}
    return {
        "policy_version": 3,
        "capacity_blocks": 5000,
        "dashboard": "http://127.0.0.1:8080/ui/",
        "redis": "redis://127.0.0.1:6379/0",
        "speed": 10.0,
        "agents": [{**agent, "id": f"w{i}", "evictor": "wa"} for i in range(4)],
        "shadow": shadow,
        "categories": [
            {"name": f"chat_{i}", "samples": 100 * i, "published": params, "fit_quality": 0.05}
            for i in range(12)
        ],
    }


@pytest.mark.parametrize("rows", [24, 40, 80])
def test_the_live_frame_fits_the_terminal_with_the_fitted_parameters_first(rows: int) -> None:
    console = Console(file=io.StringIO(), width=80, height=rows)
    frame, whole = _render(_snapshot(), console)
    lines = console.render_lines(frame)
    text = "\n".join("".join(segment.text for segment in line) for line in lines)
    assert len(lines) < rows
    assert "Fitted parameters per category" in text and "chat_11" in text
    shows_everything = "What each policy would" in text
    assert shows_everything == (rows == 80) == whole
    assert ("a taller terminal shows more" in text) == (not shows_everything)


def test_the_summary_holds_everything_the_live_frame_left_out() -> None:
    out = io.StringIO()
    print_summary(_snapshot(), Console(file=out, width=80))
    text = out.getvalue()
    for part in ("Workers", "What each policy would", "Fitted parameters", "chat_11"):
        assert part in text
    assert "a taller terminal shows more" not in text


def test_the_fitted_parameters_headers_stand_on_one_line_at_80_columns() -> None:
    """The header "mean reuse s" folded into two lines, an empty row above the others."""
    snap = _snapshot()
    widest = {"p_reuse": 0.71, "rate": 0.5882, "life_s": 0.1, "source": "override"}
    snap["categories"] = [
        {"name": "text_10", "samples": 95_027, "published": widest, "fit_quality": 0.028}
    ]
    out = io.StringIO()
    table, _ = _categories_table(snap)
    Console(file=out, width=80).print(table)
    lines = out.getvalue().splitlines()
    top = next(i for i, line in enumerate(lines) if line.startswith("┏"))
    assert lines[top + 2].startswith("┡"), lines[top : top + 4]
    assert "reuse s" in lines[top + 1]


def test_an_80x24_terminal_shows_the_workers_beside_the_top_categories() -> None:
    """At 24 rows the live view showed the fitted parameters alone: not the workers, wa
    beside stock LRU with each one's applied version, which the demo is there to show."""
    console = Console(file=io.StringIO(), width=80, height=24)
    frame, whole = _render(_snapshot(), console)
    lines = console.render_lines(frame)
    text = "\n".join("".join(segment.text for segment in line) for line in lines)
    assert len(lines) < 24 and not whole
    assert "Workers (synthetic" in text and all(f"w{i} " in text for i in range(4))
    assert "(top 5 by samples)" in text and "chat_11" in text and "chat_6" not in text
    assert "a taller terminal shows more: the shadow curves, more categories" in text
