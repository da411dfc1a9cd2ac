"""The driver side of the job: one row per replica per batch, never per event.

``Monitor`` holds the newest ``ReplicaAggregate`` of every replica (merged
from the aggregation's update-mode output), each cluster's telemetry clock
(the newest telemetry time seen from it) and the alert book. Per batch it
evaluates every replica of the clusters that sent telemetry at their own
clock, hands statuses to the store (and the state topic) and alert
transitions to the sinks. ``check_stale`` runs from a timer on the wall
clock: a cluster whose telemetry clock has not moved for
``stale_after_seconds`` raises ``IsrwatchTelemetryStale``; its replicas
keep their frozen ages (``isrwatch.status.evaluate`` evaluates at the
cluster's clock, which stops with the telemetry).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from isrwatch.alerts import Alert, AlertBook, AlertName, Transition, partition_alerts, replica_alerts, stale_alert
from isrwatch.rule import RuleConfig
from isrwatch.status import ReplicaAggregate, ReplicaStatus, Thresholds, evaluate, status_key
from streaming.checkpoint import DriverCheckpoint
from streaming.state import row_to_aggregate

__all__ = ["Monitor", "BatchReport", "REPLICA_SCOPE", "STALE_SCOPE"]

log = logging.getLogger(__name__)

ReplicaKey = tuple[str, str, int, int]  # cluster, topic, partition, broker_id

STALE_SCOPE = {AlertName.TELEMETRY_STALE.value}
REPLICA_SCOPE = {n.value for n in AlertName} - STALE_SCOPE


class Sink(Protocol):
    def send(self, transition: Transition, now_ms: int) -> None: ...


class StatusOutput(Protocol):
    def update(self, statuses: Iterable[ReplicaStatus]) -> Any: ...


@dataclass
class BatchReport:
    batch_id: int
    rows: int = 0
    observations: int = 0
    replicas: int = 0
    statuses: int = 0
    started: int = 0
    resolved: int = 0
    skipped: bool = False  # transitions of an already handled batch
    clusters: dict[str, int] = field(default_factory=dict)  # cluster -> telemetry clock


def _cluster_of(alert: Alert) -> str | None:
    for k, v in alert.labels:
        if k == "cluster":
            return v
    return None


class Monitor:
    def __init__(
        self,
        cfg: RuleConfig,
        thresholds: Thresholds,
        *,
        default_min_isr: int,
        stale_after_s: float,
        store: Any,
        sinks: Sequence[Sink],
        state_topic: Any | None = None,
        checkpoint: DriverCheckpoint | None = None,
        wall_clock: Any = time.time,
    ) -> None:
        self.cfg = cfg
        self.thresholds = thresholds
        self.default_min_isr = default_min_isr
        self.stale_after_ms = int(stale_after_s * 1000)
        self.store = store
        self.sinks = list(sinks)
        self.state_topic = state_topic
        self.checkpoint = checkpoint
        self._wall = wall_clock
        self._lock = threading.RLock()
        self.aggregates: dict[ReplicaKey, ReplicaAggregate] = {}
        self._counts: dict[ReplicaKey, int] = {}
        self._by_cluster: dict[str, set[ReplicaKey]] = {}
        self.cluster_now: dict[str, int] = {}
        self._advanced_wall_ms: dict[str, int] = {}  # wall time the cluster clock last moved
        self.statuses: dict[ReplicaKey, ReplicaStatus] = {}
        if checkpoint is not None:
            self.book, self.handled_batch = checkpoint.load_book()
        else:
            self.book, self.handled_batch = AlertBook(), -1

    # -- state ------------------------------------------------------------

    def restore(self, rows: Iterable[Mapping[str, Any]]) -> int:
        """Load aggregates read back from Spark's state store after a restart;
        evaluates them into the store without announcing anything."""
        with self._lock:
            n = self._merge(rows)
            clusters = set(self._by_cluster)
            statuses = self._evaluate(clusters)
            self.store.update(statuses)
            for c in clusters:
                self.store.set_telemetry_time(c, self.cluster_now[c])
        return n

    def _merge(self, rows: Iterable[Mapping[str, Any]]) -> int:
        n = 0
        wall = int(self._wall() * 1000)
        for row in rows:
            agg = row_to_aggregate(row)
            key = (agg.cluster, agg.topic, agg.partition, agg.broker_id)
            count = int(row.get("observations") or 0)
            n += max(0, count - self._counts.get(key, 0))
            self._counts[key] = count
            self.aggregates[key] = agg
            self._by_cluster.setdefault(agg.cluster, set()).add(key)
            if agg.last_t_ms > self.cluster_now.get(agg.cluster, -1):
                self.cluster_now[agg.cluster] = agg.last_t_ms
                self._advanced_wall_ms[agg.cluster] = wall
            self._advanced_wall_ms.setdefault(agg.cluster, wall)
        return n

    def _evaluate(self, clusters: Iterable[str]) -> list[ReplicaStatus]:
        out = []
        for c in clusters:
            now = self.cluster_now[c]
            for key in self._by_cluster.get(c, ()):
                s = evaluate(self.aggregates[key], now, self.cfg, self.thresholds)
                self.statuses[key] = s
                out.append(s)
        return out

    def _evaluate_keys(self, keys: Iterable[ReplicaKey]) -> list[ReplicaStatus]:
        out = []
        for key in keys:
            s = evaluate(self.aggregates[key], self.cluster_now[key[0]], self.cfg, self.thresholds)
            self.statuses[key] = s
            out.append(s)
        return out

    # -- per batch --------------------------------------------------------

    def apply_batch(self, batch_id: int, rows: Sequence[Mapping[str, Any]]) -> BatchReport:
        """Merge one batch of updated aggregates, evaluate, alert."""
        report = BatchReport(batch_id, rows=len(rows))
        with self._lock:
            report.observations = self._merge(rows)
            clusters = {r["cluster"] for r in rows}
            updated = {(r["cluster"], r["topic"], int(r["partition"]), int(r["broker_id"])) for r in rows}
            # Only the replicas in this batch: a replica without new rows is
            # evaluated at the last time its leader answered (``evaluate``
            # freezes ages there), which its cluster clock passed already, so
            # its status cannot change. Re-evaluating it would cost ~15 us per
            # replica per batch for nothing (docs/benchmarks.md).
            statuses = self._evaluate_keys(updated)
            report.replicas = len(updated)
            report.statuses = len(self.statuses)
            report.clusters = {c: self.cluster_now[c] for c in clusters}
            self.store.update(statuses)
            for c in clusters:
                self.store.set_telemetry_time(c, self.cluster_now[c])
            if self.state_topic is not None:
                self.state_topic.update(statuses)  # every replica of the batch has new telemetry
            if batch_id <= self.handled_batch:
                report.skipped = True
                log.info(
                    "batch_replayed batch_id=%s handled=%s (transitions already sent)", batch_id, self.handled_batch
                )
                return report
            transitions = []
            for c in sorted(clusters):
                mine = [self.statuses[k] for k in self._by_cluster[c]]
                desired = [a for s in mine for a in replica_alerts(s)]
                desired += partition_alerts(mine, self.default_min_isr)
                others = [a for a in self.book.active.values() if _cluster_of(a) != c]
                transitions.append(
                    (
                        self.book.update([*desired, *others], self.cluster_now[c], scope=REPLICA_SCOPE),
                        self.cluster_now[c],
                    )
                )
            self.handled_batch = batch_id
            if self.checkpoint is not None:
                self.checkpoint.save_book(self.book, batch_id)
        for t, now in transitions:
            report.started += len(t.started)
            report.resolved += len(t.resolved)
            self._send(t, now)
        return report

    def check_stale(self) -> Transition:
        """The wall-clock timer's job: raise or resolve ``IsrwatchTelemetryStale``."""
        wall = int(self._wall() * 1000)
        with self._lock:
            desired = [
                stale_alert(c, last, wall)
                for c, last in self._advanced_wall_ms.items()
                if wall - last > self.stale_after_ms
            ]
            # Keep the first start time's text stable while it holds.
            t = self.book.update(desired, wall, scope=STALE_SCOPE)
            if (t.started or t.resolved) and self.checkpoint is not None:
                self.checkpoint.save_book(self.book, self.handled_batch)
        if t.started or t.resolved:
            for a in t.started:
                log.warning("telemetry_stale %s", a.summary)
            self._send(t, wall)
        return t

    def _send(self, t: Transition, now_ms: int) -> None:
        for sink in self.sinks:
            try:
                sink.send(t, now_ms)
            except Exception:  # a sink failing must not stop the job
                log.exception("alert_sink_failed sink=%s", type(sink).__name__)

    def forget(self, older_than_ms: int) -> list[str]:
        """Drop replicas whose telemetry stopped while their cluster's went on
        (a deleted topic, a reassigned replica). Returns the removed keys."""
        with self._lock:
            gone = [
                k
                for k, a in self.aggregates.items()
                if self.cluster_now.get(k[0], a.last_t_ms) - a.last_t_ms > older_than_ms
            ]
            keys = []
            for k in gone:
                del self.aggregates[k]
                self._counts.pop(k, None)
                self._by_cluster.get(k[0], set()).discard(k)
                s = self.statuses.pop(k, None)
                if s is not None:
                    keys.append(status_key(s))
        if keys:
            self.store.remove(keys)
            if self.state_topic is not None:
                self.state_topic.remove(keys)  # tombstones: the exporter forgets them too
        return keys
