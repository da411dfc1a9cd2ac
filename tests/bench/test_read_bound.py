"""Smoke test: ``bench.read_bound`` (the ceiling against the job's own read and parse) runs
each of its queries over every record on the real Kafka and real Spark, the aggregate ending
with one state row per replica (so the parse gave observations), and reports each figure (no
timing asserted)."""

from __future__ import annotations

import math
from typing import Any

import pytest

from bench.read_bound import measure


# make campaign (~25 s): a benchmark's smoke run; make bench-quick and make bench run the script itself.
@pytest.mark.campaign
@pytest.mark.integration
@pytest.mark.spark
def test_read_bound_reads_every_record_in_each_query_and_reports_the_ratio(
    kafka_cluster: Any, bench_spark: Any
) -> None:
    b = measure(bench_spark, kafka_cluster, 500, 6, batch_obs=1000)
    records = -(-500 // b.per_record) * 6  # each round: its replicas in records of per_record
    assert {name: run.records for name, run in b.runs.items()} == {
        "read": records,
        "read_parse": records,
        "read_parse_aggregate": records,
    }
    assert b.runs["read_parse_aggregate"].state_rows == 500
    for figure in (b.rate("read"), b.rate("read_parse"), b.rate("read_parse_aggregate"), b.ceiling, b.ratio):
        assert math.isfinite(figure) and figure > 0
    assert b.ratio == pytest.approx(b.rate("read_parse_aggregate") / b.ceiling)
