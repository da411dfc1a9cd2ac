"""Smoke test: the alert-latency benchmark runs both paths for real (the job into a real
Alertmanager; the exporter scraped by a real Prometheus evaluating the shipped rules into the
same Alertmanager) and reports a latency for every crossing on each (no timing asserted).

It went unnoticed for a while that the benchmark no longer started (the job's settings had
been split, its query renamed): this keeps it running."""

from __future__ import annotations

import math
from typing import Any

import pytest

from bench import latency


# make campaign (~40 s): a benchmark's smoke run; make bench-quick and make bench run the script itself.
@pytest.mark.campaign
@pytest.mark.integration
@pytest.mark.spark
def test_latency_reports_every_crossing_on_both_paths(kafka_cluster: Any, bench_spark: Any) -> None:
    # A 1 s scrape and evaluation (shipped: 5 s) and a short warm-up keep the test short.
    out = latency.run(
        crossings=2,
        replicas=200,
        warmup_s=8.0,
        prometheus_interval_s=1,
        spark=bench_spark,
        kafka=kafka_cluster,
    )
    assert out["crossings"] == 2
    for path in ("job", "rules"):
        assert out[path]["missed"] == 0, out[path]
        assert out[path]["n"] == 2 and len(out[path]["values"]) == 2
        assert all(math.isfinite(v) for v in out[path]["values"])
    assert out["job_batches"]["trigger_ms_p50"] > 0
    assert not bench_spark.sparkContext._jsc.sc().isStopped()  # the session it was given is left running
