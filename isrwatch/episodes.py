"""The rule at every observation, in pure Python: the reference for the job.

``fold`` adds one observation to what is known about a replica (the
``ReplicaAggregate`` the job keeps); ``state_changes`` folds a replica's
observations in time order and evaluates it after each one, returning every
change of state (and of lag state) with the telemetry time it happened. The
streaming job computes the same in Spark (``streaming.evaluation.replicas``); tests hold
the two to each other. Pure Python, no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any

from isrwatch.rule import (
    Rule,
    RuleConfig,
    for_version,
    leader_change_caught_up_time,
    new_leadership,
    observed_caught_up_time,
    unseen_gap_caught_up_time,
)
from isrwatch.status import ReplicaAggregate, ReplicaStatus, State, Thresholds, evaluate

__all__ = ["fold", "Change", "walk", "state_changes"]


def _max(a: int | None, b: int | None) -> int | None:
    if a is None:
        return b
    return a if b is None else max(a, b)


def fold(
    agg: ReplicaAggregate | None, cluster: str, o: Mapping[str, Any], rule: Rule, max_gap_ms: int | None
) -> ReplicaAggregate:
    """``agg`` with observation ``o`` (a telemetry observation's fields) added.
    Observations are expected in time order; an older one only adds to the maxima."""
    t = int(o["t_ms"])
    leo, leader_leo, prev_leo = o.get("leo"), o.get("leader_leo"), o.get("prev_leo")
    prev_t, prev_leader_leo = o.get("prev_t_ms"), o.get("prev_leader_leo")
    # Against the replica's previous observation as folded so far (the newest), for
    # an observation newer than it (streaming.evaluation.replicas._history_exprs).
    before = agg if agg is not None and agg.last_t_ms < t else None
    unseen = False
    if before is not None and prev_t is None:  # the collector did not see it last round: the state did
        unseen = True
        prev_t, prev_leader_leo = before.last_t_ms, before.known_leader_leo
    cu = observed_caught_up_time(rule, t, leo, leader_leo, prev_t, prev_leader_leo, max_gap_ms)
    if unseen:
        cu = _max(cu, unseen_gap_caught_up_time(rule, t, leo, prev_t, max_gap_ms))
    if before is not None:
        isr = o.get("isr") or ()  # not reported: does not rule the follower out (as evaluate reads it)
        in_isr = not isr or int(o["broker_id"]) in isr
        changed = new_leadership(int(o["leader_id"]), before.leader_id, o.get("leader_epoch"), before.leader_epoch)
        cu = _max(cu, leader_change_caught_up_time(t, in_isr, changed, before.last_t_ms, max_gap_ms))
    progressed = leo is not None and (
        (prev_leo is not None and leo > prev_leo) or (leader_leo is not None and leo >= leader_leo)
    )
    newest = agg is None or t >= agg.last_t_ms
    latest: dict[str, Any] = (
        {
            "leader_id": int(o["leader_id"]),
            "leo": leo,
            "leader_leo": leader_leo,
            "hw": o.get("hw"),
            "isr": tuple(o.get("isr") or ()),
            "replicas": tuple(o.get("replicas") or ()),
            "lag_time_max_ms": o.get("lag_time_max_ms"),
            "min_isr": o.get("min_isr"),
            "leader_epoch": o.get("leader_epoch"),
            "kafka_version": o.get("kafka_version"),
        }
        if newest
        else {}
    )
    if agg is None:
        return ReplicaAggregate(
            cluster=cluster,
            topic=o["topic"],
            partition=int(o["partition"]),
            broker_id=int(o["broker_id"]),
            first_t_ms=t,
            last_t_ms=t,
            last_caught_up_ms=cu,
            last_answer_ms=t if leo is not None else None,
            last_leader_answer_ms=t if leader_leo is not None else None,
            last_progress_ms=t if progressed else None,
            known_leo=leo,
            known_leader_leo=leader_leo,
            **latest,
        )
    fields = dict(agg.__dict__)
    fields.update(
        first_t_ms=min(agg.first_t_ms, t),
        last_t_ms=max(agg.last_t_ms, t),
        last_caught_up_ms=_max(agg.last_caught_up_ms, cu),
        last_answer_ms=_max(agg.last_answer_ms, t if leo is not None else None),
        last_leader_answer_ms=_max(agg.last_leader_answer_ms, t if leader_leo is not None else None),
        last_progress_ms=_max(agg.last_progress_ms, t if progressed else None),
        **latest,
    )
    if newest and leo is not None:
        fields["known_leo"] = leo
    if newest and leader_leo is not None:
        fields["known_leader_leo"] = leader_leo
    return ReplicaAggregate(**fields)


@dataclass(frozen=True)
class Change:
    """A replica's state changed at ``status.eval_ms`` (telemetry time)."""

    status: ReplicaStatus

    @property
    def key(self) -> tuple[str, str, int, int]:
        s = self.status
        return (s.cluster, s.topic, s.partition, s.broker_id)


def walk(
    observations: Iterable[tuple[str, Mapping[str, Any]]],
    cfg: RuleConfig,
    th: Thresholds,
    max_gap_ms: int | None,
) -> Iterator[tuple[Mapping[str, Any], ReplicaStatus]]:
    """Each observation of ``observations`` ((cluster, observation) pairs, any
    order) with its replica's status right after it: replica by replica, in
    time order. A status's ``out_of_sync_episodes`` counts the times the
    replica's lag state entered out_of_sync up to it (from ok)."""
    by_replica: dict[tuple[str, str, int, int], list[Mapping[str, Any]]] = {}
    for cluster, o in observations:
        by_replica.setdefault((cluster, o["topic"], int(o["partition"]), int(o["broker_id"])), []).append(o)
    for key, obs in by_replica.items():
        obs.sort(key=lambda o: (o["t_ms"], _nulls_first(o.get("leo")), _nulls_first(o.get("leader_leo"))))
        agg: ReplicaAggregate | None = None
        lag_before, episodes = State.OK, 0
        for o in obs:
            # --rule auto: the variant of the Kafka version the observation's record states
            agg = fold(agg, key[0], o, for_version(cfg, o.get("kafka_version")).rule, max_gap_ms)
            s = evaluate(agg, agg.last_t_ms, cfg, th)
            if s.lag_state is State.OUT_OF_SYNC and lag_before is not State.OUT_OF_SYNC:
                episodes += 1
            lag_before = s.lag_state or s.state
            yield o, replace(s, out_of_sync_episodes=episodes)


def state_changes(
    observations: Iterable[tuple[str, Mapping[str, Any]]],
    cfg: RuleConfig,
    th: Thresholds,
    max_gap_ms: int | None,
) -> list[Change]:
    """Every change of (state, lag state) of every replica over ``observations``
    ((cluster, observation) pairs, any order), starting from ok, in time order."""
    out = []
    before: dict[tuple[str, str, int, int], tuple[State, State]] = {}
    for _, s in walk(observations, cfg, th, max_gap_ms):
        change = Change(s)
        now = (s.state, s.lag_state or s.state)
        if now != before.get(change.key, (State.OK, State.OK)):
            out.append(change)
            before[change.key] = now
    out.sort(key=lambda c: (c.status.eval_ms, c.key))
    return out


def _nulls_first(v: int | None) -> tuple[int, int]:
    return (0, 0) if v is None else (1, v)
