"""The REST API fuzzed from its own OpenAPI schema (schemathesis) over real HTTP: no 5xx,
responses conform to the schema. Mutations run with the token, so the fuzzer reaches the
handlers, not only the 401 path."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import schemathesis
from hypothesis import HealthCheck, settings

from controlplane.service.settings import ControllerSettings
from tests.integration.controller_fixtures import running_controller

pytestmark = [pytest.mark.integration, pytest.mark.slow]
TOKEN = "fuzz-token"


@pytest.fixture(scope="module")
def api_schema(redis_url: str) -> Iterator[schemathesis.BaseSchema]:
    import uuid

    import redis

    settings_ = ControllerSettings(
        redis_url=redis_url,
        key_prefix=f"kvwise-fuzz-{uuid.uuid4().hex[:8]}:",
        api_token=TOKEN,  # type: ignore[arg-type]
        refit_interval_s=3600,
        ingest_block_ms=100,
    )
    with running_controller(settings_) as rc:
        yield schemathesis.openapi.from_url(rc.url + "/openapi.json")
    client = redis.Redis.from_url(redis_url)
    keys = list(client.scan_iter(match=settings_.key_prefix + "*"))
    if keys:
        client.delete(*keys)


schema = schemathesis.pytest.from_fixture("api_schema")


@schema.parametrize()
@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
def test_api_never_errors(case: schemathesis.Case) -> None:
    case.call_and_validate(headers={"Authorization": f"Bearer {TOKEN}"})
