"""The API's access rules without a server: which request needs which token, tokens
compared in constant time, the start-up exposure rules and the token settings."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from pydantic import ValidationError

from controlplane.api.access import Access, AccessRules, required_access
from controlplane.api.exposure import UnsafeExposure, check_exposure, is_loopback
from controlplane.service.settings import ControllerSettings

NEEDED: dict[Access, list[str]] = {
    Access.OPEN: ["GET /healthz", "GET /readyz", "GET /openapi.json", "GET /docs"],
    Access.READ: ["GET /v1/policy", "GET /v1/agents", "GET /v1/policy/overrides", "HEAD /metrics"],
    Access.WRITE: [
        "PUT /v1/policy/overrides/x",
        "DELETE /v1/policy/overrides/x",
        "POST /v1/policy/refit",
        "POST /anything/else",
        "PATCH /healthz",
    ],
}
"""Requests ("METHOD /path") by the access they need."""


@pytest.mark.parametrize(
    ("request_line", "needed"),
    [(line, needed) for needed, lines in NEEDED.items() for line in lines],
)
def test_required_access_by_method_and_path(request_line: str, needed: Access) -> None:
    method, path = request_line.split(" ", 1)
    assert required_access(method, path) is needed


def test_refusals_and_their_challenges() -> None:
    rules = AccessRules(api_token=b"write-token", read_token=b"read-token")
    missing = rules.refusal("GET", "/v1/agents", None)
    assert missing is not None and missing.status == 401
    assert missing.headers == {"WWW-Authenticate": 'Bearer realm="kvwise"'}
    wrong = rules.refusal("GET", "/v1/agents", "Bearer nope")
    assert wrong is not None and wrong.status == 401
    assert wrong.headers["WWW-Authenticate"].endswith('error="invalid_token"')
    scope = rules.refusal("PUT", "/v1/policy/overrides/a", "Bearer read-token")
    assert scope is not None and scope.status == 403
    assert scope.headers["WWW-Authenticate"].endswith('error="insufficient_scope"')
    assert rules.refusal("GET", "/v1/agents", "Bearer read-token") is None
    assert rules.refusal("GET", "/v1/agents", "bearer write-token") is None
    assert rules.refusal("PUT", "/v1/policy/overrides/a", "Bearer write-token") is None
    assert rules.refusal("GET", "/healthz", None) is None
    # Another scheme, or an empty credential, is no token at all.
    basic = rules.refusal("GET", "/v1/agents", "Basic d3JpdGUtdG9rZW4=")
    assert basic is not None and basic.reason.startswith("missing bearer token: ")
    empty = rules.refusal("GET", "/v1/agents", "Bearer   ")
    assert empty is not None and empty.reason.startswith("missing bearer token: ")


def test_without_tokens_everything_is_open_and_reads_follow_the_read_token() -> None:
    assert AccessRules(None, None).refusal("DELETE", "/v1/policy/overrides/a", None) is None
    writes_only = AccessRules(b"w", None)
    assert writes_only.refusal("GET", "/metrics", None) is None
    refused = writes_only.refusal("POST", "/v1/policy/refit", None)
    assert refused is not None and refused.status == 401


def _fastest_of(check: Callable[[], object], rounds: int = 15) -> float:
    """The least time ``check`` took over ``rounds`` runs (the least is the least noisy)."""
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        check()
        best = min(best, time.perf_counter() - start)
    return best


def test_token_comparison_takes_as_long_wherever_the_first_wrong_byte_is() -> None:
    """A plain ``==`` returns at the first differing byte, so a wrong token that shares a
    long prefix with the real one takes longer to refuse: that difference is what a
    timing attack measures. With 8 MB tokens it is a ratio of hundreds for ``==``; the
    constant-time comparison must show none of it."""
    size = 8 << 20
    secret = b"a" * size
    rules = AccessRules(api_token=secret, read_token=b"b" * size)
    wrong_first = b"z" + b"a" * (size - 1)
    wrong_last = b"a" * (size - 1) + b"z"
    assert rules.granted(wrong_first) is Access.OPEN
    assert rules.granted(wrong_last) is Access.OPEN
    assert rules.granted(secret) is Access.WRITE
    early = _fastest_of(lambda: rules.granted(wrong_first))
    late = _fastest_of(lambda: rules.granted(wrong_last))
    assert late / early < 3, (early, late)
    # The same measurement does see the leak of a short-circuiting comparison.
    eq_early = _fastest_of(lambda: wrong_first == secret)
    eq_late = _fastest_of(lambda: wrong_last == secret)
    assert eq_late / eq_early > 10, (eq_early, eq_late)


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.0.0.53", True),
        ("::1", True),
        ("[::1]", True),
        ("localhost", True),
        ("0.0.0.0", False),
        ("::", False),
        ("10.1.2.3", False),
        ("", False),
        ("controller.example.internal", False),
    ],
)
def test_loopback_addresses(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def test_an_open_api_on_the_network_needs_explicit_consent() -> None:
    with pytest.raises(UnsafeExposure, match="KVWISE_ALLOW_OPEN_API"):
        check_exposure(ControllerSettings(host="0.0.0.0"))
    check_exposure(ControllerSettings(host="0.0.0.0", allow_open_api=True))
    check_exposure(ControllerSettings(host="0.0.0.0", api_token="t"))  # type: ignore[arg-type]
    check_exposure(ControllerSettings(host="127.0.0.1"))


@pytest.mark.parametrize("blank", ["", " ", "\t\n"])
def test_empty_or_blank_tokens_are_refused(blank: str) -> None:
    with pytest.raises(ValidationError, match="api_token"):
        ControllerSettings(api_token=blank)  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match="api_read_token"):
        ControllerSettings(api_token="w", api_read_token=blank)  # type: ignore[arg-type]


def test_a_read_token_needs_a_distinct_api_token() -> None:
    with pytest.raises(ValidationError, match="needs KVWISE_API_TOKEN"):
        ControllerSettings(api_read_token="r")  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match="must differ"):
        ControllerSettings(api_token="same", api_read_token="same")  # type: ignore[arg-type]
    ControllerSettings(api_token="w", api_read_token="r")  # type: ignore[arg-type]
