"""The Prometheus custom collector: metric families built on each scrape from
a ``StatusStore`` snapshot (docs/metrics.md lists them all).

Cardinality control: ``replica_series`` chooses which replicas get the
per-replica families (``all``, or ``not-ok`` for only those nearing, critical,
out of sync or stalled) and ``replica_series_top`` caps them to the N highest
lag ratios. The partition and cluster families always cover every replica.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from exporter.store import StatusStore, StoreSnapshot
from isrwatch.status import ReplicaStatus, State

__all__ = ["StoreCollector", "REPLICA_SERIES", "REPLICA_LABELS", "PARTITION_LABELS"]

REPLICA_SERIES = ("all", "not-ok")
REPLICA_LABELS = ["cluster", "topic", "partition", "broker_id", "leader_id"]
PARTITION_LABELS = ["cluster", "topic", "partition", "leader_id"]
_CHANGE_LABELS = ["cluster", "topic", "partition", "change"]
_STATES = [s.value for s in State]


class StoreCollector(Collector):
    def __init__(
        self,
        store: StatusStore,
        *,
        default_min_isr: int = 1,
        replica_series: str = "all",
        replica_series_top: int = 0,
    ) -> None:
        if replica_series not in REPLICA_SERIES:
            raise ValueError(f"replica_series={replica_series!r} must be one of {REPLICA_SERIES}")
        if replica_series_top < 0:
            raise ValueError(f"replica_series_top={replica_series_top} must be >= 0 (0: no cap)")
        self.store = store
        self.default_min_isr = default_min_isr
        self.replica_series = replica_series
        self.replica_series_top = replica_series_top

    def collect(self) -> Iterator[Metric]:
        snap = self.store.snapshot()
        yield from self._replica_families(snap)
        yield from self._partition_families(snap)
        yield from self._cluster_families(snap)
        if snap.batches:
            yield from self._job_families(snap)

    def _selected(self, snap: StoreSnapshot) -> list[ReplicaStatus]:
        chosen = (
            snap.statuses() if self.replica_series == "all" else (s for s in snap.statuses() if s.state is not State.OK)
        )
        if self.replica_series_top:
            return heapq.nlargest(self.replica_series_top, chosen, key=lambda s: s.lag_ratio)
        return list(chosen)

    def _replica_families(self, snap: StoreSnapshot) -> Iterator[Metric]:
        since = GaugeMetricFamily(
            "isrwatch_replica_time_since_caught_up_seconds",
            "Time since the follower last caught up with the leader's log end offset (KIP-16 lastCaughtUpTime)",
            labels=REPLICA_LABELS,
        )
        ratio = GaugeMetricFamily(
            "isrwatch_replica_lag_ratio",
            "Time since caught up divided by replica.lag.time.max.ms; 1 means the broker may drop it",
            labels=REPLICA_LABELS,
        )
        shrink = GaugeMetricFamily(
            "isrwatch_replica_time_to_shrink_seconds",
            "Time until the earliest predicted removal from the ISR; 0 when due",
            labels=REPLICA_LABELS,
        )
        lag = GaugeMetricFamily(
            "isrwatch_replica_offset_lag",
            "Messages the follower is behind the leader's log end offset",
            labels=REPLICA_LABELS,
        )
        state = GaugeMetricFamily(
            "isrwatch_replica_state",
            "1 for the replica's current state, 0 for the others",
            labels=[*REPLICA_LABELS, "state"],
        )
        for s in self._selected(snap):
            labels = [s.cluster, s.topic, str(s.partition), str(s.broker_id), str(s.leader_id)]
            since.add_metric(labels, s.time_since_caught_up_s)
            ratio.add_metric(labels, s.lag_ratio)
            shrink.add_metric(labels, s.time_to_shrink_s)
            lag.add_metric(labels, s.offset_lag)
            for name in _STATES:
                state.add_metric([*labels, name], 1.0 if s.state.value == name else 0.0)
        yield from (since, ratio, shrink, lag, state)

    def _partition_families(self, snap: StoreSnapshot) -> Iterator[Metric]:
        isr = GaugeMetricFamily(
            "isrwatch_partition_isr_size",
            "Replicas in the partition's ISR, from the newest metadata",
            labels=PARTITION_LABELS,
        )
        predicted = GaugeMetricFamily(
            "isrwatch_partition_predicted_isr_size",
            "ISR size minus in-ISR followers that are critical, out of sync or stalled",
            labels=PARTITION_LABELS,
        )
        headroom = GaugeMetricFamily(
            "isrwatch_partition_min_isr_headroom",
            "Predicted ISR size minus min.insync.replicas; below 0 acks=all producers fail",
            labels=PARTITION_LABELS,
        )
        for (cluster, topic, partition), view in snap.partitions.items():
            newest = view.newest
            labels = [cluster, topic, str(partition), str(newest.leader_id)]
            min_isr = newest.min_isr or self.default_min_isr
            isr.add_metric(labels, newest.isr_size)
            predicted.add_metric(labels, view.predicted_isr_size)
            headroom.add_metric(labels, view.predicted_isr_size - min_isr)
        changes = CounterMetricFamily(
            "isrwatch_isr_changes",
            "ISR shrinks and expands observed, per follower leaving or joining",
            labels=_CHANGE_LABELS,
        )
        for (cluster, topic, partition, change), n in sorted(snap.isr_changes.items()):
            changes.add_metric([cluster, topic, str(partition), change], n)
        yield from (isr, predicted, headroom, changes)

    def _cluster_families(self, snap: StoreSnapshot) -> Iterator[Metric]:
        last = GaugeMetricFamily(
            "isrwatch_telemetry_last_timestamp_seconds",
            "Unix time of the newest telemetry seen from the cluster",
            labels=["cluster"],
        )
        for cluster, ms in sorted(snap.telemetry_ms.items()):
            last.add_metric([cluster], ms / 1000.0)
        up = GaugeMetricFamily("isrwatch_up", "1 while isrwatch's input (state topic or telemetry) is healthy")
        up.add_metric([], 1.0 if snap.up else 0.0)
        yield from (last, up)

    def _job_families(self, snap: StoreSnapshot) -> Iterator[Metric]:
        duration = GaugeMetricFamily(
            "isrwatch_job_batch_duration_seconds", "Wall time of the streaming job's last micro-batch"
        )
        duration.add_metric([], snap.last_batch_s or 0.0)
        batches = CounterMetricFamily("isrwatch_job_batches", "Micro-batches the streaming job has completed")
        batches.add_metric([], snap.batches)
        observations = CounterMetricFamily(
            "isrwatch_job_observations", "Telemetry observations the streaming job has processed"
        )
        observations.add_metric([], snap.observations)
        dead = CounterMetricFamily(
            "isrwatch_deadletter_records", "Telemetry records rejected to the dead-letter topic", labels=["reason"]
        )
        for reason, n in sorted(snap.deadletters.items()):
            dead.add_metric([reason], n)
        yield from (duration, batches, observations, dead)
