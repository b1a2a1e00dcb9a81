"""Wire values for tests: an agent's heartbeat with every field set, and event batches
built from plain columns."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from agent.wire import COLUMNS, AgentStatus, EventBatch

FULL_STATUS = AgentStatus(
    id="w1",
    engine="vllm",
    capacity=1000,
    applied_version=1,
    events_sent=10,
    events_dropped=2,
    hits=3,
    accesses=9,
    hit_ratio=1 / 3,
    rejected=1,
    last_rejection="v3: policy: default.rate: bad",
    started_at=1.0,
    updated_at=2.0,
)
"""Worker ``w1`` after a few requests and one refused policy."""


def agent_status(**changes: Any) -> AgentStatus:
    """``FULL_STATUS`` with ``changes``."""
    return replace(FULL_STATUS, **changes)


_NO_PREVIOUS: dict[str, ArrayLike] = {
    "category": 0,
    "offset": 0,
    "prev_ts": np.nan,
    "prev_category": -1,
}
"""The columns ``event_batch`` fills when not given: category 0 at offset 0, no
previous access."""


def event_batch(
    *,
    worker: str = "w",
    seq: int = 1,
    epoch: str = "e",
    categories: tuple[str, ...] = ("a",),
    **columns: ArrayLike,
) -> EventBatch:
    """Batch ``seq`` of ``worker`` holding ``columns`` (``ts`` is needed; the others
    default as ``_NO_PREVIOUS`` says), each a sequence or one value for every event,
    converted to its wire dtype."""
    given = {**_NO_PREVIOUS, **columns}
    n = np.size(given["ts"])
    cols = {name: _column(given[name], dt, n) for name, dt in COLUMNS}
    return EventBatch(worker=worker, seq=seq, epoch=epoch, categories=categories, **cols)


def _column(value: ArrayLike, dtype: np.dtype[Any], n: int) -> np.ndarray[Any, Any]:
    """``value`` as ``n`` events' column of ``dtype`` (one value: repeated)."""
    return np.full(n, value, dtype) if np.ndim(value) == 0 else np.asarray(value, dtype)
