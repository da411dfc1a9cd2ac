"""The broker's truth, live: did isrwatch warn before each real ISR shrink, and how early;
and is the job's ``replica.lag.time.max.ms`` the brokers'.

``ShrinkOutcomes`` is told, on each cluster's telemetry clock, the replica alerts raised and
resolved (``alerts``), the ISR changes the collector saw (``isr_change``), the leaders' own
shrink counts (``leader_count``) and each status of a follower the job holds not ok
(``behind``). It counts each shrink warned (with its lead) or missed, the warnings no shrink
followed (``snapshot``), and the evidence of a wrong lag (``LagEvidence``, ``take_evidence``).
What counts as an episode, warned, missed, ``shorter`` or ``longer``: docs/metrics.md, "The
broker's truth, live". Pure Python, no I/O; thread-safe (the job's batches and its timer both
feed it, the scrape reads it). Counts start at zero with the process, as Prometheus counters may.
"""

from __future__ import annotations

import bisect
import threading
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import NamedTuple

from isrwatch.alerts import Alert, AlertName, Transition
from isrwatch.status import ReplicaStatus, last_caught_up_ms

__all__ = [
    "ShrinkOutcomes",
    "OutcomeCounts",
    "Unseen",
    "LagEvidence",
    "DIRECTIONS",
    "LEAD_BUCKETS_S",
    "OUTCOMES",
    "WARNING_NAMES",
    "PREDICTIONS_MISSING",
]

# Upper bounds of the lead histogram, in seconds (replica.lag.time.max.ms is 10 s or 30 s by default).
LEAD_BUCKETS_S = (0.5, 1.0, 2.0, 5.0, 10.0, 15.0, 20.0, 30.0, 60.0, 120.0, 300.0)
OUTCOMES = ("warned", "missed")
# The alerts that warn of a shrink: every replica alert.
WARNING_NAMES = frozenset({AlertName.NEARING, AlertName.IMMINENT, AlertName.OUT_OF_SYNC, AlertName.STALLED})
# The Prometheus rule's alert on these counts (deploy/prometheus/rules; the job does not send it).
PREDICTIONS_MISSING = "IsrwatchPredictionsMissing"
# Which way the brokers' replica.lag.time.max.ms differs from isrwatch's (``LagEvidence``).
DIRECTIONS = ("shorter", "longer")
KEEP_EVENTS = 32  # the ended episodes and ISR changes kept per replica

ReplicaKey = tuple[str, str, int, int]  # cluster, topic, partition, broker_id


class Unseen(NamedTuple):
    """A shrink a leader's own count shows and metadata did not (``ShrinkOutcomes.settle``)."""

    cluster: str
    leader: int
    replica: ReplicaKey | None  # the follower it was given to; None when missed
    t_ms: int  # the count's reading that showed it
    outcome: str
    lead_s: float | None


class LagEvidence(NamedTuple):
    """What the brokers did that isrwatch's lag time does not explain (``ShrinkOutcomes.take_evidence``)."""

    cluster: str
    direction: str  # "shorter" or "longer" (DIRECTIONS): the brokers' lag against the job's
    replica: ReplicaKey
    leader: int
    lag_ms: int  # the replica.lag.time.max.ms the job used
    behind_ms: int  # how long after its last catch-up it was dropped (shorter) or still in the ISR (longer)
    t_ms: int


@dataclass
class OutcomeCounts:
    """One cluster's counts: shrinks by outcome, the warned shrinks' leads, warnings no shrink
    followed, lag-time evidence by direction."""

    shrinks: dict[str, int] = field(default_factory=lambda: dict.fromkeys(OUTCOMES, 0))
    buckets: list[int] = field(default_factory=lambda: [0] * len(LEAD_BUCKETS_S))  # not cumulative
    lead_sum_s: float = 0.0
    unfollowed: int = 0
    evidence: dict[str, int] = field(default_factory=lambda: dict.fromkeys(DIRECTIONS, 0))

    def copy(self) -> OutcomeCounts:
        return OutcomeCounts(
            dict(self.shrinks), list(self.buckets), self.lead_sum_s, self.unfollowed, dict(self.evidence)
        )

    def cumulative(self) -> list[tuple[float, int]]:
        """(upper bound, leads at or below it), +Inf last."""
        out, n = [], 0
        for le, c in zip(LEAD_BUCKETS_S, self.buckets, strict=True):
            n += c
            out.append((le, n))
        out.append((float("inf"), self.shrinks["warned"]))
        return out


@dataclass
class _Episode:
    start_ms: int
    end_ms: int | None = None
    followed: bool = False  # the follower was out of the ISR within it
    # From the job's statuses of the follower while it ran (``ShrinkOutcomes.behind``): its last
    # catch-ups (increasing), the lag and leader they were judged with, the newest status's time.
    caught_up: deque[int] = field(default_factory=lambda: deque(maxlen=KEEP_EVENTS))
    lag_ms: int | None = None
    leader: int | None = None
    mixed: bool = False  # the lag or the leader changed within it: no lag-time evidence from it
    out_ms: int | None = None  # the first status showing the follower out of the ISR
    last_ms: int = 0
    evidence: set[str] = field(default_factory=set)  # the directions found in it

    def take(self, s: ReplicaStatus) -> None:
        """A status of the follower within the episode (its last catch-up only moves forward)."""
        if self.lag_ms is None:
            self.lag_ms, self.leader = s.lag_time_max_ms, s.leader_id
        elif (self.lag_ms, self.leader) != (s.lag_time_max_ms, s.leader_id):
            self.mixed = True
        lcu = last_caught_up_ms(s)
        if not self.caught_up or lcu > self.caught_up[-1]:
            self.caught_up.append(lcu)
        if not s.in_isr and self.out_ms is None:
            self.out_ms = s.eval_ms
        self.last_ms = max(self.last_ms, s.eval_ms)


@dataclass
class _Replica:
    leader: int | None = None  # its leader, as its newest replica alert says
    active: set[str] = field(default_factory=set)  # names of its replica alerts firing
    episodes: deque[_Episode] = field(default_factory=lambda: deque(maxlen=KEEP_EVENTS))
    changes: deque[tuple[int, bool]] = field(default_factory=lambda: deque(maxlen=KEEP_EVENTS))  # (t, in ISR after)
    behind: ReplicaStatus | None = None  # its newest status not ok: what an episode starting now begins with

    def open(self, start_ms: int) -> None:
        """A new episode from ``start_ms``."""
        e = _Episode(start_ms)
        if self.behind is not None:
            e.take(self.behind)
        self.episodes.append(e)


@dataclass
class _LeaderCount:
    """One leader's own shrink count: its last reading, the rises not yet matched, and the
    shrinks metadata showed it make since the first reading."""

    t_ms: int
    total: int
    first_ms: int  # the first reading: shrinks metadata showed before it are not in the rises
    rises: deque[tuple[int, int, int]] = field(default_factory=deque)  # (previous reading's t, t, rise)
    # when metadata showed each shrink of this leader not yet matched with a rise, with the
    # lag-time evidence it is if a rise matches it (the leader's own, not the controller's)
    seen: deque[tuple[int, list[tuple[_Episode, LagEvidence]]]] = field(default_factory=deque)
    # the windows (previous reading's t, t) of its settled rises, metadata's shrinks or not
    shrunk: deque[tuple[int, int]] = field(default_factory=lambda: deque(maxlen=KEEP_EVENTS))


def _leader(a: Alert) -> int | None:
    value = dict(a.labels).get("leader_id")
    return int(value) if value is not None and value.lstrip("-").isdigit() else None


def _replica_key(a: Alert) -> ReplicaKey | None:
    labels = dict(a.labels)
    try:
        return (labels["cluster"], labels["topic"], int(labels["partition"]), int(labels["broker_id"]))
    except KeyError:
        return None


class ShrinkOutcomes:
    def __init__(self, settle_ms: int = 10_000, lag_margin_ms: int = 2_000) -> None:
        self.settle_ms = settle_ms
        self.lag_margin_ms = lag_margin_ms
        self._lock = threading.Lock()
        self._replicas: dict[ReplicaKey, _Replica] = {}
        self._counts: dict[str, OutcomeCounts] = {}
        self._leaders: dict[tuple[str, int], _LeaderCount] = {}  # (cluster, broker id)
        self._evidence: deque[LagEvidence] = deque(maxlen=1000)  # found, not yet taken

    def resume(self, firing: Iterable[Alert]) -> None:
        """Alerts still firing when the job restarted (its checkpointed book): their
        episodes go on from their start times."""
        for a in firing:
            key = _replica_key(a)
            if key is None or a.name not in WARNING_NAMES:
                continue
            with self._lock:
                r = self._replicas.setdefault(key, _Replica())
                r.leader = _leader(a)
                if not r.active:
                    r.open(a.starts_ms)
                r.active.add(a.name.value)

    def alerts(self, t: Transition, now_ms: int) -> None:
        """The replica alerts of one transition, raised or resolved at ``now_ms``."""
        with self._lock:
            for a in t.started:
                key = _replica_key(a)
                if key is None or a.name not in WARNING_NAMES:
                    continue
                self._counts.setdefault(key[0], OutcomeCounts())
                r = self._replicas.setdefault(key, _Replica())
                r.leader = _leader(a)
                if not r.active:
                    r.open(now_ms)
                r.active.add(a.name.value)
            for a in t.resolved:
                key = _replica_key(a)
                held = self._replicas.get(key) if key is not None else None
                if held is None or a.name.value not in held.active:
                    continue
                held.active.discard(a.name.value)
                if not held.active and held.episodes:
                    held.episodes[-1].end_ms = max(now_ms, held.episodes[-1].start_ms)

    def behind(self, s: ReplicaStatus) -> None:
        """A status of a follower the job holds not ok: its last catch-up, lag and leader, for
        its episode (running, or starting with the alerts ``s`` calls for)."""
        key = (s.cluster, s.topic, s.partition, s.broker_id)
        with self._lock:
            r = self._replicas.setdefault(key, _Replica())
            r.behind = s
            if r.active and r.episodes and r.episodes[-1].end_ms is None:
                r.episodes[-1].take(s)

    def isr_change(self, cluster: str, topic: str, partition: int, t_ms: int, left: Iterable[int],
                   joined: Iterable[int] = (), leader: int | None = None,
                   ) -> list[tuple[int, str, float | None]]:  # fmt: skip
        """The followers the collector saw leave (``left``) or join the ISR at ``t_ms``, the
        partition then led by ``leader`` when known; returns (broker_id, outcome, lead in
        seconds or None) of each that left."""
        out: list[tuple[int, str, float | None]] = []
        left = list(left)
        with self._lock:
            counts = self._counts.setdefault(cluster, OutcomeCounts())
            for b in joined:
                self._replicas.setdefault((cluster, topic, partition, b), _Replica()).changes.append((t_ms, True))
            count = self._leaders.get((cluster, leader)) if leader is not None else None
            if count is not None and t_ms < count.first_ms:
                count = None  # shown before the leader's first reading: in none of its rises
            shorter: list[tuple[_Episode, LagEvidence]] = []
            for b in left:
                key = (cluster, topic, partition, b)
                r = self._replicas.setdefault(key, _Replica())
                r.changes.append((t_ms, False))
                # Metadata shows a shrink up to ``settle_ms`` after the leader made it (Kafka 0.9
                # sends ISR changes to metadata 5 s after the last one), so an episode that ended
                # less than that before ``t_ms`` may have been going at the shrink itself.
                episode = next(
                    (
                        e
                        for e in reversed(r.episodes)
                        if e.start_ms < t_ms and (e.end_ms is None or e.end_ms >= t_ms - self.settle_ms)
                    ),
                    None,
                )
                out.append((b, *self._count(counts, episode, t_ms)))
                found = self._shorter(key, episode, leader, t_ms) if count is not None else None
                if episode is not None and found is not None:
                    shorter.append((episode, found))  # evidence once a rise of the leader's count matches it
            if left and count is not None:
                # one shrink in the leader's count (however many followers it removed)
                count.seen.append((t_ms, shorter))
        return out

    def leader_count(self, cluster: str, broker: int, t_ms: int, total: int) -> None:
        """A broker's own count of the ISR shrinks it made as a leader, read at ``t_ms``
        (settled against metadata's shrinks in ``settle``)."""
        with self._lock:
            count = self._leaders.get((cluster, broker))
            if count is None:
                self._leaders[(cluster, broker)] = _LeaderCount(t_ms, total, first_ms=t_ms)
                self._counts.setdefault(cluster, OutcomeCounts())
                return
            if t_ms <= count.t_ms:
                return  # read before the last reading (records out of order): nothing new
            rise = total - count.total if total >= count.total else total  # lower: the broker restarted
            if rise > 0:
                count.rises.append((count.t_ms, t_ms, rise))
            count.t_ms, count.total = t_ms, total

    def _count(self, counts: OutcomeCounts, episode: _Episode | None, t_ms: int) -> tuple[str, float | None]:
        """Count one shrink at ``t_ms``, warned by ``episode`` or missed: (outcome, lead_s)."""
        if episode is None:
            counts.shrinks["missed"] += 1
            return "missed", None
        episode.followed = True
        lead_s = (t_ms - episode.start_ms) / 1000.0
        counts.shrinks["warned"] += 1
        counts.lead_sum_s += lead_s
        i = bisect.bisect_left(LEAD_BUCKETS_S, lead_s)
        if i < len(LEAD_BUCKETS_S):
            counts.buckets[i] += 1
        return "warned", lead_s

    def _unseen(
        self, cluster: str, leader: int, since_ms: int, t_ms: int
    ) -> tuple[ReplicaKey | None, str, float | None]:
        """A shrink leader ``leader`` made between two readings of its count that metadata did
        not show: given to the follower of that leader whose unfollowed warning was open then."""
        candidates = [
            (e.start_ms, key, e)
            for key, r in self._replicas.items()
            if key[0] == cluster and r.leader == leader
            for e in r.episodes
            if not e.followed and e.start_ms < t_ms and (e.end_ms is None or e.end_ms >= since_ms)
        ]
        counts = self._counts.setdefault(cluster, OutcomeCounts())
        if not candidates:
            return (None, *self._count(counts, None, t_ms))
        _, key, episode = min(candidates, key=lambda c: c[0])
        found = self._shorter(key, episode, leader, t_ms)  # t_ms: the latest it can have been
        if found is not None:
            self._found(episode, found)
        return (key, *self._count(counts, episode, t_ms))

    def _shorter(self, key: ReplicaKey, e: _Episode | None, leader: int | None, t_ms: int) -> LagEvidence | None:
        """``leader``'s shrink at ``t_ms`` of the follower of episode ``e``, if it came sooner
        after the follower's last catch-up than the job's lag (less the margin) allows."""
        if e is None or leader is None or e.mixed or e.leader != leader or e.lag_ms is None:
            return None
        before = [t for t in e.caught_up if t <= t_ms]  # catch-ups read after the shrink are not its
        if not before or t_ms - before[-1] >= e.lag_ms - self.lag_margin_ms:
            return None
        return LagEvidence(key[0], "shorter", key, leader, e.lag_ms, t_ms - before[-1], t_ms)

    def _longer(self, key: ReplicaKey, r: _Replica, e: _Episode, now_ms: int) -> LagEvidence | None:
        """Episode ``e``'s follower, held not caught up past the time a leader with the job's lag
        drops it, if the leader's count shows it did not (decided ``2 x settle_ms`` after). A
        drop after that time does not matter: the brokers' lag is then longer, only by less."""
        if e.mixed or e.lag_ms is None or e.leader is None or not e.caught_up:
            return None
        lcu = e.caught_up[-1]
        due = lcu + 2 * e.lag_ms + self.lag_margin_ms
        if e.last_ms <= due or now_ms < due + 2 * self.settle_ms:
            return None
        count = self._leaders.get((key[0], e.leader))
        if count is None or count.first_ms > lcu or count.t_ms < due or (count.rises and count.rises[0][0] < due):
            return None  # the leader's count does not cover the time from lcu to due (yet)
        if any(since < due and t > lcu for since, t in count.shrunk):
            return None  # the leader shrank an ISR in that time: it may have been this follower's
        # metadata (up to settle_ms late) showed it out by then: the controller's removal of a broker
        # whose ZooKeeper session expired is in no leader's count
        shown_by = due + self.settle_ms
        if (e.out_ms is not None and e.out_ms <= shown_by) or _out_within(r.changes, lcu, shown_by):
            return None
        kept = min(e.last_ms, e.out_ms if e.out_ms is not None else e.last_ms)  # the latest seen in the ISR
        return LagEvidence(key[0], "longer", key, e.leader, e.lag_ms, kept - lcu, kept)

    def _found(self, e: _Episode, found: LagEvidence) -> None:
        """Count ``found``, once per episode and direction."""
        if found.direction in e.evidence:
            return
        e.evidence.add(found.direction)
        self._counts.setdefault(found.cluster, OutcomeCounts()).evidence[found.direction] += 1
        self._evidence.append(found)

    def take_evidence(self) -> list[LagEvidence]:
        """The lag-time evidence found since the last call (the job logs it)."""
        with self._lock:
            out = list(self._evidence)
            self._evidence.clear()
        return out

    def settle(self, cluster_now: dict[str, int]) -> list[Unseen]:
        """Decide what is ``settle_ms`` behind its cluster's clock: the rises of a leader's
        count metadata's shrinks do not account for (returned, one ``Unseen`` per shrink),
        then the ended episodes (a warning no shrink followed unless the follower was out of
        the ISR within it)."""
        unseen: list[Unseen] = []
        with self._lock:
            for (cluster, leader), count in self._leaders.items():
                now = cluster_now.get(cluster)
                while now is not None and count.rises and count.rises[0][1] + self.settle_ms <= now:
                    since, t, rise = count.rises.popleft()
                    # metadata shows a shrink after it happened, so after the reading before it
                    # (``since``): one shown earlier was no rise of this leader's count (the
                    # controller's removal of a dead broker, which no leader counts)
                    while count.seen and count.seen[0][0] <= since:
                        count.seen.popleft()
                    count.shrunk.append((since, t))
                    matched = min(rise, len(count.seen))
                    for _ in range(matched):
                        for episode, found in count.seen.popleft()[1]:  # the leader's own: evidence
                            self._found(episode, found)
                    for _ in range(rise - matched):
                        key, outcome, lead_s = self._unseen(cluster, leader, since, t)
                        unseen.append(Unseen(cluster, leader, key, t, outcome, lead_s))
            for key, r in self._replicas.items():
                now = cluster_now.get(key[0])
                if now is None:
                    continue
                for e in r.episodes:
                    longer = self._longer(key, r, e, now) if "longer" not in e.evidence else None
                    if longer is not None:
                        self._found(e, longer)
                # twice settle_ms: a leader's count rise read up to settle_ms after the episode ended
                # (so decided up to 2 settle_ms after) may be the shrink that followed it
                while r.episodes and (end := r.episodes[0].end_ms) is not None and end + 2 * self.settle_ms <= now:
                    e = r.episodes.popleft()
                    if not e.followed and not _out_within(r.changes, e.start_ms, end):
                        self._counts.setdefault(key[0], OutcomeCounts()).unfollowed += 1
        return unseen

    def snapshot(self, clusters: Iterable[str] = ()) -> dict[str, OutcomeCounts]:
        """Each cluster's counts (zeros for ``clusters`` not seen yet), copied."""
        with self._lock:
            out = {c: n.copy() for c, n in self._counts.items()}
        for c in clusters:
            out.setdefault(c, OutcomeCounts())
        return dict(sorted(out.items()))


def _out_within(changes: Iterable[tuple[int, bool]], start_ms: int, end_ms: int) -> bool:
    """Whether the follower was out of the ISR at some time in [start_ms, end_ms]."""
    in_isr = True
    for t, after in sorted(changes):
        if t > end_ms:
            break
        if t <= start_ms:
            in_isr = after
        elif not after:
            return True
    return not in_isr
