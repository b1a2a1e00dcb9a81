"""Category names -> dense codes, one growing table per agent.

Owns the mapping the recorder writes into events (codes) and the publisher sends with
each batch (names). Codes never change once given; the table only grows, up to a bound,
after which new names share the ``other`` code, so a flood of distinct labels cannot grow
memory or the batches. A name longer than the wire allows (``MAX_CATEGORY_NAME_CHARS``:
the controller refuses longer ones) shares ``other`` too. It must never do I/O.
"""

from __future__ import annotations

from collections.abc import Callable

from agent.wire import MAX_CATEGORY_NAME_CHARS

OTHER_CATEGORY = "other"
"""Shared name of the categories seen after the table is full."""
REUSED_SUFFIX = "/re"
"""Name suffix of a category's reuse class (``KVWISE_REUSE_CLASSES``): ``w/re`` holds the
blocks a request of ``w`` found cached, ``w`` those it inserted."""


def reused_name(name: str) -> str:
    """The name of category ``name``'s reuse class (``name`` itself if it is one)."""
    return name if name.endswith(REUSED_SUFFIX) else name + REUSED_SUFFIX


def base_name(name: str) -> str:
    """The category a reuse class belongs to (``name`` itself if it is no reuse class)."""
    return name.removesuffix(REUSED_SUFFIX)


class CategoryTable:
    """Append-only name <-> code table. Written by the engine thread only; other threads
    read ``names`` (a growing list: a snapshot is ``tuple(table.names)``).

    ``on_new(name, code)`` is called once per new name, after it got its code.
    """

    __slots__ = ("_codes", "_on_new", "max_size", "names")

    def __init__(
        self, max_size: int = 1024, on_new: Callable[[str, int], None] | None = None
    ) -> None:
        if max_size < 2:
            raise ValueError("max_size must be >= 2 (one real category plus 'other')")
        self.max_size = max_size
        self.names: list[str] = []
        self._codes: dict[str, int] = {}
        self._on_new = on_new

    def code(self, name: str) -> int:
        """The code of ``name``, assigning the next one on first sight."""
        code = self._codes.get(name)
        if code is not None:
            return code
        full = len(self.names) >= self.max_size - 1
        if (full or len(name) > MAX_CATEGORY_NAME_CHARS) and name != OTHER_CATEGORY:
            return self.code(OTHER_CATEGORY)
        code = len(self.names)
        # Append before publishing the code, so a reader never sees a code past the list.
        self.names.append(name)
        self._codes[name] = code
        if self._on_new is not None:
            self._on_new(name, code)
        return code

    def name(self, code: int) -> str:
        return self.names[code]

    def snapshot(self) -> tuple[str, ...]:
        return tuple(self.names)

    def __len__(self) -> int:
        return len(self.names)
