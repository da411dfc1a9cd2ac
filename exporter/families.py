"""The Prometheus custom collector: metric families built on each scrape from
a ``StatusStore`` snapshot (docs/metrics.md lists them all).

What each family holds is declared once here (the tables ``REPLICA_GAUGES``,
``PARTITION_GAUGES`` and the selection in ``MetricsView``); ``StoreCollector``
yields them through prometheus_client, and ``exporter.exposition`` writes the
same samples straight to text for large fleets.

Cardinality control: ``replica_series`` chooses which replicas get the
per-replica families (``all``, or ``not-ok`` for only those nearing, critical,
out of sync or stalled) and ``replica_series_top`` caps them to the N highest
lag ratios. ``partition_series`` chooses which partitions get the partition
families (``all``, or ``at-risk``: see ``MetricsView.at_risk``). The cluster
families (``isrwatch_partitions``, ``isrwatch_cluster_isr_changes_total``)
always count every partition.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from exporter.store import PartitionKey, PartitionView, StatusStore, StoreSnapshot
from isrwatch.status import ReplicaStatus, State, status_key

__all__ = [
    "StoreCollector",
    "MetricsView",
    "REPLICA_SERIES",
    "PARTITION_SERIES",
    "PartitionSelection",
    "REPLICA_LABELS",
    "PARTITION_LABELS",
    "CHANGE_LABELS",
    "REPLICA_GAUGES",
    "EPISODE_LABELS",
    "EPISODES_FAMILY",
    "STATE_FAMILY",
    "UPDATED_FAMILY",
    "updated_at",
    "PARTITION_GAUGES",
    "CHANGES_FAMILY",
    "STATES",
    "SHRINKS_FAMILY",
    "LEAD_FAMILY",
    "UNFOLLOWED_FAMILY",
    "LAG_EVIDENCE_FAMILY",
    "outcome_rows",
]

REPLICA_SERIES = ("all", "not-ok")
PARTITION_SERIES = ("all", "at-risk")
PARTITION_STATES = ("at_risk", "healthy")
REPLICA_LABELS = ("cluster", "topic", "partition", "broker_id", "leader_id")
PARTITION_LABELS = ("cluster", "topic", "partition", "leader_id")
CHANGE_LABELS = ("cluster", "topic", "partition", "change")
STATES = tuple(s.value for s in State)

# name, help, value
REPLICA_GAUGES: tuple[tuple[str, str, Callable[[ReplicaStatus], float]], ...] = (
    (
        "isrwatch_replica_time_since_caught_up_seconds",
        "Time since the follower last caught up with the leader's log end offset (KIP-16 lastCaughtUpTime)",
        lambda s: s.time_since_caught_up_s,
    ),
    (
        "isrwatch_replica_lag_ratio",
        "Time since caught up divided by replica.lag.time.max.ms; 1 means the broker may drop it",
        lambda s: s.lag_ratio,
    ),
    (
        "isrwatch_replica_peak_lag_ratio",
        "Largest lag ratio the follower reached over the telemetry of the job's newest batch that evaluated it",
        lambda s: s.peak_lag_ratio if s.peak_lag_ratio is not None else s.lag_ratio,
    ),
    (
        "isrwatch_replica_time_to_shrink_seconds",
        "Time until the earliest predicted removal from the ISR; 0 when due",
        lambda s: s.time_to_shrink_s,
    ),
    (
        "isrwatch_replica_offset_lag",
        "Messages the follower is behind the leader's log end offset",
        lambda s: s.offset_lag,
    ),
    (
        "isrwatch_replica_in_isr",
        "1 when the follower is in the partition's ISR per the newest metadata, else 0",
        lambda s: 1.0 if s.in_isr else 0.0,
    ),
    (
        "isrwatch_replica_lag_time_max_seconds",
        "replica.lag.time.max.ms applied to the follower, in seconds (the lag ratio's denominator)",
        lambda s: s.lag_time_max_ms / 1000.0,
    ),
)
# Counted per follower, not per leader (a leader change must not reset it).
EPISODE_LABELS = ("cluster", "topic", "partition", "broker_id")
EPISODES_FAMILY = (
    "isrwatch_replica_out_of_sync_episodes",
    "Times the follower's lag state entered out_of_sync (time since caught up reached replica.lag.time.max.ms, "
    "or out of the ISR), each counted even when it began and ended between two scrapes",
)
STATE_FAMILY = ("isrwatch_replica_state", "1 for the replica's current state, 0 for the others")
UPDATED_FAMILY = (
    "isrwatch_replica_last_update_timestamp_seconds",
    "When this process last received the replica's state (Unix time): the job each batch that evaluates it, "
    "the exporter from the state topic; an old value means the series above are frozen, not healthy",
)

# name, help, value from (partition view, min ISR in force)
PARTITION_GAUGES: tuple[tuple[str, str, Callable[[PartitionView, int], float]], ...] = (
    (
        "isrwatch_partition_isr_size",
        "Replicas in the partition's ISR, from the newest metadata",
        lambda v, _: v.isr_size,
    ),
    (
        "isrwatch_partition_predicted_isr_size",
        "ISR size minus in-ISR followers that are critical, out of sync or stalled",
        lambda v, _: v.predicted_isr_size,
    ),
    (
        "isrwatch_partition_min_isr_headroom",
        "Predicted ISR size minus min.insync.replicas; below 0 acks=all producers fail",
        lambda v, min_isr: v.predicted_isr_size - min_isr,
    ),
)
CHANGES_FAMILY = ("isrwatch_isr_changes", "ISR shrinks and expands observed, per follower leaving or joining")
TELEMETRY_FAMILY = (
    "isrwatch_telemetry_last_timestamp_seconds",
    "Unix time of the newest telemetry seen from the cluster",
)
PARTITIONS_FAMILY = (
    "isrwatch_partitions",
    "Partitions by state: at_risk (a follower not ok, ISR below the replicas, min ISR headroom <= 0 "
    "or a recent ISR change) or healthy",
)
CLUSTER_CHANGES_FAMILY = (
    "isrwatch_cluster_isr_changes",
    "ISR shrinks and expands observed in the cluster, every partition counted",
)
UP_FAMILY = ("isrwatch_up", "1 while isrwatch's input (state topic or telemetry) is healthy")
UNREADABLE_FAMILY = (
    "isrwatch_state_records_unreadable",
    "Records on the state topic the exporter skipped: not state records (each logged with its reason)",
)
# The broker's truth, live (isrwatch.outcomes): the job's own, served after its first batch.
SHRINKS_FAMILY = (
    "isrwatch_isr_shrinks",
    "Followers seen leaving the ISR, by outcome: warned (a replica alert of the follower fired before it) or missed",
)
LEAD_FAMILY = (
    "isrwatch_isr_shrink_lead_seconds",
    "How long before a warned shrink its follower's first replica alert fired, on the telemetry clock",
)
UNFOLLOWED_FAMILY = (
    "isrwatch_warnings_without_shrink",
    "Replica alert episodes that ended without their follower leaving the ISR",
)
LAG_EVIDENCE_FAMILY = (
    "isrwatch_lag_time_evidence",
    "Leaders' shrinks (or their absence) showing the brokers' replica.lag.time.max.ms shorter or longer "
    "than isrwatch's",
)


@dataclass
class PartitionSelection:
    """The partitions that get per-partition series, and the count of every
    partition by cluster and state (``PARTITION_STATES``)."""

    kept: list[tuple[PartitionKey, PartitionView, int]]  # with the min ISR in force
    counts: dict[tuple[str, str], int]  # (cluster, state) -> partitions
    every: bool  # kept holds every partition

    def changes(self, snap: StoreSnapshot) -> list[tuple[tuple[str, str, int, str], int]]:
        """The per-partition ISR change counters of the kept partitions."""
        if self.every:
            return sorted(snap.isr_changes.items())
        kept = {key for key, _, _ in self.kept}
        return sorted((k, n) for k, n in snap.isr_changes.items() if k[:3] in kept)


@dataclass(frozen=True)
class MetricsView:
    """Which samples a snapshot gives, whatever writes them."""

    default_min_isr: int = 1
    replica_series: str = "all"
    replica_series_top: int = 0
    partition_series: str = "all"

    def __post_init__(self) -> None:
        if self.replica_series not in REPLICA_SERIES:
            raise ValueError(f"replica_series={self.replica_series!r} must be one of {REPLICA_SERIES}")
        if self.replica_series_top < 0:
            raise ValueError(f"replica_series_top={self.replica_series_top} must be >= 0 (0: no cap)")
        if self.partition_series not in PARTITION_SERIES:
            raise ValueError(f"partition_series={self.partition_series!r} must be one of {PARTITION_SERIES}")

    def replicas(self, snap: StoreSnapshot) -> list[ReplicaStatus]:
        """The replicas that get per-replica series."""
        chosen = (
            snap.statuses() if self.replica_series == "all" else (s for s in snap.statuses() if s.state is not State.OK)
        )
        if self.replica_series_top:
            return heapq.nlargest(self.replica_series_top, chosen, key=lambda s: s.lag_ratio)
        return list(chosen)

    def episode_replicas(self, snap: StoreSnapshot, chosen: list[ReplicaStatus]) -> list[ReplicaStatus]:
        """The replicas that get the out-of-sync episode counter: those with series,
        and every replica with an episode, whatever the selection (a counter that
        went away while its replica was ok would hide the fault it counts)."""
        keys = {status_key(s) for s in chosen}
        extra = [s for s in snap.statuses() if s.out_of_sync_episodes and status_key(s) not in keys]
        return [*chosen, *extra]

    def at_risk(self, snap: StoreSnapshot, key: PartitionKey, view: PartitionView) -> bool:
        """A follower not ok; or an ISR smaller than the replicas; or a min ISR
        headroom <= 0 (no spare in-sync replica), with the partition's own min ISR,
        else ``default_min_isr``; or an ISR change within the store's
        ``recent_change_s`` (so a recovery and its expand are scraped before the
        partition's series go). ``PartitionView.risk_min_isr`` holds all but the last."""
        return view.risk_min_isr <= self.default_min_isr or key in snap.recently_changed

    def partitions(self, snap: StoreSnapshot) -> PartitionSelection:
        """The partitions that get series (with the min ISR in force) and the
        counts; one comparison per partition."""
        default, recent = self.default_min_isr, snap.recently_changed
        risky = [(k, v) for k, v in snap.partitions.items() if v.risk_min_isr <= default or k in recent]
        counts: dict[tuple[str, str], int] = {}
        if snap.every_replica:
            for cluster, n in snap.cluster_partitions.items():
                counts[(cluster, "at_risk")] = 0
                counts[(cluster, "healthy")] = n
        else:  # a store of the replicas not ok: the at-risk count of every cluster it heard of, no healthy one
            counts = {(cluster, "at_risk"): 0 for cluster in snap.telemetry_ms}
        for (cluster, _, _), _ in risky:
            counts[(cluster, "at_risk")] = counts.get((cluster, "at_risk"), 0) + 1
            if snap.every_replica:
                counts[(cluster, "healthy")] -= 1
        every = self.partition_series == "all"
        kept = [(k, v, v.newest.min_isr or default) for k, v in (snap.partitions.items() if every else risky)]
        return PartitionSelection(kept, dict(sorted(counts.items())), every)


def updated_at(snap: StoreSnapshot, s: ReplicaStatus) -> float | None:
    """When the store last received ``s``'s replica (Unix seconds), or None."""
    view = snap.partitions.get((s.cluster, s.topic, s.partition))
    return snap.received_at(view, s.broker_id) if view is not None else None


def replica_label_values(s: ReplicaStatus) -> list[str]:
    return [s.cluster, s.topic, str(s.partition), str(s.broker_id), str(s.leader_id)]


class StoreCollector(Collector):
    def __init__(
        self,
        store: StatusStore,
        *,
        default_min_isr: int = 1,
        replica_series: str = "all",
        replica_series_top: int = 0,
        partition_series: str = "all",
    ) -> None:
        self.store = store
        self.view = MetricsView(default_min_isr, replica_series, replica_series_top, partition_series)

    def collect(self) -> Iterator[Metric]:
        snap = self.store.snapshot()
        selection = self.view.partitions(snap)
        yield from self._replica_families(snap)
        yield from self._partition_families(snap, selection)
        yield from self._cluster_families(snap, selection)
        if snap.batches:
            yield from self._job_families(snap)
            yield from self._outcome_families(snap)

    def _replica_families(self, snap: StoreSnapshot) -> Iterator[Metric]:
        gauges = [(GaugeMetricFamily(n, h, labels=REPLICA_LABELS), f) for n, h, f in REPLICA_GAUGES]
        state = GaugeMetricFamily(*STATE_FAMILY, labels=[*REPLICA_LABELS, "state"])
        updated = GaugeMetricFamily(*UPDATED_FAMILY, labels=REPLICA_LABELS)
        chosen = self.view.replicas(snap)
        for s in chosen:
            labels = replica_label_values(s)
            for family, value in gauges:
                family.add_metric(labels, value(s))
            for name in STATES:
                state.add_metric([*labels, name], 1.0 if s.state.value == name else 0.0)
            at = updated_at(snap, s)
            if at is not None:
                updated.add_metric(labels, at)
        yield from (g for g, _ in gauges)
        yield state
        yield updated
        episodes = CounterMetricFamily(*EPISODES_FAMILY, labels=EPISODE_LABELS)
        for s in self.view.episode_replicas(snap, chosen):
            episodes.add_metric([s.cluster, s.topic, str(s.partition), str(s.broker_id)], s.out_of_sync_episodes)
        yield episodes

    def _partition_families(self, snap: StoreSnapshot, selection: PartitionSelection) -> Iterator[Metric]:
        gauges = [(GaugeMetricFamily(n, h, labels=PARTITION_LABELS), f) for n, h, f in PARTITION_GAUGES]
        for (cluster, topic, partition), view, min_isr in selection.kept:
            labels = [cluster, topic, str(partition), str(view.newest.leader_id)]
            for family, value in gauges:
                family.add_metric(labels, value(view, min_isr))
        yield from (g for g, _ in gauges)
        changes = CounterMetricFamily(*CHANGES_FAMILY, labels=CHANGE_LABELS)
        for (cluster, topic, partition, change), n in selection.changes(snap):
            changes.add_metric([cluster, topic, str(partition), change], n)
        yield changes

    def _cluster_families(self, snap: StoreSnapshot, selection: PartitionSelection) -> Iterator[Metric]:
        partitions = GaugeMetricFamily(*PARTITIONS_FAMILY, labels=["cluster", "state"])
        for (cluster, state), n in selection.counts.items():
            partitions.add_metric([cluster, state], n)
        changes = CounterMetricFamily(*CLUSTER_CHANGES_FAMILY, labels=["cluster", "change"])
        for (cluster, change), n in sorted(snap.cluster_isr_changes.items()):
            changes.add_metric([cluster, change], n)
        last = GaugeMetricFamily(*TELEMETRY_FAMILY, labels=["cluster"])
        for cluster, ms in sorted(snap.telemetry_ms.items()):
            last.add_metric([cluster], ms / 1000.0)
        up = GaugeMetricFamily(*UP_FAMILY)
        up.add_metric([], 1.0 if snap.up else 0.0)
        yield from (partitions, changes, last, up)
        if snap.unreadable is not None:  # the exporter's store
            unreadable = CounterMetricFamily(*UNREADABLE_FAMILY)
            unreadable.add_metric([], snap.unreadable)
            yield unreadable

    def _job_families(self, snap: StoreSnapshot) -> Iterator[Metric]:
        for kind, name, help_text, labels, rows in job_families(snap):
            family = (GaugeMetricFamily if kind == "gauge" else CounterMetricFamily)(name, help_text, labels=labels)
            for values, v in rows:
                family.add_metric(values, v)
            yield family

    def _outcome_families(self, snap: StoreSnapshot) -> Iterator[Metric]:
        shrinks = CounterMetricFamily(*SHRINKS_FAMILY, labels=["cluster", "outcome"])
        lead = HistogramMetricFamily(*LEAD_FAMILY, labels=["cluster"])
        unfollowed = CounterMetricFamily(*UNFOLLOWED_FAMILY, labels=["cluster"])
        evidence = CounterMetricFamily(*LAG_EVIDENCE_FAMILY, labels=["cluster", "direction"])
        for cluster, by_outcome, buckets, lead_sum, n, by_direction in outcome_rows(snap):
            for outcome, count in by_outcome:
                shrinks.add_metric([cluster, outcome], count)
            lead.add_metric([cluster], buckets, lead_sum)
            unfollowed.add_metric([cluster], n)
            for direction, count in by_direction:
                evidence.add_metric([cluster, direction], count)
        yield from (shrinks, lead, unfollowed, evidence)


def outcome_rows(
    snap: StoreSnapshot,
) -> list[tuple[str, list[tuple[str, int]], list[tuple[str, float]], float, int, list[tuple[str, int]]]]:
    """Per cluster: (cluster, shrinks by outcome, cumulative lead buckets by ``le`` text, lead sum,
    warnings without shrink, lag-time evidence by direction)."""
    return [
        (
            cluster,
            sorted(c.shrinks.items()),
            [("+Inf" if le == float("inf") else str(le), float(n)) for le, n in c.cumulative()],
            c.lead_sum_s,
            c.unfollowed,
            sorted(c.evidence.items()),
        )
        for cluster, c in snap.outcomes.items()
    ]


def job_families(snap: StoreSnapshot) -> list[tuple[str, str, str, list[str], list[tuple[list[str], float]]]]:
    """The streaming job's health families: (kind, name without _total, help, labels, rows)."""
    return [
        (
            "gauge",
            "isrwatch_job_batch_duration_seconds",
            "Wall time of the streaming job's last micro-batch",
            [],
            [([], snap.last_batch_s or 0.0)],
        ),
        ("counter", "isrwatch_job_batches", "Micro-batches the streaming job has completed", [], [([], snap.batches)]),
        (
            "counter",
            "isrwatch_job_observations",
            "Telemetry observations the streaming job has processed",
            [],
            [([], snap.observations)],
        ),
        (
            "counter",
            "isrwatch_deadletter_records",
            "Telemetry records rejected to the dead-letter topic",
            ["reason"],
            [([r], n) for r, n in sorted(snap.deadletters.items())],
        ),
        (
            "gauge",
            "isrwatch_output_records_pending",
            "Records for isrwatch's own topics not yet acknowledged (queued or held while a leader hangs)",
            ["topic"],
            [([t], pending) for t, (pending, _) in sorted(snap.outputs.items())],
        ),
        (
            "counter",
            "isrwatch_output_records_lost",
            "Records for isrwatch's own topics given up (held past the bound, or not delivered in time)",
            ["topic"],
            [([t], lost) for t, (_, lost) in sorted(snap.outputs.items())],
        ),
    ]
