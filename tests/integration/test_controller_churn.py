"""What the controller holds in memory per worker and per category does not grow with
their churn: each piece is dropped once its worker or category is gone. Each test failed
before its fix."""

from __future__ import annotations

import pytest
import redis

from agent.wire import Keys
from controlplane.service.agents import AgentReader
from controlplane.service.ingest import Ingestor
from controlplane.service.ingest_judge import Refusal
from controlplane.service.ingest_settings import IngestSettings
from controlplane.service.settings import ControllerSettings
from tests.integration.controller_fixtures import controller

pytestmark = pytest.mark.integration


def test_forgetting_a_worker_drops_its_cursor_and_what_was_told_of_its_stream(
    redis_url: str, key_prefix: str
) -> None:
    keys = Keys(key_prefix)
    settings = IngestSettings.from_settings(ControllerSettings(consumer_group="g"), "c")
    ingestor = Ingestor(redis.Redis.from_url(redis_url), keys, lambda batch: 0, settings)
    stream = keys.events_stream("w1").encode()
    ingestor._streams.append(stream)
    ingestor._cursors[stream] = b"0-0"
    ingestor._schema1_told.first(stream)
    ingestor.dead_letters.tell(stream, Refusal(b"1-0", "bad", "decode", {}))
    ingestor.forget("w1")
    assert not (ingestor._streams or ingestor._cursors or ingestor._schema1_told)
    assert not ingestor.dead_letters._told


def test_an_unreadable_heartbeat_is_forgotten_once_its_key_expires(
    redis_url: str, key_prefix: str
) -> None:
    r = redis.Redis.from_url(redis_url)
    keys = Keys(key_prefix)
    reader = AgentReader(r, keys, max_agents=10)
    r.set(keys.agent("w1"), b"not a heartbeat")
    assert reader.read().agents == [] and len(reader._told) == 1
    r.delete(keys.agent("w1"))
    assert reader.read().agents == [] and len(reader._told) == 0


def test_categories_no_longer_published_leave_the_gauges(redis_url: str, key_prefix: str) -> None:
    with controller(redis_url, key_prefix) as c:
        value = c.metrics.registry.get_sample_value
        param, samples = {"category": "gone", "param": "p_reuse"}, {"category": "gone"}
        c.store.set_override("gone", {"p_reuse": 0.5})
        c.refresh_gauges()
        assert value("kvwise_category_param", param) == 0.5
        assert value("kvwise_category_samples", samples) is not None
        c.store.delete_override("gone")
        c.refresh_gauges()
        assert value("kvwise_category_param", param) is None
        assert value("kvwise_category_samples", samples) is None
