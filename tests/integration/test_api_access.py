"""Access and bounds of the REST API over real HTTP and a real Redis: the read token,
the challenges, a 100 MB body refused before it is read (by token and by size, with a
length or chunked), and the bounds of override names and counts."""

from __future__ import annotations

import re
import select
import socket
import uuid
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from fastapi.routing import APIRoute
from starlette.routing import BaseRoute, Match

from controlplane.api.access import MAX_BODY_BYTES
from tests.conftest import delete_prefix
from tests.integration.controller_fixtures import (
    RunningController,
    live_settings,
    running_controller,
)

pytestmark = pytest.mark.integration
WRITE, READ = "write-token-1", "read-token-1"
AS_WRITER = {"Authorization": f"Bearer {WRITE}"}
AS_READER = {"Authorization": f"Bearer {READ}"}
HUNDRED_MB = 100_000_000
MAX_OVERRIDES = 3


@pytest.fixture(scope="module")
def ctl(redis_url: str) -> Iterator[RunningController]:
    settings = live_settings(
        redis_url=redis_url,
        key_prefix=f"kvwise-access-{uuid.uuid4().hex[:8]}:",
        api_token=WRITE,
        api_read_token=READ,
        max_overrides=MAX_OVERRIDES,
    )
    with running_controller(settings) as rc:
        yield rc
    delete_prefix(redis_url, settings.key_prefix)


READS = ["/v1/policy", "/v1/policy/versions", "/v1/policy/overrides", "/v1/agents"]
READS += ["/v1/categories", "/metrics"]


@pytest.mark.parametrize("path", READS)
def test_reads_need_the_read_token_or_the_api_token(ctl: RunningController, path: str) -> None:
    c = ctl.client
    refused = c.get(path)
    assert refused.status_code == 401
    assert refused.json() == {"error": "unauthorized", "reason": "missing bearer token"}
    assert refused.headers["WWW-Authenticate"] == 'Bearer realm="kvwise"'
    wrong = c.get(path, headers={"Authorization": "Bearer read-token-2"})
    assert wrong.status_code == 401
    assert wrong.headers["WWW-Authenticate"] == 'Bearer realm="kvwise", error="invalid_token"'
    assert c.get(path, headers=AS_READER).status_code == 200
    assert c.get(path, headers=AS_WRITER).status_code == 200


@pytest.mark.parametrize("authorization", [READ, f"Basic {READ}", "Bearer", f"Token {READ}"])
def test_a_token_not_sent_as_bearer_says_how_to_send_it(
    ctl: RunningController, authorization: str
) -> None:
    """The bare token (a user who left out ``Bearer``) or another scheme read as no token;
    the 401 says the header's form is wrong, not only that a token is missing, and never
    repeats what the header held."""
    refused = ctl.client.get("/v1/agents", headers={"Authorization": authorization})
    assert refused.status_code == 401
    assert refused.json() == {
        "error": "unauthorized",
        "reason": "missing bearer token: the Authorization header is not 'Bearer <token>'",
    }
    assert READ not in refused.text


@pytest.mark.parametrize("scheme", ["bearer", "BEARER", "BeArEr"])
def test_the_scheme_is_case_insensitive(ctl: RunningController, scheme: str) -> None:
    """RFC 7235: the auth-scheme is case-insensitive, for reads and mutations alike."""
    c = ctl.client
    assert c.get("/v1/agents", headers={"Authorization": f"{scheme} {READ}"}).status_code == 200
    pin = c.put(
        "/v1/policy/overrides/text_case",
        json={"rate": 1},
        headers={"Authorization": f"{scheme} {WRITE}"},
    )
    assert pin.status_code == 200, pin.text
    assert c.delete("/v1/policy/overrides/text_case", headers=AS_WRITER).status_code == 200


def test_probes_and_the_description_stay_open(ctl: RunningController) -> None:
    for path in ("/healthz", "/readyz", "/openapi.json", "/docs"):
        assert ctl.client.get(path).status_code == 200, path


def test_the_read_token_changes_nothing(ctl: RunningController) -> None:
    r = ctl.client.put("/v1/policy/overrides/text_1", json={"rate": 1}, headers=AS_READER)
    assert r.status_code == 403
    assert r.json()["error"] == "forbidden"
    assert r.headers["WWW-Authenticate"] == 'Bearer realm="kvwise", error="insufficient_scope"'
    assert ctl.client.get("/v1/policy/overrides", headers=AS_READER).json() == {}


def test_openapi_declares_the_scheme_and_the_errors(ctl: RunningController) -> None:
    spec = ctl.client.get("/openapi.json").json()
    assert spec["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"
    put = spec["paths"]["/v1/policy/overrides/{category}"]["put"]
    assert put["security"] == [{"bearer": []}]
    (category,) = put["parameters"]
    assert category["schema"]["minLength"] == 1 and category["schema"]["maxLength"] == 128
    assert "any name of 1 to 128 characters" in category["description"]
    assert {"401", "403", "409", "413", "422", "503"} <= set(put["responses"])
    field_error = put["responses"]["422"]["content"]["application/json"]["schema"]["$ref"]
    assert field_error.endswith("/FieldErrorBody")
    assert spec["paths"]["/v1/agents"]["get"]["security"] == [{"bearer": []}]
    assert "security" not in spec["paths"]["/healthz"]["get"]


def test_openapi_declares_401_on_guarded_reads_and_413_everywhere(
    ctl: RunningController,
) -> None:
    """This controller has a read token: every read under /v1/ and /metrics can answer
    401. The access guard answers 413 to a body over the bound on any route, whether it
    takes a body or not, so every route declares it."""
    spec = ctl.client.get("/openapi.json").json()
    takes_body = {(m, path) for path, item in spec["paths"].items() for m, op in item.items()}
    takes_body = {(m, p) for m, p in takes_body if "requestBody" in spec["paths"][p][m]}
    assert takes_body == {
        ("post", "/v1/policy/rollback"),
        ("put", "/v1/policy/overrides/{category}"),
        ("put", "/v1/policy/overrides"),
        ("put", "/v1/policy/evictor"),
    }
    for path, item in spec["paths"].items():
        for method, op in item.items():
            declared = set(op["responses"])
            assert "413" in declared, (method, path)
            if path.startswith("/v1/") or path == "/metrics":
                assert "401" in declared, (method, path)
    oversized = b"{" + b" " * 20_000 + b"}"
    for method, path in [("POST", "/v1/policy/refit"), ("GET", "/healthz")]:
        answer = ctl.client.request(method, path, content=oversized, headers=AS_WRITER)
        assert (answer.status_code, answer.json()["error"]) == (413, "body_too_large"), path


# --- bodies ------------------------------------------------------------------------------
@dataclass
class Pushed:
    """What a client pushing a large body saw: bytes the socket took, the reply (empty
    when the server's reset overtook it), and whether the server ended the connection."""

    sent: int
    reply: bytes
    closed: bool

    def status(self) -> int:
        return int(self.reply.split(b" ", 2)[1])


def _connect(url: str) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=5)


def _read_to_end(sock: socket.socket) -> tuple[bytes, bool]:
    """The reply, and whether the server ended the connection (False: it kept it open
    past the socket's timeout, e.g. to drain a body)."""
    reply = b""
    try:
        while chunk := sock.recv(65536):
            reply += chunk
    except ConnectionResetError:
        pass
    except TimeoutError:
        return reply, False
    return reply, True


def _push(url: str, head: bytes, total: int, *, chunked: bool) -> Pushed:
    """Send ``head``, then body bytes until ``total`` or until the server answers or
    ends the connection; then read what is left of the reply."""
    piece = b"x" * 65536
    frame = (b"%x\r\n" % len(piece) + piece + b"\r\n") if chunked else piece
    sent = 0
    with _connect(url) as sock:
        sock.sendall(head)
        try:
            while sent < total and not select.select([sock], [], [], 0)[0]:
                sock.sendall(frame)
                sent += len(piece)
        except (ConnectionResetError, BrokenPipeError):
            return Pushed(sent, b"", closed=True)
        reply, closed = _read_to_end(sock)
    return Pushed(sent, reply, closed)


def _head(headers: dict[str, str], length: int | None, *, expect: bool = False) -> bytes:
    lines = ["PUT /v1/policy/overrides/text_1 HTTP/1.1", "Host: kvwise"]
    lines += ["Content-Type: application/json"] + [f"{k}: {v}" for k, v in headers.items()]
    lines += [f"Content-Length: {length}" if length is not None else "Transfer-Encoding: chunked"]
    lines += ["Expect: 100-continue"] if expect else []
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


# The kernel's socket buffers take a few MB before the client learns the server has
# stopped reading; reading the whole body would take all 100 MB.
READ_NOTHING_BOUND = HUNDRED_MB // 5
REFUSALS = [
    pytest.param({}, False, 401, "unauthorized", id="no-token"),
    pytest.param(AS_READER, False, 403, "forbidden", id="read-token"),
    pytest.param(AS_WRITER, False, 413, "body_too_large", id="too-large"),
    pytest.param(AS_WRITER, True, 413, "body_too_large", id="too-large-chunked"),
]


@pytest.mark.parametrize(("headers", "chunked", "status", "error"), REFUSALS)
def test_a_100_mb_body_is_refused_before_it_is_read(
    ctl: RunningController, headers: dict[str, str], chunked: bool, status: int, error: str
) -> None:
    """A client that sends its body at once: the server answers from the headers and
    closes instead of draining the rest."""
    head = _head(headers, None if chunked else HUNDRED_MB)
    pushed = _push(ctl.url, head, HUNDRED_MB, chunked=chunked)
    assert pushed.closed, "the server kept the connection open to drain the body"
    assert pushed.sent < READ_NOTHING_BOUND, pushed.sent
    if pushed.reply:  # else the server's reset overtook its answer (lingering data)
        assert pushed.status() == status, pushed.reply[:200]
        assert f'"error":"{error}"'.encode() in pushed.reply
        assert b"connection: close" in pushed.reply.lower()
    assert ctl.client.get("/healthz").status_code == 200


@pytest.mark.parametrize(("headers", "chunked", "status", "error"), REFUSALS[:3])
def test_a_client_that_asks_first_sends_no_byte_of_the_body(
    ctl: RunningController, headers: dict[str, str], chunked: bool, status: int, error: str
) -> None:
    """``Expect: 100-continue`` (curl sends it for large bodies): the server answers the
    headers with the refusal, never with ``100 Continue``, so no body byte is sent."""
    with _connect(ctl.url) as sock:
        sock.sendall(_head(headers, HUNDRED_MB, expect=True))
        reply, closed = _read_to_end(sock)
    pushed = Pushed(0, reply, closed)
    assert pushed.closed
    assert pushed.status() == status, reply[:200]
    assert f'"error":"{error}"'.encode() in reply
    assert b"100 Continue" not in reply


# Past what the kernel's socket buffers hold: the client is still sending when it is refused.
SENT_WHOLE = 24 * 2**20
SENDERS = ["length", "chunked", "chunked-asked-first"]


@pytest.mark.parametrize("sender", SENDERS)
def test_a_client_that_reads_once_it_has_sent_its_body_reads_the_413(
    ctl: RunningController, sender: str
) -> None:
    """A client that sends its whole body before it reads (curl after ``100 Continue``,
    which a chunked body gets as the guard must read it to size it) once saw a reset, or
    the 413's status without its JSON: the server closed on unread bytes. The guard reads
    and drops the rest for a while, so the answer arrives whole and the connection ends."""
    chunked = sender != "length"
    piece = b"x" * 65536
    frame = (b"%x\r\n" % len(piece) + piece + b"\r\n") if chunked else piece
    body = frame * (SENT_WHOLE // len(piece)) + (b"0\r\n\r\n" if chunked else b"")
    asks = sender == "chunked-asked-first"
    with _connect(ctl.url) as sock:
        sock.sendall(_head(AS_WRITER, None if chunked else SENT_WHOLE, expect=asks))
        if asks:
            assert sock.recv(4096).startswith(b"HTTP/1.1 100 Continue\r\n\r\n")
        sock.sendall(body)
        reply, closed = _read_to_end(sock)
    pushed = Pushed(len(body), reply, closed)
    assert pushed.closed
    assert pushed.status() == 413, reply[:200]
    assert reply.endswith(
        b'{"error":"body_too_large","reason":"request bodies are limited to '
        + str(MAX_BODY_BYTES).encode()
        + b' bytes"}'
    )


def test_a_body_at_the_bound_is_read(ctl: RunningController) -> None:
    padded = b'{"rate": 1' + b" " * (MAX_BODY_BYTES - 12) + b"}"
    assert len(padded) == MAX_BODY_BYTES - 1
    r = ctl.client.put(
        "/v1/policy/overrides/bound",
        content=padded,
        headers={**AS_WRITER, "Content-Type": "application/json"},
    )
    assert r.status_code == 200, r.text
    assert ctl.client.delete("/v1/policy/overrides/bound", headers=AS_WRITER).status_code == 200


# --- override names and counts -----------------------------------------------------------
AGENT_NAMES = {
    "128 characters": "x" * 128,
    "a reuse class": "text_1/re",
    "a space": "a b",
    "leading underscore": "_leading",
    "accents": "télé",
    "semicolon": "a;b",
    "slashes around": "/x/",
    "URL marks": "50%?#",
    "128 two-byte characters": "é" * 128,
    "a line break": "a\nb",
    "a control character": "a\x1fb",
}


@dataclass(frozen=True)
class Naming:
    """Where a request names its category: each route's request arguments for a name."""

    override: Callable[[str], dict[str, Any]]
    """``PUT`` and ``DELETE`` of an override."""
    category: Callable[[str], dict[str, Any]]
    """``GET`` of one category."""


IN_THE_PATH = Naming(
    override=lambda name: {"url": f"/v1/policy/overrides/{quote(name, safe='')}"},
    category=lambda name: {"url": f"/v1/categories/{quote(name, safe='')}"},
)
IN_THE_QUERY = Naming(
    override=lambda name: {"url": "/v1/policy/overrides", "params": {"category": name}},
    category=lambda name: {"url": "/v1/category", "params": {"name": name}},
)
NAMINGS = pytest.mark.parametrize("naming", [IN_THE_PATH, IN_THE_QUERY], ids=["path", "query"])


def _pinned_read_and_released(ctl: RunningController, name: str, naming: Naming) -> None:
    r = ctl.client.put(**naming.override(name), json={"rate": 1}, headers=AS_WRITER)
    assert r.status_code == 200, r.text
    assert r.json()["categories"][name]["source"] == "override"
    assert ctl.client.get("/v1/policy/overrides", headers=AS_READER).json() == {name: {"rate": 1}}
    read = ctl.client.get(**naming.category(name), headers=AS_READER)
    assert read.status_code == 200 and read.json()["name"] == name, read.text
    assert ctl.client.delete(**naming.override(name), headers=AS_WRITER).status_code == 200
    assert ctl.client.get("/v1/policy/overrides", headers=AS_READER).json() == {}


@NAMINGS
@pytest.mark.parametrize("name", AGENT_NAMES.values(), ids=AGENT_NAMES.keys())
def test_every_name_an_agent_can_send_is_pinned_and_released(
    ctl: RunningController, name: str, naming: Naming
) -> None:
    """Pins once took 1 to 64 characters of ``[A-Za-z0-9._:-]`` (and no ``/`` reached the
    route), while agents name categories with up to 128 characters of any kind (a reuse
    class is ``<category>/re``): some categories listed could not be pinned."""
    _pinned_read_and_released(ctl, name, naming)


@pytest.mark.parametrize("name", [".", ".."], ids=["one dot", "two dots"])
def test_a_name_clients_resolve_as_a_path_step_is_named_in_the_query(
    ctl: RunningController, name: str
) -> None:
    """An agent may name a category ``.`` or ``..``, and HTTP clients resolve such a path
    segment as a step (browsers even as ``%2E``): ``/v1/categories/..`` was sent as
    ``/v1/``, and no request could pin, read or release the category. The query form
    names it."""
    walked = ctl.client.get(**IN_THE_PATH.category(name), headers=AS_READER)
    assert walked.request.url.path != f"/v1/categories/{name}"  # the client's doing
    _pinned_read_and_released(ctl, name, IN_THE_QUERY)


@NAMINGS
@pytest.mark.parametrize("name", ["", "x" * 129, "é" * 129], ids=["empty", "129", "129 two-byte"])
@pytest.mark.parametrize("method", ["PUT", "DELETE"])
def test_names_no_agent_can_send_are_refused(
    ctl: RunningController, name: str, method: str, naming: Naming
) -> None:
    body = {"json": {"rate": 1}} if method == "PUT" else {}
    r = ctl.client.request(method, **naming.override(name), headers=AS_WRITER, **body)
    assert r.status_code == 422, r.text
    assert r.json()["field"] == "category"
    assert r.json()["message"] == "must be 1 to 128 characters"


@pytest.mark.parametrize("method", ["PUT", "DELETE"])
def test_the_query_form_without_a_name_names_its_field(ctl: RunningController, method: str) -> None:
    """No ``?category=``: a 422 naming the parameter, never every override at once."""
    body = {"json": {"rate": 1}} if method == "PUT" else {}
    r = ctl.client.request(method, "/v1/policy/overrides", headers=AS_WRITER, **body)
    assert r.status_code == 422, r.text
    assert (r.json()["field"], r.json()["message"]) == ("category", "is required")


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("PUT", "/v1/policy/overrides?category=a&=null"),
        ("DELETE", "/v1/policy/overrides?category=a&categroy=b"),
        ("GET", "/v1/category?name=a&names=b"),
        # routes that take no query: POST /v1/policy/refit?force=1 ran a plain refit
        ("POST", "/v1/policy/refit?force=1"),
        ("GET", "/v1/policy?version=1"),
        ("PUT", "/v1/policy/evictor?family=lru"),
    ],
)
def test_a_route_refuses_a_query_parameter_it_does_not_take(
    ctl: RunningController, method: str, path: str
) -> None:
    """A stray or misspelt query parameter is a 422 naming it, not ignored (a fuzzer sent
    ``&=null`` and the pin was published), on routes that take a query and on those that
    take none."""
    body = (
        {"json": {"family": "lru"} if "evictor" in path else {"rate": 1}} if method == "PUT" else {}
    )
    headers = AS_READER if method == "GET" else AS_WRITER
    r = ctl.client.request(method, path, headers=headers, **body)
    assert r.status_code == 422, r.text
    assert r.json()["error"] == "unknown_field", r.json()
    assert "is not a query parameter here" in r.json()["message"], r.json()
    assert ctl.client.get("/v1/policy/overrides", headers=AS_READER).json().get("a") is None


def _api_routes(routes: Sequence[BaseRoute]) -> Iterator[APIRoute]:
    """Every API route under ``routes``, through the routers included (FastAPI lists an
    included router as one entry, its routes kept on ``original_router``)."""
    for route in routes:
        if isinstance(route, APIRoute):
            yield route
        elif (included := getattr(route, "original_router", None)) is not None:
            yield from _api_routes(included.routes)


def test_the_name_routes_shadow_no_other_route(ctl: RunningController) -> None:
    """A name is the rest of the path (``{name:category}``): no other route may lie under
    it."""
    routes = list(_api_routes(ctl.app.routes))
    catch_alls = [r for r in routes if ":category}" in r.path]
    assert len(catch_alls) == 3
    for catch_all in catch_alls:
        for other in routes:
            concrete = re.sub(r"{[^}]*}", "x", other.path)
            for method in other.methods:
                scope = {"type": "http", "path": concrete, "method": method}
                matched = catch_all.matches(scope)[0] is Match.FULL
                assert not matched or other is catch_all, (catch_all.path, other.path)


def test_concurrent_pins_past_the_limit_are_all_409(ctl: RunningController) -> None:
    """Pins racing for the last room: the losers once got a 422 ``invalid_value`` from
    the store's check inside the transaction."""

    def pin(i: int) -> httpx.Response:
        with httpx.Client(base_url=ctl.url, timeout=30) as client:
            return client.put(f"/v1/policy/overrides/race-{i}", json={"rate": 1}, headers=AS_WRITER)

    with ThreadPoolExecutor(max_workers=6) as pool:
        answers = list(pool.map(pin, range(MAX_OVERRIDES + 4)))
    assert sorted({a.status_code for a in answers}) == [200, 409], [a.text for a in answers]
    assert all(a.json()["error"] == "too_many_overrides" for a in answers if a.status_code != 200)
    pinned = ctl.client.get("/v1/policy/overrides", headers=AS_READER).json()
    assert len(pinned) == MAX_OVERRIDES
    for name in pinned:
        ctl.client.delete(f"/v1/policy/overrides/{name}", headers=AS_WRITER)


def test_override_count_is_bounded_and_a_pin_can_always_change(ctl: RunningController) -> None:
    c = ctl.client
    names = [f"cat-{i}" for i in range(MAX_OVERRIDES)]
    for name in names:
        assert c.put(f"/v1/policy/overrides/{name}", json={"rate": 1}, headers=AS_WRITER).is_success
    one_more = c.put("/v1/policy/overrides/cat-x", json={"rate": 1}, headers=AS_WRITER)
    assert one_more.status_code == 409
    assert one_more.json()["error"] == "too_many_overrides"
    said = f"{MAX_OVERRIDES} categories are pinned already, the most KVWISE_MAX_OVERRIDES"
    assert said in one_more.json()["reason"], one_more.json()
    changed = c.put(f"/v1/policy/overrides/{names[0]}", json={"rate": 2}, headers=AS_WRITER)
    assert changed.status_code == 200
    assert changed.json()["categories"][names[0]]["rate"] == 2
    assert set(c.get("/v1/policy/overrides", headers=AS_READER).json()) == set(names)
    for name in names:
        assert c.delete(f"/v1/policy/overrides/{name}", headers=AS_WRITER).status_code == 200
