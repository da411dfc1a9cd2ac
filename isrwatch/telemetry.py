"""The telemetry format: what the collector and the simulator publish, and the job reads.

One record (a Kafka record, or one line of the embedded spool) holds many observations of one
cluster, JSON encoded: version 4 (observations as columns, with ``gone`` and, optional,
``cluster_id`` and ``endpoints``, by which the job knows which watched cluster carries its own
telemetry: ``streaming.driver.identity``) is what isrwatch writes; versions 1 to 3 are still read. The
dataclasses here (``TelemetryRecord``, ``Observation``, ...) state the format; ``encode_record``
and ``decode_record`` write and read it, ``SPARK_SCHEMA_DDL`` is the shape the job parses with.
The JSON Schemas are ``isrwatch/schema/telemetry-v{1,2,3,4}.schema.json``; docs/telemetry.md
explains every field and version, with an example of each layout.
"""

from __future__ import annotations

import json
import types
import typing
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field, fields, is_dataclass, replace
from importlib import resources
from typing import Any

from isrwatch import jsontext

__all__ = [
    "VERSION",
    "SUPPORTED_VERSIONS",
    "COLUMNS_FROM",
    "GONE_FROM",
    "Observation",
    "IsrChange",
    "BrokerCounters",
    "GoneReplica",
    "BrokerEndpoint",
    "TelemetryRecord",
    "PARTITION_FIELDS",
    "FOLLOWER_FIELDS",
    "OPTIONAL_PARTITION_FIELDS",
    "observation_fields",
    "encode_record",
    "decode_record",
    "MAX_TOPIC_CHARS",
    "MAX_CLUSTER_CHARS",
    "json_schema",
    "OBSERVATION_DDL",
    "SPARK_SCHEMA_DDL",
]

VERSION = 4  # what isrwatch writes
SUPPORTED_VERSIONS = frozenset({1, 2, 3, 4})  # what the job reads
COLUMNS_FROM = 3  # the first version with the observations as columns
GONE_FROM = 4  # the first version with ``gone``
# The longest names a record may carry: a topic as Kafka allows (249 characters), a cluster
# as isrwatch collect allows. Every name becomes a label of the gauges and alerts, so a
# record with a longer one is a dead letter (``name_too_long``), not megabytes of labels.
MAX_TOPIC_CHARS = 249
MAX_CLUSTER_CHARS = 255

# Version 3 carries the observations as columns: a partition's fields once per partition
# (the topic as an index into ``topics``), a follower's fields once per observation, with
# ``p``, the index of its partition entry.
PARTITION_FIELDS = ("topic", "partition", "leader_id", "hw", "isr", "replicas", "lag_time_max_ms", "min_isr")
FOLLOWER_FIELDS = ("broker_id", "t_ms", "leo", "leader_leo", "prev_t_ms", "prev_leo", "prev_leader_leo")
# Partition fields a version-4 record may leave out (each read as None): written only when some
# observation of the record has one. ``leader_epoch``: Metadata v7 and later (Kafka 2.1 on).
OPTIONAL_PARTITION_FIELDS = ("leader_epoch",)


@dataclass(frozen=True)
class Observation:
    topic: str
    partition: int
    broker_id: int
    leader_id: int
    t_ms: int
    leo: int | None
    leader_leo: int | None
    hw: int | None = None
    prev_t_ms: int | None = None
    prev_leo: int | None = None
    prev_leader_leo: int | None = None
    isr: tuple[int, ...] = ()
    replicas: tuple[int, ...] = ()
    lag_time_max_ms: int | None = None
    min_isr: int | None = None
    # The partition's leader epoch where the cluster says it (Metadata v7+; version 4, optional);
    # None: unknown, and the rule resets the follower's clock on a change of leader id alone.
    leader_epoch: int | None = None


@dataclass(frozen=True)
class IsrChange:
    t_ms: int
    topic: str
    partition: int
    isr_before: tuple[int, ...]
    isr_after: tuple[int, ...]
    leader_id: int | None = None  # the partition's leader then, the broker that shrank it (version 2)


@dataclass(frozen=True)
class BrokerCounters:
    """A broker's own count of the ISR shrinks and expands it made as a leader since it
    started (``kafka.server:type=ReplicaManager,name=IsrShrinksPerSec`` and ``IsrExpandsPerSec``,
    attribute ``Count``), read at ``t_ms`` (version 2)."""

    broker_id: int
    t_ms: int
    isr_shrinks_total: int | None = None
    isr_expands_total: int | None = None


@dataclass(frozen=True)
class GoneReplica:
    """A replica the cluster no longer has (its topic deleted, or the replica moved to
    other brokers), as the collector found at ``t_ms`` (version 4)."""

    t_ms: int
    topic: str
    partition: int
    broker_id: int


@dataclass(frozen=True)
class BrokerEndpoint:
    """A broker of the watched cluster and the address its metadata gives for it (version 4,
    optional): with ``cluster_id``, how the job knows a watched cluster is the one that
    carries its telemetry (``streaming.driver.identity``)."""

    broker_id: int
    host: str
    port: int


@dataclass(frozen=True)
class TelemetryRecord:
    cluster: str
    source: str
    sent_ms: int
    observations: tuple[Observation, ...]
    isr_changes: tuple[IsrChange, ...] = field(default=())
    brokers: tuple[BrokerCounters, ...] = field(default=())
    gone: tuple[GoneReplica, ...] = field(default=())
    version: int = VERSION
    # What the collector knows of the cluster it polls (version 4, optional): its id, where its
    # brokers give one (Kafka 0.10.1 and later), and its brokers' addresses.
    cluster_id: str | None = None
    endpoints: tuple[BrokerEndpoint, ...] = field(default=())
    # The cluster's Kafka version as the collector infers it from its brokers' ApiVersions answers
    # (version 4, optional: ``"0.10.2"``, ``"2.1"``, ``"4.0"``; the oldest broker's), by which the job
    # picks the rule's variant (``isrwatch.rule.chosen_rule``). None: not known (Kafka 0.9, whose
    # brokers cannot answer ApiVersions, the simulator).
    kafka_version: str | None = None


def _obs_dict(o: Observation) -> dict[str, Any]:
    d = asdict(o)
    d["isr"] = list(o.isr)
    d["replicas"] = list(o.replicas)
    return d


def observation_fields(version: int, observations: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """The body's observation fields in ``version``, from observations as dicts with the
    fields of ``Observation``: ``{"observations": [...]}`` before version 3, else
    ``topics``, ``partitions`` and ``followers`` (the columns). A partition entry is shared
    by the observations that agree on every one of its fields, so nothing is lost."""
    if version < COLUMNS_FROM:  # no place for the optional fields
        return {
            "observations": [{k: v for k, v in o.items() if k not in OPTIONAL_PARTITION_FIELDS} for o in observations]
        }
    observations = list(observations)
    named: tuple[str, ...] = PARTITION_FIELDS
    if version >= GONE_FROM:
        named += tuple(f for f in OPTIONAL_PARTITION_FIELDS if any(o.get(f) is not None for o in observations))
    topics: dict[Any, int] = {}
    entries: dict[tuple[Any, ...], int] = {}
    partitions: dict[str, list[Any]] = {f: [] for f in named}
    followers: dict[str, list[Any]] = {"p": [], **{f: [] for f in FOLLOWER_FIELDS}}
    for o in observations:
        entry = {f: o.get(f) for f in named}
        entry["isr"], entry["replicas"] = list(entry["isr"] or ()), list(entry["replicas"] or ())
        key = tuple(tuple(v) if isinstance(v, list) else v for v in entry.values())
        at = entries.get(key)
        if at is None:
            at = entries[key] = len(partitions["partition"])
            entry["topic"] = topics.setdefault(entry["topic"], len(topics))
            for f, v in entry.items():
                partitions[f].append(v)
        followers["p"].append(at)
        for f in FOLLOWER_FIELDS:
            followers[f].append(o.get(f))
    return {"topics": list(topics), "partitions": partitions, "followers": followers}


def _rows(body: Mapping[str, Any]) -> list[dict[str, Any]]:
    """A version-3 body's observations as dicts; ValueError when its columns do not fit."""
    topics, parts, fol = body["topics"], body["partitions"], body["followers"]
    n_parts, n = len(parts["partition"]), len(fol["p"])
    optional = [f for f in OPTIONAL_PARTITION_FIELDS if parts.get(f) is not None]
    for f in (*PARTITION_FIELDS, *optional):
        if len(parts[f]) != n_parts:
            raise ValueError(f"partitions.{f} has {len(parts[f])} entries, partitions.partition {n_parts}")
    for f in FOLLOWER_FIELDS:
        if len(fol[f]) != n:
            raise ValueError(f"followers.{f} has {len(fol[f])} entries, followers.p {n}")
    rows = []
    for i, p in enumerate(fol["p"]):
        if type(p) is not int or not 0 <= p < n_parts:  # (a bool is not an index)
            raise ValueError(f"followers.p[{i}] is {p!r}, not an index of partitions")
        t = parts["topic"][p]
        if type(t) is not int or not 0 <= t < len(topics):
            raise ValueError(f"partitions.topic[{p}] is {t!r}, not an index of topics")
        row = {f: parts[f][p] for f in (*PARTITION_FIELDS, *optional)}
        row["topic"] = topics[t]
        row.update((f, fol[f][i]) for f in FOLLOWER_FIELDS)
        rows.append(row)
    return rows


def encode_record(record: TelemetryRecord) -> bytes:
    """JSON bytes for one telemetry record (compact, UTF-8), in ``record.version``'s layout."""
    body: dict[str, Any] = {
        "version": record.version,
        "cluster": record.cluster,
        "source": record.source,
        "sent_ms": record.sent_ms,
        **observation_fields(record.version, (_obs_dict(o) for o in record.observations)),
    }
    v1 = record.version == 1  # version 1 has no leader_id and no brokers
    if record.isr_changes:
        body["isr_changes"] = [
            {**asdict(c), "isr_before": list(c.isr_before), "isr_after": list(c.isr_after)} for c in record.isr_changes
        ]
        for c in body["isr_changes"]:
            if v1 or c["leader_id"] is None:  # optional in version 2, absent in version 1
                del c["leader_id"]
    if record.brokers and not v1:
        body["brokers"] = [asdict(b) for b in record.brokers]
    if record.gone and record.version >= GONE_FROM:
        body["gone"] = [asdict(g) for g in record.gone]
    if record.version >= GONE_FROM:
        if record.cluster_id is not None:
            body["cluster_id"] = record.cluster_id
        if record.endpoints:
            body["endpoints"] = [asdict(e) for e in record.endpoints]
        if record.kafka_version is not None:
            body["kafka_version"] = record.kafka_version
    return json.dumps(body, separators=(",", ":")).encode()


def decode_record(data: bytes | str) -> TelemetryRecord:
    """Parse one record. Raises ValueError with the reason when it does not have the
    format's shape: not JSON, not an object, an unknown version, a field missing, or a
    field of the wrong JSON type (a number where an integer belongs, text for a number,
    an integer past 64 bits). The values themselves (negative offsets, times in the
    future, an offset going backwards) are the streaming job's checks (``streaming.evaluation.parse``,
    in Spark), not made here. For tests and tools (``isrwatch doctor``).
    """
    body = jsontext.loads(data)
    if not isinstance(body, dict):
        raise ValueError(f"not a JSON object: {jsontext.type_name(body)}")
    version = body.get("version")
    if version not in SUPPORTED_VERSIONS:
        raise ValueError(f"unknown schema version {version!r}")
    try:
        rows = _rows(body) if version >= COLUMNS_FROM else body["observations"]
        obs = tuple(
            Observation(
                **{
                    **o,
                    "isr": tuple(o.get("isr") or ()),
                    "replicas": tuple(o.get("replicas") or ()),
                }
            )
            for o in rows
        )
        changes = tuple(
            IsrChange(**{**c, "isr_before": tuple(c["isr_before"]), "isr_after": tuple(c["isr_after"])})
            for c in body.get("isr_changes") or ()
        )
        brokers = tuple(BrokerCounters(**b) for b in body.get("brokers") or ())
        gone = tuple(GoneReplica(**g) for g in body.get("gone") or ())
        endpoints = tuple(BrokerEndpoint(**e) for e in body.get("endpoints") or ())
        record = TelemetryRecord(
            cluster=body["cluster"],
            source=body.get("source", ""),
            sent_ms=body["sent_ms"],
            observations=obs,
            isr_changes=changes,
            brokers=brokers,
            gone=gone,
            version=version,
            cluster_id=body.get("cluster_id"),
            endpoints=endpoints,
            kafka_version=body.get("kafka_version"),
        )
    except (KeyError, TypeError) as e:
        raise ValueError(f"missing or unexpected field: {e}") from None
    return _typed(record)


def _type_problem(value: Any, hint: Any) -> str | None:
    """What keeps ``value`` from the annotated type ``hint`` (None: nothing). JSON's
    types as Python's ``json`` gives them: a bool is not an integer, nor a float."""
    if typing.get_origin(hint) is tuple:  # tuple[X, ...]
        item = typing.get_args(hint)[0]
        return next((f"[{i}] {p}" for i, v in enumerate(value) if (p := _type_problem(v, item))), None)
    if isinstance(hint, types.UnionType):  # X | None
        if value is None:
            return None
        (hint,) = [a for a in typing.get_args(hint) if a is not type(None)]
    if is_dataclass(hint):
        return None  # checked field by field itself (_typed)
    name = {int: "integer", str: "string"}[hint]
    if type(value) is not hint:
        return f"{name} expected, not {jsontext.type_name(value)}"
    if hint is int and not jsontext.INT64[0] <= value < jsontext.INT64[1]:
        return "outside the 64-bit range"
    return None


def _typed(record: Any, where: str = "") -> Any:
    """``record`` (a dataclass of this module, and the ones it holds) with each field
    checked against its annotation: ValueError naming the first that does not fit. A
    number where text belongs is read as its text, as the job's parse reads it."""
    hints = typing.get_type_hints(type(record))
    changes: dict[str, Any] = {}
    for f in fields(record):
        value = getattr(record, f.name)
        if hints[f.name] is str and type(value) in (int, float):
            value = changes[f.name] = str(value)
        problem = _type_problem(value, hints[f.name])
        if problem is not None:
            raise ValueError(f"field {where}{f.name}: {problem}")
        if isinstance(value, tuple) and value and is_dataclass(value[0]):
            changes[f.name] = tuple(_typed(item, f"{where}{f.name}[{i}].") for i, item in enumerate(value))
    return replace(record, **changes) if changes else record


def json_schema(version: int = VERSION) -> dict[str, Any]:
    """The machine-readable JSON Schema of a telemetry version."""
    text = resources.files("isrwatch").joinpath(f"schema/telemetry-v{version}.schema.json").read_text()
    return json.loads(text)


# The same shapes for Spark's from_json (parsed in the JVM, not in Python): one schema
# reads every version, the fields a version does not have are null.
OBSERVATION_DDL = (
    "STRUCT<topic: STRING, partition: INT, broker_id: INT, leader_id: INT, "
    "t_ms: BIGINT, leo: BIGINT, leader_leo: BIGINT, hw: BIGINT, prev_t_ms: BIGINT, "
    "prev_leo: BIGINT, prev_leader_leo: BIGINT, isr: ARRAY<INT>, replicas: ARRAY<INT>, "
    "lag_time_max_ms: BIGINT, min_isr: INT, leader_epoch: INT>"
)
SPARK_SCHEMA_DDL = (
    "version INT, cluster STRING, source STRING, sent_ms BIGINT, "
    f"observations ARRAY<{OBSERVATION_DDL}>, "
    "isr_changes ARRAY<STRUCT<t_ms: BIGINT, topic: STRING, partition: INT, "
    "isr_before: ARRAY<INT>, isr_after: ARRAY<INT>, leader_id: INT>>, "
    "brokers ARRAY<STRUCT<broker_id: INT, t_ms: BIGINT, isr_shrinks_total: BIGINT, isr_expands_total: BIGINT>>, "
    "gone ARRAY<STRUCT<t_ms: BIGINT, topic: STRING, partition: INT, broker_id: INT>>, "
    "cluster_id STRING, endpoints ARRAY<STRUCT<broker_id: INT, host: STRING, port: INT>>, kafka_version STRING, "
    "topics ARRAY<STRING>, "
    "partitions STRUCT<topic: ARRAY<INT>, partition: ARRAY<INT>, leader_id: ARRAY<INT>, hw: ARRAY<BIGINT>, "
    "isr: ARRAY<ARRAY<INT>>, replicas: ARRAY<ARRAY<INT>>, lag_time_max_ms: ARRAY<BIGINT>, min_isr: ARRAY<INT>, "
    "leader_epoch: ARRAY<INT>>, "
    "followers STRUCT<p: ARRAY<INT>, broker_id: ARRAY<INT>, t_ms: ARRAY<BIGINT>, leo: ARRAY<BIGINT>, "
    "leader_leo: ARRAY<BIGINT>, prev_t_ms: ARRAY<BIGINT>, prev_leo: ARRAY<BIGINT>, prev_leader_leo: ARRAY<BIGINT>>"
)
