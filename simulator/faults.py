"""Faults a scenario injects into the simulated cluster, at times relative to the start."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from simulator.model import Engine

__all__ = [
    "Fault",
    "BrokerPause",
    "FetcherStall",
    "FetcherSlowdown",
    "FollowerBootstrap",
    "EpochPerIsrChange",
    "AtLeaderCheck",
]


@dataclass(frozen=True)
class BrokerPause:
    """A broker stops dead (SIGSTOP, long GC): no fetches, no answers, no checks."""

    broker: int
    at_ms: int
    until_ms: int | None = None

    def install(self, engine: Engine) -> None:
        engine.at(self.at_ms, engine.pause_broker, self.broker)
        if self.until_ms is not None:
            engine.at(self.until_ms, engine.resume_broker, self.broker)


@dataclass(frozen=True)
class FetcherStall:
    """One replica fetcher (follower broker <- leader broker) stops sending fetches.

    The follower broker stays registered and answers offset queries: only
    this fetcher's partitions fall behind.
    """

    follower: int
    leader: int
    at_ms: int
    until_ms: int | None = None

    def install(self, engine: Engine) -> None:
        engine.at(self.at_ms, engine.stall_fetcher, self.follower, self.leader, True)
        if self.until_ms is not None:
            engine.at(self.until_ms, engine.stall_fetcher, self.follower, self.leader, False)


@dataclass(frozen=True)
class FetcherSlowdown:
    """One replica fetcher moves only ``bandwidth`` messages per ms (slow disk or link)."""

    follower: int
    leader: int
    at_ms: int
    until_ms: int | None
    bandwidth: float

    def install(self, engine: Engine) -> None:
        engine.at(self.at_ms, engine.set_bandwidth, self.follower, self.leader, self.bandwidth)
        if self.until_ms is not None:
            engine.at(self.until_ms, engine.set_bandwidth, self.follower, self.leader, None)


@dataclass(frozen=True)
class FollowerBootstrap:
    """A broker starts with empty replicas of the partitions it follows, outside their ISR.

    The leaders already hold ``backlog`` messages; the follower copies them
    and rejoins each ISR when it reaches the high watermark.
    """

    follower: int
    backlog: int

    def install(self, engine: Engine) -> None:
        engine.bootstrap_follower(self.follower, self.backlog)


@dataclass(frozen=True)
class EpochPerIsrChange:
    """Not a fault: the cluster bumps a partition's leader epoch on every ISR change, as KRaft
    does before metadata.version 3.6-IV0, and its leaders restart their in-sync followers'
    clocks each time (``Engine._bump_epoch``). Its telemetry carries the epoch."""

    def install(self, engine: Engine) -> None:
        engine.epoch_per_isr_change = True


@dataclass(frozen=True)
class AtLeaderCheck:
    """``faults`` with their times counted from ``leader``'s first ISR check at or after
    ``after_ms`` (its phase is random): for a story that needs to know when the leader
    looks. ``at_ms`` and ``until_ms`` of each may be negative (before that check)."""

    leader: int
    after_ms: int
    faults: tuple[BrokerPause | FetcherStall | FetcherSlowdown, ...]

    def install(self, engine: Engine) -> None:
        engine.at(0, self._arm, engine)  # runs once the engine has started: the phases are drawn

    def _arm(self, engine: Engine) -> None:
        check = engine.next_check_ms(self.leader, self.after_ms)
        for f in self.faults:
            until = None if f.until_ms is None else f.until_ms + check
            replace(f, at_ms=f.at_ms + check, until_ms=until).install(engine)


Fault = BrokerPause | FetcherStall | FetcherSlowdown | FollowerBootstrap | EpochPerIsrChange | AtLeaderCheck
