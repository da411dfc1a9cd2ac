"""From polling rounds to telemetry observations (pure; no Kafka here).

The tracker remembers each follower's previous observation at which its leader
answered (its time, LEO and the leader LEO then) so every observation carries
the ``prev_*`` fields the refined KIP-16 rule needs, and each partition's
previous ISR so it can report the ISR changes metadata shows.

Rounds in which the leader did not answer (paused, down, unreachable) say nothing
about the follower's catch-up, so they do not replace the previous observation:
the first round after the leader answers again carries the time and leader LEO
from before its silence, and the job reads that interval as a gap in its
telemetry (docs/rule.md), not as time out of sync. A follower that first round shows
below the leader LEO of before the silence is not observed in it (at most once in a
row: the next round observes it whatever it shows): a follower's fetch waiting at a
paused leader is answered only after the leader's backlog of produce requests, so
for a moment it looks stuck although the leader counts it caught up the instant it
answers that fetch; the next round's observation, still against the time and LEO of
before the silence, shows whether it is. A leader LEO below the
previous one (a new leader truncated its log) leaves nothing to compare against:
``prev_*`` are left out then.

A replica the cluster no longer has (its topic deleted, or the replica moved to other
brokers) is said ``gone`` once, so the job forgets it and resolves its alerts at once
rather than after its forget time. Only fresh metadata that lists partitions can say so
(a round whose metadata request failed, or an answer with no partitions at all, as a
broker just started may give, says nothing), and only once the replica has been left out
of every such answer for ``GONE_AFTER_ROUNDS`` rounds and ``GONE_AFTER_MS``. A partition
without a leader is still listed (its replicas too: ``isrwatch.kafkawire.kept_replicas``),
so an offline partition is never gone.

A follower elected its partition's leader is forgotten by the job when another follower's
observation names it leader (docs/streaming.md). A partition left with no follower (a topic
deleted and created again with one replica, a reassignment down to one) has no such
observation, so the tracker says such a replica ``gone`` itself, in the first round of fresh
metadata that shows it the partition's only replica: gone as a follower, as it is.
"""

from __future__ import annotations

from dataclasses import dataclass

from collector.probe import Snapshot
from isrwatch.telemetry import GoneReplica, IsrChange, Observation

__all__ = ["ReplicaTracker", "RoundResult", "PartitionSettings", "GONE_AFTER_ROUNDS", "GONE_AFTER_MS"]

# How long a replica must be missing from fresh metadata before it is said gone: a
# metadata answer that leaves it out once (a broker whose cache is being updated) is
# not enough.
GONE_AFTER_ROUNDS = 3
GONE_AFTER_MS = 5_000

RKey = tuple[str, int, int]  # topic, partition, broker


@dataclass(frozen=True)
class RoundResult:
    observations: list[Observation]
    isr_changes: list[IsrChange]
    gone: list[GoneReplica]
    held: int = 0  # followers whose observation this round left out, their leader back from a silence


class PartitionSettings:
    """The ``lag_time_max_ms`` and ``min_isr`` each partition's observations carry: a flag the
    user gave wins; else what the cluster said (``collector.main.ClusterConfigs`` reads it by
    DescribeConfigs): the partition's leader's ``replica.lag.time.max.ms`` (the leader decides
    the ISR) and its topic's ``min.insync.replicas``; else nothing (the job's setting applies)."""

    def __init__(self, lag_time_max_ms: int | None = None, min_isr: int | None = None) -> None:
        self.flag_lag_time_max_ms = lag_time_max_ms
        self.flag_min_isr = min_isr
        self.lag_time_max_ms: dict[int, int] = {}  # broker -> as the cluster said
        self.min_isr: dict[str, int] = {}  # topic -> as the cluster said

    @property
    def flags_given(self) -> bool:
        """Both flags given: nothing the cluster says is used."""
        return self.flag_lag_time_max_ms is not None and self.flag_min_isr is not None

    def lag_for(self, leader: int) -> int | None:
        if self.flag_lag_time_max_ms is not None:
            return self.flag_lag_time_max_ms
        return self.lag_time_max_ms.get(leader)

    def min_isr_for(self, topic: str) -> int | None:
        return self.flag_min_isr if self.flag_min_isr is not None else self.min_isr.get(topic)


class ReplicaTracker:
    def __init__(
        self,
        lag_time_max_ms: int | None = None,
        min_isr: int | None = None,
        settings: PartitionSettings | None = None,
    ) -> None:
        self.settings = settings or PartitionSettings(lag_time_max_ms, min_isr)
        # (topic, partition, follower) -> (t_ms, leo, leader_leo) of the newest observation whose leader answered
        self._prev: dict[tuple[str, int, int], tuple[int, int | None, int]] = {}
        # followers whose first observation after a leader's silence was held back (once)
        self._held: set[tuple[str, int, int]] = set()
        # (topic, partition, follower) -> t_ms of its newest observation
        self._last_t: dict[tuple[str, int, int], int] = {}
        self._isr: dict[tuple[str, int], tuple[int, ...]] = {}
        # every replica (leaders too) of the newest fresh metadata that listed partitions
        self._listed: set[RKey] = set()
        # replicas missing from it: (first round's t_ms, rounds missing)
        self._missing: dict[RKey, tuple[int, int]] = {}
        # replicas observed as followers, until said gone (a topic deleted and created again
        # keeps them through the rounds it is missing from the metadata); bounded by the
        # cluster's replicas
        self._followers: set[RKey] = set()

    def observe(self, snap: Snapshot) -> RoundResult:
        observations: list[Observation] = []
        changes: list[IsrChange] = []
        seen: set[tuple[str, int, int]] = set()
        live: set[tuple[str, int]] = set()
        held = 0
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
                self._followers.add(rkey)
                leo = snap.leo.get((follower, ps.topic, ps.partition))
                last_t = self._last_t.get(rkey, -1)
                if last_t >= snap.t_ms:
                    continue  # no new answer since the last round: nothing new to say
                self._last_t[rkey] = snap.t_ms
                prev = self._prev.get(rkey)
                if prev is not None and leader_leo is not None and leader_leo < prev[2]:
                    prev = None  # the leader's log went backwards: nothing to compare against
                if self._hold_after_silence(rkey, last_t, leo, leader_leo, prev):
                    held += 1
                    continue
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
                        lag_time_max_ms=self.settings.lag_for(ps.leader),
                        min_isr=self.settings.min_isr_for(ps.topic),
                        leader_epoch=ps.leader_epoch if ps.leader_epoch >= 0 else None,
                    )
                )
                if leader_leo is not None:
                    self._prev[rkey] = (snap.t_ms, leo, leader_leo)
        # forget replicas and partitions that are gone (topic deleted, reassigned)
        for rkey in set(self._last_t) - seen:
            del self._last_t[rkey]
            self._prev.pop(rkey, None)
            self._held.discard(rkey)
        for key in set(self._isr) - live:
            del self._isr[key]
        return RoundResult(observations, changes, self._gone(snap) + self._sole_leaders(snap), held)

    def _hold_after_silence(
        self,
        rkey: tuple[str, int, int],
        last_t: int,
        leo: int | None,
        leader_leo: int | None,
        prev: tuple[int, int | None, int] | None,
    ) -> bool:
        """Whether to leave out this round's observation of a follower: the first round its
        leader answers after a silence, when the follower is still below the leader LEO of
        before the silence (see the module's docstring). At most once in a row: the next
        observation with the leader's answer goes out, so a follower really stuck is
        observed one round later, never hidden. ``last_t``: the follower's previous observation;
        newer than ``prev`` (the previous one at which its leader answered) when the leader was
        silent then, or that observation was held."""
        if leader_leo is None:
            return False
        after_silence = prev is not None and last_t > prev[0]
        behind = prev is not None and leo is not None and leo < prev[2]
        if after_silence and behind and rkey not in self._held:
            self._held.add(rkey)
            return True
        self._held.discard(rkey)
        return False

    def _sole_leaders(self, snap: Snapshot) -> list[GoneReplica]:
        """The followers of earlier rounds that fresh metadata now shows as the only replica,
        and leader, of their partition (see the module's docstring)."""
        if not snap.metadata_fresh:
            return []
        sole = []
        for ps in snap.partitions:
            if len(ps.replicas) != 1 or ps.replicas[0] != ps.leader:
                continue
            rkey = (ps.topic, ps.partition, ps.leader)
            if rkey in self._followers:
                self._followers.discard(rkey)
                sole.append(GoneReplica(snap.t_ms, *rkey))
        return sole

    def _gone(self, snap: Snapshot) -> list[GoneReplica]:
        """The replicas found gone this round (see the module's docstring)."""
        if not snap.metadata_fresh or not snap.partitions:
            return []
        listed = {(ps.topic, ps.partition, b) for ps in snap.partitions for b in ps.replicas}
        for rkey in [k for k in self._missing if k in listed]:
            del self._missing[rkey]  # listed again
        gone = []
        for rkey in sorted(self._listed - listed):
            since, rounds = self._missing.get(rkey, (snap.t_ms, 0))
            if rounds + 1 >= GONE_AFTER_ROUNDS and snap.t_ms - since >= GONE_AFTER_MS:
                gone.append(GoneReplica(snap.t_ms, *rkey))
                del self._missing[rkey]
                self._followers.discard(rkey)
            else:
                self._missing[rkey] = (since, rounds + 1)
        self._listed = listed | set(self._missing)
        return gone
