"""Smoke test: the per-stage benchmark runs the job's own stages on a tiny fleet and
reports each (no timing asserted: only that every stage ran and the driver took each
replica's newest row)."""

from __future__ import annotations

import pytest
from pyspark.sql import SparkSession

from bench import stages


# make campaign (~12 s): a benchmark's smoke run; make bench-quick and make bench run the script itself.
@pytest.mark.campaign
@pytest.mark.integration
def test_stages_runs_every_stage_on_a_tiny_fleet(capsys: pytest.CaptureFixture[str]) -> None:
    # Not the shared `spark` fixture: created this early in the run, it would be the session
    # that later in-process jobs get from getOrCreate, and stop. The benchmark's own session
    # (built and stopped by its main) is used, or one another test left active, not stopped.
    shared = SparkSession.getActiveSession()
    if shared is not None:
        runs = [stages.measure(shared, None, 300, 2, top=3, repeat=1, version=v, calls=True) for v in (1, 3)]
    else:
        last = stages.main(
            ["--replicas", "300", "--rounds", "2", "--repeat", "1", "--no-kafka", "--versions", "1,3", "--calls"]
        )
        runs = [last]
    printed = capsys.readouterr().out
    for out in runs:
        for stage in ("parse_s", "observations_s", "window_s", "spark_s", "driver_s", "state_write_s", "aggregate_s"):
            assert out[stage] > 0, stage
        assert out["observations"] == 600
        # a healthy fleet changes no state: the driver's rows are each replica's newest, once
        assert out["driver_rows"] == 300
    assert runs[-1]["version"] == 3 and runs[-1]["bytes_per_obs"] < 150  # version 3: the columns
    assert "apply_statuses" in printed  # the driver's profile is printed
    # every DataFrame call of a batch by its line: the one Spark job is among them, and the calls
    # are most of the batch's Spark part (a small fleet's batch is its plan, not its data)
    assert "toArrow (streaming/evaluation/batch.py:" in printed and "select (streaming/evaluation/parse.py:" in printed
    assert 0 < runs[-1]["calls_ms"] <= runs[-1]["spark_s"] * 1000
    # ... split into building the plan and the one Spark job, both there
    assert runs[-1]["plan_ms"] > 0 and runs[-1]["job_ms"] > 0
    assert abs(runs[-1]["plan_ms"] + runs[-1]["job_ms"] - runs[-1]["calls_ms"]) < 1
    assert "of which building the plan" in printed
    from pyspark.sql.classic.dataframe import DataFrame

    assert not hasattr(DataFrame.select, "__wrapped__"), "the timed calls are PySpark's own again after"
