"""What every kvwise figure shares: the optional matplotlib import, the size, saving.

Owns ``PlotsUnavailable`` (matplotlib is not installed: the ``plot`` extra is missing),
``Size`` (a figure's size in pixels, which is what the written PNG measures),
``figure`` (an empty figure of side-by-side axes) and ``save`` (PNG only). Figures are
built with matplotlib's object API (``Figure``), never ``pyplot``: no global state, no
backend to choose, nothing ever opens a window, and nothing has to be closed. Layout is
"constrained", so labels stay inside the figure without changing its size. It must never
compute what a figure shows.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

DPI = 100
"""Pixels per inch of every figure: a size in pixels is ``inches * DPI``."""


class PlotsUnavailable(RuntimeError):
    """matplotlib cannot be imported: the ``plot`` extra is not installed."""

    def __init__(self) -> None:
        super().__init__(
            "plots need matplotlib, kvwise's plot extra: pip install '.[plot]' in a kvwise checkout"
        )


@dataclass(frozen=True)
class Size:
    """A figure's size in pixels."""

    width: int
    height: int

    def __post_init__(self) -> None:
        if not (100 <= self.width <= 10_000 and 100 <= self.height <= 10_000):
            raise ValueError(f"a figure is 100 to 10,000 pixels a side, got {self}")

    def __str__(self) -> str:
        return f"{self.width}x{self.height}"


DEFAULT_SIZE = Size(1000, 625)


def check_available() -> None:
    """Raise ``PlotsUnavailable`` now rather than after a long computation."""
    try:
        import matplotlib  # noqa: F401
    except ImportError as exc:
        raise PlotsUnavailable() from exc


def check_path(path: Path) -> None:
    """Raise ``OSError`` unless ``path`` names a PNG (the only format written) that can be
    written: its folder exists and takes a file (a trial one, removed at once)."""
    if path.suffix.lower() != ".png":
        raise OSError(f"{path}: plots are written as .png")
    if path.is_dir():
        raise OSError(f"{path}: is a folder")
    check_folder(path.parent, path)


def check_folder(folder: Path, named: Path | None = None) -> None:
    """Raise ``OSError`` (naming ``named``, by default ``folder``) unless ``folder`` is an
    existing folder that takes a file. No folder is ever created here: a typo in a path
    should not leave a tree behind."""
    named = named or folder
    if not folder.is_dir():
        raise OSError(f"{named}: folder {folder} does not exist")
    try:
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as exc:
        raise OSError(
            f"{named}: cannot create a file in {folder} ({exc.strerror or exc})"
        ) from None


def figure(columns: int = 1, *, size: Size = DEFAULT_SIZE) -> tuple[Figure, list[Axes]]:
    """An empty figure of ``size`` pixels with ``columns`` side-by-side axes."""
    check_available()
    from matplotlib.figure import Figure

    fig = Figure(figsize=(size.width / DPI, size.height / DPI), dpi=DPI, layout="constrained")
    axes = fig.subplots(1, columns, squeeze=False)
    return fig, list(axes[0])


def save(fig: Figure, path: Path, title: str = "") -> Path:
    """Write ``fig`` to ``path`` as a PNG of exactly its size (its folder must exist)."""
    check_path(path)
    if title:
        fig.suptitle(title)
    fig.savefig(path, format="png", dpi=DPI)
    return path
