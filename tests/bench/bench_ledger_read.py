"""Benchmark: what reading one worker's ledger back costs ingest, read whole (``HGETALL``,
as before ``ledger_reads``) and read within bounds (``LedgerReader.read``), for a ledger
filled by another hand with ``--fields`` fields and for the fullest ledger ingest writes.

Bytes are those the client read off its socket for the read (counted by a connection whose
socket counts what it receives); times are wall seconds of the read and its parse
into a ``WorkerLedger``, median of ``--repeat``, both ways in the same process against the
same key. The keys live under a prefix of their own and are deleted at the end.

    python -m tests.bench.bench_ledger_read [--fields 1000000] [--repeat 3]
        [--redis-url redis://127.0.0.1:6379/0]

Not collected by pytest; results go in docs/benchmarks.md ("Ledger read").
"""

from __future__ import annotations

import secrets
import socket
import statistics
import time
import uuid
from collections.abc import Callable
from typing import Any

import redis

from agent.wire import Keys
from controlplane.service.ledger import EPOCHS_KEPT, MAX_OUT_OF_ORDER, WorkerLedger
from controlplane.service.ledger_reads import LedgerReader
from tests.bench.command_line import REDIS_URL, run_from_command_line

VALUE_BYTES = 80
"""Bytes of each field another hand wrote into the bloated ledger."""


class CountingSocket:
    """A socket that counts the bytes it receives; everything else is the socket's."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.received = 0

    def recv(self, size: int, *flags: int) -> bytes:
        data = self.sock.recv(size, *flags)
        self.received += len(data)
        return data

    def recv_into(self, buffer: Any, *args: int) -> int:
        n = self.sock.recv_into(buffer, *args)
        self.received += n
        return n

    def __getattr__(self, name: str) -> Any:
        return getattr(self.sock, name)


class CountingConnection(redis.Connection):
    """A connection whose socket counts what it receives (``received``)."""

    counting: CountingSocket | None = None

    def _connect(self) -> Any:
        self.counting = CountingSocket(super()._connect())
        return self.counting


def received(r: redis.Redis) -> int:
    """Bytes ``r``'s connections have received so far."""
    pool: Any = r.connection_pool
    conns = [*pool._available_connections, *pool._in_use_connections]
    return sum(c.counting.received for c in conns if c.counting is not None)


def read_whole(r: redis.Redis, keys: Keys, worker: str) -> WorkerLedger:
    """The ledger as ingest read it before: ``HGETALL``, then parsed (a new one if not)."""
    raw = r.hgetall(keys.ingest_state(worker))
    try:
        return WorkerLedger.from_hash(worker, raw)
    except ValueError:
        return WorkerLedger(worker)


def read_bounded(r: redis.Redis, keys: Keys, worker: str) -> WorkerLedger:
    """The ledger as ingest reads it now."""
    return LedgerReader(r, keys).read([worker])[worker]


def fullest_ledger(worker: str) -> dict[str, str]:
    """The largest ledger ingest writes: every kept epoch with ``MAX_OUT_OF_ORDER``
    sequence numbers of 19 digits above its floor."""
    ledger = WorkerLedger(worker)
    big = 10**18
    for _ in range(EPOCHS_KEPT):
        epoch = secrets.token_hex(8)
        for seq in range(big + 2, big + 2 * MAX_OUT_OF_ORDER + 4, 2):
            ledger.see(epoch, seq)
    ledger.counts.events = big
    return ledger.to_hash()


def bloat(r: redis.Redis, key: str, fields: int) -> None:
    """``fields`` fields of ``VALUE_BYTES`` each beside those of a readable ledger (of 5
    events), written in chunks."""
    readable = WorkerLedger("bloated")
    readable.counts.events = 5
    r.hset(key, mapping=readable.to_hash())
    value = b"x" * VALUE_BYTES
    for lo in range(0, fields, 10_000):
        chunk = {f"f{i:07d}": value for i in range(lo, min(lo + 10_000, fields))}
        r.hset(key, mapping=chunk)  # type: ignore[arg-type]


def measure(
    read: Callable[[redis.Redis, Keys, str], WorkerLedger],
    r: redis.Redis,
    keys: Keys,
    worker: str,
    repeat: int,
) -> tuple[float, int, int]:
    """Median wall seconds, reply bytes and events counted of ``repeat`` reads."""
    walls, size, events = [], 0, 0
    for _ in range(repeat):
        before = received(r)
        start = time.perf_counter()
        ledger = read(r, keys, worker)
        walls.append(time.perf_counter() - start)
        size = received(r) - before
        events = ledger.counts.events
    return statistics.median(walls), size, events


def run(redis_url: str, fields: int, repeat: int) -> None:
    r = redis.Redis.from_url(redis_url, connection_class=CountingConnection)
    keys = Keys(f"kvwise-bench-ledger-{uuid.uuid4().hex[:8]}:")
    try:
        r.hset(keys.ingest_state("fullest"), mapping=fullest_ledger("fullest"))
        bloat(r, keys.ingest_state("bloated"), fields)
        print("| ledger | read | reply bytes | wall (median) | events read |")
        print("|---|---|---|---|---|")
        for worker, what in (("bloated", f"{fields:,} fields"), ("fullest", "fullest written")):
            for name, read in (("HGETALL (before)", read_whole), ("bounded (after)", read_bounded)):
                wall, size, events = measure(read, r, keys, worker, repeat)
                print(f"| {what} | {name} | {size:,} | {wall * 1000:,.1f} ms | {events:,} |")
    finally:
        r.unlink(keys.ingest_state("fullest"), keys.ingest_state("bloated"))
        r.close()


def main() -> None:
    run_from_command_line(__doc__, run, fields=1_000_000, repeat=3, redis_url=REDIS_URL)


if __name__ == "__main__":
    main()
