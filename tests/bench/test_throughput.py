"""Smoke test: the throughput comparison behind ``make bench-quick`` and ``make bench`` runs
all its parts on the real Kafka and real Spark over a small fleet (the job end to end, its
second, warm pass, the plain consumer, the in-memory aggregation ceiling, the naive design)
and reports each, with the ratios the quick benchmark prints (no timing asserted: only that
each figure is there). The latency benchmark once stopped starting unnoticed; this keeps the
throughput one going."""

from __future__ import annotations

import math
import statistics
from typing import Any

import pytest

from bench.throughput import measure


# make campaign (~70 s): a benchmark's smoke run; make bench-quick and make bench run the script itself.
@pytest.mark.campaign
@pytest.mark.integration
@pytest.mark.spark
def test_throughput_reports_the_job_the_ceilings_and_the_naive_design(kafka_cluster: Any, bench_spark: Any) -> None:
    # 500 replicas, 6 rounds: 3,000 observations in batches of 1,000.
    r = measure(
        bench_spark,
        kafka_cluster,
        500,
        6,
        batch_obs=1000,
        naive_batch_obs=1000,
        naive_budget_s=60.0,
        warm_pass=True,
        bound_runs=2,
    )
    assert r.observations == 3000
    for figure in (r.e2e, r.warm_e2e, r.ceiling, r.input, r.naive):
        assert figure is not None and math.isfinite(figure) and figure > 0
    assert r.naive_observations > 0
    assert r.ceiling_ratio == pytest.approx(r.e2e / r.ceiling)
    assert r.naive_ratio == pytest.approx(r.e2e / r.naive)
    assert r.warm_ceiling_ratio == pytest.approx(r.warm_e2e / r.ceiling)
    assert r.warm_naive_ratio == pytest.approx(r.warm_e2e / r.naive)
    # the bound alternated with the warm job in the same session: two runs of each, medians
    assert len(r.warm_runs) == len(r.bound_runs) == 2 and r.warm_runs[0] == r.warm_e2e
    assert all(math.isfinite(x) and x > 0 for x in r.warm_runs + r.bound_runs)
    assert r.bound_ratio == pytest.approx(statistics.median(r.warm_runs) / statistics.median(r.bound_runs))
