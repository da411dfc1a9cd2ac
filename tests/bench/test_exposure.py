"""Smoke test: the exposure benchmark serves a small filled store through the real
exporter and prints its line (no timing asserted)."""

from __future__ import annotations

import pytest

from bench import exposure


@pytest.mark.integration
def test_exposure_runs_on_a_tiny_fleet(capsys: pytest.CaptureFixture[str]) -> None:
    out = exposure.main(["--replicas", "400,2000", "--large", "2000", "--top", "3"])
    text = capsys.readouterr().out
    assert "command:" in text and "nproc:" in text and "pyspark:" in text
    small, full, not_ok, top, at_risk = out
    assert small.replicas == 400 and "replicas=400 replica_series='all'" in text
    # every replica has its per-replica families: at least 9 series each
    assert small.series >= 9 * 400
    assert full.series > small.series
    # cardinality control: only the 0.5% not-ok replicas keep per-replica series, top caps them further
    assert top.series < not_ok.series < full.series
    assert full.bytes > not_ok.bytes > top.bytes > 0
    # and --partition-series at-risk leaves only the partitions of those replicas
    assert at_risk.mode == "not-ok partition_series=at-risk"
    assert at_risk.series < not_ok.series
