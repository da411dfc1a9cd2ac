"""The broker's truth, live: did isrwatch warn before each real ISR shrink, and how early.

``ShrinkOutcomes`` is told two things, both on a cluster's telemetry clock: the replica
alerts isrwatch raised and resolved (``alerts``, the transitions the job sends), and the
followers the collector saw leaving or joining an ISR (``isr_change``, the telemetry's
``isr_changes`` entries). A replica's *episode* runs from its first replica alert
(``KafkaReplicaNearingIsrShrink`` or worse: every replica alert is Nearing or worse, or
``KafkaReplicaStalled``) until its last one resolves. Then:

* a shrink of a follower at time t is *warned* when an episode of that follower began before
  t and had not ended before t; its lead is t - the episode's start. Else it is *missed*
  (no warning, or one that came at or after the shrink, or one that had already ended);
* an episode that ended without the follower being out of the ISR at any time within it
  is a *warning no shrink followed*. It is decided once the cluster's clock is
  ``settle_ms`` past its end, so a shrink read a batch later still counts.

The shrink time is when the collector saw the new ISR (its metadata round), a little after
the leader's own shrink: a lead is overstated by at most one collector interval.

Pure Python, no I/O; thread-safe (the job's batches and its timer both feed it, the scrape
reads it). Counts start at zero with the process, as Prometheus counters may.
"""

from __future__ import annotations

import bisect
import threading
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from isrwatch.alerts import Alert, AlertName, Transition

__all__ = ["ShrinkOutcomes", "OutcomeCounts", "LEAD_BUCKETS_S", "OUTCOMES", "WARNING_NAMES", "PREDICTIONS_MISSING"]

# Upper bounds of the lead histogram, in seconds (replica.lag.time.max.ms is 10 s or 30 s by default).
LEAD_BUCKETS_S = (0.5, 1.0, 2.0, 5.0, 10.0, 15.0, 20.0, 30.0, 60.0, 120.0, 300.0)
OUTCOMES = ("warned", "missed")
# The alerts that warn of a shrink: every replica alert.
WARNING_NAMES = frozenset({AlertName.NEARING, AlertName.IMMINENT, AlertName.OUT_OF_SYNC, AlertName.STALLED})
# The Prometheus rule's alert on these counts (deploy/prometheus/rules; the job does not send it).
PREDICTIONS_MISSING = "IsrwatchPredictionsMissing"
KEEP_EVENTS = 32  # the ended episodes and ISR changes kept per replica

ReplicaKey = tuple[str, str, int, int]  # cluster, topic, partition, broker_id


@dataclass
class OutcomeCounts:
    """One cluster's counts: shrinks by outcome, the warned shrinks' leads, warnings no shrink followed."""

    shrinks: dict[str, int] = field(default_factory=lambda: dict.fromkeys(OUTCOMES, 0))
    buckets: list[int] = field(default_factory=lambda: [0] * len(LEAD_BUCKETS_S))  # not cumulative
    lead_sum_s: float = 0.0
    unfollowed: int = 0

    def copy(self) -> OutcomeCounts:
        return OutcomeCounts(dict(self.shrinks), list(self.buckets), self.lead_sum_s, self.unfollowed)

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


@dataclass
class _Replica:
    active: set[str] = field(default_factory=set)  # names of its replica alerts firing
    episodes: deque[_Episode] = field(default_factory=lambda: deque(maxlen=KEEP_EVENTS))
    changes: deque[tuple[int, bool]] = field(default_factory=lambda: deque(maxlen=KEEP_EVENTS))  # (t, in ISR after)


def _replica_key(a: Alert) -> ReplicaKey | None:
    labels = dict(a.labels)
    try:
        return (labels["cluster"], labels["topic"], int(labels["partition"]), int(labels["broker_id"]))
    except KeyError:
        return None


class ShrinkOutcomes:
    def __init__(self, settle_ms: int = 10_000) -> None:
        self.settle_ms = settle_ms
        self._lock = threading.Lock()
        self._replicas: dict[ReplicaKey, _Replica] = {}
        self._counts: dict[str, OutcomeCounts] = {}

    def resume(self, firing: Iterable[Alert]) -> None:
        """Alerts still firing when the job restarted (its checkpointed book): their
        episodes go on from their start times."""
        for a in firing:
            key = _replica_key(a)
            if key is None or a.name not in WARNING_NAMES:
                continue
            with self._lock:
                r = self._replicas.setdefault(key, _Replica())
                if not r.active:
                    r.episodes.append(_Episode(a.starts_ms))
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
                if not r.active:
                    r.episodes.append(_Episode(now_ms))
                r.active.add(a.name.value)
            for a in t.resolved:
                key = _replica_key(a)
                held = self._replicas.get(key) if key is not None else None
                if held is None or a.name.value not in held.active:
                    continue
                held.active.discard(a.name.value)
                if not held.active and held.episodes:
                    held.episodes[-1].end_ms = max(now_ms, held.episodes[-1].start_ms)

    def isr_change(self, cluster: str, topic: str, partition: int, t_ms: int, left: Iterable[int],
                   joined: Iterable[int] = ()) -> list[tuple[int, str, float | None]]:  # fmt: skip
        """The followers the collector saw leave (``left``) or join the ISR at ``t_ms``; returns
        (broker_id, outcome, lead in seconds or None) of each that left."""
        out: list[tuple[int, str, float | None]] = []
        with self._lock:
            counts = self._counts.setdefault(cluster, OutcomeCounts())
            for b in joined:
                self._replicas.setdefault((cluster, topic, partition, b), _Replica()).changes.append((t_ms, True))
            for b in left:
                r = self._replicas.setdefault((cluster, topic, partition, b), _Replica())
                r.changes.append((t_ms, False))
                episode = next(
                    (e for e in reversed(r.episodes) if e.start_ms < t_ms and (e.end_ms is None or e.end_ms >= t_ms)),
                    None,
                )
                if episode is None:
                    counts.shrinks["missed"] += 1
                    out.append((b, "missed", None))
                    continue
                episode.followed = True
                lead_s = (t_ms - episode.start_ms) / 1000.0
                counts.shrinks["warned"] += 1
                counts.lead_sum_s += lead_s
                i = bisect.bisect_left(LEAD_BUCKETS_S, lead_s)
                if i < len(LEAD_BUCKETS_S):
                    counts.buckets[i] += 1
                out.append((b, "warned", lead_s))
        return out

    def settle(self, cluster_now: dict[str, int]) -> None:
        """Decide the ended episodes ``settle_ms`` behind their cluster's clock: a warning
        no shrink followed unless the follower was out of the ISR within it."""
        with self._lock:
            for key, r in self._replicas.items():
                now = cluster_now.get(key[0])
                if now is None:
                    continue
                while r.episodes and r.episodes[0].end_ms is not None and r.episodes[0].end_ms + self.settle_ms <= now:
                    e = r.episodes.popleft()
                    if not e.followed and not _out_within(r.changes, e):
                        self._counts.setdefault(key[0], OutcomeCounts()).unfollowed += 1

    def snapshot(self, clusters: Iterable[str] = ()) -> dict[str, OutcomeCounts]:
        """Each cluster's counts (zeros for ``clusters`` not seen yet), copied."""
        with self._lock:
            out = {c: n.copy() for c, n in self._counts.items()}
        for c in clusters:
            out.setdefault(c, OutcomeCounts())
        return dict(sorted(out.items()))


def _out_within(changes: Iterable[tuple[int, bool]], e: _Episode) -> bool:
    """Whether the follower was out of the ISR at some time in [start, end] of ``e``."""
    assert e.end_ms is not None
    in_isr = True
    for t, after in sorted(changes):
        if t > e.end_ms:
            break
        if t <= e.start_ms:
            in_isr = after
        elif not after:
            return True
    return not in_isr
