"""A stop that interrupts a micro-batch ends the query as a stop, on real Spark.

Spark tells a batch's failure during its stop from a real failure by matching the
traceback py4j hands back from ``foreachBatch`` against its own pattern
(``StreamExecution.PROXY_ERROR``), which recurses once per character. The traceback of
an interrupted Spark call carries a Java stack trace; matched in full it overflowed the
stream thread's stack (a ``StackOverflowError`` at the 1M-replica benchmark's stop).
``streaming.lifecycle.stopping.stopped_batch`` hands back a few lines that say "interrupted"."""

from __future__ import annotations

import logging
import threading
import traceback
from typing import Any

import pytest

from streaming.lifecycle.job import Job
from streaming.settings import JobSettings

pytestmark = pytest.mark.spark


class _Tracebacks(logging.Handler):
    """The tracebacks py4j logs as it hands a Python failure back to the JVM."""

    def __init__(self) -> None:
        super().__init__()
        self.texts: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.exc_info and record.exc_info[1] is not None:
            self.texts.append("".join(traceback.format_exception(*record.exc_info)))


def _proxy_error_matches(spark: Any, text: str) -> bool:
    """Spark's own test of that text: whether it reads it as its stop's interruption."""
    pattern = spark._jvm.org.apache.spark.sql.execution.streaming.runtime.StreamExecution.PROXY_ERROR()
    return bool(pattern.findFirstIn(text).isDefined())


def test_a_batch_interrupted_by_the_stop_ends_the_query_as_a_stop(spark, tmp_path) -> None:
    settings = JobSettings(spool_dir=str(tmp_path), checkpoint_dir=str(tmp_path / "ck"), metrics_port=0)
    running = threading.Event()

    def slow_batch(batch: Any, batch_id: int) -> None:
        running.set()
        # A Spark job far longer than the test: the stop interrupts it.
        batch.sparkSession.range(0, 1 << 42, 1, 2).selectExpr("sum(id * id)").collect()

    tracebacks = _Tracebacks()
    bridge = logging.getLogger("py4j.clientserver")
    bridge.addHandler(tracebacks)
    try:
        with Job(settings, spark=spark) as job:
            query = (
                spark.readStream.format("rate")
                .option("rowsPerSecond", 1)
                .load()
                .writeStream.queryName("test_stop_mid_batch")
                .option("checkpointLocation", str(tmp_path / "rate-ck"))
                .foreachBatch(job._guard(slow_batch))
                .start()
            )
            job.query = query
            assert running.wait(120), "no batch started"
            job._stop_query(0.0)  # the job's own stop, with no time to finish the batch
            assert not query.isActive
            # Ended as a stop: no failure recorded for the query.
            assert query.exception() is None
    finally:
        bridge.removeHandler(tracebacks)
    assert tracebacks.texts, "the interrupted batch's failure went back to the JVM"
    handed_back = tracebacks.texts[-1]
    assert "interrupted by the job's stop" in handed_back and len(handed_back) < 2_000, handed_back
    # Spark's pattern reads it as the stop's own interruption (and, a few lines long, without
    # overflowing: the original traceback raised StackOverflowError here).
    assert _proxy_error_matches(spark, handed_back)
