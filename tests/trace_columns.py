"""``columns``: a trace's contents as plain values, for exact comparisons between traces."""

from __future__ import annotations

from dataclasses import fields
from typing import Any

import numpy as np

from controlplane.traces.model import Trace

NOT_CONTENT = ("name", "skipped_lines")
"""Fields that say where a trace came from, not what it holds."""


def columns(trace: Trace) -> dict[str, Any]:
    """Every array and scalar a reader fills (arrays as lists), by field name."""
    out: dict[str, Any] = {}
    for f in fields(trace):
        if f.name not in NOT_CONTENT:
            value = getattr(trace, f.name)
            out[f.name] = value.tolist() if isinstance(value, np.ndarray) else value
    return out
