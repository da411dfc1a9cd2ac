"""The job as an object with a life cycle (``streaming.lifecycle.job.Job``), on real Spark and
a real spool: it starts, reports progress through Spark's own query events
(``streaming.lifecycle.listener.QueryEvents``), stops on request, and releases everything
it made; a failing micro-batch ends ``await_stop`` with the reason."""

from __future__ import annotations

import logging
import signal
import threading
import time

import pytest

from isrwatch.exceptions import IsrwatchError
from isrwatch.spool import SpoolWriter
from simulator.run import Simulation, now_ms
from streaming.lifecycle.job import Job
from streaming.settings import JobSettings

pytestmark = pytest.mark.spark


def _spool_with_telemetry(path: str, seconds: int = 5) -> int:
    """A few rounds of the steady scenario (in the past, all there at once); their observations."""
    sim = Simulation("steady", cluster="lifecycle", start_ms=now_ms() - 60_000, seed=1, lag_time_max_ms=10_000)
    writer = SpoolWriter(path)
    for _, records in sim.rounds(seconds):
        writer.append(records)
    return seconds


def _listeners(spark) -> int:
    return len(spark.streams._jsqm.listListeners())


def test_a_job_starts_reports_progress_from_sparks_events_and_releases_everything(spark, tmp_path) -> None:
    spool = str(tmp_path / "spool")
    _spool_with_telemetry(spool)
    settings = JobSettings(spool_dir=spool, checkpoint_dir=str(tmp_path / "ck"), metrics_port=0, trigger_seconds=0.5)
    before = _listeners(spark)
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    stop = threading.Event()
    job = Job(settings, spark=spark, stop_event=stop)
    with job:
        assert all(signal.getsignal(sig) != h for sig, h in handlers.items()), "SIGINT and SIGTERM stop the job"
        job.start()
        assert _listeners(spark) == before + 1
        deadline = time.monotonic() + 120
        while job.events.input_rows == 0 and time.monotonic() < deadline:
            time.sleep(0.2)
        # Progress as Spark reports it: a micro-batch with the spool's records.
        assert job.events.batches >= 1 and job.events.input_rows > 0
        assert job.events.ready.is_set() and not job.events.ended.is_set()
        assert job.monitor.statuses, "the batch reached the driver"
        stop.set()
        job.await_stop()  # returns at once: stopping was asked for
        query = job.query
    # Released: the query stopped (Spark said so), the listener gone, the session still usable,
    # and Ctrl-C is the embedding process's own again (it once went to the closed job's handler).
    assert not query.isActive
    assert {sig: signal.getsignal(sig) for sig in handlers} == handlers
    assert _listeners(spark) == before
    assert spark.range(3).count() == 3


def test_a_job_that_finds_a_spark_session_running_uses_it_and_leaves_it_running(spark, tmp_path) -> None:
    # `spark`, the tests' shared session, stands for an application's own session that it does
    # not pass to the job: Spark's getOrCreate hands the job that session.
    spool = str(tmp_path / "spool")
    _spool_with_telemetry(spool)
    settings = JobSettings(spool_dir=spool, checkpoint_dir=str(tmp_path / "ck"), metrics_port=0, trigger_seconds=0.5)
    stop = threading.Event()
    with Job(settings, stop_event=stop) as job:
        job.start()
        assert job.spark.sparkContext is spark.sparkContext
        deadline = time.monotonic() + 120
        while job.events.input_rows == 0 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert job.events.input_rows > 0
        stop.set()
        job.await_stop()
    # The job ended; the application's session did not.
    assert not spark.sparkContext._jsc.sc().isStopped()
    assert spark.range(3).count() == 3


def test_a_failing_micro_batch_ends_the_job_with_the_reason(spark, tmp_path, monkeypatch, caplog) -> None:
    from streaming.lifecycle import handler
    from streaming.lifecycle.restarts import RestartPolicy

    def fail(self, raw_batch, batch_id):
        raise RuntimeError("a batch that cannot be handled")

    monkeypatch.setattr(handler.BatchHandler, "__call__", fail)
    # The restarts' waits (2 s doubled: a minute in all) are not what is tested here, their
    # count and the end are; shortened so the test does not spend a minute waiting.
    restarts = RestartPolicy(backoff_s=0.05)
    caplog.set_level(logging.INFO, logger="streaming.job")
    spool = str(tmp_path / "spool")
    _spool_with_telemetry(spool)
    settings = JobSettings(spool_dir=spool, checkpoint_dir=str(tmp_path / "ck"), metrics_port=0, trigger_seconds=0.5)
    with Job(settings, spark=spark) as job:
        job.restarts = restarts
        job.start()
        with pytest.raises(IsrwatchError, match="query isrwatch stopped"):
            job.await_stop()
        assert job.events.ended.wait(10) and job.events.error  # Spark's terminated event, with its reason
    restarted = [r for r in caplog.records if r.getMessage().startswith("query_restarted ")]
    assert len(restarted) == restarts.attempts  # tried again as often as it says, then ended
