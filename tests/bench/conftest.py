"""The benchmarks' smoke tests run on a session of their own choosing."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture
def bench_spark() -> Iterator[Any]:
    """The Spark session a benchmark runs on: the one another test left active, or its own,
    stopped after. Not the shared `spark` fixture: these tests run early, and that session
    would then stay active for the rest of the run, so every later in-process job not given a
    session would get it from getOrCreate instead of its own. (Its first form, in
    tests/bench/test_scale.py, met a job that stopped such a session, and
    tests/replay/test_replay.py failed on it; the job now leaves it running.)"""
    from pyspark.sql import SparkSession

    from streaming.lifecycle.session import build_session

    shared = SparkSession.getActiveSession()
    spark = shared if shared is not None else build_session("local[2]", 2, app_name="isrwatch-test-bench")
    yield spark
    if shared is None:
        spark.stop()
