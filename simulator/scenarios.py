"""The named scenarios: a produce profile plus the faults to inject.

Times are relative to the start. Faults aim at broker 1's partitions: the
fault follower is the last replica of the first partition broker 1 leads
(broker 3 in the default 3-broker cluster).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from simulator.cluster import ClusterSpec, build_partitions
from simulator.faults import (
    AtLeaderCheck,
    BrokerPause,
    EpochPerIsrChange,
    Fault,
    FetcherSlowdown,
    FetcherStall,
    FollowerBootstrap,
)
from simulator.profiles import BURST, LOW_VOLUME, STEADY, ProduceProfile
from simulator.settings import SCENARIOS

__all__ = ["Scenario", "build_scenario", "SCENARIOS", "FAULT_START_MS"]

FAULT_START_MS = 10_000
PAUSED_BROKER = 2
PAUSE_END_MS = 40_000
BOOTSTRAP_BACKLOG = 400_000
SLOW_FRACTION = 0.6  # the slow fetcher moves 60% of what is produced for it
FETCHER_LOAD = 0.2  # healthy fetchers use at most this share of their bandwidth
BURST_ABSORB_MS = 1000  # and copy a burst in about a second
# leader-epoch-bump, in ms from the leader's check that drops the stopped follower (at or
# after FAULT_START_MS + EPOCH_STOP_BEFORE_MS): the stopped follower's fetcher stops this long
# before it and resumes after; the slow one moves EPOCH_SLOW_FRACTION of what is produced
# for it over (EPOCH_SLOW_FROM_MS, EPOCH_SLOW_UNTIL_MS).
EPOCH_STOP_BEFORE_MS = 11_000
EPOCH_STOP_UNTIL_MS = 20_000
EPOCH_SLOW_FROM_MS = -6_500
EPOCH_SLOW_UNTIL_MS = 5_000
EPOCH_SLOW_FRACTION = 0.5


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    profile: ProduceProfile
    faults: tuple[Fault, ...] = ()


def _fault_pair(spec: ClusterSpec) -> tuple[int, int]:
    """(follower, leader) of the fetcher the follower faults hit."""
    if spec.replication_factor < 2:
        raise ValueError("this scenario needs replication_factor >= 2")
    first = build_partitions(spec, 0)[0]
    return first.replicas[-1], first.replicas[0]


def fault_end_ms(lag_time_max_ms: int) -> int:
    """When a follower fault ends: long enough for the shrink to happen (~45 s at 10 s)."""
    return FAULT_START_MS + max(35_000, 3 * lag_time_max_ms + 5_000)


def fit_profile(profile: ProduceProfile, spec: ClusterSpec) -> ProduceProfile:
    """Scale the load down to what the cluster's fetchers carry with ease (benchmark sizes).

    The busiest replica fetcher may use at most ``FETCHER_LOAD`` of its
    bandwidth for the steady rate, and copy one burst in ``BURST_ABSORB_MS``.
    The default 3-broker cluster is left as is.
    """
    per_fetcher: dict[tuple[int, int], int] = {}
    for p in build_partitions(spec, 0):
        for r in p.replicas[1:]:
            per_fetcher[(r, p.replicas[0])] = per_fetcher.get((r, p.replicas[0]), 0) + 1
    busiest = max(per_fetcher.values(), default=0)
    rate, burst = profile.rate_per_s, profile.burst_messages
    load = busiest * rate / 1000.0  # messages per ms
    if load > FETCHER_LOAD * spec.fetch_bandwidth:
        rate *= FETCHER_LOAD * spec.fetch_bandwidth / load
    absorb_ms = busiest * burst / spec.fetch_bandwidth
    if absorb_ms > BURST_ABSORB_MS:
        burst = round(burst * BURST_ABSORB_MS / absorb_ms)
    if (rate, burst) == (profile.rate_per_s, profile.burst_messages):
        return profile
    return replace(profile, rate_per_s=rate, burst_messages=burst)


def build_scenario(name: str, spec: ClusterSpec, lag_time_max_ms: int = 10_000) -> Scenario:
    """The scenario ``name`` for a cluster of shape ``spec``."""
    if name not in SCENARIOS:
        raise ValueError(f"scenario={name!r} is not one of: {', '.join(SCENARIOS)}")
    steady = fit_profile(STEADY, spec)
    if name == "steady":
        return Scenario(name, "steady high volume; followers keep up", steady)
    if name == "burst":
        return Scenario(
            name, "light traffic with large batches every 20 s; followers absorb them in ~1 s", fit_profile(BURST, spec)
        )
    if name == "low-volume":
        return Scenario(name, "a message every few seconds and long idle stretches", LOW_VOLUME)
    end = fault_end_ms(lag_time_max_ms)
    if name == "stuck-follower":
        follower, leader = _fault_pair(spec)
        return Scenario(
            name,
            f"broker {follower}'s fetcher from broker {leader} stops at {FAULT_START_MS // 1000} s, "
            f"resumes at {end // 1000} s; the broker stays up",
            steady,
            (FetcherStall(follower, leader, FAULT_START_MS, end),),
        )
    if name == "slow-follower":
        follower, leader = _fault_pair(spec)
        n = sum(1 for p in build_partitions(spec, 0) if p.replicas[0] == leader and follower in p.replicas[1:])
        bandwidth = SLOW_FRACTION * n * steady.rate_per_s / 1000.0
        return Scenario(
            name,
            f"broker {follower}'s fetcher from broker {leader} moves {SLOW_FRACTION:.0%} of the produce rate "
            f"from {FAULT_START_MS // 1000} s to {end // 1000} s",
            steady,
            (FetcherSlowdown(follower, leader, FAULT_START_MS, end, bandwidth),),
        )
    if name == "bootstrapping-follower":
        follower, _ = _fault_pair(spec)
        return Scenario(
            name,
            f"broker {follower} starts {BOOTSTRAP_BACKLOG} messages behind, outside the ISR, and catches up",
            steady,
            (FollowerBootstrap(follower, BOOTSTRAP_BACKLOG),),
        )
    if name == "leader-epoch-bump":
        return _leader_epoch_bump(spec, steady)
    # broker-pause
    broker = min(PAUSED_BROKER, spec.brokers)
    return Scenario(
        name,
        f"broker {broker} pauses from {FAULT_START_MS // 1000} s to {PAUSE_END_MS // 1000} s, past its "
        f"{spec.session_timeout_ms // 1000} s session: the controller moves its leaderships",
        steady,
        (BrokerPause(broker, FAULT_START_MS, PAUSE_END_MS),),
    )


def _leader_epoch_bump(spec: ClusterSpec, steady: ProduceProfile) -> Scenario:
    """A cluster that bumps the leader epoch on every ISR change (KRaft before
    metadata.version 3.6-IV0). The fault follower stops fetching and its leader drops it at
    a check; the partitions' other follower, slow since a few seconds before that check, is
    past half its lag window then, and the bump the drop makes restarts its clock: the
    broker keeps it, and so must the monitor (it is out of sync without the reset)."""
    stopped, leader = _fault_pair(spec)
    first = build_partitions(spec, 0)[0]
    if spec.replication_factor < 3:
        raise ValueError("this scenario needs replication_factor >= 3")
    slow = first.replicas[1]
    n = sum(1 for p in build_partitions(spec, 0) if p.replicas[0] == leader and slow in p.replicas[1:])
    bandwidth = EPOCH_SLOW_FRACTION * n * steady.rate_per_s / 1000.0
    after = FAULT_START_MS + EPOCH_STOP_BEFORE_MS
    return Scenario(
        "leader-epoch-bump",
        f"every ISR change bumps the leader epoch (KRaft before metadata.version 3.6-IV0); broker "
        f"{stopped}'s fetcher from broker {leader} stops {EPOCH_STOP_BEFORE_MS // 1000} s before the "
        f"leader's check that drops it (its first at or after {after // 1000} s); broker {slow}, slow "
        f"from {-EPOCH_SLOW_FROM_MS / 1000:g} s before that check, is kept by the bump it makes",
        steady,
        (
            EpochPerIsrChange(),
            AtLeaderCheck(
                leader,
                after,
                (
                    FetcherStall(stopped, leader, -EPOCH_STOP_BEFORE_MS, EPOCH_STOP_UNTIL_MS),
                    FetcherSlowdown(slow, leader, EPOCH_SLOW_FROM_MS, EPOCH_SLOW_UNTIL_MS, bandwidth),
                ),
            ),
        ),
    )
