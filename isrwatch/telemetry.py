"""The telemetry format: what the collector and the simulator publish.

One telemetry record (a Kafka record, or one line of the embedded spool) holds
many observations of one cluster, JSON encoded::

    {"version": 2, "cluster": "prod-eu", "source": "jmx",
     "sent_ms": 1732190000123,
     "observations": [
        {"topic": "orders", "partition": 3, "broker_id": 2, "leader_id": 1,
         "t_ms": 1732190000100, "leo": 5120, "leader_leo": 5130, "hw": 5118,
         "prev_t_ms": 1732189999100, "prev_leo": 5000, "prev_leader_leo": 5110,
         "isr": [1, 2, 3], "replicas": [1, 2, 3],
         "lag_time_max_ms": 30000, "min_isr": 2}
     ],
     "isr_changes": [
        {"t_ms": 1732190000100, "topic": "orders", "partition": 3,
         "isr_before": [1, 2, 3], "isr_after": [1, 3], "leader_id": 1}
     ],
     "brokers": [
        {"broker_id": 1, "t_ms": 1732190000100, "isr_shrinks_total": 4, "isr_expands_total": 3}
     ]}

An observation is one follower replica seen at ``t_ms`` (milliseconds since the
epoch, the source's clock). ``leo`` is the follower's log end offset (its next
fetch offset), ``leader_leo`` the leader's LEO at that time; either is null when
that broker did not answer. ``prev_*`` are the same follower's previous
observation, so the refined KIP-16 rule becomes a per-observation max (see
``isrwatch.rule.caught_up_time``). ``source`` says how the observations were made:
``fetch`` or ``jmx`` (``isrwatch collect --source``: ListOffsets, or the brokers' MBeans),
``simulator`` or ``simulator-fetch`` (the simulator); collectors before the JMX mode wrote
``collector`` (fetch). It is optional and any text is valid: nothing downstream branches on
it, so one format serves both collector modes. ``brokers`` (version 2) holds what each
broker says of its own replication: its ``IsrShrinksPerSec``/``IsrExpandsPerSec`` counts (the
JMX collector reads them), so the job counts the shrinks metadata never showed
(``isrwatch.outcomes``). Version 1 is the same without ``brokers`` and an ISR change's
``leader_id``; the job reads both. The machine-readable schemas are
``isrwatch/schema/telemetry-v{1,2}.schema.json``; docs/telemetry.md explains them.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from importlib import resources
from typing import Any

__all__ = [
    "VERSION",
    "SUPPORTED_VERSIONS",
    "Observation",
    "IsrChange",
    "BrokerCounters",
    "TelemetryRecord",
    "encode_record",
    "decode_record",
    "json_schema",
    "SPARK_SCHEMA_DDL",
]

VERSION = 2  # what isrwatch writes
SUPPORTED_VERSIONS = frozenset({1, 2})  # what the job reads


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
class TelemetryRecord:
    cluster: str
    source: str
    sent_ms: int
    observations: tuple[Observation, ...]
    isr_changes: tuple[IsrChange, ...] = field(default=())
    brokers: tuple[BrokerCounters, ...] = field(default=())
    version: int = VERSION


def _obs_dict(o: Observation) -> dict[str, Any]:
    d = asdict(o)
    d["isr"] = list(o.isr)
    d["replicas"] = list(o.replicas)
    return d


def encode_record(record: TelemetryRecord) -> bytes:
    """JSON bytes for one telemetry record (compact, UTF-8)."""
    body: dict[str, Any] = {
        "version": record.version,
        "cluster": record.cluster,
        "source": record.source,
        "sent_ms": record.sent_ms,
        "observations": [_obs_dict(o) for o in record.observations],
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
    return json.dumps(body, separators=(",", ":")).encode()


def decode_record(data: bytes | str) -> TelemetryRecord:
    """Parse one record. Raises ValueError with the reason when it is not valid.

    The streaming job validates in Spark (the same checks, as SQL); this is for
    tests, tools and the what-if replay.
    """
    try:
        body = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"not JSON: {e}") from None
    if not isinstance(body, dict):
        raise ValueError("not a JSON object")
    version = body.get("version")
    if version not in SUPPORTED_VERSIONS:
        raise ValueError(f"unknown schema version {version!r}")
    try:
        obs = tuple(
            Observation(
                **{
                    **o,
                    "isr": tuple(o.get("isr") or ()),
                    "replicas": tuple(o.get("replicas") or ()),
                }
            )
            for o in body["observations"]
        )
        changes = tuple(
            IsrChange(**{**c, "isr_before": tuple(c["isr_before"]), "isr_after": tuple(c["isr_after"])})
            for c in body.get("isr_changes") or ()
        )
        brokers = tuple(BrokerCounters(**b) for b in body.get("brokers") or ())
        return TelemetryRecord(
            cluster=str(body["cluster"]),
            source=str(body.get("source", "")),
            sent_ms=int(body["sent_ms"]),
            observations=obs,
            isr_changes=changes,
            brokers=brokers,
            version=version,
        )
    except (KeyError, TypeError) as e:
        raise ValueError(f"missing or unexpected field: {e}") from None


def json_schema(version: int = VERSION) -> dict[str, Any]:
    """The machine-readable JSON Schema of a telemetry version."""
    text = resources.files("isrwatch").joinpath(f"schema/telemetry-v{version}.schema.json").read_text()
    return json.loads(text)


# The same shape for Spark's from_json (parsed in the JVM, not in Python).
SPARK_SCHEMA_DDL = (
    "version INT, cluster STRING, source STRING, sent_ms BIGINT, "
    "observations ARRAY<STRUCT<topic: STRING, partition: INT, broker_id: INT, leader_id: INT, "
    "t_ms: BIGINT, leo: BIGINT, leader_leo: BIGINT, hw: BIGINT, prev_t_ms: BIGINT, "
    "prev_leo: BIGINT, prev_leader_leo: BIGINT, isr: ARRAY<INT>, replicas: ARRAY<INT>, "
    "lag_time_max_ms: BIGINT, min_isr: INT>>, "
    "isr_changes ARRAY<STRUCT<t_ms: BIGINT, topic: STRING, partition: INT, "
    "isr_before: ARRAY<INT>, isr_after: ARRAY<INT>, leader_id: INT>>, "
    "brokers ARRAY<STRUCT<broker_id: INT, t_ms: BIGINT, isr_shrinks_total: BIGINT, isr_expands_total: BIGINT>>"
)
