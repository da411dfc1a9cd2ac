"""From what the job knows about a replica to what isrwatch says about it.

``ReplicaAggregate`` is the per-replica row the streaming job keeps in Spark's
state store (monotone max / max_by aggregates of the observations).
``evaluate`` turns it into a ``ReplicaStatus`` at the cluster's telemetry
clock: the gauges, the state topic and the alerts are all made from that.
Pure Python; no I/O but reading the state record's own JSON Schema.
"""

from __future__ import annotations

import enum
import json
import operator
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any

from isrwatch import jsontext
from isrwatch.rule import Rule, RuleConfig, check_period_ms, for_version

__all__ = [
    "ReplicaKey",
    "PartitionKey",
    "GoneKey",
    "State",
    "Thresholds",
    "ReplicaAggregate",
    "ReplicaStatus",
    "evaluate",
    "lag_state_of",
    "last_caught_up_ms",
    "STATUS_FIELDS",
    "status_from_values",
    "status_key",
    "status_to_json",
    "status_from_json",
    "status_from_record",
    "json_schema",
]

ReplicaKey = tuple[str, str, int, int]  # cluster, topic, partition, broker_id
PartitionKey = tuple[str, str, int]  # cluster, topic, partition
# A replica to forget, and the telemetry time from which on it is no follower: said gone by
# the collector (a telemetry record's ``gone``), or named its partition's leader.
GoneKey = tuple[str, str, int, int, int]


class State(str, enum.Enum):  # noqa: UP042 (not StrEnum: str() and format() of a member stay as they are)
    OK = "ok"
    NEARING = "nearing"
    CRITICAL = "critical"
    OUT_OF_SYNC = "out_of_sync"
    STALLED = "stalled"


@dataclass(frozen=True)
class Thresholds:
    nearing_ratio: float = 0.5
    critical_ratio: float = 0.8
    # A follower whose broker has not answered for this long, while its
    # leader answers and is ahead, is STALLED (paused / crashed broker).
    stall_after_ms: int = 3000

    def __post_init__(self) -> None:
        if not 0 < self.nearing_ratio <= self.critical_ratio < 1:
            raise ValueError(
                f"need 0 < nearing_ratio ({self.nearing_ratio}) <= critical_ratio ({self.critical_ratio}) < 1"
            )
        if self.stall_after_ms <= 0:
            raise ValueError(f"stall_after_ms={self.stall_after_ms} must be > 0")


@dataclass(frozen=True)
class ReplicaAggregate:
    """What the state store holds for one follower replica.

    Column names are a contract between ``streaming`` (which computes them in
    Spark) and this module.
    """

    cluster: str
    topic: str
    partition: int
    broker_id: int
    first_t_ms: int  # min t_ms: when isrwatch first saw the replica
    last_t_ms: int  # max t_ms
    last_caught_up_ms: int | None  # max of rule.caught_up_time over observations
    last_answer_ms: int | None  # max t_ms where the follower answered (leo not null)
    last_leader_answer_ms: int | None  # max t_ms where the leader answered
    last_progress_ms: int | None  # max t_ms where leo > prev_leo, or caught up
    # From the newest observation (max_by t_ms):
    leader_id: int
    leo: int | None
    leader_leo: int | None
    hw: int | None
    isr: tuple[int, ...]
    replicas: tuple[int, ...]
    lag_time_max_ms: int | None
    min_isr: int | None
    # Newest known offsets (max_by over observations where each is not null):
    known_leo: int | None = None
    known_leader_leo: int | None = None
    # From the newest observation too: the partition's leader epoch (None: not known)
    leader_epoch: int | None = None
    # and its cluster's Kafka version as the telemetry stated it (None: not stated)
    kafka_version: str | None = None


@dataclass(frozen=True, slots=True)
class ReplicaStatus:
    cluster: str
    topic: str
    partition: int
    broker_id: int
    leader_id: int
    eval_ms: int  # the telemetry time this status is for
    state: State
    time_since_caught_up_s: float
    lag_ratio: float
    time_to_shrink_s: float
    offset_lag: int
    in_isr: bool
    isr_size: int
    min_isr: int | None
    lag_time_max_ms: int
    shrink_window_start_ms: int  # earliest predicted removal
    shrink_window_end_ms: int  # latest predicted removal
    # The state from the lag ratio alone. Equal to ``state`` except for a
    # stalled follower, whose lag keeps growing while its broker is silent.
    lag_state: State | None = None
    # The largest lag ratio the replica reached over the telemetry of the batch
    # this status closes (the job evaluates every observation): a fault that
    # lived between two scrapes still shows. None: ``lag_ratio``.
    peak_lag_ratio: float | None = None
    # Times the replica's lag state entered out_of_sync, since isrwatch first
    # saw it (the job carries the count in its checkpoint).
    out_of_sync_episodes: int = 0

    def __post_init__(self) -> None:
        if self.lag_state is None:
            object.__setattr__(self, "lag_state", self.state)
        if self.peak_lag_ratio is None:
            object.__setattr__(self, "peak_lag_ratio", self.lag_ratio)


# ReplicaStatus's field names, in its constructor's order.
STATUS_FIELDS: tuple[str, ...] = tuple(ReplicaStatus.__dataclass_fields__)
# Its slots' setters, which a frozen dataclass's own __setattr__ refuses, in the same order.
_SETTERS = tuple(getattr(ReplicaStatus, name).__set__ for name in STATUS_FIELDS)
_VALUES = operator.attrgetter(*STATUS_FIELDS)


def status_from_values(values: Sequence[Any]) -> ReplicaStatus:
    """A ``ReplicaStatus`` from its field values in declaration order (``lag_state``
    included), without the dataclass constructor: the streaming driver builds
    one per replica per batch, and the frozen constructor costs several times more."""
    status = object.__new__(ReplicaStatus)
    for set_field, value in zip(_SETTERS, values, strict=True):
        set_field(status, value)
    return status


def lag_state_of(ratio: float, out_of_isr: bool, th: Thresholds) -> State:
    """The state a lag ratio calls for (a follower the ISR left out is out of sync)."""
    if ratio >= 1.0 or out_of_isr:
        return State.OUT_OF_SYNC
    if ratio >= th.critical_ratio:
        return State.CRITICAL
    if ratio >= th.nearing_ratio:
        return State.NEARING
    return State.OK


def evaluate(agg: ReplicaAggregate, cluster_now_ms: int, cfg: RuleConfig, th: Thresholds) -> ReplicaStatus:
    """Evaluate one replica at the cluster's telemetry clock.

    Ages freeze where telemetry stops: a replica is evaluated at the last time
    its leader answered, so a gap (collector down, leader unreachable) never
    ages replicas into false alerts.
    """
    cfg = for_version(cfg, agg.kafka_version)  # --rule auto: the variant of the cluster's version
    max_lag = agg.lag_time_max_ms or cfg.lag_time_max_ms
    if max_lag != cfg.lag_time_max_ms:
        cfg = RuleConfig(cfg.rule, max_lag, cfg.lag_max_messages, cfg.idle_is_caught_up)
    leader_seen = agg.last_leader_answer_ms if agg.last_leader_answer_ms is not None else agg.first_t_ms
    now = min(cluster_now_ms, leader_seen)
    leo = agg.known_leo if agg.known_leo is not None else agg.leo
    leader_leo = agg.known_leader_leo if agg.known_leader_leo is not None else agg.leader_leo
    offset_lag = max(0, (leader_leo or 0) - (leo or 0)) if leader_leo is not None else 0

    lcu = agg.last_caught_up_ms if agg.last_caught_up_ms is not None else agg.first_t_ms
    if cfg.rule is Rule.LEGACY_MESSAGES:
        fetched = agg.last_progress_ms if agg.last_progress_ms is not None else agg.first_t_ms
        age = max(0, now - max(fetched, lcu))
        ratio = max(age / max_lag, offset_lag / cfg.lag_max_messages)
        lcu = now - int(ratio * max_lag)
    else:
        idle = (
            cfg.rule is Rule.KIP16_REFINED
            and cfg.idle_is_caught_up
            and leo is not None
            and leader_leo is not None
            and leo >= leader_leo
        )
        if idle:
            lcu = max(lcu, now)
        age = max(0, now - lcu)
        ratio = age / max_lag

    in_isr = agg.broker_id in agg.isr
    # silent in the newest round, its leader's last answer stall_after_ms after its own
    # (streaming.evaluation.evaluate: a round its leader missed does not end it)
    stalled = (
        agg.leo is None
        and now - (agg.last_answer_ms if agg.last_answer_ms is not None else agg.first_t_ms) >= th.stall_after_ms
        and offset_lag > 0
    )
    lag_state = lag_state_of(ratio, bool(agg.isr) and not in_isr, th)
    state = State.STALLED if stalled else lag_state

    start = lcu + max_lag
    return ReplicaStatus(
        cluster=agg.cluster,
        topic=agg.topic,
        partition=agg.partition,
        broker_id=agg.broker_id,
        leader_id=agg.leader_id,
        eval_ms=now,
        state=state,
        time_since_caught_up_s=max(0, now - lcu) / 1000.0,
        lag_ratio=0.0 if ratio <= 0 else ratio,
        time_to_shrink_s=max(0, start - now) / 1000.0,
        offset_lag=offset_lag,
        in_isr=in_isr,
        isr_size=len(agg.isr),
        min_isr=agg.min_isr,
        lag_time_max_ms=max_lag,
        shrink_window_start_ms=start,
        shrink_window_end_ms=start + check_period_ms(cfg),
        lag_state=lag_state,
    )


def last_caught_up_ms(s: ReplicaStatus) -> int:
    """The follower's ``lastCaughtUpTimeMs`` as ``s`` computed it."""
    return s.shrink_window_start_ms - s.lag_time_max_ms


def status_key(s: ReplicaStatus) -> str:
    """The state topic key: ``cluster/topic/partition/broker_id``."""
    return f"{s.cluster}/{s.topic}/{s.partition}/{s.broker_id}"


def status_to_json(s: ReplicaStatus) -> dict[str, object]:
    d = dict(zip(STATUS_FIELDS, _VALUES(s), strict=True))
    d["state"] = s.state.value
    d["lag_state"] = s.lag_state.value if s.lag_state is not None else s.state.value
    return d


def status_from_json(d: dict[str, object]) -> ReplicaStatus:
    """The inverse of ``status_to_json``; a record of an older job (without
    ``lag_state``, ``peak_lag_ratio`` or ``out_of_sync_episodes``) gets their defaults."""
    lag_state = d.get("lag_state")
    return ReplicaStatus(
        **{**d, "state": State(d["state"]), "lag_state": State(lag_state) if lag_state else None}  # type: ignore[arg-type]
    )


def json_schema() -> dict[str, Any]:
    """The JSON Schema of a state topic record (``status_to_json``'s output;
    ``isrwatch/schema/state-v1.schema.json``, docs/state-topic.md)."""
    return dict(json.loads(resources.files("isrwatch").joinpath("schema/state-v1.schema.json").read_text()))


def _field_rules() -> tuple[dict[str, tuple[str, ...]], frozenset[str], dict[str, int]]:
    """(field -> the JSON types its schema allows, ``state`` for the two state fields;
    the required fields; field -> its longest text), read from the schema file once."""
    schema = json_schema()
    kinds: dict[str, tuple[str, ...]] = {}
    for name, spec in schema["properties"].items():
        kind = spec.get("type", "state")
        kinds[name] = tuple(kind) if isinstance(kind, list) else (kind,)
    # every text field's bound (none: as long as a record may be)
    longest = {name: spec.get("maxLength", sys.maxsize) for name, spec in schema["properties"].items()}
    return kinds, frozenset(schema["required"]), longest


# (The names' bounds, as the telemetry's: a label of every gauge, not megabytes of one.)
_FIELD_TYPES, _REQUIRED, _LONGEST = _field_rules()
_INT64_LOW, _INT64_HIGH = jsontext.INT64
_STATES = frozenset(st.value for st in State)
# A state field holds one of the states (``lag_state`` may be null: an older job's record).
_STATE_FIELD_TYPES: dict[str, set[type]] = {"state": {str}, "lag_state": {str, type(None)}}
# The fast check of ``status_from_record``: each field's exact Python types (jsontext.PYTHON_TYPES).
_TYPES: dict[str, set[type]] = {
    name: _STATE_FIELD_TYPES[name] if kinds == ("state",) else {t for k in kinds for t in jsontext.PYTHON_TYPES[k]}
    for name, kinds in _FIELD_TYPES.items()
}


def _field_problem(name: str, value: object, kinds: tuple[str, ...]) -> str:
    """What is wrong with ``value``, refused for a field of the JSON types ``kinds``."""
    if kinds == ("state",):
        return f"a state expected, not {repr(value)[:40]}"
    if type(value) is str and "string" in kinds:
        return f"{len(value)} characters, at most {_LONGEST[name]}"
    if type(value) is int and ("integer" in kinds or "number" in kinds):
        return "outside the 64-bit range"  # what Kafka's offsets and times fit in; a float of it overflows
    return f"{' or '.join(kinds)} expected, not {jsontext.type_name(value)}"


def status_from_record(value: bytes) -> ReplicaStatus:
    """A state topic record's value, read as the exporter does: any bytes either make a
    ``ReplicaStatus`` or raise ``ValueError`` saying what is wrong (not JSON, not an
    object, a required field missing, a field of the wrong type; a field this version
    does not know, from a newer job, is left out). Checked against the record's JSON
    Schema field by field, without a schema validator (one record per replica per batch)."""
    d = jsontext.loads(value)
    if not isinstance(d, dict):
        raise ValueError(f"not a JSON object: {jsontext.type_name(d)}")
    missing = sorted(_REQUIRED - d.keys())
    if missing:
        raise ValueError(f"missing fields: {', '.join(missing)}")
    known = {}
    for name, v in d.items():
        types = _TYPES.get(name)
        if types is None:
            continue  # a field of a newer job
        kind = type(v)
        if kind not in types:
            bad = True
        elif kind is int:
            bad = not _INT64_LOW <= v < _INT64_HIGH
        elif kind is str:
            bad = v not in _STATES if name in _STATE_FIELD_TYPES else len(v) > _LONGEST[name]
        else:
            bad = False
        if bad:
            raise ValueError(f"field {name}: {_field_problem(name, v, _FIELD_TYPES[name])}")
        known[name] = v
    return status_from_json(known)
