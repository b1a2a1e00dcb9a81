"""The REST API fuzzed from its own OpenAPI schema (schemathesis) over real HTTP.

Valid and invalid inputs (both generation modes): no 5xx, every status documented for
its route, every body (errors included: ``ErrorBody``, ``FieldErrorBody``) conforming
to its schema, and auth enforced where declared (schemathesis probes each secured route
without a token and with a wrong one). Requests carry the API token, so the fuzzer
reaches the handlers; a read token is set too, so reads are secured as well. A second
run fuzzes the same API with Redis unreachable: then 503 is the only 5xx allowed, and
it must be the documented JSON error.

Headers that frame the HTTP message itself (``Transfer-Encoding``, ``Content-Length``)
are taken out of the generated cases: a malformed one (``transfer-encoding: 6``) is
refused by the HTTP server with a 400 before any route sees the request, which tests
the server's parser, not this API.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error

from controlplane.dev.embedded_redis import free_port
from controlplane.service.settings import ControllerSettings
from tests.conftest import delete_prefix
from tests.integration.controller_fixtures import AUTH, TOKEN, live_settings, running_controller

pytestmark = [pytest.mark.integration, pytest.mark.slow]
READ_TOKEN = "fuzz-read-token"


def _settings(redis_url: str) -> ControllerSettings:
    return live_settings(
        redis_url=redis_url,
        key_prefix=f"kvwise-fuzz-{uuid.uuid4().hex[:8]}:",
        api_token=TOKEN,
        api_read_token=READ_TOKEN,
    )


@pytest.fixture(scope="module")
def api_schema(redis_url: str) -> Iterator[schemathesis.BaseSchema]:
    settings_ = _settings(redis_url)
    with running_controller(settings_) as rc:
        yield schemathesis.openapi.from_url(rc.url + "/openapi.json")
    delete_prefix(redis_url, settings_.key_prefix)


@pytest.fixture(scope="module")
def api_schema_without_redis() -> Iterator[schemathesis.BaseSchema]:
    with running_controller(_settings(f"redis://127.0.0.1:{free_port()}/0")) as rc:
        loaded = schemathesis.openapi.from_url(rc.url + "/openapi.json")
        # Each request waits out the controller's Redis retries (about a second), so
        # this run fuzzes a few cases per route instead of also covering every boundary.
        loaded.config.phases.update(phases=["fuzzing"])
        yield loaded


schema = schemathesis.pytest.from_fixture("api_schema")
schema_without_redis = schemathesis.pytest.from_fixture("api_schema_without_redis")


FRAMING_HEADERS = frozenset({"transfer-encoding", "content-length"})


def _without_framing(case: schemathesis.Case) -> schemathesis.Case:
    """``case`` without generated message-framing headers (the module's docstring)."""
    if case.headers:
        for name in [h for h in case.headers if h.lower() in FRAMING_HEADERS]:
            del case.headers[name]
    return case


@schema.parametrize()
@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
def test_api_never_errors(case: schemathesis.Case) -> None:
    _without_framing(case).call_and_validate(headers=AUTH)


@schema_without_redis.parametrize()
@settings(max_examples=3, deadline=None, suppress_health_check=list(HealthCheck))
def test_api_without_redis_answers_documented_json(case: schemathesis.Case) -> None:
    response = _without_framing(case).call_and_validate(
        headers=AUTH, excluded_checks=[not_a_server_error]
    )
    assert response.status_code < 500 or response.status_code == 503, response.text
    if response.status_code == 503 and case.path != "/readyz":
        assert response.json()["error"] == "redis_unavailable"
