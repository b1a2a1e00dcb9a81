"""Tables that stay whole at any terminal width: too many columns fold into more tables.

Owns ``FoldedTable``: a table of key columns (always shown) and value columns (one per
policy, capacity, ...). When the value columns do not fit the console, they are split
over several tables, each repeating the key columns, so no cell is ever cut short or
squeezed into a ragged wrap. It must never compute what the cells hold.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from rich.console import Console
from rich.table import Table

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
            console.print(self.title + suffix, style="table.title", highlight=False)
            console.print(self._table(group))

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
