"""What a command prints for a terminal of a given width: the checks that it reads well
there, lines that fit, end in no space, and none of prose (anything outside a table's
borders) left holding a lone word of a sentence wrapped too late."""

from __future__ import annotations

BORDERS = "┏┃┡│└┌├╭╰"
"""Characters a line of a rich table starts with."""


def assert_reads_at(width: int, out: str) -> None:
    """``out`` fits ``width`` columns, no line ends in a space, and every line outside a
    table holds more than one word."""
    lines = out.splitlines()
    assert [line for line in lines if len(line) > width] == []
    assert [line for line in lines if line != line.rstrip()] == []
    prose = [line for line in lines if line and line[0] not in BORDERS]
    assert [line for line in prose if " " not in line.strip()] == []
