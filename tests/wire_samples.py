"""Wire values for tests: an agent's heartbeat with every field set."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from agent.wire import AgentStatus

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
