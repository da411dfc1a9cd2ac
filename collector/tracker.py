"""From polling rounds to telemetry observations (pure; no Kafka here).

The tracker remembers each follower's previous observation (its time, LEO and
the leader LEO then) so every observation carries the ``prev_*`` fields the
refined KIP-16 rule needs, and each partition's previous ISR so it can report
the ISR changes metadata shows.
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
        # (topic, partition, follower) -> (t_ms, leo, leader_leo)
        self._prev: dict[tuple[str, int, int], tuple[int, int | None, int | None]] = {}
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
                prev = self._prev.get(rkey)
                if prev is not None and prev[0] >= snap.t_ms:
                    continue  # no new answer since the last round: nothing new to say
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
                self._prev[rkey] = (snap.t_ms, leo, leader_leo)
        # forget replicas and partitions that are gone (topic deleted, reassigned)
        for rkey in set(self._prev) - seen:
            del self._prev[rkey]
        for key in set(self._isr) - live:
            del self._isr[key]
        return RoundResult(observations, changes)
