"""The driver side of the job: one row per replica per batch, never per event.

Spark evaluates each updated replica (``streaming.evaluation.evaluate``); ``Monitor``
receives the batch's statuses and keeps the newest one of every replica, each
cluster's telemetry clock (the newest telemetry time seen from it) and the
alert book. With ``holds_ok`` off (``--driver-replicas not-ok``, a large fleet) it is
given only the replicas it needs and keeps only those not ok (``_release_ok``); Spark
counts the batch and gives the clocks (``apply_statuses``' ``totals``). Per batch it
hands the statuses to the store and alert transitions to the sinks (the state topic's
records come from the executors, ``streaming.sinks.statewriter``; only its tombstones
from here). A replica without new
telemetry keeps its status: it is evaluated at the last time its leader answered, which
its cluster clock passed already, so nothing about it can change
(tests/isrwatch/test_status.py proves it), and it costs nothing per batch.

The alerts the replicas call for are kept per replica and per partition and
updated only for the batch's replicas and their partitions, so a batch costs
in proportion to its rows and the alerts firing, not to the replicas tracked.

``check_stale`` runs from a timer on the wall clock: a cluster whose
telemetry clock has not moved for ``stale_after_seconds`` raises
``IsrwatchTelemetryStale``; its replicas keep their frozen ages.

Every transition sent is also told to ``isrwatch.outcomes`` (the store's ``outcomes``),
which weighs it against the real ISR shrinks the handler reports; so is every status held
of a follower not ok (its last catch-up and lag: whether the brokers' lag time is the job's).

``carry_forward`` runs from the same timer: a follower behind, due to cross
``nearing_ratio`` before the next batch can show it, is said nearing when it
does (``streaming.driver.lookahead``, bounded; Kafka telemetry only). So is a follower on a
broker the job itself sees silent while the telemetry stands still
(``streaming.driver.brokerwatch``: isrwatch's topics on the watched cluster, held up by that broker);
with ``holds_ok`` off that broker's ok followers are read back from the state table first
(``followers_of``, on a thread of its own: ``streaming.driver.readback``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from isrwatch.alerts import Alert, AlertBook, AlertName, Transition, partition_alert, replica_alerts, stale_alert
from isrwatch.logs import kv
from isrwatch.rule import Rule, RuleConfig
from isrwatch.status import GoneKey, PartitionKey, ReplicaKey, ReplicaStatus, State, Thresholds, status_key
from streaming.driver.brokerwatch import BrokerWatch
from streaming.driver.checkpoint import DriverCheckpoint
from streaming.driver.identity import Identities
from streaming.driver.lookahead import Lookahead
from streaming.driver.notify import AlertSink
from streaming.driver.readback import ReadBack
from streaming.sinks.outputs import KafkaStates

if TYPE_CHECKING:
    from exporter.store import StatusStore
    from streaming.driver.rows import Evaluated
    from streaming.evaluation.batch import BatchTotals

__all__ = ["Monitor", "BatchReport", "REPLICA_SCOPE", "STALE_SCOPE"]

log = logging.getLogger("streaming.monitor")

# (cluster, broker id) pairs -> their ok in-sync followers as the state last held them
# (``streaming.lifecycle.query.follower_statuses``).
FollowersOf = Callable[[set[tuple[str, int]]], "list[Evaluated]"]
# Seconds a read of them under way is given to end when the job stops (~6 s for one broker's
# followers of a 1M-replica fleet on 3 brokers), before Spark stops under it.
READ_BACK_CLOSE_S = 15.0

STALE_SCOPE = {AlertName.TELEMETRY_STALE.value}
REPLICA_SCOPE = {n.value for n in AlertName} - STALE_SCOPE


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
    # followers forgotten as their partition's new leader, with their election's telemetry time
    leading: list[GoneKey] = field(default_factory=list)
    # replicas forgotten before whose older telemetry came in this batch (ignored), with that time
    late: list[GoneKey] = field(default_factory=list)
    clusters: dict[str, int] = field(default_factory=dict)  # cluster -> telemetry clock


def _no_spare(s: ReplicaStatus, default_min_isr: int) -> bool:
    """``streaming.evaluation.evaluate.no_spare`` for one status."""
    return 0 < s.isr_size <= (s.min_isr or default_min_isr)


def _pairs(brokers: set[tuple[str, int]]) -> str:
    """(cluster, broker id) pairs for a log line: ``cluster/broker,...``."""
    return ",".join(f"{c}/{b}" for c, b in sorted(brokers))


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
        store: StatusStore,
        sinks: Sequence[AlertSink],
        state_topic: KafkaStates | None = None,  # its tombstones
        checkpoint: DriverCheckpoint | None = None,
        wall_clock: Callable[[], float] = time.time,
        lookahead: Lookahead | None = None,
        broker_watch: BrokerWatch | None = None,
        identities: Identities | None = None,
        holds_ok: bool = True,
        followers_of: FollowersOf | None = None,
    ) -> None:
        self.cfg = cfg
        # False (``--driver-replicas not-ok``): ok replicas are let go after each batch
        # (``_release_ok``); Spark counts the batch and keeps the clocks (``apply_statuses``' totals).
        self.holds_ok = holds_ok
        # With holds_ok off: where the ok followers of a broker the job sees silent come from
        # (``_hold_silent``), and the brokers whose followers it holds while they stay silent.
        self.followers_of = followers_of
        self._held_silent: set[tuple[str, int]] = set()
        self._silent_reads = ReadBack(self._read_silent, self._take_silent, self._unread, "isrwatch-silent-followers")
        self.thresholds = thresholds
        self.default_min_isr = default_min_isr
        self.stale_after_ms = int(stale_after_s * 1000)
        self.store = store
        self.sinks = list(sinks)
        self.state_topic = state_topic
        self.checkpoint = checkpoint
        self._wall = wall_clock
        self.lookahead = lookahead
        # the telemetry cluster's brokers as the job itself sees them (streaming.driver.brokerwatch)
        self.broker_watch = broker_watch
        # which watched clusters' brokers that watch speaks of (streaming.driver.identity)
        self.identities = identities or Identities()
        if checkpoint is not None:
            self.identities.learn(checkpoint.load_identities().items())
        self._lock = threading.RLock()
        self.statuses: dict[ReplicaKey, ReplicaStatus] = {}
        self._last_t: dict[ReplicaKey, int] = {}  # newest telemetry time of each replica
        self._counts: dict[ReplicaKey, int] = {}  # observations aggregated, ever
        # Replicas forgotten as gone or elected leader -> that telemetry time, kept for the forget
        # time: a record older than it read later (the telemetry topic's partitions are read in
        # no common order) must not bring the replica back (``_late``).
        self._forgotten: dict[ReplicaKey, int] = checkpoint.load_forgotten() if checkpoint is not None else {}
        self._forgotten_changed = False  # since the checkpoint's copy was written
        self._late_in_batch: dict[ReplicaKey, int] = {}
        # followers with a status (a tuple, not a set: ~0.1 KB less a replica)
        self._members: dict[PartitionKey, tuple[int, ...]] = {}
        self.cluster_now: dict[str, int] = {}
        self._advanced_wall_ms: dict[str, int] = {}  # wall time the cluster clock last moved
        # The alerts the current statuses call for, per cluster: replicas not ok, partitions at risk.
        self._replica_alerts: dict[str, dict[ReplicaKey, list[Alert]]] = {}
        self._partition_alerts: dict[str, dict[PartitionKey, Alert]] = {}
        if checkpoint is not None:
            self.book, self.handled_batch = checkpoint.load_book()
        else:
            self.book, self.handled_batch = AlertBook(), -1
        # Every transition sent is also told to the shrink outcomes (isrwatch.outcomes), the
        # ISR changes by streaming.lifecycle.handler; an episode firing at a restart goes on.
        self.outcomes = store.outcomes
        self.outcomes.resume(self.book.active.values())
        # The legacy rule's last catch-up is made up from a message count: no evidence of the lag time.
        self._lag_evidence = cfg.rule is not Rule.LEGACY_MESSAGES
        # The alerts the checkpoint's book had firing: a restart's first batches re-read
        # telemetry from before them, which must not end them (AlertBook.update).
        self._restored_alerts = frozenset(self.book.active)

    # -- state ------------------------------------------------------------

    def restore(self, items: Iterable[Evaluated]) -> int:
        """Load statuses evaluated from Spark's state store after a restart,
        into the store, without announcing anything."""
        with self._lock:
            statuses = self._merge(items)[0]
            if self.lookahead is not None:
                statuses = self._resume_carried(statuses)
            self.store.update(statuses)
            if not self.holds_ok:
                self._release_ok(keep=set())
            for c, now in self.cluster_now.items():
                self.store.set_telemetry_time(c, now)
        return len(statuses)

    def _merge(self, items: Iterable[Evaluated]) -> tuple[list[ReplicaStatus], list[ReplicaStatus], int, list[GoneKey]]:
        """Take in evaluated replicas; returns the statuses held for them (``_hold``), the
        statuses as evaluated, the observations new to the driver, and the leaders the
        statuses name that are held as followers (each with the naming replica's newest
        telemetry time: its partition's leader then; ``apply_statuses`` forgets those whose
        own telemetry as a follower is older)."""
        held = []
        statuses = []
        leaders: list[GoneKey] = []
        n = 0
        wall = int(self._wall() * 1000)
        touched: set[PartitionKey] = set()
        for s, last_t, count, prev_t in items:
            key = (s.cluster, s.topic, s.partition, s.broker_id)
            if self._forgotten and self._late(key, last_t):
                continue
            lead = (s.cluster, s.topic, s.partition, s.leader_id)
            if lead in self._last_t:  # its leader held as a follower
                leaders.append((*lead, last_t))
            n += max(0, count - self._counts.get(key, 0))
            self._counts[key] = count
            self._last_t[key] = last_t
            statuses.append(s)
            h = self._observed(key, s, prev_t)
            held.append(h)
            touched.add(self._hold(h, key))
            self._advance(s.cluster, last_t, wall)
        for pkey in touched:
            self._update_partition_alert(pkey)
        return held, statuses, n, leaders

    def _advance(self, cluster: str, t_ms: int, wall_ms: int) -> None:
        """Under the lock: ``cluster``'s telemetry clock to ``t_ms`` if that is newer."""
        if t_ms > self.cluster_now.get(cluster, -1):
            self.cluster_now[cluster] = t_ms
            self._advanced_wall_ms[cluster] = wall_ms
        self._advanced_wall_ms.setdefault(cluster, wall_ms)

    def _release_ok(self, keep: set[tuple[str, int]]) -> None:
        """Under the lock, with ``holds_ok`` off: let go of the replicas held as ok (off
        ``/metrics`` too; their state-topic records stay), but for the followers the
        lookahead watches, those of partitions without a spare in-sync replica
        (``streaming.evaluation.evaluate.held`` sends those every batch) and those on the
        brokers in ``keep`` ((cluster, broker id): silent, their followers read back)."""
        watched = self.lookahead.watched() if self.lookahead is not None else set()
        ok = [
            k
            for k, s in self.statuses.items()
            if s.state is State.OK
            and k not in watched
            and not _no_spare(s, self.default_min_isr)
            and (k[0], k[3]) not in keep
        ]
        if ok:
            self.store.remove(self._drop(ok))

    def _late(self, key: ReplicaKey, t_ms: int) -> bool:
        """Whether telemetry of ``key`` at ``t_ms`` comes from before the replica was forgotten
        as gone or elected leader (noted for the batch's report: the state table leaves it out
        again); telemetry after it ends the forgetting: the replica is a follower again."""
        at = self._forgotten.get(key)
        if at is None:
            return False
        if t_ms <= at:
            self._late_in_batch[key] = at
            return True
        del self._forgotten[key]
        self._forgotten_changed = True
        return False

    def _resume_carried(self, statuses: list[ReplicaStatus]) -> list[ReplicaStatus]:
        """The restored statuses, those the book shows carried to Nearing carried again."""
        assert self.lookahead is not None
        firing = set(self.book.active)
        out = []
        for s in statuses:
            key = (s.cluster, s.topic, s.partition, s.broker_id)
            held = self.lookahead.resume(key, s, firing)
            if held is not s:
                self._update_partition_alert(self._hold(held))
            out.append(held)
        return out

    def _observed(self, key: ReplicaKey, s: ReplicaStatus, prev_t_ms: int | None = None) -> ReplicaStatus:
        """The status to hold for ``s``, evaluated from telemetry: ``s``, or the lookahead's
        (``prev_t_ms``: the replica's observation before ``s``'s, when known, ``Lookahead.observe``)."""
        return s if self.lookahead is None else self.lookahead.observe(key, s, prev_t_ms)

    def _hold(self, s: ReplicaStatus, key: ReplicaKey | None = None) -> PartitionKey:
        """Keep ``s`` as its replica's status and the replica alerts it calls for; its
        partition. ``key``: the replica's key, when the caller has made it already (the
        maps then share one tuple a replica)."""
        if key is None:
            key = (s.cluster, s.topic, s.partition, s.broker_id)
        self.statuses[key] = s
        pkey = key[:3]
        members = self._members.get(pkey, ())
        if s.broker_id not in members:
            self._members[pkey] = (*members, s.broker_id)
        alerts = self._replica_alerts.setdefault(s.cluster, {})
        if s.state is State.OK:
            alerts.pop(key, None)
        else:
            alerts[key] = replica_alerts(s, self.thresholds)
            if self._lag_evidence:
                self.outcomes.behind(s)  # before its alerts start: the episode begins with it
        return pkey

    def _update_partition_alert(self, pkey: PartitionKey) -> None:
        cluster, topic, partition = pkey
        group = [self.statuses[(cluster, topic, partition, b)] for b in self._members.get(pkey, ())]
        alert = partition_alert(group, self.default_min_isr) if group else None
        alerts = self._partition_alerts.setdefault(cluster, {})
        if alert is None:
            alerts.pop(pkey, None)
        else:
            alerts[pkey] = alert

    def forget_cutoffs(self, older_than_ms: int) -> dict[str, int]:
        """Per cluster, the telemetry time before which ``forget`` drops a replica
        (its newest telemetry more than ``older_than_ms`` behind its cluster's):
        the state table leaves those replicas out too (``StateTable.write``)."""
        with self._lock:
            return {c: now - older_than_ms for c, now in self.cluster_now.items()}

    def not_ok_keys(self) -> frozenset[str]:
        """Status keys of the replicas whose newest status is not ok (exactly those
        with replica alerts)."""
        with self._lock:
            return frozenset(f"{c}/{t}/{p}/{b}" for alerts in self._replica_alerts.values() for c, t, p, b in alerts)

    def watched_keys(self) -> frozenset[str]:
        """Status keys of the replicas whose every observation the driver needs, whatever
        ``--ok-refresh-batches``: those not ok (a return to ok resolves alerts) and the
        followers the lookahead is to carry, or carries, to Nearing (a catch-up cancels it)."""
        with self._lock:
            ahead = self.lookahead.watched() if self.lookahead is not None else ()
            return self.not_ok_keys() | {f"{c}/{t}/{p}/{b}" for c, t, p, b in ahead}

    def clusters(self) -> list[str]:
        """The clusters whose telemetry the monitor has read."""
        with self._lock:
            return list(self.cluster_now)

    def held_keys(self) -> frozenset[str]:
        """Status keys of every replica held: with ``holds_ok`` off, those whose every
        observation the driver needs (a held status is never left stale: one held for its
        partition's missing spare is let go once a newer row shows the spare back)."""
        with self._lock:
            return frozenset(f"{c}/{t}/{p}/{b}" for c, t, p, b in self.statuses)

    # -- per batch --------------------------------------------------------

    def apply_statuses(
        self,
        batch_id: int,
        items: Iterable[Evaluated],
        changes: Sequence[ReplicaStatus] = (),
        gone: Iterable[GoneKey] = (),
        totals: BatchTotals | None = None,
    ) -> BatchReport:
        """Take in one batch: ``changes``, the statuses at which replicas changed state
        within it (``streaming.evaluation.replicas``), then ``items``, each observed replica's
        newest status, then ``gone``, the replicas the collector said the cluster no
        longer has (each with the time it said so: one observed after it stays).
        Each change moves the alerts at its own telemetry time, so an
        episode that began and ended inside the batch is announced, fired and
        resolved, with both times; a gone replica's alerts resolve with the batch.
        ``totals``: the batch's counts and each cluster's newest telemetry time, from Spark,
        when ``items`` are not every observed replica (``holds_ok`` off)."""
        report = BatchReport(batch_id)
        with self._lock:
            self._late_in_batch = {}
            replay = batch_id <= self.handled_batch
            steps = [] if replay else self._steps(changes)
            held, statuses, report.observations, leaders = self._merge(items)
            report.rows = report.replicas = len(statuses)
            report.statuses = len(self.statuses)
            clusters = {s.cluster for s in statuses}
            if totals is not None:
                wall = int(self._wall() * 1000)
                for cluster, t_ms in totals.clocks.items():
                    self._advance(cluster, t_ms, wall)
                report.observations, report.replicas = totals.observations, totals.replicas
                clusters |= set(totals.clocks)
            report.clusters = {c: self.cluster_now[c] for c in clusters}
            self.store.update(held, telemetry=False)  # (the telemetry time: just below)
            for c in clusters:
                self.store.set_telemetry_time(c, self.cluster_now[c])
            # (The state topic's records of the batch: streaming.sinks.statewriter, after this;
            # only its tombstones come from here.)
            said = [g for g in gone if self._last_t.get(g[:4], g[4]) <= g[4]]  # (not observed after)
            dropped = [g[:4] for g in said]
            # (Not held: an ok replica with holds_ok off. Its state-topic record still needs the tombstone.)
            unheld = [] if self.holds_ok else ["/".join(map(str, k)) for k in dropped if k not in self._last_t]
            removed = self._drop(dropped) + unheld
            # A follower its partition's other replicas now name as their leader, whose newest
            # telemetry as a follower came before: elected. The collector observes followers only,
            # so nothing else would ever end its status (and its alerts) as a follower.
            elected = {g[:4]: g for g in leaders if self._last_t.get(g[:4], g[4]) < g[4]}
            report.leading = list(elected.values())
            led = self._drop(elected)
            if said or report.leading:
                self._forgotten.update({g[:4]: g[4] for g in [*said, *report.leading]})
                self._forgotten_changed = True
            self._save_forgotten()
            report.late = [(*k, at) for k, at in self._late_in_batch.items()]
            if report.late:
                log.info(
                    "late_telemetry_of_forgotten %s",
                    kv(batch_id=batch_id, count=len(report.late), first="/".join(map(str, report.late[0][:4]))),
                )
            self._remove(removed + led)  # (after the batch's own records: the tombstone is the last word)
            if not self.holds_ok:
                # A silent broker's followers read back stay held while it is silent (each batch
                # brings their rows: they are held keys), not read again after every batch;
                # let go with the rest once it answers.
                self._held_silent &= set(self._own_evidence(int(self._wall() * 1000))[0])
                self._release_ok(keep=self._held_silent)
                report.statuses = len(self.statuses)
            if removed:
                log.info("replicas_gone %s", kv(batch_id=batch_id, count=len(removed), first=removed[0]))
            if led:
                log.info("replicas_leading %s", kv(batch_id=batch_id, count=len(led), first=led[0]))
            clusters |= {k[0] for k in [*dropped, *report.leading] if k[0] in self.cluster_now}
            if replay:
                report.skipped = True
                log.info(
                    "batch_replayed batch_id=%s handled=%s (transitions already sent)", batch_id, self.handled_batch
                )
                return report
            transitions = steps + [
                (self._transition(c, self.cluster_now[c]), self.cluster_now[c]) for c in sorted(clusters)
            ]
            self.handled_batch = batch_id
            # (Sent under the lock: the timer's transitions between batches go out in order with these.)
            self._announce(transitions, batch_id)
            for t, _ in transitions:
                report.started += len(t.started)
                report.resolved += len(t.resolved)
        return report

    def _steps(self, changes: Sequence[ReplicaStatus]) -> list[tuple[Transition, int]]:
        """Move the book through ``changes``, one telemetry time of one cluster after another."""
        out = []
        if self._forgotten:
            changes = [s for s in changes if not self._late((s.cluster, s.topic, s.partition, s.broker_id), s.eval_ms)]
        ordered = sorted(changes, key=lambda s: (s.cluster, s.eval_ms))
        i = 0
        while i < len(ordered):
            cluster, at = ordered[i].cluster, ordered[i].eval_ms
            touched: set[PartitionKey] = set()
            while i < len(ordered) and ordered[i].cluster == cluster and ordered[i].eval_ms == at:
                s = ordered[i]
                key = (s.cluster, s.topic, s.partition, s.broker_id)
                touched.add(self._hold(self._observed(key, s), key))
                i += 1
            for pkey in touched:
                self._update_partition_alert(pkey)
            t = self._transition(cluster, at)
            if t.started or t.resolved:
                out.append((t, at))
        return out

    def _transition(self, cluster: str, now_ms: int) -> Transition:
        """Move the book to what ``cluster``'s statuses call for; other clusters' alerts stay."""
        desired = [a for alerts in self._replica_alerts.get(cluster, {}).values() for a in alerts]
        desired += self._partition_alerts.get(cluster, {}).values()
        others = [a for a in self.book.active.values() if _cluster_of(a) != cluster]
        t = self.book.update(
            [*desired, *others],
            now_ms,
            scope=REPLICA_SCOPE,
            held_to_start=self._restored_alerts,
            hold_ms={AlertName.STALLED.value: self.thresholds.stall_after_ms},
        )
        if t.resolved and self._restored_alerts:  # an alert this run fires again is its own
            self._restored_alerts -= {a.key for a in t.resolved}
        return t

    def carry_forward(self) -> list[ReplicaStatus]:
        """The timer's other job: the followers whose Nearing crossing has come on the wall
        clock before a batch showed it (``streaming.driver.lookahead``) are held nearing, in the
        store and the alerts, from their crossing. Returns them."""
        if self.lookahead is None:
            return []
        wall = int(self._wall() * 1000)
        self._hold_silent(wall)
        with self._lock:
            silent, resumed = self._own_evidence(wall)
            carried = self.lookahead.due(wall, self.cluster_now, self.statuses, resumed)
            if silent:
                carried += self.lookahead.silent_due(wall, self._still_for(wall), self.statuses, silent)
            if not carried:
                return []
            for pkey in {self._hold(s) for s in carried}:
                self._update_partition_alert(pkey)
            self.store.update(carried, telemetry=False)
            transitions = []
            for cluster in sorted({s.cluster for s in carried}):
                at = max(s.eval_ms for s in carried if s.cluster == cluster)
                transitions.append((self._transition(cluster, at), at))
            self._announce(transitions, self.handled_batch)
        for s in carried:
            log.info(
                "carried_forward cluster=%s replica=%s/%s/%s lag_ratio=%.3f eval_ms=%s ahead_of_telemetry_ms=%s",
                s.cluster, s.topic, s.partition, s.broker_id, s.lag_ratio, s.eval_ms,
                s.eval_ms - self.cluster_now.get(s.cluster, s.eval_ms),
            )  # fmt: skip
        return carried

    def _hold_silent(self, wall_ms: int) -> None:
        """With ``holds_ok`` off the driver holds no ok follower, so a broker the job sees
        silent while its cluster's telemetry stands still would have none for
        ``Lookahead.silent_due`` to carry: hold its ok in-sync followers, as the state table
        last had them (``followers_of``: a Spark job, on the reader's thread, so the timer goes
        on meanwhile), once the telemetry has stood still half the stall time; once per broker
        while it stays silent (batches keep them, ``_release_ok``). The timer carries them at
        its first tick after."""
        if self.holds_ok or self.followers_of is None or self.lookahead is None or not self.lookahead.enabled:
            return
        with self._lock:
            silent = self._own_evidence(wall_ms)[0]
            still = self._still_for(wall_ms)
            wanted = {
                b
                for b in silent
                if b not in self._held_silent and still.get(b[0], 0) >= self.thresholds.stall_after_ms // 2
            }
        if wanted:
            self._silent_reads.ask(frozenset(wanted))  # (one at a time: asked again at a later tick)

    def _read_silent(self, brokers: frozenset[tuple[str, int]]) -> list[Evaluated]:
        assert self.followers_of is not None, "asked only with followers_of"
        return self.followers_of(set(brokers))

    def _take_silent(self, brokers: frozenset[tuple[str, int]], found: list[Evaluated]) -> None:
        with self._lock:
            self._held_silent |= brokers
            holding = self.statuses.keys()  # (held: as new as the table's or newer)
            fresh = [
                item
                for item in found
                if (item[0].cluster, item[0].topic, item[0].partition, item[0].broker_id) not in holding
            ]
            held = self._merge(fresh)[0]
            self.store.update(held, telemetry=False)
        log.info("silent_followers_held %s", kv(brokers=_pairs(set(brokers)), replicas=len(held)))

    @staticmethod
    def _unread(brokers: frozenset[tuple[str, int]], e: Exception) -> None:
        # a state version pruned under the read: read again at the next tick
        log.warning("silent_followers_unread %s", kv(brokers=_pairs(set(brokers)), error=type(e).__name__))

    def wait_read_back(self, timeout_s: float | None = None) -> bool:
        """Until no read of silent brokers' followers is under way (True), or ``timeout_s`` passed."""
        return self._silent_reads.wait(timeout_s)

    def close(self, timeout_s: float = READ_BACK_CLOSE_S) -> None:
        """No more reads back; one under way is given ``timeout_s`` to end before Spark stops."""
        self._silent_reads.close(timeout_s)

    def identify(self, stated: Iterable[tuple[str, Mapping[str, object]]]) -> None:
        """Take in what collectors said of the clusters they poll (``streaming.driver.identity``)."""
        with self._lock:
            if self.identities.learn(stated) and self.checkpoint is not None:
                self.checkpoint.save_identities(self.identities.as_json())

    def _own_evidence(self, wall_ms: int) -> tuple[dict[tuple[str, int], float], dict[tuple[str, int], float]]:
        """Under the lock: the job's own evidence of its telemetry cluster's brokers, silent
        and answering again after a silence, keyed (cluster, broker id) for the watched
        clusters that are that cluster by identity (``streaming.driver.identity``); none for others."""
        if self.broker_watch is None:
            return {}, {}
        after_s = self.thresholds.stall_after_ms / 1000
        own = self.broker_watch.identity()
        clusters = list(self.cluster_now)
        return (
            self.identities.own_brokers(own, clusters, self.broker_watch.silent(wall_ms / 1000, after_s)),
            self.identities.own_brokers(own, clusters, self.broker_watch.resumed(after_s)),
        )

    def _still_for(self, wall_ms: int) -> dict[str, int]:
        """Per cluster, how long its telemetry has stood still, on the job's clock: the time
        since its newest telemetry time last moved, plus how far that time was behind the job's
        clock then (the pipeline's delay), at most the stall time. Not the job's clock minus the
        telemetry's: a collector whose clock is behind the job's would make telemetry that flows
        look still (tests/e2e/test_clock_skew.py, collector 30 s behind)."""
        cap = self.thresholds.stall_after_ms
        return {
            c: wall_ms - advanced + min(cap, max(0, advanced - self.cluster_now.get(c, advanced)))
            for c, advanced in self._advanced_wall_ms.items()
        }

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
            if t.started or t.resolved:
                self._announce([(t, wall)], self.handled_batch)
        for a in t.started:
            log.warning("telemetry_stale %s", a.summary)
        return t

    def _announce(self, transitions: Sequence[tuple[Transition, int]], batch_id: int) -> None:
        """Under the lock: stage the transitions with the sinks that keep an outbox, save the
        book that says they were announced, then send them. A sink that cannot stage (a full
        disk) fails the batch as the book would: what is not kept is not announced.

        The book is saved only when an alert started or resolved: a batch that changes no
        alert's firing leaves the saved book as it is (its ``handled_batch`` then the last batch
        that did: a batch run again after a restart that starts or resolves nothing has nothing
        to repeat). In an incident the book holds thousands of firing alerts, and writing it
        every batch was the driver's largest cost (docs/benchmarks.md, "The driver's held
        replicas in an incident"). The saved descriptions of alerts still firing are then those
        of the batch that last changed the book; the next batch after a restart refreshes them."""
        for sink in self.sinks:
            stage = getattr(sink, "stage", None)
            if stage is not None:
                stage([t for t, _ in transitions])
        if self.checkpoint is not None and any(t.started or t.resolved for t, _ in transitions):
            self.checkpoint.save_book(self.book, batch_id)
        for t, now in transitions:
            self._send(t, now)

    def _send(self, t: Transition, now_ms: int) -> None:
        self.outcomes.alerts(t, now_ms)
        for sink in self.sinks:
            try:
                sink.send(t, now_ms)
            except Exception:  # a sink failing must not stop the job
                log.exception("alert_sink_failed sink=%s", type(sink).__name__)

    def forget(self, older_than_ms: int) -> list[str]:
        """Drop replicas whose telemetry stopped while their cluster's went on
        (a deleted topic, a reassigned replica, when the collector did not say it
        gone). Returns the removed keys; their alerts resolve with their cluster's
        next batch."""
        with self._lock:
            keys = self._drop([k for k, t in self._last_t.items() if self.cluster_now.get(k[0], t) - t > older_than_ms])
            # what a record older than the forget time brings back, this forgets again
            kept = {k: t for k, t in self._forgotten.items() if self.cluster_now.get(k[0], t) - t <= older_than_ms}
            if len(kept) < len(self._forgotten):
                self._forgotten, self._forgotten_changed = kept, True
                self._save_forgotten()
        self._remove(keys)
        return keys

    def _save_forgotten(self) -> None:
        """Under the lock: the checkpoint's copy of ``_forgotten``, written when it changed (a
        batch that says replicas gone or elected, or ends the memory of one; the minute's prune)."""
        if self._forgotten_changed and self.checkpoint is not None:
            self.checkpoint.save_forgotten(self._forgotten)
        self._forgotten_changed = False

    def _drop(self, gone: Iterable[ReplicaKey]) -> list[str]:
        """Under the lock: forget the replicas ``gone`` (those held), their alerts and
        their part of their partitions' alerts. Returns their status keys."""
        gone = [k for k in dict.fromkeys(gone) if k in self._last_t]  # (once each)
        keys = []
        for k in gone:
            del self._last_t[k]
            self._counts.pop(k, None)
            if self.lookahead is not None:
                self.lookahead.forget(k)
            self._replica_alerts.get(k[0], {}).pop(k, None)
            pkey = k[:3]
            members = tuple(b for b in self._members.get(pkey, ()) if b != k[3])
            if members:
                self._members[pkey] = members
            else:
                self._members.pop(pkey, None)
            s = self.statuses.pop(k, None)
            if s is not None:
                keys.append(status_key(s))
        for pkey in {k[:3] for k in gone}:
            self._update_partition_alert(pkey)
        return keys

    def _remove(self, keys: Sequence[str]) -> None:
        """The dropped replicas off ``/metrics`` and the state topic."""
        if keys:
            self.store.remove(keys)
            if self.state_topic is not None:
                self.state_topic.remove(keys)  # tombstones: the exporter forgets them too
