"""Validation errors in the request's own terms: which field, and what it must be.

Owns the translation of pydantic's error records (``body.p_reuse.function-before[...]``,
"Input should be less than or equal to 1") into a ``FieldProblem`` such as
``invalid_value`` / ``p_reuse`` / ``must be a number in [0, 1]``. The words come from the
constraints the API's own OpenAPI document publishes for that route, so the error and
the schema always agree. It must never build a response (``controlplane.api.errors``)
or know a route by name.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from fastapi import Request
from fastapi.routing import APIRoute

_WHOLE_BODY = "body"
_NOT_AN_OBJECT = {"model_attributes_type", "model_type", "dict_type"}
_BOUND_WORDS = (
    ("exclusiveMinimum", ">"),
    ("minimum", ">="),
    ("exclusiveMaximum", "<"),
    ("maximum", "<="),
)


@dataclass(frozen=True)
class FieldProblem:
    """One bad field: ``error`` is ``invalid_value``, ``missing_field``,
    ``unknown_field`` or ``invalid_json``; ``field`` is ``body`` for the whole body."""

    error: str
    field: str
    message: str


NOT_JSON = FieldProblem("invalid_json", _WHOLE_BODY, "is not valid JSON (UTF-8)")
NOT_AN_OBJECT = FieldProblem("invalid_value", _WHOLE_BODY, "must be a JSON object")
_TAKES_NO_BODY = "this request takes no body"


def unwanted_body(raw: bytes) -> list[FieldProblem]:
    """The problems of ``raw`` sent to a route that takes no body: none for an empty body
    or ``{}`` (nothing in it), each field of an object as ``unknown_field`` (as a body
    route's unknown field), anything else as the whole body."""
    if not raw.strip():
        return []
    try:
        sent = json.loads(raw)
    except (ValueError, RecursionError):  # not JSON, or nested deeper than the parser goes
        sent = None
    if not isinstance(sent, dict):
        return [FieldProblem("invalid_value", _WHOLE_BODY, f"must be empty ({_TAKES_NO_BODY})")]
    message = f"is not a field here ({_TAKES_NO_BODY})"
    return [FieldProblem("unknown_field", str(name), message) for name in sent]


@dataclass(frozen=True)
class _OperationFields:
    """The published schema of each field of one operation: parameters and body."""

    parameters: dict[str, Mapping[str, Any]]
    body: dict[str, Mapping[str, Any]]

    def schema_of(self, name: str) -> Mapping[str, Any] | None:
        return self.body.get(name) or self.parameters.get(name)


def field_problems(errors: Sequence[Any], request: Request) -> list[FieldProblem]:
    """One problem per field at fault, in pydantic's order (never empty)."""
    fields = _operation_fields(request)
    out: dict[str, FieldProblem] = {}
    for error in errors:
        problem = _problem(error, fields)
        if problem == NOT_AN_OBJECT and not _sent_as_json(request):
            problem = _not_sent_as_json(request)
        out.setdefault(problem.field, problem)
    return list(out.values()) or [FieldProblem("invalid_value", _WHOLE_BODY, "is not valid")]


def _sent_as_json(request: Request) -> bool:
    media = request.headers.get("content-type", "").split(";")[0].strip().lower()
    return media == "application/json" or media.endswith("+json")


def _not_sent_as_json(request: Request) -> FieldProblem:
    """A body sent without a JSON media type: FastAPI read it as text, so "not a JSON
    object" would mislead; say what to send instead."""
    sent = request.headers.get("content-type") or "none"
    message = f"must be sent as Content-Type: application/json (sent: {sent})"
    return FieldProblem("invalid_value", _WHOLE_BODY, message)


def expectation(schema: Mapping[str, Any]) -> str | None:
    """What a value of ``schema`` must be, in words (None: the schema says nothing)."""
    kind = schema.get("type")
    if "enum" in schema:
        return "must be one of " + ", ".join(map(str, schema["enum"]))
    if kind == "boolean":
        return "must be true or false"
    if kind in ("number", "integer"):
        return _number_words(schema, integer=kind == "integer")
    if kind == "string":
        return _string_words(schema)
    return None


def _not_json_at(error: Mapping[str, Any], loc: tuple[Any, ...]) -> FieldProblem:
    """``NOT_JSON``, with the parser's complaint and its character offset when known."""
    why = error.get("ctx", {}).get("error")
    at = loc[1] if len(loc) > 1 and isinstance(loc[1], int) else None
    if not isinstance(why, str) or at is None:
        return NOT_JSON
    return FieldProblem(NOT_JSON.error, _WHOLE_BODY, f"{NOT_JSON.message}: {why} at character {at}")


def _problem(error: Mapping[str, Any], fields: _OperationFields) -> FieldProblem:
    loc = tuple(error.get("loc", ()))
    kind = str(error.get("type", ""))
    # loc[0] says where (body, path, query); loc[1] is the field; the rest is pydantic's.
    name = str(loc[1]) if len(loc) > 1 and kind != "json_invalid" else _WHOLE_BODY
    if kind == "json_invalid":
        return _not_json_at(error, loc)
    if kind == "missing":
        return FieldProblem("missing_field", name, "is required")
    if kind == "extra_forbidden":
        known = ", ".join(fields.body) or "none"
        return FieldProblem("unknown_field", name, f"is not a field here (known: {known})")
    if name == _WHOLE_BODY and kind in _NOT_AN_OBJECT:
        return NOT_AN_OBJECT
    schema = fields.schema_of(name)
    words = expectation(schema) if schema is not None else None
    return FieldProblem("invalid_value", name, words or _plain(str(error.get("msg", ""))))


def _operation_fields(request: Request) -> _OperationFields:
    route = request.scope.get("route")
    if not isinstance(route, APIRoute):
        return _OperationFields({}, {})
    spec = request.app.openapi()
    operation = spec.get("paths", {}).get(route.path_format, {}).get(request.method.lower(), {})
    parameters = {p["name"]: p.get("schema", {}) for p in operation.get("parameters", [])}
    content = operation.get("requestBody", {}).get("content", {})
    body = _resolve(content.get("application/json", {}).get("schema", {}), spec)
    return _OperationFields(parameters, dict(body.get("properties", {})))


def _resolve(schema: Mapping[str, Any], spec: Mapping[str, Any]) -> Mapping[str, Any]:
    ref = schema.get("$ref")
    if not isinstance(ref, str) or not ref.startswith("#/components/schemas/"):
        return schema
    found: Mapping[str, Any] = spec["components"]["schemas"][ref.rsplit("/", 1)[1]]
    return found


def _number_words(schema: Mapping[str, Any], *, integer: bool) -> str:
    noun = "an integer" if integer else "a number"
    low, high = schema.get("minimum"), schema.get("maximum")
    if low is not None and high is not None:
        return f"must be {noun} in [{_num(low)}, {_num(high)}]"
    bounds = [f"{word} {_num(schema[key])}" for key, word in _BOUND_WORDS if key in schema]
    return f"must be {noun}" + (" " + " and ".join(bounds) if bounds else "")


def _num(value: float) -> str:
    """0.0 -> '0', 1e-06 -> '1e-06': a bound as a person writes it."""
    return str(int(value)) if float(value).is_integer() else str(value)


def _string_words(schema: Mapping[str, Any]) -> str:
    low, high = schema.get("minLength"), schema.get("maxLength")
    size = "a string"
    if low is not None and high is not None:
        size = f"{low} to {high} characters"
    elif high is not None:
        size = f"at most {high} characters"
    pattern = schema.get("pattern")
    return f"must be {size}" + (f" matching {pattern}" if pattern else "")


def _plain(msg: str) -> str:
    """pydantic's sentence without its prefix: 'Value error, x' -> 'x'."""
    for prefix in ("Value error, ", "Assertion failed, "):
        msg = msg.removeprefix(prefix)
    return msg[:1].lower() + msg[1:] if msg else "is not valid"
