"""The telemetry format: encoding, decoding, the JSON schema."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import replace

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from isrwatch.telemetry import (
    FOLLOWER_FIELDS,
    OPTIONAL_PARTITION_FIELDS,
    PARTITION_FIELDS,
    BrokerCounters,
    BrokerEndpoint,
    GoneReplica,
    IsrChange,
    Observation,
    TelemetryRecord,
    decode_record,
    encode_record,
    json_schema,
)

offsets = st.one_of(st.none(), st.integers(0, 2**53))
ids = st.integers(0, 10_000)
observations = st.builds(
    Observation,
    topic=st.text(min_size=1, max_size=20),
    partition=st.integers(0, 10_000),
    broker_id=ids,
    leader_id=ids,
    t_ms=st.integers(0, 2**45),
    leo=offsets,
    leader_leo=offsets,
    hw=offsets,
    prev_t_ms=st.one_of(st.none(), st.integers(0, 2**45)),
    prev_leo=offsets,
    prev_leader_leo=offsets,
    isr=st.lists(ids, max_size=5).map(tuple),
    replicas=st.lists(ids, max_size=5).map(tuple),
    lag_time_max_ms=st.one_of(st.none(), st.integers(1, 10**7)),
    min_isr=st.one_of(st.none(), st.integers(1, 5)),
    leader_epoch=st.one_of(st.none(), st.integers(0, 2**31 - 1)),
)
records = st.builds(
    TelemetryRecord,
    cluster=st.text(min_size=1, max_size=10),
    source=st.sampled_from(["collector", "simulator"]),
    sent_ms=st.integers(0, 2**45),
    observations=st.lists(observations, max_size=5).map(tuple),
    isr_changes=st.lists(
        st.builds(
            IsrChange,
            t_ms=st.integers(0, 2**45),
            topic=st.text(min_size=1, max_size=5),
            partition=st.integers(0, 99),
            isr_before=st.lists(ids, max_size=3).map(tuple),
            isr_after=st.lists(ids, max_size=3).map(tuple),
            leader_id=st.one_of(st.none(), ids),
        ),
        max_size=2,
    ).map(tuple),
    brokers=st.lists(
        st.builds(
            BrokerCounters,
            broker_id=ids,
            t_ms=st.integers(0, 2**45),
            isr_shrinks_total=st.one_of(st.none(), st.integers(0, 2**53)),
            isr_expands_total=st.one_of(st.none(), st.integers(0, 2**53)),
        ),
        max_size=3,
    ).map(tuple),
    gone=st.lists(
        st.builds(
            GoneReplica,
            t_ms=st.integers(0, 2**45),
            topic=st.text(min_size=1, max_size=5),
            partition=st.integers(0, 99),
            broker_id=ids,
        ),
        max_size=2,
    ).map(tuple),
    cluster_id=st.one_of(st.none(), st.text(min_size=1, max_size=22)),
    endpoints=st.lists(
        st.builds(BrokerEndpoint, broker_id=ids, host=st.text(min_size=1, max_size=12), port=st.integers(0, 65535)),
        max_size=3,
    ).map(tuple),
    kafka_version=st.one_of(st.none(), st.sampled_from(["0.10.2", "2.1", "4.0"])),
)
# what versions before 4 have no place for
NOT_BEFORE_4 = {"gone": (), "cluster_id": None, "endpoints": (), "kafka_version": None}


def _older(record: TelemetryRecord, version: int) -> TelemetryRecord:
    """``record`` as a version before 4 keeps it: without NOT_BEFORE_4 and the leader epochs."""
    obs = tuple(replace(o, leader_epoch=None) for o in record.observations)
    return replace(record, version=version, observations=obs, **NOT_BEFORE_4)


@given(records)
def test_round_trip_and_schema(record: TelemetryRecord) -> None:
    data = encode_record(record)
    assert decode_record(data) == record
    jsonschema.validate(json.loads(data), json_schema())


@given(records)
def test_version_2_round_trip_and_schema(record: TelemetryRecord) -> None:
    """What collectors before version 3 write, and ``isrwatch collect --telemetry-version 2``."""
    data = encode_record(replace(record, version=2))
    assert "observations" in json.loads(data)
    assert decode_record(data) == _older(record, 2)
    jsonschema.validate(json.loads(data), json_schema(2))


@given(records)
def test_version_3_is_version_2_as_columns(record: TelemetryRecord) -> None:
    """The same observations, in order; a partition's fields once per distinct partition entry."""
    body = json.loads(encode_record(replace(record, version=3)))
    jsonschema.validate(body, json_schema(3))
    assert decode_record(json.dumps(body)) == _older(record, 3)
    v2 = json.loads(encode_record(replace(record, version=2)))
    assert body["version"] == 3 and len(body["followers"]["p"]) == len(v2["observations"])
    parts = {tuple((f, str(o[f])) for f in PARTITION_FIELDS) for o in v2["observations"]}
    assert len(body["partitions"]["partition"]) == len(parts)
    assert len(body["topics"]) == len({o["topic"] for o in v2["observations"]})


@given(records)
def test_version_4_is_version_3_with_the_replicas_gone(record: TelemetryRecord) -> None:
    """What isrwatch writes: version 3 plus ``gone``, the cluster's identity and the leader
    epochs (each absent when there is none)."""
    epochs = [o.leader_epoch for o in record.observations]
    with_epochs = json.loads(encode_record(record))["partitions"]
    assert ("leader_epoch" in with_epochs) == any(e is not None for e in epochs)
    assert set(with_epochs.get("leader_epoch", [])) <= set(epochs)
    record = replace(record, observations=tuple(replace(o, leader_epoch=None) for o in record.observations))
    body = json.loads(encode_record(record))
    v3 = json.loads(encode_record(replace(record, version=3)))
    assert body.pop("version") == 4 and v3.pop("version") == 3
    assert body.pop("gone", []) == [dataclasses.asdict(g) for g in record.gone]
    assert body.pop("cluster_id", None) == record.cluster_id
    assert body.pop("endpoints", []) == [dataclasses.asdict(e) for e in record.endpoints]
    assert body.pop("kafka_version", None) == record.kafka_version
    assert body == v3


@given(records)
def test_version_1_is_version_2_without_leaders_brokers_and_gone(record: TelemetryRecord) -> None:
    """What an older collector writes: the same record less the version-2 fields."""
    old = replace(record, version=1)
    data = encode_record(old)
    jsonschema.validate(json.loads(data), json_schema(1))
    changes = tuple(replace(c, leader_id=None) for c in record.isr_changes)
    assert decode_record(data) == replace(_older(record, 1), isr_changes=changes, brokers=())


def _v3(**over: object) -> bytes:
    """A good version-3 record of two observations of one partition, fields replaced."""
    o = Observation("t", 0, 2, 1, 5, 3, 3)
    body = json.loads(encode_record(TelemetryRecord("c", "test", 1, (o, replace(o, broker_id=3)))))
    for path, value in over.items():
        group, field = path.split(".")
        body[group][field] = value
    return json.dumps(body).encode()


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"\xff\xfe", "not JSON"),
        (b"{not json", "not JSON"),
        (b"[1, 2]", "not a JSON object: array"),
        (b"null", "not a JSON object: null"),
        (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),  # (isrwatch doctor read it with a traceback)
        (b'{"version": 7, "cluster": "c", "sent_ms": 1, "observations": []}', "unknown schema version 7"),
        (b'{"version": 1, "sent_ms": 1, "observations": []}', "missing or unexpected field"),
        (b'{"version": 1, "cluster": "c", "sent_ms": 1, "observations": [{"topic": "t"}]}', "missing or unexpected"),
        (b'{"version": 3, "cluster": "c", "sent_ms": 1, "observations": []}', "missing or unexpected"),
        (_v3(**{"followers.leo": [1]}), "followers.leo has 1 entries, followers.p 2"),
        (_v3(**{"partitions.hw": []}), "partitions.hw has 0 entries"),
        (_v3(**{"followers.p": [0, 1]}), r"followers.p\[1\] is 1, not an index of partitions"),
        (_v3(**{"partitions.topic": [3]}), r"partitions.topic\[0\] is 3, not an index of topics"),
        # Each field of its JSON type, as the job's parse reads it (isrwatch doctor took a
        # sent_ms of 1e400 for infinity and stopped with an OverflowError; NaN was an offset)
        (_v3(**{"followers.leo": [float("nan"), 3]}), "not JSON: NaN is not a JSON number"),
        (_v3(**{"followers.leo": [float("-inf"), 3]}), "not JSON: -Infinity is not a JSON number"),
        (_v3(**{"followers.leo": [1.5, 3]}), r"field observations\[0\].leo: integer expected, not number"),
        (_v3(**{"followers.t_ms": [5, True]}), r"field observations\[1\].t_ms: integer expected, not boolean"),
        (_v3(**{"followers.leo": [2**64, 3]}), r"field observations\[0\].leo: outside the 64-bit range"),
        (_v3(**{"partitions.isr": [[1, "2"]]}), r"field observations\[0\].isr: \[1\] integer expected, not string"),
        (b'{"version": 1, "cluster": "c", "sent_ms": 1e400, "observations": []}', "field sent_ms: integer expected"),
        (b'{"version": 1, "cluster": "c", "sent_ms": "1", "observations": []}', "field sent_ms: integer expected"),
        (b'{"version": 1, "cluster": [], "sent_ms": 1, "observations": []}', "field cluster: string expected"),
        (b'{"version": true, "cluster": "c", "sent_ms": 1, "observations": []}', "field version: integer expected"),
        (
            b'{"version": 2, "cluster": "c", "sent_ms": 1, "observations": [], "brokers": [{"broker_id": 1, '
            b'"t_ms": 1, "isr_shrinks_total": false}]}',
            r"field brokers\[0\].isr_shrinks_total: integer expected, not boolean",
        ),
        (
            b'{"version": 2, "cluster": "c", "sent_ms": 1, "observations": [], "isr_changes": [{"t_ms": 1, '
            b'"topic": "t", "partition": 0, "isr_before": [1, 2.0], "isr_after": [1]}]}',
            r"field isr_changes\[0\].isr_before: \[1\] integer expected, not number",
        ),
    ],
)
def test_bad_records_say_why(data: bytes, reason: str) -> None:
    with pytest.raises(ValueError, match=reason):
        decode_record(data)


def test_schema_rejects_what_the_job_rejects() -> None:
    schema = json_schema()
    bad = {
        "version": 1,
        "cluster": "c",
        "sent_ms": 1,
        "observations": [
            {"topic": "t", "partition": 0, "broker_id": 1, "leader_id": 2, "t_ms": 5, "leo": -1, "leader_leo": 3}
        ],
    }
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, schema)


def _ddl_fields(ddl: str) -> list[str]:
    """Top-level field names of a Spark DDL list (nested types skipped)."""
    names, depth, token = [], 0, ""
    for ch in ddl + ",":
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        elif ch == "," and depth == 0:
            names.append(token.strip().split()[0].rstrip(":"))
            token = ""
            continue
        if depth == 0:
            token += ch
    return names


def _ddl_struct(ddl: str, field: str, kind: str = "ARRAY<STRUCT<") -> str:
    """The inside of ``field``'s ARRAY<STRUCT<...>> (or STRUCT<...>)."""
    start = ddl.index(f"{field} {kind}") + len(f"{field} {kind}")
    depth, i = kind.count("<"), start
    while depth:
        depth += {"<": 1, ">": -1}.get(ddl[i], 0)
        i += 1
    return ddl[start : i - kind.count("<")]


def test_the_spark_schema_and_the_json_schema_name_the_dataclasses_fields() -> None:
    """The telemetry is stated three times: the dataclasses, the JSON Schema and the DDL
    the job parses with (``SPARK_SCHEMA_DDL``). Same fields in the same order."""
    from dataclasses import fields

    from isrwatch.telemetry import SPARK_SCHEMA_DDL

    record = [f.name for f in fields(TelemetryRecord)]
    obs = [f.name for f in fields(Observation)]
    change = [f.name for f in fields(IsrChange)]
    columns = ["topics", "partitions", "followers"]  # version 3's observations
    assert sorted(_ddl_fields(SPARK_SCHEMA_DDL)) == sorted(record + columns)
    assert sorted(json_schema(2)["properties"]) == sorted(f for f in record if f not in NOT_BEFORE_4)
    assert sorted(json_schema(3)["properties"]) == sorted(
        f for f in record + columns if f != "observations" and f not in NOT_BEFORE_4
    )
    assert sorted(json_schema(4)["properties"]) == sorted(f for f in record + columns if f != "observations")
    v4_parts = json.loads(json.dumps(json_schema(4)["properties"]["partitions"]))
    assert list(v4_parts["properties"])[-len(OPTIONAL_PARTITION_FIELDS) :] == list(OPTIONAL_PARTITION_FIELDS)
    for f in OPTIONAL_PARTITION_FIELDS:
        assert f not in v4_parts["required"]
        del v4_parts["properties"][f]
    assert v4_parts == json_schema(3)["properties"]["partitions"]
    assert json_schema(4)["properties"]["followers"] == json_schema(3)["properties"]["followers"]
    assert _ddl_fields(_ddl_struct(SPARK_SCHEMA_DDL, "observations")) == obs
    assert list(json_schema(2)["$defs"]["observation"]["properties"]) == [
        f for f in obs if f not in OPTIONAL_PARTITION_FIELDS
    ]
    assert sorted(PARTITION_FIELDS + OPTIONAL_PARTITION_FIELDS + FOLLOWER_FIELDS) == sorted(obs)
    v3 = json_schema(3)["properties"]
    assert list(v3["partitions"]["properties"]) == list(PARTITION_FIELDS)
    assert list(v3["followers"]["properties"]) == ["p", *FOLLOWER_FIELDS]
    assert _ddl_fields(_ddl_struct(SPARK_SCHEMA_DDL, "partitions", "STRUCT<")) == [
        *PARTITION_FIELDS,
        *OPTIONAL_PARTITION_FIELDS,
    ]
    assert _ddl_fields(_ddl_struct(SPARK_SCHEMA_DDL, "followers", "STRUCT<")) == ["p", *FOLLOWER_FIELDS]
    for schema in (json_schema(2), json_schema(3), json_schema(4)):
        assert _ddl_fields(_ddl_struct(SPARK_SCHEMA_DDL, "isr_changes")) == change
        assert list(schema["$defs"]["isr_change"]["properties"]) == change
        counters = [f.name for f in fields(BrokerCounters)]
        assert _ddl_fields(_ddl_struct(SPARK_SCHEMA_DDL, "brokers")) == counters
        assert list(schema["$defs"]["broker_counters"]["properties"]) == counters
    gone = [f.name for f in fields(GoneReplica)]
    assert _ddl_fields(_ddl_struct(SPARK_SCHEMA_DDL, "gone")) == gone
    assert list(json_schema(4)["$defs"]["gone_replica"]["properties"]) == gone
    endpoint = [f.name for f in fields(BrokerEndpoint)]
    assert _ddl_fields(_ddl_struct(SPARK_SCHEMA_DDL, "endpoints")) == endpoint
    assert list(json_schema(4)["$defs"]["broker_endpoint"]["properties"]) == endpoint


# Any JSON value, NaN and the infinities included (json.dumps writes them as Python reads them)
_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)
_FIELDS = ("sent_ms", "cluster", "followers.leo", "followers.t_ms", "partitions.isr", "partitions.partition")


@settings(max_examples=300, deadline=None)
@given(
    st.binary(max_size=300)
    | _json.map(lambda v: json.dumps(v).encode())
    | st.tuples(st.sampled_from(_FIELDS), _json).map(
        lambda fv: _v3(**{fv[0]: fv[1]}) if "." in fv[0] else json.dumps({**json.loads(_v3()), fv[0]: fv[1]}).encode()
    )
)
def test_any_bytes_make_a_record_or_a_reason_never_another_error(data: bytes) -> None:
    """What ``isrwatch doctor`` reads from the telemetry topic: a record whose fields have
    their types, or a ValueError; never another exception."""
    try:
        record = decode_record(data)
    except ValueError as e:
        assert str(e)
    else:
        assert type(record.sent_ms) is int and all(type(o.t_ms) is int for o in record.observations)


def test_a_number_where_text_belongs_is_read_as_its_text_as_the_job_reads_it() -> None:
    """(docs/streaming.md, ``bad_type``: ``"cluster": 5`` is the cluster "5" to the job.)"""
    body = json.loads(_v3())
    body["cluster"], body["topics"] = 5, [17]
    record = decode_record(json.dumps(body).encode())
    assert record.cluster == "5" and {o.topic for o in record.observations} == {"17"}
