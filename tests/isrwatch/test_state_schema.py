"""The state topic record has one statement, ``ReplicaStatus``; its JSON Schema
(isrwatch/schema/state-v1.schema.json, docs/state-topic.md) is checked against it."""

from __future__ import annotations

import dataclasses
import json

import jsonschema
import pytest
from hypothesis import given, settings

from isrwatch.status import STATUS_FIELDS, ReplicaStatus, State, json_schema, status_from_json, status_to_json
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
