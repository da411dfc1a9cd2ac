"""Smoke test: the held-replicas benchmark runs both ways at each size and checks they keep
the same rows (it raises if not). No timing asserted."""

from __future__ import annotations

import pytest

from bench import held_keys


def test_held_keys_are_the_fleets_own_and_as_many_as_asked() -> None:
    keys = held_keys.held_keys(1000, 30)
    assert len(keys) == 30
    assert all(k.startswith("fleet/t") and k.endswith("/2") for k in keys)


# make campaign, as the other benchmarks' smoke runs: make test keeps the two ways' equal rows
# (tests/streaming/test_evaluate.py, and the job's own path in tests/streaming/test_driver_replicas.py).
@pytest.mark.campaign
def test_held_keys_times_both_ways_on_a_small_fleet(bench_spark) -> None:
    out = held_keys.measure(bench_spark, 2000, [10, 300], repeat=1)
    assert set(out) == {10, 300}
    for secs in out.values():
        assert secs["literal"] > 0 and secs["table"] > 0
