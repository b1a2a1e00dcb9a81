"""Every error of the REST API is JSON, over real HTTP: Redis stopped, never reachable or
out of memory gives 503 on every route that needs it (no traceback in the log), bad
values name the user's field, unknown paths and methods keep the shape."""

from __future__ import annotations

import contextlib
import logging
import os
import re
import signal
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from agent.wire import Keys
from controlplane.dev.embedded_redis import EmbeddedRedis, free_port
from controlplane.service.controller_parts import PROBE_TIMEOUT_S
from controlplane.service.settings import ControllerSettings
from tests.conftest import delete_prefix
from tests.integration.controller_fixtures import (
    AUTH,
    TOKEN,
    RunningController,
    live_settings,
    running_controller,
)
from tests.waiting import wait_until

pytestmark = pytest.mark.integration

# One valid request per operation: the test below checks this covers the whole API.
REQUESTS: dict[tuple[str, str], tuple[str, dict[str, Any] | None]] = {
    ("GET", "/v1/policy"): ("/v1/policy", None),
    ("GET", "/v1/policy/versions"): ("/v1/policy/versions", None),
    ("GET", "/v1/policy/versions/{version}"): ("/v1/policy/versions/1", None),
    ("GET", "/v1/policy/refit"): ("/v1/policy/refit", None),
    ("POST", "/v1/policy/refit"): ("/v1/policy/refit", None),
    ("POST", "/v1/policy/rollback"): ("/v1/policy/rollback", {"version": 1}),
    ("GET", "/v1/policy/overrides"): ("/v1/policy/overrides", None),
    ("PUT", "/v1/policy/overrides/{category}"): ("/v1/policy/overrides/text_1", {"rate": 1}),
    ("DELETE", "/v1/policy/overrides/{category}"): ("/v1/policy/overrides/text_1", None),
    ("PUT", "/v1/policy/overrides"): ("/v1/policy/overrides?category=.", {"rate": 1}),
    ("DELETE", "/v1/policy/overrides"): ("/v1/policy/overrides?category=..", None),
    ("GET", "/v1/policy/evictor"): ("/v1/policy/evictor", None),
    ("PUT", "/v1/policy/evictor"): ("/v1/policy/evictor", {"family": "lru"}),
    ("DELETE", "/v1/policy/evictor"): ("/v1/policy/evictor", None),
    ("GET", "/v1/categories"): ("/v1/categories", None),
    ("GET", "/v1/categories/{name}"): ("/v1/categories/text_1", None),
    ("GET", "/v1/category"): ("/v1/category?name=.", None),
    ("GET", "/v1/agents"): ("/v1/agents", None),
}
WITHOUT_REDIS = {
    ("GET", "/healthz"),
    ("GET", "/readyz"),
    ("GET", "/metrics"),
    ("GET", "/v1/shadow"),  # the leader's memory: it answers while Redis is away
}


def _settings(redis_url: str) -> ControllerSettings:
    return live_settings(
        redis_url=redis_url,
        key_prefix=f"kvwise-errors-{uuid.uuid4().hex[:8]}:",
        api_token=TOKEN,
        lease_ttl_s=5,
    )


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[EmbeddedRedis]:
    with EmbeddedRedis(tmp_path) as server:
        yield server


def _operations(client: httpx.Client) -> set[tuple[str, str]]:
    spec = client.get("/openapi.json").json()
    return {(m.upper(), path) for path, item in spec["paths"].items() for m in item}


def _call_every_route(client: httpx.Client) -> dict[tuple[str, str], httpx.Response]:
    out = {}
    for (method, template), (path, body) in REQUESTS.items():
        out[(method, template)] = client.request(method, path, json=body, headers=AUTH)
    return out


def _no_tracebacks(caplog: pytest.LogCaptureFixture) -> None:
    noisy = [
        r for r in caplog.records if r.exc_info and not r.name.startswith("controlplane.service")
    ]
    assert not noisy, [f"{r.name}: {r.getMessage()}" for r in noisy]


def test_the_request_table_covers_the_api(own_redis: EmbeddedRedis) -> None:
    with running_controller(_settings(own_redis.url)) as rc:
        assert _operations(rc.client) == set(REQUESTS) | WITHOUT_REDIS


def test_redis_stopped_every_route_answers_503_json(
    own_redis: EmbeddedRedis, caplog: pytest.LogCaptureFixture
) -> None:
    with running_controller(_settings(own_redis.url)) as rc:
        assert rc.client.get("/readyz").status_code == 200
        own_redis.stop()
        caplog.clear()
        caplog.set_level(logging.INFO)
        for op, r in _call_every_route(rc.client).items():
            assert r.status_code == 503, (op, r.text)
            assert r.headers["content-type"] == "application/json", op
            body = r.json()
            assert body["error"] == "redis_unavailable", (op, body)
            assert body["reason"].startswith("redis unavailable: "), (op, body)
        _probes_still_answer(rc)
        _no_tracebacks(caplog)


def test_redis_never_reachable_every_route_answers_503_json(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    with running_controller(_settings(f"redis://127.0.0.1:{free_port()}/0")) as rc:
        for op, r in _call_every_route(rc.client).items():
            assert r.status_code == 503, (op, r.text)
            assert r.json()["error"] == "redis_unavailable", op
        _probes_still_answer(rc)
        _no_tracebacks(caplog)


def test_a_redis_cluster_never_reachable_is_answered_as_redis_is(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """With ``KVWISE_REDIS_CLUSTER`` the controller died at start with a traceback
    ("Redis Cluster cannot be connected"): its lease registered a script, and the cluster
    client connects when first used."""
    caplog.set_level(logging.INFO)
    settings = _settings(f"redis://127.0.0.1:{free_port()}/0").model_copy(
        update={"redis_cluster": True}
    )
    with running_controller(settings) as rc:
        answer = rc.client.get("/v1/policy")
        assert answer.status_code == 503 and answer.json()["error"] == "redis_unavailable"
        assert "Redis Cluster at " in answer.json()["reason"]
        _probes_still_answer(rc)
        _no_tracebacks(caplog)


def _probes_still_answer(rc: RunningController) -> None:
    assert rc.client.get("/healthz").status_code == 200
    ready = rc.client.get("/readyz")
    assert ready.status_code == 503
    assert ready.json()["reason"].startswith("redis unavailable")
    assert rc.client.get("/metrics").status_code == 200
    assert rc.client.get("/v1/shadow", headers=AUTH).json()["enabled"] is True


def test_a_stalled_redis_costs_the_probes_and_a_scrape_one_short_wait(
    own_redis: EmbeddedRedis,
) -> None:
    """A Redis that stops answering (SIGSTOP: a hung host, a long fork) made /readyz wait
    35 s and /metrics 80 s on retried calls; and API reads hung on it fill the server's
    thread pool, where /healthz then waited too: a kubelet would restart a controller
    that is well. The probes answer now at once or within one probe timeout."""
    assert own_redis.proc is not None
    with running_controller(_settings(own_redis.url)) as rc:
        assert rc.client.get("/readyz").status_code == 200
        os.kill(own_redis.proc.pid, signal.SIGSTOP)
        try:
            hung = _reads_in_flight(rc.url, SHARED_POOL_THREADS + 8)
            health = rc.client.get("/healthz", timeout=2 * PROBE_TIMEOUT_S)
            ready = rc.client.get("/readyz", timeout=4 * PROBE_TIMEOUT_S)
            scrape = rc.client.get("/metrics", timeout=4 * PROBE_TIMEOUT_S)
        finally:
            os.kill(own_redis.proc.pid, signal.SIGCONT)
        for thread in hung:
            thread.join(timeout=60)
        assert health.status_code == 200
        assert ready.status_code == 503
        assert ready.json()["reason"].startswith("redis unavailable: Timeout")
        assert scrape.status_code == 200
        assert 'kvwise_redis_state{state="unreachable"} 1.0' in scrape.text
        wait_until(lambda: rc.client.get("/readyz").status_code == 200, what="readiness back")


def test_while_redis_is_known_down_a_route_answers_at_once_and_serves_once_it_is_back(
    own_redis: EmbeddedRedis,
) -> None:
    """Each read waited out its timeout and retries (20 s or more) though the controller
    knew Redis was down; a dashboard refreshing every 2 s piled up such requests."""
    assert own_redis.proc is not None
    with running_controller(_settings(own_redis.url)) as rc:
        assert rc.client.get("/v1/policy", headers=AUTH).status_code == 200
        os.kill(own_redis.proc.pid, signal.SIGSTOP)
        try:
            assert rc.client.get("/readyz").status_code == 503  # now known down
            read = rc.client.get("/v1/policy", headers=AUTH, timeout=2 * PROBE_TIMEOUT_S)
        finally:
            os.kill(own_redis.proc.pid, signal.SIGCONT)
        assert read.status_code == 503
        assert read.json()["reason"] == "redis unavailable: Timeout reading from socket"
        wait_until(
            lambda: rc.client.get("/v1/policy", headers=AUTH).status_code == 200,
            what="reads served again",
        )


SHARED_POOL_THREADS = 40
"""Threads of the server's shared pool (anyio's default limiter)."""


def _reads_in_flight(url: str, n: int) -> list[threading.Thread]:
    """``n`` API reads sent at once, in threads; returns once they fill the shared pool."""

    def read() -> None:
        with contextlib.suppress(httpx.HTTPError):
            httpx.get(url + "/v1/policy", headers=AUTH, timeout=60)

    threads = [threading.Thread(target=read, daemon=True) for _ in range(n)]
    for thread in threads:
        thread.start()
    wait_until(  # the server runs in this process: its pool's threads are ours to count
        lambda: _pool_threads() >= SHARED_POOL_THREADS, what="the shared pool taken"
    )
    return threads


def _pool_threads() -> int:
    return sum(t.name == "AnyIO worker thread" for t in threading.enumerate())


def test_redis_out_of_memory_is_said_as_such(own_redis: EmbeddedRedis) -> None:
    with running_controller(_settings(own_redis.url)) as rc:
        assert rc.client.get("/v1/policy").status_code == 200
        redis.Redis(port=own_redis.port).config_set("maxmemory", 1)
        r = rc.client.put("/v1/policy/overrides/text_1", json={"rate": 2}, headers=AUTH)
        assert r.status_code == 503, r.text
        assert r.json()["error"] == "redis_out_of_memory"
        assert "maxmemory" in r.json()["reason"]
        # Reads still work: only what needs memory is refused.
        assert rc.client.get("/v1/policy").status_code == 200


@pytest.fixture(scope="module")
def ctl(redis_url: str) -> Iterator[RunningController]:
    settings = _settings(redis_url)
    with running_controller(settings) as rc:
        yield rc
    delete_prefix(redis_url, settings.key_prefix)


@pytest.mark.parametrize(
    ("body", "error", "field", "message"),
    [
        ({"p_reuse": 1.5}, "invalid_value", "p_reuse", "must be a number in [0, 1]"),
        ({"p_reuse": None}, "invalid_value", "p_reuse", "must be a number in [0, 1]"),
        ({"p_reuse": "0.5"}, "invalid_value", "p_reuse", "must be a number in [0, 1]"),
        ({"p_reuse": True}, "invalid_value", "p_reuse", "must be a number in [0, 1]"),
        ({"rate": 0}, "invalid_value", "rate", "must be a number in [1e-09, 1000000]"),
        ({"rate": 1e-320}, "invalid_value", "rate", "must be a number in [1e-09, 1000000]"),
        ({"rate": 1e308}, "invalid_value", "rate", "must be a number in [1e-09, 1000000]"),
        (
            {"life_s": -1, "rate": 1},
            "invalid_value",
            "life_s",
            "must be a number in [0.001, 1000000000]",
        ),
        (
            {"life_s": 1e-320},
            "invalid_value",
            "life_s",
            "must be a number in [0.001, 1000000000]",
        ),
        (
            {"speed": 1},
            "unknown_field",
            "speed",
            "is not a field here (known: rate, p_reuse, life_s)",
        ),
        ({}, "invalid_value", "body", "give rate, p_reuse or life_s"),
        ([1, 2], "invalid_value", "body", "must be a JSON object"),
    ],
)
def test_bad_override_values_name_the_field(
    ctl: RunningController, body: Any, error: str, field: str, message: str
) -> None:
    r = ctl.client.put("/v1/policy/overrides/text_1", json=body, headers=AUTH)
    assert r.status_code == 422
    assert r.json() == {
        "error": error,
        "field": field,
        "message": message,
        "reason": f"{field}: {message}",
    }


def test_the_description_quotes_the_message_the_api_answers(ctl: RunningController) -> None:
    """The API's description once quoted "must be in [0, 1]" for a bad ``p_reuse``, while
    the API answers "must be a number in [0, 1]"."""
    said = ctl.client.put("/v1/policy/overrides/text_1", json={"p_reuse": 2}, headers=AUTH)
    assert said.status_code == 422 and said.json()["field"] == "p_reuse", said.text
    message = said.json()["message"]
    spec = ctl.client.get("/openapi.json").json()
    quoted = re.findall(r'"field": "p_reuse", "message":\s+"([^"]*)"', spec["info"]["description"])
    assert quoted == [message]
    field_doc = spec["components"]["schemas"]["FieldErrorBody"]["properties"]["message"]
    assert field_doc["description"].endswith(f"e.g. '{message}'")


def test_other_validation_errors_keep_the_shape(ctl: RunningController) -> None:
    c = ctl.client
    not_json = c.put(
        "/v1/policy/overrides/text_1",
        content=b'{"rate": ',
        headers={**AUTH, "Content-Type": "application/json"},
    )
    assert not_json.status_code == 422
    assert not_json.json()["error"] == "invalid_json" and not_json.json()["field"] == "body"
    assert not_json.json()["message"] == (
        "is not valid JSON (UTF-8): Expecting value at character 9"
    )
    not_utf8 = c.put(
        "/v1/policy/overrides/text_1",
        content=b'{"rate": "\xff"}',
        headers={**AUTH, "Content-Type": "application/json"},
    )
    assert not_utf8.status_code == 422 and not_utf8.json()["error"] == "invalid_json"
    too_deep = c.put(
        "/v1/policy/overrides/text_1",
        content=b'{"rate": ' + b"[" * 5000 + b"]" * 5000 + b"}",
        headers={**AUTH, "Content-Type": "application/json"},
    )
    assert too_deep.status_code == 422 and too_deep.json()["error"] == "invalid_json"
    # Valid JSON, under the body's bound, but an integer Python will not read: it was
    # answered as JSON that is not valid.
    too_long = c.put(
        "/v1/policy/overrides/text_1",
        content=b'{"rate": ' + b"1" * 5000 + b"}",
        headers={**AUTH, "Content-Type": "application/json"},
    )
    assert too_long.status_code == 422
    assert (too_long.json()["error"], too_long.json()["field"]) == ("invalid_value", "body")
    assert too_long.json()["message"].startswith("holds an integer of more than 4,300 digits")
    # curl -d sends a form's media type: the body is a JSON object, its type is wrong.
    as_form = c.put(
        "/v1/policy/evictor",
        content=b'{"family": "lru"}',
        headers={**AUTH, "Content-Type": "application/x-www-form-urlencoded"},
    )
    assert as_form.status_code == 422
    assert as_form.json()["message"] == (
        "must be sent as Content-Type: application/json (sent: application/x-www-form-urlencoded)"
    )
    missing = c.post("/v1/policy/rollback", json={"hold": True}, headers=AUTH).json()
    assert (missing["error"], missing["field"], missing["message"]) == (
        "missing_field",
        "version",
        "is required",
    )
    zero = c.post("/v1/policy/rollback", json={"version": 0}, headers=AUTH).json()
    assert (zero["field"], zero["message"]) == ("version", "must be an integer >= 1")
    hold = c.post("/v1/policy/rollback", json={"version": 1, "hold": "yes"}, headers=AUTH)
    assert hold.json()["message"] == "must be true or false"
    path = c.get("/v1/policy/versions/abc").json()
    assert (path["field"], path["message"]) == ("version", "must be an integer >= 1")
    several = c.put("/v1/policy/overrides/a", json={"rate": -1, "p_reuse": 2}, headers=AUTH)
    assert several.json()["reason"] == (
        "rate: must be a number in [1e-09, 1000000]; p_reuse: must be a number in [0, 1]"
    )


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", "/v1/policy/refit"),
        ("DELETE", "/v1/policy/evictor"),
        ("DELETE", "/v1/policy/overrides/text_1"),
    ],
)
def test_a_route_that_takes_no_body_refuses_one(
    ctl: RunningController, method: str, path: str
) -> None:
    """A field the route would ignore (a refit's "force") is refused as a body route
    refuses a field it does not know; nothing is published."""
    c = ctl.client
    before = c.get("/v1/policy").json()["version"]
    r = c.request(method, path, json={"force": True}, headers=AUTH)
    assert (r.status_code, r.json()) == (
        422,
        {
            "error": "unknown_field",
            "field": "force",
            "message": "is not a field here (this request takes no body)",
            "reason": "force: is not a field here (this request takes no body)",
        },
    )
    text = c.request(method, path, content=b"now", headers=AUTH)
    assert text.status_code == 422 and text.json()["field"] == "body"
    assert text.json()["message"] == "must be empty (this request takes no body)"
    assert c.get("/v1/policy").json()["version"] == before
    empty = c.request(method, path, json={}, headers=AUTH)  # nothing in it: served
    assert empty.status_code != 422, empty.text


@pytest.mark.parametrize("spelling", ["1_0", "+1", "1.0", "1e0", "%201", "\u0661", "-1", "0"])
def test_a_version_in_the_path_is_plain_decimal_digits(
    ctl: RunningController, spelling: str
) -> None:
    r = ctl.client.get(f"/v1/policy/versions/{spelling}")
    assert r.status_code == 422
    assert (r.json()["field"], r.json()["message"]) == ("version", "must be an integer >= 1")


def test_a_category_name_no_agent_can_send_is_invalid_on_a_read(
    ctl: RunningController,
) -> None:
    """A name over the wire's 128 characters can never have been seen: 422 as a bad
    override name is, not "unknown"; any shorter name (a space, a reuse class's "/re" are
    the agents' to send) is a category that may merely be unseen: 404."""
    c = ctl.client
    too_long = c.get("/v1/categories/" + "a" * 129)
    assert too_long.status_code == 422
    assert (too_long.json()["error"], too_long.json()["field"]) == ("invalid_value", "name")
    assert too_long.json()["message"] == "must be 1 to 128 characters"
    for unseen_name in ("a%20b", "text_1%2Fre"):
        unseen = c.get(f"/v1/categories/{unseen_name}")
        assert (unseen.status_code, unseen.json()["error"]) == (404, "unknown_category")
    assert c.get("/v1/categories/" + "a" * 128).status_code == 404


def test_a_pin_whose_name_is_not_utf8_once_decoded_is_refused(ctl: RunningController) -> None:
    """``%FF`` decodes to U+FFFD: the pin went to that name, which no agent sends, and
    answered 200."""
    c = ctl.client
    for url in ("/v1/policy/overrides/%FF", "/v1/policy/overrides?category=%ED%A0%80"):
        r = c.put(url, json={"life_s": 5}, headers=AUTH)
        assert r.status_code == 422, r.text
        assert (r.json()["field"], r.json()["error"]) == ("category", "invalid_value")
        assert "not UTF-8 once percent-decoded" in r.json()["message"]
    assert c.get("/v1/policy/overrides").json() == {}


def test_unknown_paths_and_methods_answer_json_naming_them(ctl: RunningController) -> None:
    missing = ctl.client.get("/v1/nothing-here")
    assert missing.status_code == 404
    assert missing.json() == {
        "error": "not_found",
        "reason": "no route /v1/nothing-here (GET /openapi.json lists them)",
    }
    wrong = ctl.client.request("PATCH", "/v1/policy/overrides/text_1", headers=AUTH)
    assert wrong.status_code == 405
    assert wrong.json() == {
        "error": "method_not_allowed",
        "reason": "PATCH is not allowed on /v1/policy/overrides/text_1; allowed: DELETE, PUT",
    }
    assert wrong.headers["Allow"] == "DELETE, PUT"
    read_only = ctl.client.post("/v1/policy", headers=AUTH)
    assert read_only.status_code == 405 and read_only.headers["Allow"] == "GET, HEAD"


def test_head_answers_as_get_without_a_body(ctl: RunningController) -> None:
    """Every route answering GET answers HEAD (its ``Allow`` header names it): the GET's
    status and headers, no body."""
    spec = ctl.client.get("/openapi.json").json()
    reads = [path for path, item in spec["paths"].items() if "get" in item and "{" not in path]
    assert "/v1/policy/versions" in reads and "/metrics" in reads
    statuses = set()
    for path in reads:
        got, head = ctl.client.get(path), ctl.client.head(path)
        assert head.status_code == got.status_code, path
        assert head.content == b"", path
        assert head.headers["content-type"] == got.headers["content-type"], path
        statuses.add(head.status_code)
    assert 200 in statuses
    assert ctl.client.head("/v1/nothing-here").status_code == 404


def test_a_current_pointer_without_its_document_is_reported(
    redis_url: str, key_prefix: str
) -> None:
    settings = _settings(redis_url).model_copy(update={"key_prefix": key_prefix})
    with running_controller(settings) as rc:
        version = rc.client.get("/v1/policy").json()["version"]
        redis.Redis.from_url(redis_url).delete(Keys(key_prefix).policy_doc(version))
        r = rc.client.get("/v1/policy")
        assert r.status_code == 503
        assert r.json() == {
            "error": "policy_missing",
            "reason": f"current names version {version}, not stored",
        }
