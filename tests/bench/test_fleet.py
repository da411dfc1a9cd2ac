"""bench.fleet's verdict from a run's batches (the run itself is ``make bench-fleet``)."""

from __future__ import annotations

from bench.fleet import ROUND_S, _one, failure_reason, summarize
from isrwatch.telemetry import VERSION

T0 = 1_000_000.0


def batch(end: float, lag_s: float, batch_ms: int = 900, driver_ms: int = 100) -> dict[str, float]:
    return {
        "wall": T0 + end,
        "batch_ms": batch_ms,
        "spark_ms": batch_ms - driver_ms,
        "state_topic_ms": 0,
        "state_ms": 0,
        "driver_ms": driver_ms,
        "observations": 5000,
        "lag_s": lag_s,
        "changes": 0,
    }


def run(batches, restarts=0):
    return summarize(100_000, batches, T0, 500.0, 560.0, 580.0, {"late_s": 0.1}, restarts)


def test_a_flat_lag_after_the_first_round_is_kept_up_and_warm_up_batches_do_not_count():
    warm = [batch(5, 4.0, batch_ms=9000, driver_ms=3000), batch(12, 7.0, batch_ms=7000, driver_ms=2000)]
    steady = [batch(ROUND_S + 2 + i, 1.5 + 0.1 * (i % 2), driver_ms=100 + i) for i in range(10)]
    r = run(warm + steady)
    assert r["kept_up"] and r["steady_batches"] == 10
    assert r["driver_s"] == 0.1045  # the median of the steady batches only
    assert r["driver_growth_mb"] == 60.0 and r["driver_peak_growth_mb"] == 80.0


def test_a_growing_lag_is_not_kept_up():
    steady = [batch(ROUND_S + 2 + 3 * i, 2.0 + 2.0 * i, batch_ms=3000) for i in range(6)]
    r = run(steady)
    assert not r["kept_up"] and r["lag_end_s"] - r["lag_start_s"] == 10.0


def test_a_failed_batch_or_too_few_batches_is_not_kept_up():
    steady = [batch(ROUND_S + 2 + i, 1.5) for i in range(5)]
    assert not run(steady, restarts=1)["kept_up"]
    one = run([batch(ROUND_S + 30, 50.0, batch_ms=55_000, driver_ms=16_000)])
    assert not one["kept_up"] and one["driver_s"] == 16.0


def test_nothing_after_the_first_round_measures_nothing():
    r = run([batch(5, 4.0)])
    assert r["steady_batches"] == 0 and r["driver_s"] is None and not r["kept_up"]


def test_a_dead_jvm_is_named_by_its_out_of_memory_line():
    log = "INFO batch 1\njava.lang.OutOfMemoryError: Java heap space\n\tat x\nTraceback ...\nPy4JError: gone\n"
    assert failure_reason(log, 1) == "java.lang.OutOfMemoryError: Java heap space"
    assert failure_reason("a\nPy4JError: gone\n\n", 1) == "Py4JError: gone"
    assert failure_reason("", -9) == "exit code -9"


def test_a_size_whose_process_fails_is_reported_not_kept_up_and_the_runs_go_on(tmp_path, capsys):
    # A real process of bench.fleet that fails (a fleet smaller than a round is refused):
    # the path a run takes when its JVM dies, without a job to kill.
    r = _one(ROUND_S - 1, VERSION, tmp_path)
    assert r["failed"] and "--replicas must be at least" in r["failed"]
    assert not r["kept_up"] and r["driver_s"] is None and r["steady_batches"] == 0
    assert "failed:" in capsys.readouterr().out


def test_the_medians_skip_runs_that_measured_nothing():
    from bench.machine import median_of_measured

    assert median_of_measured([0.4, None, 0.2, 0.3]) == 0.3
    assert median_of_measured([None, None]) is None
