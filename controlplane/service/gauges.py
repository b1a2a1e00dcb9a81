"""The gauges a scrape sets from what the controller read: the document in force, per
category and parameter, and the live agents, per agent.

Owns ``show_policy`` and ``show_agents``: each clears its series first, so a category no
longer published and an agent whose heartbeat expired leave the gauges instead of
lingering as stale series. It must never read Redis (the controller reads, within the
probe's bounds) nor define a metric (``metrics`` does).
"""

from __future__ import annotations

from agent.policy_document import MODEL_PARAMS, PolicyDocument
from controlplane.service.agents import AgentListing
from controlplane.service.metrics import ControllerMetrics


def show_policy(m: ControllerMetrics, cur: PolicyDocument | None) -> None:
    """The version in force and each of its categories' parameters and samples."""
    # Categories no longer published leave the gauges instead of lingering as stale series.
    m.param.clear()
    m.samples.clear()
    if cur is not None:
        m.policy_version.set(cur.version)
        for name, p in cur.categories.items():
            for field in MODEL_PARAMS:
                m.param.labels(category=name, param=field).set(getattr(p, field))
            m.samples.labels(category=name).set(p.samples)


def show_agents(m: ControllerMetrics, listing: AgentListing) -> None:
    """Each live agent's figures, and the heartbeats left out or refused."""
    # Agents whose heartbeat expired leave the gauges instead of lingering as stale series.
    for gauge in (m.agent_evictor, m.agent_loop_unexpected_errors, *m.per_agent.values()):
        gauge.clear()
    m.agents_not_listed.set(listing.not_listed)
    m.heartbeats_refused.set(listing.refused)
    for a in listing.agents:
        if a.evictor:
            m.agent_evictor.labels(agent=a.id, family=a.evictor).set(1)
        for field, gauge in m.per_agent.items():
            gauge.labels(agent=a.id).set(getattr(a, field))
        for loop, errors in a.loop_unexpected_errors.items():
            m.agent_loop_unexpected_errors.labels(agent=a.id, loop=loop).set(errors)
