"""Smoke test: the driver-memory benchmark feeds the real monitor and store and reports what
they hold per replica (no size asserted beyond "something per replica")."""

from __future__ import annotations

from bench import driver_memory


def test_driver_memory_reports_bytes_per_replica_and_sites() -> None:
    out = driver_memory.measure(2000, top=10)
    assert out["replicas"] == 2000
    assert out["bytes_per_replica"] > 100  # every replica's status is held
    assert len(out["sites"]) == 10 and all(per > 0 for _, per in out["sites"])
    # the monitor's own holdings among the largest sites (5th at 2,000 replicas in a process of its own)
    assert any(site.startswith("driver/monitor.py") for site, _ in out["sites"])
