"""The job's warning about a cluster whose telemetry is stamped ahead of its clock (unit:
the handler's check alone; tests/e2e/test_clock_skew.py runs a real collector 30 s off)."""

from __future__ import annotations

import logging
import time
from types import SimpleNamespace

from streaming.lifecycle.handler import CLOCK_AHEAD_WARN_MS, BatchHandler


def _check(handler: SimpleNamespace, clusters: dict[str, int], wall_ms: int) -> None:
    BatchHandler._check_clocks(handler, clusters, wall_ms)  # type: ignore[arg-type]


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "telemetry_clock_ahead" in r.getMessage()]


def test_a_clock_ahead_is_reported_once_per_period_and_per_cluster(caplog) -> None:
    caplog.set_level(logging.WARNING, logger="streaming.job")
    handler = SimpleNamespace(future_tolerance_ms=300_000, _clock_warned={})
    wall = int(time.time() * 1000)
    _check(handler, {"a": wall + 30_000, "b": wall + CLOCK_AHEAD_WARN_MS}, wall)
    _check(handler, {"a": wall + 31_000}, wall + 1_000)
    warned = _warnings(caplog)
    assert len(warned) == 1, warned
    assert "cluster=a" in warned[0] and "ahead_s=30 " in warned[0]


def test_behind_or_a_simulator_faster_than_real_time_is_not_reported(caplog) -> None:
    caplog.set_level(logging.WARNING, logger="streaming.job")
    wall = int(time.time() * 1000)
    _check(SimpleNamespace(future_tolerance_ms=300_000, _clock_warned={}), {"a": wall - 30_000}, wall)
    _check(SimpleNamespace(future_tolerance_ms=None, _clock_warned={}), {"a": wall + 600_000}, wall)
    assert not _warnings(caplog)
