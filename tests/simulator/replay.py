"""Test helpers: run a simulation and replay its telemetry through ``isrwatch.rule``."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from isrwatch.rule import Rule, observed_caught_up_time
from isrwatch.telemetry import Observation, decode_record
from simulator import Scenario, Simulation

START_MS = 1_700_000_000_000

Key = tuple[str, int, int]  # topic, partition, follower broker


def run(scenario: str | Scenario, duration_s: float, **options: object) -> tuple[Simulation, list[bytes]]:
    """The whole run: the simulation (for its truth) and every record it emitted."""
    options.setdefault("start_ms", START_MS)
    sim = Simulation(scenario, **options)  # type: ignore[arg-type]
    records = [r for _, batch in sim.rounds(duration_s) for r in batch]
    return sim, records


def observations(records: Iterable[bytes]) -> Iterator[Observation]:
    for r in records:
        yield from decode_record(r).observations


def key(o: Observation) -> Key:
    return (o.topic, o.partition, o.broker_id)


@dataclass
class RuleReplay:
    """What isrwatch derives from the telemetry: per replica, lastCaughtUpTimeMs over time.

    ``max_gap_ms``: the job's ``--observation-gap-ms`` (None: the broker's rule
    alone, ``isrwatch.rule.caught_up_time``). ``max_age_ms``: the age just before
    each observation; ``max_age_after_ms``: just after it, what a job batch
    ending at that observation reports."""

    rule: Rule = Rule.KIP16_REFINED
    max_gap_ms: int | None = None
    lcu: dict[Key, int] = field(default_factory=dict)
    max_age_ms: dict[Key, int] = field(default_factory=dict)
    max_age_after_ms: dict[Key, int] = field(default_factory=dict)

    def feed(self, obs: Iterable[Observation], until_ms: int | None = None) -> RuleReplay:
        for o in obs:
            if until_ms is not None and o.t_ms > until_ms:
                continue
            k = key(o)
            known = self.lcu.get(k)
            # Age just before this observation: how long since it was last seen caught up.
            if known is not None:
                self.max_age_ms[k] = max(self.max_age_ms.get(k, 0), o.t_ms - known)
            seen = observed_caught_up_time(
                self.rule, o.t_ms, o.leo, o.leader_leo, o.prev_t_ms, o.prev_leader_leo, self.max_gap_ms
            )
            if seen is not None and (known is None or seen > known):
                self.lcu[k] = seen
            if k in self.lcu:
                self.max_age_after_ms[k] = max(self.max_age_after_ms.get(k, 0), o.t_ms - self.lcu[k])
        return self
