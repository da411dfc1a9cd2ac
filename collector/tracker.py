"""From polling rounds to telemetry observations (pure; no Kafka here).

The tracker remembers each follower's previous observation at which its leader
answered (its time, LEO and the leader LEO then) so every observation carries
the ``prev_*`` fields the refined KIP-16 rule needs, and each partition's
previous ISR so it can report the ISR changes metadata shows.

Rounds in which the leader did not answer (paused, down, unreachable) say nothing
about the follower's catch-up, so they do not replace the previous observation:
the first round after the leader answers again carries the time and leader LEO
from before its silence, and the job reads that interval as a gap in its
telemetry (docs/rule.md), not as time out of sync. A leader LEO below the
previous one (a new leader truncated its log) leaves nothing to compare against:
``prev_*`` are left out then.
"""

from __future__ import annotations

from dataclasses import dataclass

from collector.probe import Snapshot
from isrwatch.telemetry import IsrChange, Observation

__all__ = ["ReplicaTracker", "RoundResult"]


@dataclass(frozen=True)
class RoundResult:
    observations: list[Observation]
    isr_changes: list[IsrChange]


class ReplicaTracker:
    def __init__(self, lag_time_max_ms: int | None = None, min_isr: int | None = None) -> None:
        self.lag_time_max_ms = lag_time_max_ms
        self.min_isr = min_isr
        # (topic, partition, follower) -> (t_ms, leo, leader_leo) of the newest observation whose leader answered
        self._prev: dict[tuple[str, int, int], tuple[int, int | None, int]] = {}
        # (topic, partition, follower) -> t_ms of its newest observation
        self._last_t: dict[tuple[str, int, int], int] = {}
        self._isr: dict[tuple[str, int], tuple[int, ...]] = {}

    def observe(self, snap: Snapshot) -> RoundResult:
        observations: list[Observation] = []
        changes: list[IsrChange] = []
        seen: set[tuple[str, int, int]] = set()
        live: set[tuple[str, int]] = set()
        for ps in snap.partitions:
            key = (ps.topic, ps.partition)
            live.add(key)
            before = self._isr.get(key)
            if snap.metadata_fresh:
                if before is not None and set(before) != set(ps.isr):
                    changes.append(IsrChange(snap.t_ms, ps.topic, ps.partition, before, ps.isr, leader_id=ps.leader))
                self._isr[key] = ps.isr
            if ps.leader < 0:
                continue
            leader_leo = snap.leo.get((ps.leader, ps.topic, ps.partition))
            for follower in ps.replicas:
                if follower == ps.leader:
                    continue
                rkey = (ps.topic, ps.partition, follower)
                seen.add(rkey)
                leo = snap.leo.get((follower, ps.topic, ps.partition))
                if self._last_t.get(rkey, -1) >= snap.t_ms:
                    continue  # no new answer since the last round: nothing new to say
                self._last_t[rkey] = snap.t_ms
                prev = self._prev.get(rkey)
                if prev is not None and leader_leo is not None and leader_leo < prev[2]:
                    prev = None  # the leader's log went backwards: nothing to compare against
                observations.append(
                    Observation(
                        topic=ps.topic,
                        partition=ps.partition,
                        broker_id=follower,
                        leader_id=ps.leader,
                        t_ms=snap.t_ms,
                        leo=leo,
                        leader_leo=leader_leo,
                        hw=snap.hw.get(key),
                        prev_t_ms=prev[0] if prev else None,
                        prev_leo=prev[1] if prev else None,
                        prev_leader_leo=prev[2] if prev else None,
                        isr=ps.isr,
                        replicas=ps.replicas,
                        lag_time_max_ms=self.lag_time_max_ms,
                        min_isr=self.min_isr,
                    )
                )
                if leader_leo is not None:
                    self._prev[rkey] = (snap.t_ms, leo, leader_leo)
        # forget replicas and partitions that are gone (topic deleted, reassigned)
        for rkey in set(self._last_t) - seen:
            del self._last_t[rkey]
            self._prev.pop(rkey, None)
        for key in set(self._isr) - live:
            del self._isr[key]
        return RoundResult(observations, changes)
