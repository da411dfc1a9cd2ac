"""The benchmarks' smoke tests run on a session of their own choosing."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture
def bench_spark() -> Iterator[Any]:
    """The Spark session a benchmark runs on: the one another test left active, or its own,
    stopped after. Not the shared `spark` fixture: created this early in the run, it would be
    the session that later in-process jobs get from getOrCreate, and (before the job learnt to
    leave such a session running) stopped; tests/replay/test_replay.py then failed on a stopped
    session."""
    from pyspark.sql import SparkSession

    from streaming.session import build_session

    shared = SparkSession.getActiveSession()
    spark = shared if shared is not None else build_session("local[2]", 2, app_name="isrwatch-test-bench")
    yield spark
    if shared is None:
        spark.stop()
