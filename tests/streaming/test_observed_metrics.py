"""The batch's totals with ``--driver-replicas not-ok`` when Spark does not answer its
observed metrics.

``Observation.get`` waits without end; an observation Spark never completes (one was seen
on the held rare rows inside the job's ``foreachBatch``) would stop the job for good with
nothing in its log. The driver waits a bounded time (``batch.observed_metrics``) and then
counts the same totals with a Spark job of its own (``replicas.count_totals``): real Spark.
"""

from __future__ import annotations

import logging
import threading
import time

import pytest
from pyspark.sql import Observation
from pyspark.sql import functions as F

from streaming.evaluation import batch

from .test_driver_replicas import FOLLOWERS, _batch, _handler
from .test_refresh_lookahead import _raw

pytestmark = pytest.mark.spark


def test_an_observation_spark_never_answers_gives_none_within_the_wait(spark) -> None:
    df = spark.range(10)
    never = Observation("never_run")
    df.observe(never, F.count(F.lit(1)).alias("n"))  # attached, its action never run
    got: list[object] = []
    th = threading.Thread(target=lambda: got.append(batch.observed_metrics(never, wait_s=0.3)), daemon=True)
    t0 = time.monotonic()
    th.start()
    th.join(timeout=30)
    assert not th.is_alive(), "observed_metrics waited past its bound (Observation.get's endless wait)"
    assert got == [None]
    assert time.monotonic() - t0 >= 0.3
    assert batch.observed_metrics(Observation("never_attached"), wait_s=0.3) is None


def test_an_answered_observation_gives_its_metrics(spark) -> None:
    answered = Observation("answered")
    spark.range(10).observe(answered, F.count(F.lit(1)).alias("n")).collect()
    assert batch.observed_metrics(answered, wait_s=0.3) == {"n": 10}


def test_without_spark_s_metrics_the_totals_are_counted_the_same(spark, tmp_path, monkeypatch, caplog) -> None:
    """The job's path both ways on the same batches: the totals counted by a Spark job when
    the observation gives nothing equal those of the default (every row to the driver)."""
    asked: list[float] = []

    def unanswered(observation, wait_s=batch.OBSERVED_WAIT_S):
        asked.append(wait_s)
        return None

    monkeypatch.setattr(batch, "observed_metrics", unanswered)
    default, not_ok = _handler(spark, tmp_path / "all", True), _handler(spark, tmp_path / "not-ok", False)
    with caplog.at_level(logging.WARNING, logger="streaming.batch"):
        for b in range(4):
            for handler in (default, not_ok):
                handler(_raw(spark, b, _batch(b)), b)
            assert not_ok.monitor.cluster_now == default.monitor.cluster_now, b
    assert len(asked) == 4, "the not-ok handler asked for its observed metrics at each batch"
    assert not_ok.store.snapshot().observations == default.store.snapshot().observations == 4 * 2 * FOLLOWERS
    assert sum("observed_metrics_missing" in r.getMessage() for r in caplog.records) == 4
