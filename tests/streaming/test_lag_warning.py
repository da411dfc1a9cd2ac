"""The job's warning that the brokers' replica.lag.time.max.ms is not its own (unit: the
driver's log line alone; the evidence is isrwatch.outcomes', tests/isrwatch/test_outcomes.py)."""

from __future__ import annotations

import logging
from types import SimpleNamespace

from isrwatch.outcomes import LagEvidence
from streaming.driver.rare import RareRows


def _warn(rare: SimpleNamespace, found: LagEvidence) -> None:
    RareRows._warn_lag_time(rare, found)  # type: ignore[arg-type]


def test_each_direction_is_reported_once_per_period_and_per_cluster(caplog) -> None:
    caplog.set_level(logging.WARNING, logger="streaming.job")
    handler = SimpleNamespace(_lag_warned={})
    shorter = LagEvidence("c1", "shorter", ("c1", "orders", 0, 3), 2, 30_000, 12_100, 50_000)
    _warn(handler, shorter)
    _warn(handler, shorter._replace(replica=("c1", "orders", 1, 3)))  # the same cluster and direction: held
    _warn(handler, shorter._replace(direction="longer", behind_ms=65_000))
    _warn(handler, shorter._replace(cluster="c2"))
    lines = [r.getMessage() for r in caplog.records if "event=lag_time_max_ms_mismatch" in r.getMessage()]
    assert len(lines) == 3, lines
    assert lines[0] == (
        "event=lag_time_max_ms_mismatch cluster=c1 direction=shorter "
        'evidence="broker 2 dropped follower orders-0/3 12.1 s after its last catch-up; '
        'isrwatch uses replica.lag.time.max.ms=30000" '
        "hint=\"the brokers' replica.lag.time.max.ms is shorter than 30000: set the job's --lag-time-max-ms "
        "and the collector's --lag-time-max-ms to it (docs/kafka.md)\""
    )
    assert "direction=longer" in lines[1] and "kept follower orders-0/3 in the ISR 65.0 s" in lines[1]
    assert "cluster=c2" in lines[2]
