"""The latest replica statuses and pipeline counters, shared between the
writers (the streaming job's sinks, the exporter's state-topic consumer) and
the scrape (``exporter.families``).

Statuses are grouped by partition; each partition's entry is an immutable
``PartitionView`` replaced as a whole on every change, so ``snapshot()`` is a
shallow copy taken under the lock and stays consistent while the scrape reads
it, even for a million replicas.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal

from exporter.health import Health
from isrwatch.outcomes import OutcomeCounts, ShrinkOutcomes
from isrwatch.status import ReplicaStatus, State, status_key

__all__ = ["StatusStore", "StoreSnapshot", "PartitionView", "PartitionKey", "LEAVING", "NEVER"]

PartitionKey = tuple[str, str, int]  # cluster, topic, partition

# A follower in one of these states is predicted to leave the ISR soon.
LEAVING = frozenset({State.CRITICAL, State.OUT_OF_SYNC, State.STALLED})
NEVER = sys.maxsize


@dataclass(frozen=True)
class PartitionView:
    """The followers of one partition as last reported, with the aggregates
    the partition gauges need (computed once per change, not per scrape)."""

    # broker_id -> status: the view's own dict, never changed after ``of`` (read-only by
    # convention; a MappingProxyType around it and ``updated`` cost ~0.1 KB a replica)
    replicas: Mapping[int, ReplicaStatus]
    newest: ReplicaStatus  # evaluated last: its ISR, leader and min ISR are current
    leaving: int  # in-ISR followers predicted to leave
    # At risk (exporter.families.MetricsView.at_risk) when the min ISR the
    # exporter assumes is at least this (0: whatever it assumes). Precomputed
    # so a scrape tests 500k partitions with one comparison each.
    risk_min_isr: int
    # broker_id -> when its status was last written here, on the store's monotonic ``clock``
    # (``StoreSnapshot.received_at`` turns it into Unix seconds); also what ``expire`` reads
    updated: Mapping[int, float] = field(default_factory=dict)

    @classmethod
    def of(cls, replicas: dict[int, ReplicaStatus], updated: dict[int, float] | None = None) -> PartitionView:
        # One pass (this runs for every partition of every batch): the newest
        # status (the first of equally new ones), followers leaving, any not ok.
        newest: ReplicaStatus | None = None
        leaving = 0
        not_ok = False
        for s in replicas.values():
            if newest is None or s.eval_ms > newest.eval_ms:
                newest = s
            if s.state is not State.OK:
                not_ok = True
                if s.in_isr and s.state in LEAVING:
                    leaving += 1
        assert newest is not None, "a partition view needs at least one replica"
        predicted = max(0, newest.isr_size - leaving)
        # A follower not ok, or an ISR smaller than the replicas (the followers
        # reported other than the current leader, plus the leader; an unknown ISR is 0).
        followers = sum(1 for b in replicas if b != newest.leader_id)
        degraded = not_ok or newest.isr_size < followers + 1
        if degraded:
            risk = 0
        elif newest.min_isr:  # its own min ISR: headroom = predicted - min ISR <= 0, or never
            risk = 0 if predicted <= newest.min_isr else NEVER
        else:  # the assumed min ISR decides: at risk from min ISR = predicted
            risk = predicted
        return cls(replicas, newest, leaving, risk, updated if updated is not None else {})

    @property
    def isr_size(self) -> int:
        return self.newest.isr_size

    @property
    def predicted_isr_size(self) -> int:
        return max(0, self.newest.isr_size - self.leaving)


@dataclass(frozen=True)
class StoreSnapshot:
    partitions: dict[PartitionKey, PartitionView]
    telemetry_ms: dict[str, int]  # cluster -> newest telemetry time
    isr_changes: dict[tuple[str, str, int, str], int]  # (cluster, topic, partition, change) -> count
    up: bool
    batches: int
    observations: int
    last_batch_s: float | None
    deadletters: dict[str, int]  # reason -> count
    cluster_isr_changes: dict[tuple[str, str], int] = field(default_factory=dict)  # (cluster, change) -> count
    cluster_partitions: dict[str, int] = field(default_factory=dict)  # cluster -> partitions in ``partitions``
    recently_changed: frozenset[PartitionKey] = frozenset()  # an ISR change within the store's recent_change_s
    outputs: dict[str, tuple[int, int]] = field(default_factory=dict)  # output topic -> (pending, lost)
    outcomes: dict[str, OutcomeCounts] = field(default_factory=dict)  # cluster -> shrinks warned or missed
    wall_offset_s: float = 0.0  # the wall clock minus the store's monotonic clock, at its newest update
    unreadable: int | None = None  # state records the exporter skipped (None: not an exporter's store)
    # False: the store holds only some replicas (the job with --driver-replicas not-ok), so its
    # partitions are not every partition, and no count of healthy ones can be made from them.
    every_replica: bool = True

    def received_at(self, view: PartitionView, broker_id: int) -> float | None:
        """When the store last received the replica's status, in Unix seconds (its age on the
        monotonic clock, from the wall clock of the store's newest update), or None."""
        at = view.updated.get(broker_id)
        return at + self.wall_offset_s if at is not None else None

    def statuses(self) -> Iterable[ReplicaStatus]:
        for view in self.partitions.values():
            yield from view.replicas.values()

    def __len__(self) -> int:
        return sum(len(v.replicas) for v in self.partitions.values())


def _partition_key(s: ReplicaStatus) -> PartitionKey:
    return (s.cluster, s.topic, s.partition)


def _split_key(key: str) -> tuple[PartitionKey, int]:
    """``cluster/topic/partition/broker_id`` back into parts (a topic name
    cannot hold '/', a cluster name may)."""
    rest, topic, partition, broker = key.rsplit("/", 3)
    return (rest, topic, int(partition)), int(broker)


@dataclass
class StatusStore:
    """The replicas' newest statuses and the ISR change counters, for /metrics.

    Thread-safe; every method is cheap (proportional to its arguments).

    ``derive_isr_changes``: count ``isrwatch_isr_changes_total`` from the
    replicas' ``in_isr`` flips between updates (the exporter, which only sees
    statuses); leave it off where ``add_isr_changes`` is fed from metadata.
    ``recent_change_s``: how long a partition counts as recently changed
    after an ISR change (``StoreSnapshot.recently_changed``).
    """

    derive_isr_changes: bool = False
    recent_change_s: float = 600.0
    # when a status was last received (expiry; isrwatch_replica_last_update_timestamp_seconds
    # with ``wall_clock``): one time a replica, kept in its ``PartitionView.updated``
    clock: Callable[[], float] = time.monotonic
    wall_clock: Callable[[], float] = time.time
    _wall_offset_s: float = field(default=0.0, repr=False)  # wall_clock - clock at the newest update
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _partitions: dict[PartitionKey, PartitionView] = field(default_factory=dict, repr=False)
    _telemetry_ms: dict[str, int] = field(default_factory=dict, repr=False)
    _isr_changes: dict[tuple[str, str, int, str], int] = field(default_factory=dict, repr=False)
    _cluster_isr_changes: dict[tuple[str, str], int] = field(default_factory=dict, repr=False)
    _changed_at: dict[PartitionKey, float] = field(default_factory=dict, repr=False)  # clock of the last change
    _cluster_partitions: dict[str, int] = field(default_factory=dict, repr=False)
    # False: fed only the replicas not ok (``StoreSnapshot.every_replica``)
    every_replica: bool = True
    # how the process feeding this store is doing (exporter.health), served with its data
    health: Health = field(default_factory=Health)
    # whether isrwatch warned before each real shrink (the job feeds it: streaming.driver.monitor, streaming.driver.rare)
    outcomes: ShrinkOutcomes = field(default_factory=ShrinkOutcomes)

    def update(self, statuses: Iterable[ReplicaStatus], *, telemetry: bool = True) -> None:
        """Replace each given replica's status (newer or not: last write wins). ``telemetry``
        False: statuses carried past their telemetry (streaming.driver.lookahead), whose times do
        not move the cluster's telemetry time."""
        grouped: dict[PartitionKey, list[ReplicaStatus]] = {}
        for s in statuses:
            grouped.setdefault(_partition_key(s), []).append(s)
        now = self.clock()
        wall_offset_s = self.wall_clock() - now
        with self._lock:
            self._wall_offset_s = wall_offset_s
            for pkey, group in grouped.items():
                old = self._partitions.get(pkey)
                replicas = dict(old.replicas) if old else {}
                updated = dict(old.updated) if old else {}
                if old is None:
                    self._cluster_partitions[pkey[0]] = self._cluster_partitions.get(pkey[0], 0) + 1
                for s in group:
                    before = replicas.get(s.broker_id)
                    if self.derive_isr_changes and before is not None and before.in_isr != s.in_isr:
                        self._count_change(pkey, "expand" if s.in_isr else "shrink", 1)
                    replicas[s.broker_id] = s
                    updated[s.broker_id] = now
                    cluster = s.cluster
                    if telemetry and s.eval_ms > self._telemetry_ms.get(cluster, -1):
                        self._telemetry_ms[cluster] = s.eval_ms
                self._partitions[pkey] = PartitionView.of(replicas, updated)

    def remove(self, keys: Iterable[str]) -> None:
        """Forget replicas by ``status_key`` (a tombstone on the state topic)."""
        with self._lock:
            for key in keys:
                pkey, broker = _split_key(key)
                old = self._partitions.get(pkey)
                if old is None or broker not in old.replicas:
                    continue
                replicas = {b: s for b, s in old.replicas.items() if b != broker}
                if replicas:
                    updated = {b: t for b, t in old.updated.items() if b != broker}
                    self._partitions[pkey] = PartitionView.of(replicas, updated)
                else:
                    del self._partitions[pkey]
                    self._cluster_partitions[pkey[0]] -= 1
                    if not self._cluster_partitions[pkey[0]]:
                        del self._cluster_partitions[pkey[0]]

    def expire(self, older_than_ms: int) -> list[str]:
        """Remove replicas that have gone quiet (a deleted topic, a moved
        replica): status more than ``older_than_ms`` behind its cluster's
        telemetry clock *and* not received for as long. The cluster clock keeps
        a stopped job or collector from emptying the store; the receive time
        keeps a replica the job still reports (frozen at its unreachable
        leader's last answer) from leaving. Returns the removed keys."""
        quiet_s = older_than_ms / 1000
        now = self.clock()
        with self._lock:
            gone = [
                status_key(s)
                for pkey, view in self._partitions.items()
                for s in view.replicas.values()
                if self._telemetry_ms.get(s.cluster, s.eval_ms) - s.eval_ms > older_than_ms
                and now - view.updated.get(s.broker_id, now) > quiet_s
            ]
        self.remove(gone)
        return gone

    def set_telemetry_time(self, cluster: str, ms: int) -> None:
        """The newest telemetry time seen from ``cluster`` (never goes back)."""
        with self._lock:
            if ms > self._telemetry_ms.get(cluster, -1):
                self._telemetry_ms[cluster] = ms

    def add_isr_changes(
        self, cluster: str, topic: str, partition: int, change: Literal["shrink", "expand"], n: int = 1
    ) -> None:
        if change not in ("shrink", "expand"):
            raise ValueError(f"change={change!r} must be 'shrink' or 'expand'")
        with self._lock:
            self._count_change((cluster, topic, partition), change, n)

    def _count_change(self, pkey: PartitionKey, change: str, n: int) -> None:
        k = (*pkey, change)
        self._isr_changes[k] = self._isr_changes.get(k, 0) + n
        ck = (pkey[0], change)
        self._cluster_isr_changes[ck] = self._cluster_isr_changes.get(ck, 0) + n
        self._changed_at[pkey] = self.clock()

    def snapshot(self) -> StoreSnapshot:
        horizon = self.clock() - self.recent_change_s
        health = self.health.snapshot()
        with self._lock:
            for pkey in [k for k, t in self._changed_at.items() if t < horizon]:
                del self._changed_at[pkey]  # keeps the dict to the recent changes
            return StoreSnapshot(
                partitions=dict(self._partitions),
                telemetry_ms=dict(self._telemetry_ms),
                isr_changes=dict(self._isr_changes),
                up=health.up,
                batches=health.batches,
                observations=health.observations,
                last_batch_s=health.last_batch_s,
                deadletters=health.deadletters,
                cluster_isr_changes=dict(self._cluster_isr_changes),
                recently_changed=frozenset(self._changed_at),
                cluster_partitions=dict(self._cluster_partitions),
                outputs=health.outputs,
                outcomes=self.outcomes.snapshot(self._telemetry_ms),
                wall_offset_s=self._wall_offset_s,
                unreadable=health.unreadable,
                every_replica=self.every_replica,
            )
