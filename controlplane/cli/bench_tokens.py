"""The two bearer tokens of ``kvwise bench serve``: the server's API key and the
controller's read token.

Owns where each comes from (its option, else its environment variables in order; an empty
value is no token), the check that it can go in a header, and what a refusal of it (401,
403) or a 404 is told as: which token is missing or wrong and how to give it. A token is
kept out of every ``repr`` and message: it must never be printed, logged or written to a
summary. It must never send anything itself.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import NamedTuple

from controlplane.cli.common import fail

SERVER_KEY_VARIABLES = ("OPENAI_API_KEY",)
"""Where ``--api-key`` is read from when not given (OpenAI clients and vLLM's own
benchmark read it)."""
CONTROLLER_TOKEN_VARIABLES = ("KVWISE_API_READ_TOKEN", "KVWISE_API_TOKEN")
"""Where ``--controller-token`` is read from when not given, in order: the controller's
read token, else its API token (which also reads)."""


@dataclass(frozen=True)
class Token:
    """A bearer token for one service, and where it came from (``source``: the option or
    the environment variable; None when there is no token)."""

    value: str | None = field(repr=False)
    source: str | None


class _Kind(NamedTuple):
    """One of the two tokens: how it is given, and what asks for it (for messages)."""

    option: str
    variables: tuple[str, ...]
    """Read in order when the option is not given."""
    service: str
    """The service that asks for it, as a sentence's subject."""
    wants: str
    """What the service wants, as its object."""


SERVER_KEY = _Kind("--api-key", SERVER_KEY_VARIABLES, "the server", "an API key")
CONTROLLER_TOKEN = _Kind(
    "--controller-token",
    CONTROLLER_TOKEN_VARIABLES,
    "the controller",
    "its read token (or its API token, which also reads)",
)


def read_token(kind: _Kind, given: str | None) -> Token:
    """The token of ``kind``: ``given`` (its option), else the first of its environment
    variables that holds more than white space; surrounding whitespace (a newline read from a
    file) goes. One that cannot be a header value fails naming its source, never its
    value."""
    found = [(kind.option, given)] if given is not None else []
    found += [(v, os.environ[v]) for v in kind.variables if os.environ.get(v, "").strip()]
    if not found or not found[0][1].strip():
        return Token(None, None)
    source, value = found[0][0], found[0][1].strip()
    if not all("!" <= c <= "~" for c in value):
        fail(f"{source}: not a usable bearer token (printable ASCII without spaces expected)")
    return Token(value, source)


def option_help(kind: _Kind, what: str) -> str:
    """The help of ``kind``'s option: a bearer token for ``what``, and the environment
    variables read when it is not given."""
    return f"Bearer token for {what} (default: {', else '.join(f'${v}' for v in kind.variables)})"


def how_to_give(kind: _Kind) -> str:
    """Where ``kind`` is given: its option and its environment variables."""
    return " or ".join((f"{kind.option} TOKEN", *(f"{v}=TOKEN" for v in kind.variables)))


def refusal(kind: _Kind, token: Token, url: str, status: int) -> str | None:
    """What a 401 or 403 from ``url`` means for ``token`` (None for another status)."""
    if status not in (401, 403):
        return None
    said = f"{url} answered HTTP {status}"
    if token.value is None:
        return f"{said}: {kind.service} wants {kind.wants}; give it with {how_to_give(kind)}"
    return (
        f"{said}: {kind.service} refused the token from {token.source}; give "
        f"{kind.wants} with {how_to_give(kind)}"
    )
