"""kvwise on a real Redis Cluster (three masters with a replica each, started by the test
from the redis-server binary): workers' keys spread over the shards, the controller and the
workers use the cluster client, notices and polls reach every worker, and a master failover
in the middle of the run loses nothing that was acknowledged."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from redis.cluster import RedisCluster

from agent.runtime.agent import Agent
from agent.runtime.connection import connect
from agent.wire import AgentInstance, Keys
from controlplane.service.agent_instances import InstanceConflicts
from controlplane.service.agents import LEDGER_FIELDS, AgentReader
from controlplane.service.ledger_reads import LedgerFields, LedgerReader
from controlplane.service.stream_io import Commit, StreamIO
from controlplane.traces.synth import synthesize
from controlplane.traces.writer import write_bailian
from tests.e2e.procs import Stack, get, metric, version_in_force
from tests.integration.agent_fixtures import fast_settings
from tests.redis_cluster import LocalCluster
from tests.waiting import wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

WORKERS = 4


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path / "cluster") as c:
        yield c


@pytest.fixture
def stack(tmp_path: Path, cluster: LocalCluster) -> Iterator[Stack]:
    with Stack.running(tmp_path, cluster.url, "cl") as s:
        yield s


def _applied(url: str, version: int) -> bool:
    agents = get(url, "/v1/agents")
    return len(agents) == WORKERS and all(a["applied_version"] >= version for a in agents)


def test_the_live_loop_on_a_cluster_survives_a_master_failover(
    stack: Stack, cluster: LocalCluster, tmp_path: Path
) -> None:
    trace = synthesize("to-c", duration_s=600, qps=3, seed=11)
    path = tmp_path / "toc.jsonl"
    write_bailian(trace, path)
    capacity = max(100, trace.n_unique // 10)
    on_cluster = {"KVWISE_REDIS_CLUSTER": "true"}
    # No grace before acknowledged entries are trimmed: the streams drain to empty.
    ctl, url = stack.controller("ctl-a", **on_cluster, KVWISE_STREAM_TRIM_GRACE_S="0")
    workers = [
        stack.worker(f"w{i}", path, capacity, speed=30, **on_cluster) for i in range(WORKERS)
    ]
    keys = Keys(stack.prefix)
    shards = {cluster.master_of(keys.events_stream(f"w{i}")).port for i in range(WORKERS)}
    assert len(shards) >= 2, "the workers' streams should spread over the shards"

    wait_until(lambda: get(url, "/v1/policy")["version"] >= 2, timeout=120, what="a fit")
    first = get(url, "/v1/policy")["version"]
    wait_until(lambda: _applied(url, first), timeout=60, what="every worker on it")

    # Take down the master of the policy keys (and of whatever streams share it).
    cluster.kill_master(keys.policy_current)
    before = metric(url, "kvwise_ingest_events_total")
    wait_until(
        lambda: metric(url, "kvwise_ingest_events_total") > before,
        timeout=90,
        what="ingest to go on after the failover",
    )
    # Routes answer 503 while their shard fails over (at once, once one call has failed).
    wait_until(lambda: version_in_force(url) > first, timeout=120, what="a newer version")
    newest = version_in_force(url)
    wait_until(lambda: _applied(url, newest), timeout=60, what="every worker on the newer one")

    summaries = []
    for w in workers:
        assert w.stop() == 0, w.output()[-2000:]
        summaries.append(stack.summary(w))
    sent = sum(s["events_sent"] for s in summaries)
    client = RedisCluster.from_url(cluster.url)

    def drained() -> bool:
        pending = 0
        for i in range(WORKERS):
            try:
                pending += int(
                    client.xpending(keys.events_stream(f"w{i}"), "controller")["pending"]
                )
            except redis.ResponseError:
                return False
        return pending == 0 and all(
            client.xlen(keys.events_stream(f"w{i}")) == 0 for i in range(WORKERS)
        )

    wait_until(drained, timeout=60, what="every entry acknowledged and trimmed")
    ingested = metric(url, "kvwise_ingest_events_total")
    # A master killed mid-run loses the writes its replica had not yet received: the
    # workers saw those XADDs acknowledged. What reached the controller is at most what
    # was sent, and most of it.
    assert 0.5 * sent < ingested <= sent + sum(s["events_dropped"] for s in summaries)
    client.close()
    # The policy state it keeps to restore an emptied Redis reads on a cluster too.
    assert "policy state not read" not in ctl.output()


def test_ledgers_on_a_cluster_are_read_within_bounds_and_written_over(
    cluster: LocalCluster,
) -> None:
    """Ledgers on several shards are read in one call (whole, and their counts alone, as an
    agents listing reads them), a bloated and a mistyped one refused unread, and ingest's
    commit (one script over a worker's stream and ledger) writes a ledger over the mistyped
    key: each script keeps its keys on the worker's shard."""
    client = RedisCluster.from_url(cluster.url)
    keys = Keys("cl-ledger:")
    workers = [f"w{i}" for i in range(6)]
    assert len({cluster.master_of(keys.ingest_state(w)).port for w in workers}) >= 2
    client.hset(keys.ingest_state("w0"), mapping={f"f{i}": "x" for i in range(1000)})
    client.rpush(keys.ingest_state("w1"), "not a hash")
    client.hset(keys.ingest_state("w2"), mapping={"events": 7, "epochs": "{}"})
    reader = LedgerReader(client, keys)
    ledgers = reader.read(workers)
    assert [ledgers[w].counts.events for w in workers] == [0, 0, 7, 0, 0, 0]
    assert reader.refused == 2
    counts = LedgerFields(client, keys, LEDGER_FIELDS).read(workers)  # an agents listing's
    assert [isinstance(c, ValueError) for c in counts] == [True, True] + [False] * 4
    assert counts[2:] == [{b"events": b"7"}, {}, {}, {}]

    stream = keys.events_stream("w1")
    entry = client.xadd(stream, {"x": "1"})
    client.xgroup_create(stream, "controller", id="0")
    client.xreadgroup("controller", "ctl", {stream: ">"})
    job = Commit(ack=[entry], ledger={"events": "3", "epochs": "{}"})
    io = StreamIO(client, group="controller", consumer="ctl")
    assert not io.commit({stream.encode(): keys.ingest_state("w1")}, {stream.encode(): job}).failed
    assert reader.read(["w1"])["w1"].counts.events == 3 and reader.refused == 2
    client.close()


def test_agent_instances_on_a_cluster_are_recorded_read_and_pruned_on_each_shard(
    cluster: LocalCluster,
) -> None:
    """Agents on the cluster client record themselves beside their heartbeats (one pipeline
    on the worker's shard); a listing reads the instances hashes of workers on several
    shards in one call, finds the two agents under one id, and the leader's removal of the
    records crashed processes left reaches every shard."""
    client = RedisCluster.from_url(cluster.url)
    keys = Keys("cl-instances:")
    workers = [f"w{i}" for i in range(6)]
    assert len({cluster.master_of(keys.instances(w)).port for w in workers}) >= 2
    crashed = AgentInstance(1.0, 2.0, 0.1).to_field()  # long dead
    for worker in workers:
        client.hset(keys.instances(worker), "crashed", crashed)
    settings = {w: fast_settings(cluster.url, keys.prefix, worker_id=w, redis_cluster=True)
                for w in workers}  # fmt: skip
    agents = [Agent(settings[w], capacity=10) for w in [*workers, "w0"]]
    for agent in agents:
        agent.started_at -= 120  # as if they had run two minutes
        agent.start()
    try:
        wait_until(
            lambda: all(client.hexists(keys.instances(a.worker_id), a.epoch) for a in agents),
            what="every agent's record",
        )
        listing = AgentReader(client, keys, max_agents=10).read()
        assert {a.id: a.heartbeat_id_conflict for a in listing.agents} == {
            w: 2 if w == "w0" else 0 for w in workers
        }
        InstanceConflicts(client, keys).tend(listing.instances)
        assert not any(client.hexists(keys.instances(w), "crashed") for w in workers)
    finally:
        for agent in agents:
            agent.close()
    client.close()


def test_a_script_registered_on_the_lazy_cluster_client_runs_on_each_shard(
    cluster: LocalCluster,
) -> None:
    """Scripts are registered on the lazy client without connecting (the controller does it
    as it starts); run, each goes to its key's shard, and is loaded again once flushed."""
    client = connect(cluster.url, cluster=True, timeout_s=2, retries=2)
    incr = client.register_script("return redis.call('INCR', KEYS[1])")
    keys = ["{w0}n", "{w1}n", "{w2}n", "{w3}n"]
    assert len({cluster.master_of(k).port for k in keys}) >= 2
    assert [incr(keys=[k]) for k in keys] == [1, 1, 1, 1]
    client.script_flush()
    assert incr(keys=[keys[0]]) == 2
