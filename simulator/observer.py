"""Telemetry from the simulated cluster, in the format of ``isrwatch.telemetry``.

Two ways to watch:

* ``PollObserver`` ("poll" mode, what the collector does): every interval,
  one observation per follower replica with the follower's LEO and its
  leader's LEO at that instant (None for a paused broker), and the previous
  observation of the same replica as ``prev_*``.
* ``FetchObserver`` ("fetch" mode): one observation per fetch a leader
  serves, with the fetch offset, the leader LEO before the read and the
  previous fetch as the leader saw them: exactly what the broker's rule sees.

Either way each emission round also carries the true ISR changes made since
the previous round. Observations are built as plain dicts in the field order
of ``isrwatch.telemetry.Observation`` and encoded with one ``json.dumps``
per record, so the bytes equal ``encode_record`` of the same record.
"""

from __future__ import annotations

import json
from typing import Any

from isrwatch.rule import FollowerState
from isrwatch.telemetry import VERSION, observation_fields
from simulator.cluster import Partition
from simulator.model import Engine
from simulator.settings import MODES
from simulator.truth import TrueChange

__all__ = ["PollObserver", "FetchObserver", "encode_round", "MODES"]


Obs = dict[str, Any]


class PollObserver:
    source = "simulator"

    def __init__(self, engine: Engine, lag_time_max_ms: int) -> None:
        self.engine = engine
        self.lag_time_max_ms = lag_time_max_ms
        self._prev: dict[tuple[str, int, int], tuple[int, int | None, int | None]] = {}

    def observations(self, now: int) -> list[Obs]:
        engine, prev_map = self.engine, self._prev
        min_isr, lag = engine.spec.min_isr, self.lag_time_max_ms
        epochs = engine.epoch_per_isr_change  # a cluster whose metadata gives the epoch
        out = []
        for p in engine.partitions:
            leader = p.leader
            if leader is None:
                continue
            leader_up = not engine.is_paused(leader)
            leader_leo = p.leo[leader] if leader_up else None
            hw = p.hw if leader_up else None
            isr, replicas = list(p.isr), list(p.replicas)
            for r in p.replicas:
                if r == leader:
                    continue
                leo = None if engine.is_paused(r) else p.leo[r]
                key = (p.topic, p.index, r)
                prev = prev_map.get(key)
                prev_map[key] = (now, leo, leader_leo)
                out.append(
                    {
                        "topic": p.topic,
                        "partition": p.index,
                        "broker_id": r,
                        "leader_id": leader,
                        "t_ms": now,
                        "leo": leo,
                        "leader_leo": leader_leo,
                        "hw": hw,
                        "prev_t_ms": prev[0] if prev else None,
                        "prev_leo": prev[1] if prev else None,
                        "prev_leader_leo": prev[2] if prev else None,
                        "isr": isr,
                        "replicas": replicas,
                        "lag_time_max_ms": lag,
                        "min_isr": min_isr,
                    }
                )
                if epochs:
                    out[-1]["leader_epoch"] = p.epoch
        return out


class FetchObserver:
    """Install as the engine's fetch hook; ``observations`` drains what was seen."""

    source = "simulator-fetch"

    def __init__(self, engine: Engine, lag_time_max_ms: int) -> None:
        self.engine = engine
        self.lag_time_max_ms = lag_time_max_ms
        self._buffer: list[Obs] = []
        engine.fetch_hook = self.on_fetch

    def on_fetch(
        self, p: Partition, follower: int, t_ms: int, offset: int, leader_leo: int, state: FollowerState
    ) -> None:
        seen_before = state.prev_fetch_ms is not None
        self._buffer.append(
            {
                "topic": p.topic,
                "partition": p.index,
                "broker_id": follower,
                "leader_id": p.leader,
                "t_ms": t_ms,
                "leo": offset,
                "leader_leo": leader_leo,
                "hw": p.hw,
                "prev_t_ms": state.prev_fetch_ms,
                "prev_leo": state.leo if seen_before else None,
                "prev_leader_leo": state.prev_leader_leo,
                "isr": list(p.isr),
                "replicas": list(p.replicas),
                "lag_time_max_ms": self.lag_time_max_ms,
                "min_isr": self.engine.spec.min_isr,
            }
        )
        if self.engine.epoch_per_isr_change:
            self._buffer[-1]["leader_epoch"] = p.epoch

    def observations(self, now: int) -> list[Obs]:
        out, self._buffer = self._buffer, []
        return out


def _change_dict(c: TrueChange) -> dict[str, Any]:
    return {
        "t_ms": c.t_ms,
        "topic": c.topic,
        "partition": c.partition,
        "isr_before": list(c.isr_before),
        "isr_after": list(c.isr_after),
    }


def encode_round(
    cluster: str,
    source: str,
    sent_ms: int,
    observations: list[Obs],
    changes: list[TrueChange],
    max_observations: int,
) -> list[bytes]:
    """One round as records of at most ``max_observations`` observations; changes ride in the first."""
    records = []
    isr_changes = [_change_dict(c) for c in changes]
    for i in range(0, max(1, len(observations)), max_observations):
        chunk = observations[i : i + max_observations]
        if not chunk and not isr_changes:
            break
        body: dict[str, Any] = {
            "version": VERSION,
            "cluster": cluster,
            "source": source,
            "sent_ms": sent_ms,
            **observation_fields(VERSION, chunk),
        }
        if isr_changes:
            body["isr_changes"] = isr_changes
            isr_changes = []
        records.append(json.dumps(body, separators=(",", ":")).encode())
    return records
