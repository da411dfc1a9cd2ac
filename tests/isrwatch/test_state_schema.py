"""The state topic record has one statement, ``ReplicaStatus``; its JSON Schema
(isrwatch/schema/state-v1.schema.json, docs/state-topic.md) is checked against it."""

from __future__ import annotations

import dataclasses
import json
import re

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from isrwatch.status import (
    STATUS_FIELDS,
    ReplicaStatus,
    State,
    json_schema,
    status_from_json,
    status_from_record,
    status_to_json,
)
from tests.exporter.samples import replica, replica_statuses

SCHEMA = json_schema()

statuses = replica_statuses()


def test_the_schema_names_every_field_of_the_record_and_requires_those_without_a_default() -> None:
    assert set(SCHEMA["properties"]) == set(STATUS_FIELDS)
    without_default = {
        f.name
        for f in dataclasses.fields(ReplicaStatus)
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    }
    assert set(SCHEMA["required"]) == without_default


@settings(max_examples=200, deadline=None)
@given(statuses)
def test_every_record_the_job_writes_is_valid_and_reads_back_the_same(s: ReplicaStatus) -> None:
    record = json.loads(json.dumps(status_to_json(s)))  # as on the topic
    jsonschema.validate(record, SCHEMA)
    assert status_from_json(record) == s
    assert status_from_record(json.dumps(status_to_json(s)).encode()) == s  # as the exporter reads it


def test_a_record_of_an_older_job_is_valid_and_gets_the_defaults() -> None:
    record = status_to_json(replica(2, State.NEARING, ratio=0.6))
    for added in ("lag_state", "peak_lag_ratio", "out_of_sync_episodes"):
        del record[added]
    jsonschema.validate(record, SCHEMA)
    s = status_from_json(record)
    assert (s.lag_state, s.peak_lag_ratio, s.out_of_sync_episodes) == (State.NEARING, 0.6, 0)


def test_an_unknown_state_is_not_a_valid_record() -> None:
    record = status_to_json(replica(2))
    record["state"] = "sleepy"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(record, SCHEMA)


# -- any bytes on the state topic (the exporter's reader, status_from_record) -------------------

GOOD = status_to_json(replica(2, State.NEARING, ratio=0.6))


def _with(**changes: object) -> bytes:
    return json.dumps({**GOOD, **changes}).encode()


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        (b"", "not JSON"),
        (b"\xff\xfe{", "not JSON"),
        (b"{'single': 'quotes'}", "not JSON"),
        (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
        (b"null", "not a JSON object: null"),
        (b"[1, 2]", "not a JSON object: array"),
        (b'"ok"', "not a JSON object: string"),
        (b"17", "not a JSON object: integer"),
        (b"{}", "missing fields: broker_id, cluster"),
        (json.dumps({k: v for k, v in GOOD.items() if k != "lag_ratio"}).encode(), "missing fields: lag_ratio"),
        (_with(lag_ratio="0.6"), "field lag_ratio: number expected, not string"),
        (_with(partition=True), "field partition: integer expected, not boolean"),
        (_with(partition=1.5), "field partition: integer expected, not number"),
        (_with(in_isr=1), "field in_isr: boolean expected, not integer"),
        (_with(topic=["orders"]), "field topic: string expected, not array"),
        (_with(min_isr={"n": 2}), "field min_isr: integer or null expected, not object"),
        (_with(state="sleepy"), "field state: a state expected"),
        (_with(state=["ok"]), "field state: a state expected"),
        (_with(lag_state=3), "field lag_state: a state expected"),
        (_with(eval_ms=10**30), "field eval_ms: outside the 64-bit range"),
        (_with(topic="t" * 250), "field topic: 250 characters, at most 249"),  # a label of every gauge
        (_with(cluster="c" * 256), "field cluster: 256 characters, at most 255"),
        (_with(cluster=5), "field cluster: string expected, not integer"),
        # Python's json reads these by default; they are not JSON, and a NaN gauge says nothing
        (json.dumps({**GOOD, "lag_ratio": float("nan")}).encode(), "not JSON: NaN is not a JSON number"),
        (json.dumps({**GOOD, "lag_ratio": float("inf")}).encode(), "not JSON: Infinity is not a JSON number"),
    ],
)
def test_a_bad_state_record_is_refused_with_its_reason(value: bytes, reason: str) -> None:
    with pytest.raises(ValueError, match=re.escape(reason)):
        status_from_record(value)


def test_a_state_record_of_a_newer_job_is_read_without_its_new_fields() -> None:
    s = status_from_record(_with(shrink_forecast={"p50": 3}, labels=["x"]))
    assert s == status_from_json(GOOD)


def test_the_nullable_fields_may_be_null() -> None:
    s = status_from_record(_with(min_isr=None, lag_state=None, peak_lag_ratio=None))
    assert (s.min_isr, s.lag_state, s.peak_lag_ratio) == (None, State.NEARING, 0.6)


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(
    st.binary(max_size=300)
    | _json.map(lambda v: json.dumps(v).encode())
    | _json.map(lambda v: _with(**{"lag_ratio": v}))
)
def test_any_bytes_make_a_status_or_a_reason_never_another_error(value: bytes) -> None:
    try:
        s = status_from_record(value)
    except ValueError as e:
        assert str(e)
    else:
        assert isinstance(s, ReplicaStatus) and isinstance(s.lag_ratio, (int, float))


def test_the_names_bounds_are_the_telemetrys() -> None:
    """One bound for a name wherever isrwatch reads it (the job's parse uses the constants)."""
    from isrwatch.telemetry import MAX_CLUSTER_CHARS, MAX_TOPIC_CHARS
    from isrwatch.telemetry import json_schema as telemetry_schema

    assert (SCHEMA["properties"]["cluster"]["maxLength"], SCHEMA["properties"]["topic"]["maxLength"]) == (
        MAX_CLUSTER_CHARS,
        MAX_TOPIC_CHARS,
    )
    for version in (1, 2, 3):
        text = json.dumps(telemetry_schema(version))
        assert text.count(f'"maxLength": {MAX_TOPIC_CHARS}') == 2, version  # the observations' topics, the changes'
        assert telemetry_schema(version)["properties"]["cluster"]["maxLength"] == MAX_CLUSTER_CHARS
    longest = status_from_record(_with(cluster="c" * MAX_CLUSTER_CHARS, topic="t" * MAX_TOPIC_CHARS))
    assert (len(longest.cluster), len(longest.topic)) == (MAX_CLUSTER_CHARS, MAX_TOPIC_CHARS)
