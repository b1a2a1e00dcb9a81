"""What ``kvwise bench serve`` reads of a server besides its completions, over a real
loopback socket: ``/metrics`` and JSON answers are read in bounded chunks, and one over
the bound is an error naming its URL, not a whole body held in memory."""

from __future__ import annotations

import gzip
import json
import threading
import time
import tracemalloc
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from controlplane.cli import app, bench_cmd
from controlplane.loadgen import observe
from controlplane.loadgen.observe import (
    AnswerTooLarge,
    ServerUnreachable,
    cache_counters,
    served_model,
)
from controlplane.loadgen.report import SUMMARY_SCHEMA

CAP = 64 << 10
"""The bound the tests set (the real one is 16 MiB)."""


class _Endless(BaseHTTPRequestHandler):
    """Answers every GET with 200 and a body that never ends (chunks of ``CAP`` bytes),
    counting the bytes it managed to send in ``sent``."""

    sent = 0

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.end_headers()
        chunk = b"# " + b"x" * (CAP - 3) + b"\n"
        try:
            for _ in range(1000):  # 64 MiB: far past the bound, never reached in full
                self.wfile.write(chunk)
                type(self).sent += len(chunk)
        except OSError:
            return  # the client stopped reading

    def log_message(self, *args: object) -> None:
        pass


@contextmanager
def _endless_server(handler: type[BaseHTTPRequestHandler] = _Endless) -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def capped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(observe, "MAX_METRICS_BYTES", CAP)
    monkeypatch.setattr(observe, "MAX_JSON_BYTES", CAP, raising=False)


@pytest.mark.usefixtures("capped")
@pytest.mark.parametrize(
    ("read", "path"),
    [(cache_counters, "/metrics"), (served_model, "/v1/models")],
    ids=["metrics", "json"],
)
def test_an_answer_over_the_bound_is_an_error_naming_its_url(
    read: Callable[[httpx.Client, str], object], path: str
) -> None:
    _Endless.sent = 0
    with (
        _endless_server() as base,
        httpx.Client(timeout=10) as client,
        pytest.raises(ServerUnreachable) as error,
    ):
        read(client, base)
    message = str(error.value)
    assert f"{base}{path}" in message and f"{CAP:,} bytes" in message, message
    assert _Endless.sent < 32 << 20  # it stopped reading: half the body was never sent


def _bench(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["bench", "serve", *args], env={"COLUMNS": "200"})
    return result.exit_code, " ".join(result.output.split())


@pytest.mark.usefixtures("capped")
def test_bench_serve_stops_before_sending_when_metrics_are_over_the_bound(
    tmp_path: Path,
) -> None:
    trace = tmp_path / "trace.jsonl"
    trace.write_text(
        '{"timestamp": 0, "hash_ids": [1, 2], "input_length": 32, "output_length": 1}\n'
    )
    with _endless_server() as base:
        code, out = _bench(str(trace), "--url", base, "--model", "m")
    assert code == 2, out
    assert f"error: {base}/metrics answered more than {CAP:,} bytes" in out
    assert "Traceback" not in out


def test_compare_refuses_a_file_over_its_bound(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(bench_cmd, "MAX_SUMMARY_BYTES", 1024)
    small, large = tmp_path / "a.json", tmp_path / "b.json"
    summary = json.dumps({"schema": SUMMARY_SCHEMA, "requests": 1, "server": None})
    small.write_text(summary)
    large.write_text(summary + " " * 1024)  # valid JSON, one byte a whitespace too many
    assert _bench("--compare", str(small), str(small))[0] == 0
    code, out = _bench("--compare", str(small), str(large))
    assert code == 2, out
    assert f"--compare {large}: over 1,024 bytes, not a bench summary" in out


@pytest.mark.parametrize(
    ("written", "said"),
    [
        (
            {"name": "t", "requests": 3},
            'is not a bench summary: it has no "schema" field; expected a bench summary of '
            'schema 1 (the JSON object with "schema": 1 that `kvwise bench serve -o FILE` writes)',
        ),
        ({"schema": 2, "requests": 3}, 'has "schema": 2; expected a bench summary of schema 1'),
    ],
)
def test_compare_says_what_a_file_that_is_no_summary_lacks(
    tmp_path: Path, written: dict[str, object], said: str
) -> None:
    """A JSON object that is not a summary was refused as "(schema None)"."""
    good, other = tmp_path / "a.json", tmp_path / "b.json"
    good.write_text(json.dumps({"schema": SUMMARY_SCHEMA, "requests": 3}))
    other.write_text(json.dumps(written))
    code, out = _bench("--compare", str(good), str(other))
    assert code == 2, out
    assert f"--compare: {other} {said}" in out
    assert "None" not in out


@pytest.mark.parametrize(
    ("written", "field"),
    [
        ('"ttft_s": {"mean": NaN}', "'ttft_s.mean' is nan"),
        ('"per_request": {"index": [0], "ttft_s": [Infinity]}', "'per_request.ttft_s[0]' is inf"),
    ],
)
def test_compare_refuses_a_number_that_is_not_finite(
    tmp_path: Path, written: str, field: str
) -> None:
    """Python's JSON reads NaN and Infinity: a hand-written summary was shown as "nan s"."""
    good, bad = tmp_path / "a.json", tmp_path / "b.json"
    good.write_text(json.dumps({"schema": SUMMARY_SCHEMA, "ttft_s": {"mean": 0.1}}))
    bad.write_text(f'{{"schema": {SUMMARY_SCHEMA}, {written}}}')
    code, out = _bench("--compare", str(good), str(bad))
    assert code == 2, out
    assert f"--compare: {bad}: field {field}, not a finite number" in out
    assert "nan s" not in out


class _Trickle(BaseHTTPRequestHandler):
    """Answers 200 and a byte of Prometheus comment every 20 ms, for 3 s at most: each
    read is quick, the answer slow."""

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.end_headers()
        try:
            self.wfile.write(b"#")
            for _ in range(150):
                time.sleep(0.02)  # the trickle itself, not a wait for a condition
                self.wfile.write(b" ")
        except OSError:
            return

    def log_message(self, *args: object) -> None:
        pass


def test_an_answer_that_trickles_past_the_deadline_is_an_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The client's timeout bounds each read: bytes every 20 ms held it for ever."""
    monkeypatch.setattr(observe, "ANSWER_DEADLINE_S", 0.3, raising=False)
    with (
        _endless_server(_Trickle) as base,
        httpx.Client(timeout=10) as client,
        pytest.raises(AnswerTooLarge, match=r"/metrics did not finish answering within 0\.3 s"),
    ):
        cache_counters(client, base)


_BOMB = gzip.compress(b"#" * (64 << 20), compresslevel=1)  # 64 MiB from about 300 KB


class _Gzip(BaseHTTPRequestHandler):
    """Answers every GET with gzip, whatever was asked."""

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Encoding", "gzip")
        self.send_header("Content-Length", str(len(_BOMB)))
        self.end_headers()
        try:
            self.wfile.write(_BOMB)
        except OSError:
            return

    def log_message(self, *args: object) -> None:
        pass


@pytest.mark.usefixtures("capped")
def test_a_compressed_answer_is_refused_before_it_is_inflated() -> None:
    """The bound was checked on inflated chunks: one chunk of gzip took megabytes."""
    with _endless_server(_Gzip) as base, httpx.Client(timeout=10) as client:
        tracemalloc.start()
        try:
            with pytest.raises(ServerUnreachable) as error:
                served_model(client, base)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    assert peak < 4 * CAP, f"peak {peak:,} bytes"
    assert str(error.value) == f"{base}/v1/models answered compressed (gzip), unasked"
