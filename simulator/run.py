"""Running a simulation: emission rounds of encoded telemetry, the truth, and pacing.

``Simulation`` advances the model one emission interval at a time and
encodes what the observer saw; ``iter_records`` is the generator the
streaming job calls; ``feed_spool`` appends the rounds to a spool directory
in real time (or ``speed`` times faster).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import IO, Any

from isrwatch.logs import kv
from isrwatch.rule import Rule, RuleConfig
from isrwatch.spool import SpoolWriter
from simulator.cluster import ClusterSpec
from simulator.model import Engine
from simulator.observer import MODES, FetchObserver, PollObserver, encode_round
from simulator.profiles import ProduceProfile
from simulator.scenarios import Scenario, build_scenario
from simulator.truth import TrueChange, write_truth

__all__ = ["Simulation", "iter_records", "feed_spool", "now_ms"]

log = logging.getLogger(__name__)

MAX_OBSERVATIONS_PER_RECORD = 1000


def now_ms() -> int:
    return time.time_ns() // 1_000_000


class Simulation:
    """One simulated cluster running one scenario.

    ``spec`` sizes the cluster; ``brokers``, ``topics`` and ``partitions``
    (per topic) override its fields, for benchmark loads. ``profile``
    replaces the scenario's produce profile. ``truth`` lists every true ISR
    change so far.
    """

    def __init__(
        self,
        scenario: str | Scenario,
        *,
        seed: int = 1,
        lag_time_max_ms: int = 10_000,
        cluster: str = "sim",
        start_ms: int | None = None,
        interval_ms: int = 1000,
        mode: str = "poll",
        rule: Rule | str = Rule.KIP16_REFINED,
        lag_max_messages: int = 4000,
        spec: ClusterSpec | None = None,
        brokers: int | None = None,
        topics: int | None = None,
        partitions: int | None = None,
        profile: ProduceProfile | None = None,
        max_observations_per_record: int = MAX_OBSERVATIONS_PER_RECORD,
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"mode={mode!r} is not one of: {', '.join(MODES)}")
        if interval_ms < 1:
            raise ValueError(f"interval_ms={interval_ms} must be >= 1")
        base = spec or ClusterSpec()
        sizes: dict[str, Any] = {k: v for k, v in (("topics", topics), ("partitions", partitions)) if v}
        if brokers:  # replication factor 3, or all brokers when fewer
            sizes.update(brokers=brokers, replication_factor=min(base.replication_factor, brokers))
        self.spec = replace(base, **sizes)
        self.rule = RuleConfig(
            rule=Rule.parse(rule) if isinstance(rule, str) else rule,
            lag_time_max_ms=lag_time_max_ms,
            lag_max_messages=lag_max_messages,
        )
        if isinstance(scenario, str):
            scenario = build_scenario(scenario, self.spec, lag_time_max_ms)
        if profile is not None:
            scenario = replace(scenario, profile=profile)
        self.scenario = scenario
        self.cluster = cluster
        self.interval_ms = interval_ms
        self.mode = mode
        self.max_observations_per_record = max_observations_per_record
        self.start_ms = now_ms() if start_ms is None else start_ms
        self.engine = Engine(self.spec, self.rule, scenario.profile, seed=seed, start_ms=self.start_ms)
        self.observer: PollObserver | FetchObserver = (
            PollObserver(self.engine, lag_time_max_ms)
            if mode == "poll"
            else FetchObserver(self.engine, lag_time_max_ms)
        )
        for fault in scenario.faults:
            fault.install(self.engine)
        self.engine.start()
        self._emitted_changes = 0
        self._next_ms = self.start_ms
        self.records = 0
        self.observations = 0

    @property
    def truth(self) -> list[TrueChange]:
        return self.engine.changes

    @property
    def now_ms(self) -> int:
        return self.engine.now

    def step(self) -> tuple[int, list[bytes]]:
        """Run to the next emission time; return (that time, its encoded records)."""
        t = self._next_ms
        self._next_ms += self.interval_ms
        self.engine.run_until(t)
        changes = self.engine.changes[self._emitted_changes :]
        self._emitted_changes = len(self.engine.changes)
        obs = self.observer.observations(t)
        records = encode_round(self.cluster, self.observer.source, t, obs, changes, self.max_observations_per_record)
        self.records += len(records)
        self.observations += len(obs)
        return t, records

    def rounds(self, duration_s: float | None = None) -> Iterator[tuple[int, list[bytes]]]:
        """Emission rounds from the start (t = start) until ``duration_s`` (None: forever)."""
        end = None if duration_s is None else self.start_ms + round(duration_s * 1000)
        while end is None or self._next_ms <= end:
            yield self.step()


def iter_records(
    scenario: str,
    *,
    seed: int = 1,
    lag_time_max_ms: int = 10_000,
    cluster: str = "sim",
    start_ms: int | None = None,
    duration_s: float | None = None,
    interval_ms: int = 1000,
    truth: list[TrueChange] | None = None,
    **options: Any,
) -> Iterator[tuple[int, list[bytes]]]:
    """Yield (simulated time ms, encoded telemetry records) per emission round.

    ``truth``, when given, receives every true ISR change as it happens.
    Other keyword options go to ``Simulation`` (``mode``, ``brokers``,
    ``partitions``, ``rule``...).
    """
    sim = Simulation(
        scenario,
        seed=seed,
        lag_time_max_ms=lag_time_max_ms,
        cluster=cluster,
        start_ms=start_ms,
        interval_ms=interval_ms,
        **options,
    )
    seen = 0
    for t, records in sim.rounds(duration_s):
        if truth is not None:
            truth.extend(sim.truth[seen:])
            seen = len(sim.truth)
        yield t, records


class Pacer:
    """Waits until a simulated time is due on the wall clock, at ``speed`` x real time."""

    def __init__(self, start_ms: int, speed: float, stop_event: threading.Event | None = None) -> None:
        if speed <= 0:
            raise ValueError(f"speed={speed} must be > 0")
        self.start_ms = start_ms
        self.speed = speed
        self.stop_event = stop_event or threading.Event()
        self._wall0 = time.monotonic()

    def wait_for(self, t_ms: int) -> bool:
        """Sleep until ``t_ms`` is due; False when stopped meanwhile."""
        due = (t_ms - self.start_ms) / 1000.0 / self.speed
        delay = due - (time.monotonic() - self._wall0)
        if delay > 0:
            return not self.stop_event.wait(delay)
        return not self.stop_event.is_set()


def feed_spool(
    path: str | Path,
    scenario: str,
    speed: float = 1.0,
    *,
    seed: int = 1,
    lag_time_max_ms: int = 10_000,
    cluster: str = "sim",
    duration_s: float | None = None,
    interval_ms: int = 1000,
    stop_event: threading.Event | None = None,
    truth_file: IO[str] | None = None,
    start_ms: int | None = None,
    **options: Any,
) -> Simulation:
    """Append the simulation's rounds to the spool at ``path``, paced at ``speed`` x real time.

    Runs until ``duration_s`` of simulated time (None: until ``stop_event``
    is set). True ISR changes go to ``truth_file`` as JSON lines. Returns the
    finished simulation (its ``truth``, ``records``, ``observations``).
    """
    writer = SpoolWriter(path)
    sim = Simulation(
        scenario,
        seed=seed,
        lag_time_max_ms=lag_time_max_ms,
        cluster=cluster,
        start_ms=start_ms,
        interval_ms=interval_ms,
        **options,
    )
    pacer = Pacer(sim.start_ms, speed, stop_event)
    log.info(
        "feeding spool %s",
        kv(path=str(path), scenario=sim.scenario.name, speed=speed, seed=seed, mode=sim.mode),
    )
    written_truth = 0
    for t, records in sim.rounds(duration_s):
        if not pacer.wait_for(t):
            break
        writer.append(records)
        if truth_file is not None:
            write_truth(truth_file, sim.truth[written_truth:])
            written_truth = len(sim.truth)
    log.info("spool fed %s", kv(path=str(path), records=sim.records, end_offset=writer.end))
    return sim
