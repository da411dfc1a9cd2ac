"""Alerts: which ones a replica status calls for, and their transitions.

An ``Alert`` maps one to one onto an Alertmanager API v2 alert object.
``AlertBook`` remembers what is firing and turns each evaluation into the
transitions to send: started, resolved (and, for re-sending, what still
holds). Pure Python, no I/O; delivery lives in ``streaming.driver.notify``.
"""

from __future__ import annotations

import enum
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, NotRequired, TypedDict

from isrwatch.status import ReplicaStatus, State, Thresholds

__all__ = [
    "AlertName",
    "SEVERITY",
    "Alert",
    "AlertKey",
    "PostableAlert",
    "AlertBook",
    "Transition",
    "replica_alerts",
    "partition_alert",
    "partition_alerts",
    "crossed_at",
    "stale_alert",
]


class AlertName(str, enum.Enum):  # noqa: UP042 (not StrEnum: str() and format() of a member stay as they are)
    NEARING = "KafkaReplicaNearingIsrShrink"
    IMMINENT = "KafkaReplicaIsrShrinkImminent"
    OUT_OF_SYNC = "KafkaReplicaOutOfSync"
    STALLED = "KafkaReplicaStalled"
    MIN_ISR_AT_RISK = "KafkaPartitionMinIsrAtRisk"
    TELEMETRY_STALE = "IsrwatchTelemetryStale"


SEVERITY = {
    AlertName.NEARING: "warning",
    AlertName.IMMINENT: "critical",
    AlertName.OUT_OF_SYNC: "critical",
    AlertName.STALLED: "critical",
    AlertName.MIN_ISR_AT_RISK: "critical",
    AlertName.TELEMETRY_STALE: "warning",
}

# Lag alerts are cumulative: a replica past 0.8 is also past 0.5. They follow
# the lag state; a stalled follower also gets KafkaReplicaStalled, so a paused
# broker is told apart from a slow follower while its lag still counts down.
_BY_LAG_STATE = {
    State.OK: (),
    State.NEARING: (AlertName.NEARING,),
    State.CRITICAL: (AlertName.NEARING, AlertName.IMMINENT),
    State.OUT_OF_SYNC: (AlertName.NEARING, AlertName.IMMINENT, AlertName.OUT_OF_SYNC),
    State.STALLED: (),
}


def _iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


# An alert's identity: its name and labels (what Alertmanager groups and dedups by).
AlertKey = tuple[str, tuple[tuple[str, str], ...]]


class PostableAlert(TypedDict):
    """An alert as Alertmanager's API v2 takes it (``postableAlert``; times in RFC 3339)."""

    labels: dict[str, str]
    annotations: dict[str, str]
    startsAt: str
    endsAt: NotRequired[str]
    generatorURL: NotRequired[str]


@dataclass(frozen=True)
class Alert:
    name: AlertName
    labels: tuple[tuple[str, str], ...]  # sorted, without alertname/severity
    summary: str
    description: str
    starts_ms: int
    ends_ms: int | None = None
    generator_url: str = ""

    @property
    def key(self) -> AlertKey:
        return (self.name.value, self.labels)

    def to_alertmanager(self, runbook_base: str | None = None) -> PostableAlert:
        """The Alertmanager API v2 ``postableAlert`` object; its ``runbook_url`` annotation is the
        alert's section of the runbook at ``runbook_base``, left out without one (no link that
        leads nowhere)."""
        labels = {"alertname": self.name.value, "severity": SEVERITY[self.name], **dict(self.labels)}
        annotations = {"summary": self.summary, "description": self.description}
        if runbook_base:
            annotations["runbook_url"] = f"{runbook_base.rstrip('/')}#{self.name.value.lower()}"
        body: PostableAlert = {"labels": labels, "annotations": annotations, "startsAt": _iso(self.starts_ms)}
        if self.ends_ms is not None:
            body["endsAt"] = _iso(self.ends_ms)
        if self.generator_url:
            body["generatorURL"] = self.generator_url
        return body


def _replica_labels(s: ReplicaStatus) -> tuple[tuple[str, str], ...]:
    return (
        ("broker_id", str(s.broker_id)),
        ("cluster", s.cluster),
        ("leader_id", str(s.leader_id)),
        ("partition", str(s.partition)),
        ("topic", s.topic),
    )


def crossed_at(s: ReplicaStatus, ratio: float) -> int:
    """The telemetry time at which ``s``'s lag ratio reached ``ratio``.

    The age since ``lastCaughtUpTimeMs`` grows with the clock until new caught-up
    evidence arrives, and ``s`` holds the newest evidence: the ratio reached
    ``ratio`` at ``lcu + ratio * lag_time_max_ms``, however long the batch that
    showed it (capped at ``eval_ms``: a replica out of the ISR for another
    reason is out of sync from when it was seen so).
    """
    lcu = s.shrink_window_start_ms - s.lag_time_max_ms
    return min(s.eval_ms, lcu + int(round(ratio * s.lag_time_max_ms)))


def replica_alerts(s: ReplicaStatus, th: Thresholds | None = None) -> list[Alert]:
    """The alerts one replica status calls for. A lag alert starts when the
    replica crossed its threshold (``crossed_at``), not when a batch noticed."""
    th = th or Thresholds()
    crossing = {AlertName.NEARING: th.nearing_ratio, AlertName.IMMINENT: th.critical_ratio, AlertName.OUT_OF_SYNC: 1.0}
    where = f"{s.topic}-{s.partition} on broker {s.broker_id} (leader {s.leader_id}, cluster {s.cluster})"
    out = []
    lag_state = s.lag_state or s.state
    names = _BY_LAG_STATE[lag_state] + ((AlertName.STALLED,) if s.state is State.STALLED else ())
    for name in names:
        if name is AlertName.STALLED:
            summary = f"Follower {where} is stalled"
            description = (
                f"Broker {s.broker_id} has not answered while leader {s.leader_id} moved "
                f"{s.offset_lag} messages ahead; it is paused, crashed or cut off."
            )
        else:
            summary = f"Follower {where}: {s.lag_ratio:.0%} of replica.lag.time.max.ms"
            description = (
                f"Not caught up for {s.time_since_caught_up_s:.1f}s of "
                f"{s.lag_time_max_ms / 1000:.1f}s; {s.offset_lag} messages behind; "
                f"predicted removal from the ISR in {s.time_to_shrink_s:.1f}s "
                f"(window {_iso(s.shrink_window_start_ms)} .. {_iso(s.shrink_window_end_ms)})."
            )
        starts = crossed_at(s, crossing[name]) if name in crossing else s.eval_ms
        out.append(Alert(name, _replica_labels(s), summary, description, starts))
    return out


def partition_alerts(statuses: Iterable[ReplicaStatus], default_min_isr: int) -> list[Alert]:
    """``KafkaPartitionMinIsrAtRisk`` for every partition of ``statuses`` that calls for it."""
    by_partition: dict[tuple[str, str, int], list[ReplicaStatus]] = {}
    for s in statuses:
        by_partition.setdefault((s.cluster, s.topic, s.partition), []).append(s)
    out = []
    for group in by_partition.values():
        alert = partition_alert(group, default_min_isr)
        if alert is not None:
            out.append(alert)
    return out


def partition_alert(group: Sequence[ReplicaStatus], default_min_isr: int) -> Alert | None:
    """``KafkaPartitionMinIsrAtRisk`` when the predicted ISR of one partition
    (its followers' statuses) falls below ``min.insync.replicas``. A follower
    predicted to leave is one that is critical, out of sync or stalled; the
    leader always stays. ISR, leader and min ISR come from the newest status
    (the highest broker id among equally new ones, so any order gives one answer)."""
    newest = max(group, key=lambda s: (s.eval_ms, s.broker_id))
    min_isr = newest.min_isr or default_min_isr
    leaving = sum(1 for s in group if s.in_isr and s.state in (State.CRITICAL, State.OUT_OF_SYNC, State.STALLED))
    predicted = newest.isr_size - leaving
    if not newest.isr_size or predicted >= min_isr:
        return None
    cluster, topic, partition = newest.cluster, newest.topic, newest.partition
    labels = (
        ("cluster", cluster),
        ("leader_id", str(newest.leader_id)),
        ("partition", str(partition)),
        ("topic", topic),
    )
    return Alert(
        AlertName.MIN_ISR_AT_RISK,
        labels,
        f"{topic}-{partition} (cluster {cluster}) may fall below min.insync.replicas={min_isr}",
        f"ISR has {newest.isr_size} replicas; {leaving} predicted to leave soon; producers with acks=all would fail.",
        newest.eval_ms,
    )


def stale_alert(cluster: str, last_telemetry_ms: int, now_ms: int) -> Alert:
    age = (now_ms - last_telemetry_ms) / 1000
    return Alert(
        AlertName.TELEMETRY_STALE,
        (("cluster", cluster),),
        f"No telemetry from cluster {cluster} for {age:.0f}s",
        "isrwatch cannot see this cluster: the collector is down or cannot reach it. "
        "Replica ages are frozen until telemetry returns; no replica alert is raised from the gap.",
        now_ms,
    )


@dataclass(frozen=True)
class Transition:
    started: list[Alert]
    resolved: list[Alert]
    holding: list[Alert]


@dataclass
class AlertBook:
    """What is firing, keyed by alert name + labels."""

    active: dict[AlertKey, Alert] = field(default_factory=dict)

    def update(
        self,
        desired: Iterable[Alert],
        now_ms: int,
        scope: set[str] | None = None,
        held_to_start: Collection[AlertKey] = (),
        hold_ms: Mapping[str, int] | None = None,
    ) -> Transition:
        """Move to ``desired``. Alerts of a name outside ``scope`` (if given)
        are left as they are, so replica and staleness alerts can be updated
        apart. ``held_to_start``: keys of alerts that evidence (``now_ms``, a
        telemetry time) from no later than their start (+ ``hold_ms`` of their
        name) cannot end: those a restarted job found in its checkpoint's book. Its
        first run fired them on evidence the restarted one re-reads from before
        them, or, for ``KafkaReplicaStalled``, on its own watch of the brokers,
        which says a broker silent up to the stall time before the telemetry does
        (else the restarted job resolves them and fires them again a batch later)."""
        wanted = {a.key: a for a in desired}
        started, holding, resolved = [], [], []
        for key, alert in wanted.items():
            if key in self.active:
                kept = self.active[key]
                fresh = Alert(alert.name, alert.labels, alert.summary, alert.description, kept.starts_ms)
                self.active[key] = fresh
                holding.append(fresh)
            else:
                self.active[key] = alert
                started.append(alert)
        for key in list(self.active):
            if key in wanted or (scope is not None and key[0] not in scope):
                continue
            if key in held_to_start and now_ms <= self.active[key].starts_ms + (hold_ms or {}).get(key[0], 0):
                continue
            old = self.active.pop(key)
            resolved.append(
                Alert(old.name, old.labels, old.summary, old.description, old.starts_ms, max(now_ms, old.starts_ms))
            )
        return Transition(started, resolved, holding)

    def to_json(self) -> list[dict[str, Any]]:
        return [
            {
                "name": a.name.value,
                "labels": [list(p) for p in a.labels],
                "summary": a.summary,
                "description": a.description,
                "starts_ms": a.starts_ms,
            }
            for a in self.active.values()
        ]

    @classmethod
    def from_json(cls, items: list[dict[str, Any]]) -> AlertBook:
        book = cls()
        for it in items:
            a = Alert(
                AlertName(it["name"]),
                tuple((k, v) for k, v in it["labels"]),
                it["summary"],
                it["description"],
                int(it["starts_ms"]),
            )
            book.active[a.key] = a
        return book
