"""Smoke test: the scale benchmark runs the real job over a small fleet on the real Kafka and
reports every batch's parts and the memory (no timing asserted: only that each figure is
there and adds up)."""

from __future__ import annotations

from typing import Any

import pytest

from bench import scale


# make campaign (~15 s): a benchmark's smoke run; make bench-quick and make bench run the script itself.
@pytest.mark.campaign
@pytest.mark.integration
@pytest.mark.spark
def test_scale_reports_each_batch_its_parts_and_the_memory(kafka_cluster: Any, bench_spark: Any) -> None:
    # 1,000 replicas observed every 2 s at a 1 s trigger: 500 observations a batch.
    out = scale.scale(bench_spark, kafka_cluster, 1000, batch_obs=500, batches=2)
    batches = out["batches"]
    assert out["batch_obs"] == 500 and len(batches) >= 3
    for b in batches:
        assert b["observations"] == 500, f"a batch other than 500 observations: {batches}"
        assert b["replicas"] == 500, f"half the fleet a batch, each replica once: {batches}"
        assert b["spark_ms"] > 0 and b["state_ms"] > 0
        assert b["python_ms"] == b["driver_ms"] - b["spark_ms"] - b["state_ms"] >= 0
    memory = out["memory"]
    assert memory["driver_python_peak_rss_mb"] >= memory["driver_python_rss_mb"] > 0
    assert memory["driver_python_rss_before_job_mb"] > 0 and memory["driver_jvm_rss_mb"] > 0
    assert memory["state_table_mb"] > 0
