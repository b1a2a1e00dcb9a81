"""Wire values for tests: an agent's heartbeat with every field set, event batches built
from plain columns, and policy documents at the agent's bounds (the largest legitimate
one, and ones cheap in bytes but rich in values)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from agent.policy_document import CategoryParams, PolicyDocument
from agent.settings import AgentSettings
from agent.wire import COLUMNS, MAX_CATEGORY_NAME_CHARS, AgentStatus, EventBatch

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


_SETTINGS = AgentSettings.model_fields  # the defaults, whatever the environment says
MAX_POLICY_BYTES: int = _SETTINGS["max_policy_bytes"].default
MAX_POLICY_CATEGORIES: int = _SETTINGS["max_policy_categories"].default

FULL_PARAMS = CategoryParams(
    rate=0.1234567890123456,
    p_reuse=0.1234567890123456,
    life_s=1234.567890123456,
    samples=10**12,
    fit_quality=0.1234567890123456,
    source="override",
)
"""A category's parameters, every one set, at full precision: the longest to write."""


def largest_policy(name_char: str = "a") -> PolicyDocument:
    """The largest legitimate document: ``MAX_POLICY_CATEGORIES`` categories, each named
    with the most characters (a number, ``name_char`` repeated, a reuse class's ``/re``:
    ``MAX_CATEGORY_NAME_CHARS`` in all), each of ``FULL_PARAMS``, and the longest note."""
    longest = MAX_CATEGORY_NAME_CHARS - 5 - len("/re")
    names = (f"{i:05d}{name_char * longest}/re" for i in range(MAX_POLICY_CATEGORIES))
    return PolicyDocument(version=1, categories=dict.fromkeys(names, FULL_PARAMS), note="n" * 500)


def filled(head: bytes, unit: bytes, tail: bytes, size: int = MAX_POLICY_BYTES) -> bytes:
    """``head``, as many ``unit`` as fit (comma-separated), then ``tail``: at most ``size``
    bytes. ``filled(b'{"version":1,"x":[', b"[]", b"]}")`` is 2 MiB of empty arrays."""
    count = (size - len(head) - len(tail) + 1) // (len(unit) + 1)
    return head + b",".join([unit] * count) + tail
