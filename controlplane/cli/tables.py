"""Tables that stay whole at any terminal width: too many columns fold into more tables.

Owns ``FoldedTable``: a table of key columns (always shown) and value columns (one per
policy, capacity, ...). When the value columns do not fit the console, they are split
over several tables, each repeating the key columns, so no cell is ever cut short or
squeezed into a ragged wrap. Also ``print_even`` (a line of prose wrapped into lines of
even length, none left with a lone word) and ``print_titled`` (a table with its title
and caption printed that way, outside it: rich pads a table's own to the table's width
and wraps them there). It must never compute what the cells hold.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from rich.console import Console
from rich.table import Table
from rich.text import Text

Justify = Literal["left", "right"]

_CELL_PADDING = 3
"""What rich adds to a column's content: one space each side and one border line."""


@dataclass(frozen=True)
class Column:
    header: str
    justify: Justify = "right"


@dataclass
class FoldedTable:
    """A table whose value columns fold into as many tables as the width needs."""

    title: str
    keys: list[Column]
    values: list[Column]
    rows: list[tuple[list[str], list[str]]] = field(default_factory=list)

    def add_row(self, keys: list[str], values: list[str]) -> None:
        if len(keys) != len(self.keys) or len(values) != len(self.values):
            raise ValueError("a row must have one cell per column")
        self.rows.append((keys, values))

    def print(self, console: Console) -> None:
        groups = self._groups(console.width)
        for i, group in enumerate(groups):
            suffix = f" ({i + 1}/{len(groups)})" if len(groups) > 1 else ""
            # The title stands above the table, not in it: a table's title wraps at the
            # table's width, and a narrow table would fold it over several lines.
            print_titled(console, self.title + suffix, self._table(group))

    def _width(self, header: str, cells: list[str]) -> int:
        lines = [*header.splitlines(), *cells]
        return max(len(line) for line in lines) + _CELL_PADDING

    def _groups(self, width: int) -> list[list[int]]:
        """Indexes of the value columns of each table, in order, each group as wide as fits
        (at least one column per table)."""
        fixed = 1 + sum(
            self._width(c.header, [r[0][i] for r in self.rows]) for i, c in enumerate(self.keys)
        )
        groups: list[list[int]] = [[]]
        used = fixed
        for j, column in enumerate(self.values):
            w = self._width(column.header, [r[1][j] for r in self.rows])
            if groups[-1] and used + w > width:
                groups.append([])
                used = fixed
            groups[-1].append(j)
            used += w
        return groups

    def _table(self, group: list[int]) -> Table:
        table = Table()
        for c in self.keys:
            table.add_column(c.header, justify=c.justify, no_wrap=True)
        for j in group:
            table.add_column(self.values[j].header, justify=self.values[j].justify, no_wrap=True)
        for keys, values in self.rows:
            table.add_row(*keys, *(values[j] for j in group))
        return table


def print_even(console: Console, text: str, *, style: str = "", highlight: bool = True) -> None:
    """Print ``text`` (rich markup) in as few lines as the console's width allows, each
    as long as the others as far as words allow, so the last is never a lone word; no
    line ends in a space."""
    line = console.render_str(text, highlight=highlight)
    starts = _even_breaks(line.plain.split(" "), console.width, " ")
    if starts:
        pieces = line.divide(o for start in starts for o in (start - 1, start))
        line = Text("\n").join(pieces[0::2])
    console.print(line, style=style, soft_wrap=True)


def even_wrap(units: list[str], width: int, sep: str = ", ") -> str:
    """``units`` joined by ``sep`` as ``print_even`` lays out words: broken only between
    units, each line but the last ending in ``sep`` without its spaces."""
    joined = sep.join(units)
    starts = _even_breaks(units, width, sep)
    ends = [start - len(sep) for start in starts]
    lines = [joined[a:b] for a, b in zip([0, *starts], [*ends, len(joined)], strict=True)]
    return f"{sep.rstrip()}\n".join(lines)


def print_titled(console: Console, title: str, table: Table, caption: str = "") -> None:
    """Print ``table`` under ``title`` and over ``caption``, both as ``print_even`` does."""
    print_even(console, title, style="table.title", highlight=False)
    console.print(table)
    if caption:
        print_even(console, caption, style="table.caption", highlight=False)


def _even_breaks(units: list[str], width: int, sep: str) -> list[int]:
    """Where lines start (offsets into ``sep.join(units)``, the first line's left out) when
    ``units`` take as few lines of at most ``width`` characters as they can, each line as
    short as that count allows. A unit longer than ``width`` takes a line of its own; a
    line that ends before the last unit ends in ``sep`` without its trailing spaces."""
    last = len(units) - 1

    def breaks(limit: int) -> list[int]:
        starts: list[int] = []
        offset = length = 0  # where the unit starts; how long its line is before it
        for i, unit in enumerate(units):
            tail = len(sep.rstrip()) if i < last else 0
            if length and length + len(sep) + len(unit) + tail > limit:
                starts.append(offset)
                length = 0
            length += (len(sep) if length else 0) + len(unit)
            offset += len(unit) + len(sep)
        return starts

    fewest = breaks(width)
    narrowest = width
    while fewest and narrowest > 1 and len(breaks(narrowest - 1)) == len(fewest):
        narrowest -= 1
    return breaks(narrowest)
