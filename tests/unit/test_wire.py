"""The wire contract: key names, event batch round trip and every rejection, policy
documents, heartbeats."""

from __future__ import annotations

import contextlib
import json
import math
import sys
from dataclasses import replace
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from agent.policy_document import BUILTIN_POLICY, CategoryParams, PolicyDocument
from agent.wire import (
    COLUMNS,
    MAX_CATEGORY_NAME_CHARS,
    MAX_EPOCH_CHARS,
    MAX_LOCATION_PART_CHARS,
    MAX_WIRE_INT,
    ROW_BYTES,
    WIRE_SCHEMA_VERSION,
    AgentStatus,
    BatchLimits,
    EventBatch,
    EventKind,
    Keys,
    WireError,
    WireLimitError,
    decode_batch,
    decode_policy,
    encode_batch,
    encode_policy,
)
from tests.wire_samples import (
    FULL_PARAMS,
    FULL_STATUS,
    MAX_POLICY_BYTES,
    MAX_POLICY_CATEGORIES,
    agent_status,
    event_batch,
    filled,
    largest_policy,
)


def make_batch(n: int = 4, categories: tuple[str, ...] = ("text_1", "image_2")) -> EventBatch:
    i = np.arange(n)
    return event_batch(
        worker="w-1",
        seq=7,
        epoch="e0",
        categories=categories,
        ts=1.7e9 + i,
        block=i * -(2**40),
        category=i % len(categories),
        offset=i,
        kind=i % 3,
        prev_ts=np.where(i % 2 == 0, np.nan, 1.6e9),
        prev_category=np.where(i % 2 == 0, -1, 0),
    )


def as_redis(fields: dict[str, bytes]) -> dict[bytes, bytes]:
    """What redis-py's XRANGE returns: bytes keys and values."""
    return {k.encode(): v for k, v in fields.items()}


def test_keys_follow_the_contract() -> None:
    k = Keys("p:")
    assert k.events_stream("w1") == "p:events:{w1}"
    assert k.events_match == "p:events:*"
    assert k.dead_letter == "p:deadletter"
    assert k.policy_current == "p:{policy}:current"
    assert k.policy_doc(12) == "p:{policy}:v:12"
    assert k.policy_versions == "p:{policy}:versions"
    assert k.policy_channel == "p:policy:notify"
    assert k.agent("w1") == "p:agent:{w1}"
    assert k.agents_match == "p:agent:*"
    assert k.instances("w1") == "p:instances:{w1}"
    assert k.leader == "p:leader"
    assert k.overrides == "p:{policy}:overrides"
    assert Keys().events_stream("x") == "kvwise:events:{x}"
    assert k.worker_of(b"p:events:{gpu-0:3}") == "gpu-0:3"
    with pytest.raises(WireError):
        k.worker_of("q:events:{w1}")
    with pytest.raises(WireError):
        k.worker_of("p:events:w1")  # schema 1's untagged name
    with pytest.raises(WireError, match="braces"):
        Keys("a{b}:")


def _slot(key: str) -> str:
    """The part of ``key`` Redis Cluster hashes: the first non-empty ``{...}``, else all."""
    lo = key.find("{")
    hi = key.find("}", lo + 1)
    return key[lo + 1 : hi] if lo >= 0 and hi > lo + 1 else key


def test_a_workers_keys_share_a_shard_and_so_do_the_policy_keys() -> None:
    k = Keys("kvwise:")
    worker = {k.events_stream("w7"), k.agent("w7"), k.ingest_state("w7")}
    worker.add(k.instances("w7"))
    assert {_slot(key) for key in worker} == {"w7"}
    assert _slot(k.events_stream("w8")) != _slot(k.events_stream("w7"))
    policy = {k.policy_current, k.policy_doc(3), k.policy_versions, k.overrides}
    policy |= {k.policy_base, k.policy_hold}
    assert {_slot(key) for key in policy} == {"policy"}


def test_row_layout() -> None:
    assert [name for name, _ in COLUMNS] == [
        "ts",
        "block",
        "category",
        "offset",
        "kind",
        "prev_ts",
        "prev_category",
    ]
    assert ROW_BYTES == 37
    assert [int(k) for k in EventKind] == [0, 1, 2]


def test_encoded_fields_are_compact_and_little_endian() -> None:
    b = make_batch(3)
    f = encode_batch(b)
    assert set(f) == {"v", "w", "e", "s", "c", "n", "d"}
    assert f["v"] == str(WIRE_SCHEMA_VERSION).encode()
    assert f["s"] == b"7" and f["n"] == b"3" and f["w"] == b"w-1" and f["e"] == b"e0"
    assert json.loads(f["c"]) == ["text_1", "image_2"]
    assert len(f["d"]) == 3 * ROW_BYTES
    # Columnar: the first column is the three timestamps, little-endian float64.
    assert np.frombuffer(f["d"][:24], dtype="<f8").tolist() == b.ts.tolist()


def assert_same(a: EventBatch, b: EventBatch) -> None:
    assert (a.worker, a.seq, a.epoch, a.categories) == (b.worker, b.seq, b.epoch, b.categories)
    assert len(a) == len(b)
    for name, dt in COLUMNS:
        x, y = getattr(a, name), getattr(b, name)
        assert y.dtype == dt.newbyteorder("=")
        assert np.array_equal(x, y, equal_nan=x.dtype.kind == "f"), name


EPOCH_ALPHABET = st.characters(min_codepoint=0x21, max_codepoint=0x7E)
"""The characters an epoch may hold: visible ASCII."""


@st.composite
def batches(draw: st.DrawFn) -> EventBatch:
    n = draw(st.integers(0, 40))
    cats = tuple(draw(st.lists(st.text(max_size=12), min_size=1, max_size=5)))
    k = len(cats)
    finite = st.floats(allow_nan=False, allow_infinity=False, width=64)

    def col(dtype: str, elements: st.SearchStrategy[Any]) -> Any:
        return draw(hnp.arrays(np.dtype(dtype), n, elements=elements))

    return EventBatch(
        worker=draw(st.text(min_size=1, max_size=20)),
        seq=draw(st.integers(1, 2**62)),
        epoch=draw(st.text(EPOCH_ALPHABET, min_size=1, max_size=MAX_EPOCH_CHARS)),
        categories=cats,
        ts=col("f8", finite),
        block=col("i8", st.integers(-(2**63), 2**63 - 1)),
        category=col("i4", st.integers(0, k - 1)),
        offset=col("i4", st.integers(-1, 2**31 - 1)),
        kind=col("u1", st.sampled_from([0, 1, 2])),
        prev_ts=col("f8", finite | st.just(math.nan)),
        prev_category=col("i4", st.integers(-1, k - 1)),
    )


@settings(max_examples=60, deadline=None)
@given(batches(), st.booleans())
def test_round_trip(batch: EventBatch, as_bytes: bool) -> None:
    fields = encode_batch(batch)
    back = decode_batch(as_redis(fields) if as_bytes else fields)
    assert_same(batch, back)


def test_decoded_columns_are_writable_native_copies() -> None:
    back = decode_batch(as_redis(encode_batch(make_batch(5))))
    back.ts[0] = 0.0  # a read-only frombuffer view would raise
    assert back.ts.flags.aligned and back.prev_ts.flags.aligned


def test_columns_of_different_lengths_are_refused() -> None:
    b = make_batch(3)
    with pytest.raises(ValueError, match="offset"):
        replace(b, offset=b.offset[:2])


def corrupt_column(name: str, value: float) -> dict[bytes, bytes]:
    b = make_batch(4)
    getattr(b, name)[2] = value
    return as_redis(encode_batch(b))


DROP = None
"""In a ``MALFORMED_FIELDS`` row: the field is left out."""
MALFORMED_FIELDS: list[tuple[bytes, bytes | None, str]] = [
    # (field, its new value or DROP, what the error must say)
    (b"d", DROP, "'d'"),
    (b"v", DROP, "'v'"),
    (b"c", DROP, "'c'"),
    (b"v", b"1", "v: the sender speaks wire schema 1, this side 2"),
    (b"v", b"one", "v:"),
    (b"s", b"x7", "s:"),
    (b"s", b"1.5", "s:"),
    (b"s", b"0", "s:"),
    (b"s", b"9223372036854775808", "s: 9223372036854775808 is past the limit"),
    (b"n", b"four", "n:"),
    (b"n", b"5", "d:"),
    (b"c", b"[text", "c:"),
    (b"c", b'{"a": 1}', "c:"),
    (b"c", b'["only_one"]', "category:"),
    # Issue 14, B1: each of these once escaped as UnicodeDecodeError or RecursionError.
    (b"\xff\xfe", b"x", "field name: not UTF-8"),
    (b"v", b"\xff", "v: not UTF-8"),
    (b"w", b"\xc3\x28", "w: not UTF-8"),
    (b"e", b"\x80", "e: not UTF-8"),
    (b"e", b"", "e: '' is not 1 to"),
    (b"e", "\u00e9".encode(), "e: '\u00e9' is not 1 to"),
    (b"e", b"a b", "e: 'a b' is not 1 to"),
    (b"c", b"[" * 50_000 + b"]" * 50_000, "c: not JSON (RecursionError"),
    (b"c", b'["\xff"]', "c: not JSON"),
]


@pytest.mark.parametrize(("name", "value", "field"), MALFORMED_FIELDS)
def test_malformed_fields_raise_wire_error_naming_the_field(
    name: bytes, value: bytes | None, field: str
) -> None:
    fields = as_redis(encode_batch(make_batch(4)))
    if value is DROP:
        del fields[name]
    else:
        fields[name] = value
    with pytest.raises(WireError) as err:
        decode_batch(fields)
    assert field in str(err.value)
    assert isinstance(err.value, ValueError)


def test_another_schema_is_told_before_the_fields_it_lacks() -> None:
    """A sender of another schema may name other fields: its entry is refused for the
    schema it speaks, not for a field of this one it does not send."""
    with pytest.raises(WireError, match="v: the sender speaks wire schema 9, this side 2"):
        decode_batch({b"v": b"9", b"w": b"junk", b"n": b"1"})


def test_a_truncated_column_raises_wire_error_naming_it() -> None:
    fields = as_redis(encode_batch(make_batch(4)))
    fields[b"d"] = fields[b"d"][:-1]
    with pytest.raises(WireError, match="d:"):
        decode_batch(fields)


@pytest.mark.parametrize(
    ("column", "value", "field"),
    [
        ("category", 2, "category:"),
        ("category", -1, "category:"),
        ("prev_category", 2, "prev_category:"),
        ("prev_category", -2, "prev_category:"),
        ("ts", math.nan, "ts:"),
        ("ts", math.inf, "ts:"),
        ("prev_ts", -math.inf, "prev_ts:"),
        ("kind", 3, "kind:"),
    ],
)
def test_bad_column_values_raise_wire_error(column: str, value: float, field: str) -> None:
    with pytest.raises(WireError) as err:
        decode_batch(corrupt_column(column, value))
    assert str(err.value).startswith(field)


@settings(max_examples=300, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from([b"v", b"w", b"e", b"s", b"c", b"n", b"d", b"\xff"])
        | st.binary(max_size=3),
        st.binary(max_size=64) | st.sampled_from([b"2", b"1", b"0", b"[]", b'["a"]', b"[[[["]),
        max_size=9,
    )
)
def test_any_bytes_decode_or_raise_wire_error(fields: dict[bytes, bytes]) -> None:
    with contextlib.suppress(WireError):  # anything else fails the test
        decode_batch(fields)


def test_limits_are_wire_limit_errors_checked_before_parsing() -> None:
    limits = BatchLimits(max_events=3, max_categories=2, max_name_chars=5)
    fields = as_redis(encode_batch(make_batch(4)))
    with pytest.raises(WireLimitError, match="n: 4 events in one entry > limit 3"):
        decode_batch(fields, limits)
    small = as_redis(encode_batch(make_batch(2)))
    small[b"c"] = json.dumps(["a", "b", "c"]).encode()
    with pytest.raises(WireLimitError, match="3 category names > limit 2"):
        decode_batch(small, limits)
    small[b"c"] = json.dumps(["a", "sixsix"]).encode()
    with pytest.raises(WireLimitError, match="name of 6 characters > limit 5"):
        decode_batch(small, limits)
    small[b"c"] = b'["' + b"x" * limits.max_categories_bytes + b'"]'
    with pytest.raises(WireLimitError, match=r"c: \d+ bytes > limit"):
        decode_batch(small, limits)
    assert len(small[b"d"]) + 1000 < limits.max_entry_bytes


def test_an_epoch_past_its_bound_is_a_limit_error() -> None:
    """An epoch of any length was taken: one of 200,000 characters made the controller
    write a ledger it then refused to read back at every start (counts and duplicate
    detection lost)."""
    fields = as_redis(encode_batch(make_batch(2)))
    fields[b"e"] = b"x" * MAX_EPOCH_CHARS
    assert decode_batch(fields).epoch == "x" * MAX_EPOCH_CHARS
    for epoch in (b"x" * (MAX_EPOCH_CHARS + 1), "\u00e9".encode() * 200_000):
        fields[b"e"] = epoch
        with pytest.raises(WireLimitError, match=f"e: an epoch of .* > limit {MAX_EPOCH_CHARS}"):
            decode_batch(fields)


def test_empty_batch_round_trips() -> None:
    back = decode_batch(as_redis(encode_batch(make_batch(0))))
    assert len(back) == 0 and back.categories == ("text_1", "image_2")


def test_policy_round_trip() -> None:
    doc = PolicyDocument(
        version=9,
        categories={"text_1": CategoryParams(rate=0.5, p_reuse=0.3, life_s=30, source="fit")},
        note="refit",
    )
    assert decode_policy(encode_policy(doc)) == doc
    assert decode_policy(encode_policy(BUILTIN_POLICY).decode()) == BUILTIN_POLICY


def policy_json(**default: object) -> str:
    params = {"rate": 0.1, "p_reuse": 0.5, "life_s": 60.0, **default}
    return json.dumps({"version": 3, "default": params})


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (policy_json(rate=float("nan")), "default.rate"),
        (policy_json(rate=float("inf")), "default.rate"),
        (policy_json(rate=-1.0), "default.rate"),
        (policy_json(p_reuse=1.5), "default.p_reuse"),
        (policy_json(life_s=0), "default.life_s"),
        ('{"version": 3, "default": ', "policy:"),
        ('{"version": -1}', "version"),
        ('{"version": 3, "schema_version": 2}', "schema_version"),
        ('{"version": 3, "surprise": 1}', "surprise"),
        ("[]", "policy:"),
        (b"\xff\xfe", "policy:"),
    ],
)
def test_invalid_policy_documents_raise_wire_error(raw: str | bytes, reason: str) -> None:
    with pytest.raises(WireError) as err:
        decode_policy(raw)
    assert reason in str(err.value)
    assert str(err.value).startswith("policy:")


@pytest.mark.parametrize(("schema", "shown"), [("2", "2"), ('"2"', "'2'"), ("{}", "dict")])
def test_a_document_of_another_schema_is_refused_as_a_release_mismatch(
    schema: str, shown: str
) -> None:
    """A controller of a newer release publishes documents of a newer schema (with fields
    this agent does not know): the agent's rejection, in its heartbeat, says what to do
    rather than listing pydantic's complaints."""
    newer = f'{{"schema_version": {schema}, "version": 3, "admission": "on"}}'
    with pytest.raises(WireError) as err:
        decode_policy(newer)
    assert str(err.value) == (
        f"policy: schema_version: the document is of schema {shown}, this side reads 1: "
        "run the same kvwise release on agents and controller"
    )


def test_the_default_size_limit_takes_a_full_document_at_the_category_limit() -> None:
    """The largest legitimate document (every category the limit allows, each of the
    longest name and every parameter at full precision) fits the default with margin."""
    doc = largest_policy()
    raw = encode_policy(doc)
    assert len(raw) * 1.5 < MAX_POLICY_BYTES, f"{len(raw)} bytes"
    limits = {"max_bytes": MAX_POLICY_BYTES, "max_categories": MAX_POLICY_CATEGORIES}
    assert decode_policy(raw, **limits) == doc


_DEEP = 100_000
_EMPTY_OBJECTS = filled(b'{"version":1,"x":{', b'"a":{}', b"}}")
_FIELDS = filled(b'{"version":1,', b'"k":0', b"}")
_NAMES = filled(b'{"version":1,"categories":{', b'"a":0', b"}}")
_PARAMETERS = filled(b'{"version":1,"categories":{"a":{', b'"k":0', b"}}}")


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (
            filled(b'{"version":1,"x":[', b"[]", b"]}"),
            'an array at byte 17 (after b\'{"version":1,"x":\'): a policy document holds none',
        ),
        (
            b'{"version":1,"x":' + b'{"a":' * _DEEP + b"{}" + b"}" * _DEEP + b"}",
            f'objects nested {_DEEP + 2} deep at byte 27 (after b\'ersion":1,"x":{{"a":'
            "{\"a\":') > limit 3 (the document, categories, a category's parameters)",
        ),
        (_EMPTY_OBJECTS, f"{_EMPTY_OBJECTS.count(b'{') - 2} categories > limit 4096"),
        (
            _FIELDS,
            f"{_FIELDS.count(b':')} keys at depth 1 > limit 8 (the document's fields); the "
            'first past it at byte 58 (after b\':0,"k":0,"k":0,"k":0,"k"\')',
        ),
        (
            _NAMES,
            f"{_NAMES.count(b':') - 2} keys at depth 2 > limit 4102 (category names and the "
            "default's parameters); the first past it at byte 24642 (after "
            'b\':0,"a":0,"a":0,"a":0,"a"\')',
        ),
        (
            _PARAMETERS,
            f"a category of {_PARAMETERS.count(b':') - 3} keys at byte 31 (after "
            'b\'on":1,"categories":{"a":\') > limit 6 (its parameters)',
        ),
    ],
    ids=["empty arrays", "deep objects", "empty objects", "fields", "names", "parameters"],
)
def test_a_document_cheap_in_bytes_but_rich_in_values_is_refused_by_its_shape(
    raw: bytes, reason: str
) -> None:
    """Documents of the size limit held the GIL 0.3 to 1.7 s (a parse built an object for
    each of their values, twice, then validation listed an error for each): refused from
    their bytes, before any parse, saying what and where."""
    assert len(raw) <= MAX_POLICY_BYTES
    with pytest.raises(WireLimitError) as err:
        decode_policy(raw, max_bytes=MAX_POLICY_BYTES, max_categories=MAX_POLICY_CATEGORIES)
    assert err.value.reason == f"policy: {reason}"


_TEXT = st.text(
    st.characters(exclude_categories=("Cs",)) | st.sampled_from('[]{}:,"\\'), max_size=12
)


@settings(max_examples=200, deadline=None)
@given(names=st.lists(_TEXT, max_size=6, unique=True), note=_TEXT)
def test_brackets_quotes_and_escapes_in_names_and_notes_are_text_to_the_shape_check(
    names: list[str], note: str
) -> None:
    """The shape is judged outside strings: a name or a note may hold any character, and
    the categories are counted exactly."""
    doc = PolicyDocument(version=1, categories=dict.fromkeys(names, FULL_PARAMS), note=note)
    raw = encode_policy(doc)
    assert decode_policy(raw, max_categories=len(names)) == doc
    if names:
        with pytest.raises(WireLimitError) as err:
            decode_policy(raw, max_categories=len(names) - 1)
        assert err.value.reason == f"policy: {len(names)} categories > limit {len(names) - 1}"


def test_a_category_name_is_bounded_as_in_an_event_batch() -> None:
    """A document took a name of any length (2 MB within the size limit), which every
    agent then held in its tables, heartbeats and metric labels: refused past
    ``MAX_CATEGORY_NAME_CHARS``, the name cut short in the reason."""
    longest = "n" * MAX_CATEGORY_NAME_CHARS
    params = {"rate": 1.0, "p_reuse": 0.5, "life_s": 2.0}
    raw = json.dumps({"version": 1, "categories": {longest: params}})
    assert list(decode_policy(raw).categories) == [longest]
    with pytest.raises(WireLimitError, match=f"of {MAX_CATEGORY_NAME_CHARS + 1} characters"):
        decode_policy(json.dumps({"version": 1, "categories": {longest + "/": params}}))
    raw = json.dumps({"version": 1, "categories": {"n" * 2_000_000: params}})
    with pytest.raises(WireLimitError) as err:
        decode_policy(raw, max_bytes=MAX_POLICY_BYTES, max_categories=MAX_POLICY_CATEGORIES)
    assert err.value.reason == (
        f"policy: categories.{'n' * MAX_LOCATION_PART_CHARS}...: a category name of 2000000 "
        f"characters > limit {MAX_CATEGORY_NAME_CHARS}"
    )


def test_a_bad_category_ends_validation() -> None:
    """Every category was validated whatever came before: thousands of bad ones each
    added an error (and its input) to a report that shows five."""
    bad = {"rate": -1.0, "p_reuse": 0.5, "life_s": 1.0}
    raw = json.dumps({"version": 1, "categories": {f"c{i}": bad for i in range(3)}})
    with pytest.raises(WireError) as err:
        decode_policy(raw)
    assert err.value.reason == "policy: categories.c0.rate: Input should be greater than 0"


def test_a_document_is_parsed_once() -> None:
    """It was parsed twice: once to count its categories, then again to validate it."""
    raw = encode_policy(largest_policy())
    parses: list[str] = []

    def watch(_frame: object, event: str, function: Any) -> None:
        name = getattr(function, "__name__", "")
        if event == "c_call" and name in {"from_json", "validate_json", "loads"}:
            parses.append(name)

    sys.setprofile(watch)
    try:
        decode_policy(raw, max_bytes=MAX_POLICY_BYTES, max_categories=MAX_POLICY_CATEGORIES)
    finally:
        sys.setprofile(None)
    assert parses == ["validate_json"]


def test_negative_zero_is_normalised() -> None:
    raw = json.dumps(
        {"version": 3, "categories": {"a": {"rate": 1.0, "p_reuse": -0.0, "life_s": 2.0}}}
    )
    p = decode_policy(raw).categories["a"].p_reuse
    assert p == 0.0 and math.copysign(1.0, p) == 1.0
    assert '"p_reuse":0.0' in encode_policy(decode_policy(raw)).decode()


def test_agent_status_round_trip_and_validation() -> None:
    s = FULL_STATUS
    assert AgentStatus.from_json(s.to_json()) == s
    assert AgentStatus.from_json(s.to_json().encode()) == s
    obj = json.loads(s.to_json())
    obj["extra_field_from_a_newer_agent"] = True
    assert AgentStatus.from_json(json.dumps(obj)) == s
    for bad in (
        {k: v for k, v in obj.items() if k != "capacity"},
        {**obj, "capacity": "1000"},
        {**obj, "hits": True},
        {**obj, "hit_ratio": None},
        {**obj, "v": 99},
    ):
        with pytest.raises(WireError):
            AgentStatus.from_json(json.dumps(bad))
    with pytest.raises(WireError):
        AgentStatus.from_json("not json")
    with pytest.raises(WireError, match="RecursionError"):  # 10 KB, deeper than json recurses
        AgentStatus.from_json("[" * 5000 + "]" * 5000)


def test_heartbeat_without_applied_at_still_parses() -> None:
    """``applied_at`` came after schema 1: an older agent's heartbeat omits it."""
    import json as _json

    from agent.wire import AgentStatus

    full = _json.loads(AgentStatus(id="w", engine="sim", capacity=1, applied_at=5.0).to_json())
    assert AgentStatus.from_json(_json.dumps(full)).applied_at == 5.0
    del full["applied_at"]
    assert AgentStatus.from_json(_json.dumps(full)).applied_at == 0.0


def test_heartbeat_staged_version_defaults_to_the_applied_one() -> None:
    """``staged_version`` came after schema 1: missing, nothing is known to wait."""
    waiting = AgentStatus(id="w", engine="vllm", capacity=1, applied_version=3, staged_version=5)
    assert AgentStatus.from_json(waiting.to_json()).staged_version == 5
    old = json.loads(waiting.to_json())
    del old["staged_version"]
    assert AgentStatus.from_json(json.dumps(old)).staged_version == 3
    assert AgentStatus(id="w", engine="sim", capacity=1, applied_version=2).staged_version == 2


def test_heartbeat_loop_errors_round_trip_and_an_older_heartbeat_reads_0() -> None:
    """The ``*_unexpected_errors`` counts came after schema 1: an older agent's heartbeat
    omits them and is read, its counts 0."""
    failing = agent_status(publisher_unexpected_errors=7, heartbeat_unexpected_errors=1)
    read = AgentStatus.from_json(failing.to_json())
    assert read.loop_unexpected_errors == {"publisher": 7, "subscriber": 0, "heartbeat": 1}
    old = json.loads(failing.to_json())
    for loop in ("publisher", "subscriber", "heartbeat"):
        del old[f"{loop}_unexpected_errors"]
    assert AgentStatus.from_json(json.dumps(old)) == FULL_STATUS
    with pytest.raises(WireError, match="subscriber_unexpected_errors is not a int"):
        AgentStatus.from_json(json.dumps({**old, "subscriber_unexpected_errors": 1.5}))


def test_agent_status_refuses_a_negative_count_naming_the_field() -> None:
    """A capacity sizes the shadow's caches, a ghost its trackers; the rest are counts
    and versions: none is negative, bar ``staged_version``'s -1 (not reported)."""
    obj = json.loads(FULL_STATUS.to_json())
    for name in (
        "capacity",
        "reuse_ghost_blocks",
        "events_sent",
        "applied_version",
        "publisher_unexpected_errors",
    ):
        with pytest.raises(WireError, match=f"heartbeat: {name} is negative: -1"):
            AgentStatus.from_json(json.dumps({**obj, name: -1}))
    assert AgentStatus.from_json(json.dumps({**obj, "capacity": 0})).capacity == 0
    unreported = AgentStatus.from_json(json.dumps({**obj, "staged_version": -1}))
    assert unreported.staged_version == unreported.applied_version


def test_agent_status_refuses_an_integer_past_64_bits_in_any_field() -> None:
    """Integers of any size were taken: a count of 10**400 made every /metrics answer 500
    (a gauge cannot hold it) while its heartbeat lived, and one in a float field raised
    OverflowError out of the parser."""
    obj = json.loads(FULL_STATUS.to_json())
    at_limit = AgentStatus.from_json(json.dumps({**obj, "events_dropped": MAX_WIRE_INT}))
    assert at_limit.events_dropped == MAX_WIRE_INT
    for name, value in (
        ("events_dropped", MAX_WIRE_INT + 1),
        ("applied_version", 10**400),
        ("heartbeat_unexpected_errors", 10**400),
        ("staged_version", -(10**400)),
        ("updated_at", 10**400),
    ):
        with pytest.raises(WireError, match=f"heartbeat: {name} is an integer past the limit"):
            AgentStatus.from_json(json.dumps({**obj, name: value}))
