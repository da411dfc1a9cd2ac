"""The named scenarios: a produce profile plus the faults to inject.

Times are relative to the start. Faults aim at broker 1's partitions: the
fault follower is the last replica of the first partition broker 1 leads
(broker 3 in the default 3-broker cluster).
"""

from __future__ import annotations

from dataclasses import dataclass

from simulator.cluster import ClusterSpec, build_partitions
from simulator.faults import BrokerPause, Fault, FetcherSlowdown, FetcherStall, FollowerBootstrap
from simulator.profiles import BURST, LOW_VOLUME, STEADY, ProduceProfile
from simulator.settings import SCENARIOS

__all__ = ["Scenario", "build_scenario", "SCENARIOS", "FAULT_START_MS"]

FAULT_START_MS = 10_000
PAUSED_BROKER = 2
PAUSE_END_MS = 40_000
BOOTSTRAP_BACKLOG = 400_000
SLOW_FRACTION = 0.6  # the slow fetcher moves 60% of what is produced for it


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


def build_scenario(name: str, spec: ClusterSpec, lag_time_max_ms: int = 10_000) -> Scenario:
    if name not in SCENARIOS:
        raise ValueError(f"scenario={name!r} is not one of: {', '.join(SCENARIOS)}")
    if name == "steady":
        return Scenario(name, "steady high volume; followers keep up", STEADY)
    if name == "burst":
        return Scenario(name, "light traffic with large batches every 20 s; followers absorb them in ~1 s", BURST)
    if name == "low-volume":
        return Scenario(name, "a message every few seconds and long idle stretches", LOW_VOLUME)
    end = fault_end_ms(lag_time_max_ms)
    if name == "stuck-follower":
        follower, leader = _fault_pair(spec)
        return Scenario(
            name,
            f"broker {follower}'s fetcher from broker {leader} stops at {FAULT_START_MS // 1000} s, "
            f"resumes at {end // 1000} s; the broker stays up",
            STEADY,
            (FetcherStall(follower, leader, FAULT_START_MS, end),),
        )
    if name == "slow-follower":
        follower, leader = _fault_pair(spec)
        n = sum(1 for p in build_partitions(spec, 0) if p.replicas[0] == leader and follower in p.replicas[1:])
        bandwidth = SLOW_FRACTION * n * STEADY.rate_per_s / 1000.0
        return Scenario(
            name,
            f"broker {follower}'s fetcher from broker {leader} moves {SLOW_FRACTION:.0%} of the produce rate "
            f"from {FAULT_START_MS // 1000} s to {end // 1000} s",
            STEADY,
            (FetcherSlowdown(follower, leader, FAULT_START_MS, end, bandwidth),),
        )
    if name == "bootstrapping-follower":
        follower, _ = _fault_pair(spec)
        return Scenario(
            name,
            f"broker {follower} starts {BOOTSTRAP_BACKLOG} messages behind, outside the ISR, and catches up",
            STEADY,
            (FollowerBootstrap(follower, BOOTSTRAP_BACKLOG),),
        )
    # broker-pause
    broker = min(PAUSED_BROKER, spec.brokers)
    return Scenario(
        name,
        f"broker {broker} pauses from {FAULT_START_MS // 1000} s to {PAUSE_END_MS // 1000} s, past its "
        f"{spec.session_timeout_ms // 1000} s session: the controller moves its leaderships",
        STEADY,
        (BrokerPause(broker, FAULT_START_MS, PAUSE_END_MS),),
    )
