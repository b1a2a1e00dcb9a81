"""A worker's ledger filled by another hand, against a real controller and a real Redis.

Ingest read each ledger whole (HGETALL): a ledger of a million fields was read at every
ledger load (about 100 MB and half a minute), a field of megabytes was trusted, and a key of
another type failed every pass (WRONGTYPE) until an operator deleted it. Each is refused
unread, counted and told, and ingest's next commit replaces it; a good ledger reads as
before."""

from __future__ import annotations

import pytest
import redis

from agent.wire import Keys
from controlplane.service.ledger import HASH_FIELDS, MAX_HASH_FIELDS, NUMBER_BYTES
from controlplane.service.ledger_reads import LedgerReader
from tests.integration.controller_fixtures import (
    controller,
    good_batch,
    ingest_good_batches,
    send,
)
from tests.ledger_samples import fullest_ledger
from tests.waiting import wait_until

pytestmark = pytest.mark.integration

REFUSED = "kvwise_ingest_ledgers_refused_total"


def _told(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [m for m in caplog.messages if "refused" in m and "ingest starts it again" in m]


def test_a_ledger_of_too_many_fields_or_another_type_is_refused_and_replaced(
    redis_url: str, key_prefix: str, r: redis.Redis, keys: Keys, caplog: pytest.LogCaptureFixture
) -> None:
    """w1's ledger holds 10,000 fields beside its counts, w2's is a list, w3's is one
    ingest wrote: w1 and w2 are refused unread and started again, each told once with its
    key and reason; their batches are applied and acknowledged and the commit writes a
    ledger of ingest's fields only over each; w3 goes on where it was."""
    with controller(redis_url, key_prefix) as first:
        ingest_good_batches(first, r, "w3", 2)
    bloat = {f"f{i}": "x" for i in range(10_000)}
    r.hset(keys.ingest_state("w1"), mapping={**bloat, "events": 5, "batches": 1})
    r.rpush(keys.ingest_state("w2"), "not", "a", "hash")
    with controller(redis_url, key_prefix) as c:
        for worker, seq in (("w1", 1), ("w2", 1), ("w3", 3)):
            send(r, keys, good_batch(worker, seq))
        wait_until(lambda: c.ingestor.counters.batches == 3, what="the three batches")
        wait_until(lambda: c.ingestor.pending() == 0, what="their passes committed")
        refused = c.metrics.registry.get_sample_value(REFUSED)
    assert refused == 2
    for worker in ("w1", "w2", "w3"):
        ledger = r.hgetall(keys.ingest_state(worker))
        assert sorted(ledger) == sorted(f.encode() for f in HASH_FIELDS), worker
        expected = 3 if worker == "w3" else 1
        assert int(ledger[b"batches"]) == expected and ledger[b"duplicates"] == b"0", worker
        assert ledger[b"missing"] == b"0", worker
    told = _told(caplog)
    assert len(told) == 2, told
    assert any(keys.ingest_state("w1") in m and "10002 fields > limit" in m for m in told)
    assert any(keys.ingest_state("w2") in m and "a list, not a hash" in m for m in told)


def test_a_field_over_its_bound_is_refused_before_it_is_read_and_told_once(
    r: redis.Redis, keys: Keys, caplog: pytest.LogCaptureFixture
) -> None:
    """A count of ``NUMBER_BYTES`` digits is read; one digit more refuses the ledger by
    its size, as does an ``epochs`` of megabytes; a refusal is counted at each read, said
    once until the key reads well again."""
    reader = LedgerReader(r, keys, max_out_of_order=64)
    key = keys.ingest_state("w1")
    r.hset(key, mapping={"events": "7" * NUMBER_BYTES, "epochs": "{}"})
    assert reader.read(["w1"])["w1"].counts.events == int("7" * NUMBER_BYTES)
    r.hset(key, "events", "7" * (NUMBER_BYTES + 1))
    for _ in range(2):
        assert reader.read(["w1"])["w1"].counts.events == 0
    r.hset(key, mapping={"events": "7", "epochs": "[" * 4_000_000})
    assert reader.read(["w1"])["w1"].counts.events == 0
    assert reader.refused == 3
    told = _told(caplog)
    assert len(told) == 1 and f"events: {NUMBER_BYTES + 1} bytes > limit" in told[0], told
    r.hset(key, "epochs", "{}")
    assert reader.read(["w1"])["w1"].counts.events == 7
    r.hset(key, "epochs", "[" * 4_000_000)
    reader.read(["w1"])
    assert "epochs: 4000000 bytes > limit" in _told(caplog)[-1]


def test_a_ledger_at_the_field_limit_or_missing_reads_as_written(
    r: redis.Redis, keys: Keys
) -> None:
    """``MAX_HASH_FIELDS`` fields are read (their counts kept); one more refuses the ledger;
    a missing ledger reads as a new one, without a refusal."""
    reader = LedgerReader(r, keys)
    extra = {f"later_{i}": "1" for i in range(MAX_HASH_FIELDS - len(HASH_FIELDS))}
    r.hset(keys.ingest_state("w1"), mapping={**extra, **dict.fromkeys(HASH_FIELDS, "0")})
    r.hset(
        keys.ingest_state("w1"),
        mapping={"events": 11, "epochs": '{"e1": {"floor": 4, "above": [6], "lost": 0}}'},
    )
    ledgers = reader.read(["w1", "w2"])
    assert ledgers["w1"].counts.events == 11 and ledgers["w1"].missing == 1
    assert ledgers["w2"].counts.events == 0 and reader.refused == 0
    r.hset(keys.ingest_state("w1"), "one_more", "1")
    assert reader.read(["w1"])["w1"].counts.events == 0 and reader.refused == 1


def test_the_fullest_ledger_ingest_can_write_reads_back_whole(r: redis.Redis, keys: Keys) -> None:
    """The largest ledger ingest writes within the wire's bounds (every kept epoch as long
    as a batch may name it, in escaped characters, each with ``max_out_of_order`` numbers
    of 19 digits) is read back as written, not refused."""
    ledger = fullest_ledger("w1")
    r.hset(keys.ingest_state("w1"), mapping=ledger.to_hash())
    reader = LedgerReader(r, keys)
    back = reader.read(["w1"])["w1"]
    assert reader.refused == 0
    assert back.epochs == ledger.epochs and back.counts == ledger.counts
