"""What every plot shares: a headless figure and saving it.

Owns the backend choice (Agg: no display needed) and the file format rules. It must
never compute what it draws.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # after the backend is chosen


def figure(columns: int, *, width: float = 5.0, height: float = 3.8) -> tuple[Any, list[Any]]:
    """A figure with ``columns`` side-by-side axes."""
    fig, axes = plt.subplots(1, columns, figsize=(width * columns, height), squeeze=False)
    return fig, list(axes[0])


def save(fig: Any, path: Path, title: str = "") -> None:
    """Write ``fig`` as a PNG to ``path`` and close it."""
    if path.suffix.lower() != ".png":
        plt.close(fig)
        raise OSError(f"{path}: plots are written as .png")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    try:
        fig.savefig(path, dpi=120)
    finally:
        plt.close(fig)
