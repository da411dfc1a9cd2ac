"""Smoke test: the per-stage benchmark runs the job's own stages on a tiny fleet in
the shared Spark session and reports each (no timing asserted: only that every stage
ran and the driver took each replica's newest row)."""

from __future__ import annotations

from typing import Any

import pytest

from bench import stages


@pytest.mark.integration
def test_stages_runs_every_stage_on_a_tiny_fleet(spark: Any, capsys: pytest.CaptureFixture[str]) -> None:
    out = stages.measure(spark, None, 300, 2, top=3, repeat=1)
    for stage in ("parse_s", "observations_s", "window_s", "spark_s", "driver_s", "state_write_s", "aggregate_s"):
        assert out[stage] > 0, stage
    assert out["observations"] == 600
    # a healthy fleet changes no state: the driver's rows are each replica's newest, once
    assert out["driver_rows"] == 300
    assert "apply_statuses" in capsys.readouterr().out  # the driver's profile is printed
