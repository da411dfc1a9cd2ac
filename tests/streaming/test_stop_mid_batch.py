"""How the job's stop meets its micro-batches, on real Spark: the batch under way finishes and
none starts after it; a stop that interrupts a batch ends the query as a stop.

Spark tells a batch's failure during its stop from a real failure by matching the
traceback py4j hands back from ``foreachBatch`` against its own pattern
(``StreamExecution.PROXY_ERROR``), which recurses once per character. The traceback of
an interrupted Spark call carries a Java stack trace; matched in full it overflowed the
stream thread's stack (a ``StackOverflowError`` at the 1M-replica benchmark's stop).
``streaming.lifecycle.stopping.stopped_batch`` hands back a few lines that say "interrupted"."""

from __future__ import annotations

import logging
import threading
import time
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


def _rate_query(spark: Any, job: Job, handler: Any, tmp_path: Any, rows_per_second: int) -> Any:
    """A query over Spark's rate source through the job's own batch guard, made the job's query."""
    job.query = (
        spark.readStream.format("rate")
        .option("rowsPerSecond", rows_per_second)
        .load()
        .writeStream.queryName("test_stop")
        .option("checkpointLocation", str(tmp_path / "rate-ck"))
        .foreachBatch(job._guard(handler))
        .start()
    )
    return job.query


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
            query = _rate_query(spark, job, slow_batch, tmp_path, 1)
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


def test_the_batch_under_way_finishes_and_none_starts_after_the_stop(spark, tmp_path) -> None:
    """A live feed always has more telemetry available: the stop lets the batch under way
    finish and starts no other (the stop once waited for all available data: with a feed
    still running, it waited its whole allowance, then cut the batch running then)."""
    settings = JobSettings(spool_dir=str(tmp_path), checkpoint_dir=str(tmp_path / "ck"), metrics_port=0)
    running = threading.Event()
    seen: list[tuple[str, int]] = []

    def batch_of_two_seconds(batch: Any, batch_id: int) -> None:
        seen.append(("started", batch_id))
        if batch_id == 0:
            running.set()
            time.sleep(2.0)  # the stop is asked meanwhile
        seen.append(("finished", batch_id))

    with Job(settings, spark=spark) as job:
        query = _rate_query(spark, job, batch_of_two_seconds, tmp_path, 100)  # new rows at every trigger
        assert running.wait(120), "no batch started"
        seen.append(("stop asked", -1))
        job._stop_query(60.0)
        assert not query.isActive
        assert query.exception() is None, "ended as a stop, not as a failure"
    asked = seen.index(("stop asked", -1))
    assert ("finished", 0) in seen[asked:], f"the batch under way was not let finish: {seen}"
    assert not [e for e in seen[asked:] if e[0] == "started"], f"a batch started after the stop: {seen}"


def test_a_batch_started_after_the_stop_was_asked_does_nothing_and_runs_again(spark, tmp_path, caplog) -> None:
    """Spark starts the next batch as soon as one commits; one that starts once the stop is
    asked does nothing, ends the query as a stop, and is Spark's first batch at the next start
    on the same checkpoint: no telemetry is skipped."""
    settings = JobSettings(spool_dir=str(tmp_path), checkpoint_dir=str(tmp_path / "ck"), metrics_port=0)
    seen: list[int] = []
    running = threading.Event()

    def record(batch: Any, batch_id: int) -> None:
        seen.append(batch_id)
        running.set()

    caplog.set_level(logging.INFO, logger="streaming.stopping")
    with Job(settings, spark=spark) as job:
        query = _rate_query(spark, job, record, tmp_path, 100)
        assert running.wait(120), "no batch started"
        assert job._batches.close(60.0), "the batch under way finished"
        deadline = time.monotonic() + 120
        while job._batches.held_back == 0 and time.monotonic() < deadline:
            time.sleep(0.05)  # Spark starts its next batch: it finds the gate closed
        assert job._batches.held_back == 1
        job._stop_query(60.0)
        assert not query.isActive
        assert query.exception() is None, "ended as a stop, not as a failure"
    stopped = [r.getMessage() for r in caplog.records if r.getMessage().startswith("batch_stopped")]
    held = max(seen) + 1
    assert stopped == [f"batch_stopped batch_id={held} error=none runs_again=at the next start"], stopped
    seen.clear()
    running.clear()
    with Job(settings, spark=spark) as job:
        _rate_query(spark, job, record, tmp_path, 100)
        assert running.wait(120), "no batch after the restart"
        job._stop_query(60.0)
    assert seen[0] == held, f"the batch held back ran again first: {seen}"
