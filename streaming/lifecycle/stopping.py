"""How the job stops: the signals that ask it to, and the micro-batch under way let finish.

SIGTERM and Ctrl-C end in the job's one clean-up (``Job.close``), like ``--duration``.
"""

from __future__ import annotations

import errno
import logging
import threading
import time
from typing import TYPE_CHECKING, Any

from isrwatch.logs import kv
from isrwatch.signals import StopSignals

if TYPE_CHECKING:
    from collections.abc import Callable

    from pyspark.sql import SparkSession
    from pyspark.sql.streaming import StreamingQuery


__all__ = [
    "install_signals",
    "restore_signals",
    "stop_query",
    "stop_allowance_s",
    "BatchGate",
    "stopped_batch",
    "BatchStopped",
    "out_of_space",
    "quiet_spark",
]

log = logging.getLogger("streaming.stopping")


def stop_allowance_s(trigger_seconds: float) -> float:
    """How long a stop waits for the micro-batch under way: 30 s, or ten triggers when that is
    longer (docs/deploy.md, "Stopping the job"; docker-compose.yml's grace period exceeds it)."""
    return max(30.0, 10 * trigger_seconds)


def stop_query(q: StreamingQuery, drain_s: float, gate: BatchGate) -> None:
    """Let the micro-batch under way finish, for up to ``drain_s`` (a stop does not cut a
    batch halfway: a restart would redo it, harmlessly but noisily), start no other, then
    stop the query. Only the batch under way: a live feed always has more telemetry
    available, and waiting for all of it kept every stop waiting the whole ``drain_s`` and
    then cut the batch after all. A batch that Spark starts meanwhile does nothing and runs
    again at the next start (``BatchGate``)."""
    try:
        if not gate.close(drain_s if q.isActive else 0.0):
            log.info("batch_still_running %s", kv(query=q.name, waited_s=drain_s))
    finally:  # a batch held back waits for this, even when the JVM is gone already
        gate.stopping.set()
    _quiet_the_interruption()
    q.stop()


# What Spark logs when a stop interrupts its query between batches, as every stop does: the
# stream thread is most often planning the next trigger, writing its offsets through Hadoop's
# file system (``Shell`` then warns "Interrupted while joining", with the Java stack), and
# the stop cancels the query's job group, which has no job then ("Failed to cancel job group").
# Both said nothing wrong, at every SIGTERM; nothing of an interrupted trigger is committed.
_INTERRUPTION_LOGGERS = ("org.apache.hadoop.util.Shell", "org.apache.spark.scheduler.DAGScheduler")


def _quiet_the_interruption() -> None:
    """Spark's warnings of the stop's own interruption left out (``_INTERRUPTION_LOGGERS``):
    the job logs its stop itself. Errors still print. For the rest of the JVM's life: the
    job's JVM ends with the job (a process that embeds the job and goes on, a test run, keeps
    those two loggers at ERROR)."""
    from pyspark import SparkContext

    _spark_log_level(SparkContext._jvm, "ERROR", _INTERRUPTION_LOGGERS)


def _spark_log_level(jvm: Any, level: str, loggers: tuple[str, ...]) -> None:
    """Spark's ``loggers`` (log4j's names; "" for every logger) set to ``level`` in the JVM,
    best effort: only what is printed depends on it."""
    if jvm is None:  # no session, or its JVM is gone: nothing of Spark's left to print
        log.debug("spark_log_not_quietened")
        return
    try:
        log4j = jvm.org.apache.logging.log4j
        for name in loggers:
            if name:
                log4j.core.config.Configurator.setLevel(name, getattr(log4j.Level, level))
            else:  # every logger, not the root alone: streaming/lifecycle/log4j2.properties sets some of its own
                log4j.core.config.Configurator.setAllLevels("", getattr(log4j.Level, level))
    except Exception:  # noqa: BLE001 - best effort
        log.debug("spark_log_not_quietened", exc_info=True)


class BatchGate:
    """Whether a micro-batch may start its work: open while the job runs, closed by
    ``stop_query``. A batch that finds it closed does nothing: it waits for the query's stop
    and then raises ``stopped_batch`` (Spark reads that as the stop's own interruption, and
    runs the batch again at the next start). Nothing of such a batch is committed, so no
    telemetry is lost."""

    # How long a batch that found the gate closed waits for the query's stop before it gives
    # up and fails (the stop is then under way already: ``stop_query`` closes, then stops).
    PARKED_WAIT_S = 120.0

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._closed = False
        self._running = 0  # batches whose work is under way (Spark runs one at a time)
        self.held_back = 0  # batches that found the gate closed
        self.stopping = threading.Event()  # set just before the query's stop

    def enter(self) -> bool:
        """A batch starts: False when the stop was asked (the batch must do nothing)."""
        with self._cond:
            if self._closed:
                self.held_back += 1
                return False
            self._running += 1
            return True

    def leave(self) -> None:
        with self._cond:
            self._running -= 1
            self._cond.notify_all()

    def close(self, timeout_s: float) -> bool:
        """No batch starts its work from now on; True once the one under way has finished
        (or none was), False when ``timeout_s`` passed first."""
        with self._cond:
            self._closed = True
            return self._cond.wait_for(lambda: self._running == 0, timeout_s)

    def park(self, q: StreamingQuery | None, batch_id: int) -> BatchStopped:
        """For a batch that found the gate closed: wait until Spark has begun the query's
        stop (its pattern for a stop's interruption only counts once the query is no longer
        active), then the exception the batch raises."""
        deadline = time.monotonic() + self.PARKED_WAIT_S
        if self.stopping.wait(self.PARKED_WAIT_S):
            while q is not None and _active(q) and time.monotonic() < deadline:
                time.sleep(0.05)
        return stopped_batch(batch_id, None)


def _active(q: StreamingQuery) -> bool:
    """``q.isActive``; False once the JVM cannot be asked (it is gone, or going: the stop is
    over for this batch either way, and its error must stay the stop's)."""
    try:
        return bool(q.isActive)
    except Exception:  # noqa: BLE001 - py4j's errors for a JVM gone are of several kinds
        return False


class BatchStopped(Exception):
    """A micro-batch the job's stop of its query interrupted; it runs again at the next start."""


def stopped_batch(batch_id: int, error: BaseException | None) -> BatchStopped:
    """What the query's ``foreachBatch`` raises for a batch that ``stop_query`` interrupted.

    Spark reads a batch's failure during its stop as the stop itself by matching the Python
    traceback that py4j hands back (``StreamExecution.PROXY_ERROR``: "py4j.protocol.Py4JJavaError:
    An error occurred while calling", anything, then the JVM's interruption exception). That
    pattern recurses once per character it skips; the traceback of the batch's own error
    carries a Java stack trace, thousands of characters, and overflowed the stream thread's
    stack: a ``StackOverflowError`` of 1,024 frames in the log at a stop during a long batch
    (seen at the 1M-replica benchmark's end). This exception's traceback (raised ``from None``)
    is a few lines, and its text is what the pattern looks for."""
    cause = type(error).__name__ if error is not None else "none"  # none: stopped before it started its work
    log.info("batch_stopped %s", kv(batch_id=batch_id, error=cause, runs_again="at the next start"))
    return BatchStopped(
        f"batch {batch_id} interrupted by the job's stop: "
        "py4j.protocol.Py4JJavaError: An error occurred while calling the batch's Spark job.\n"
        ": java.lang.InterruptedException"
    )


def install_signals(stop_event: threading.Event, note: Callable[[int], None]) -> StopSignals:
    """SIGTERM and Ctrl-C (SIGINT) ask the job to stop, through the same clean-up as
    ``--duration`` (``isrwatch.signals.StopSignals`` setting the job's ``stop_event``, after
    ``note`` of the signal's number); a second
    Ctrl-C gives up waiting (KeyboardInterrupt, exit 130). Returns it, for ``restore_signals``
    (nothing installed off the main thread).

    Installed before Spark starts and again once it has: PySpark installs its own
    SIGINT handler, which cancels Spark's jobs and raises KeyboardInterrupt inside
    whatever call into the JVM the main thread is making (a traceback, not a stop).
    A signal sent to the whole process group (a terminal's Ctrl-C, systemd) ends the
    JVM too: what the dying JVM makes Py4J and PySpark print (``_quiet_the_bridge``) is
    left out."""

    def on_stop(signum: int) -> None:
        note(signum)
        _quiet_the_bridge()

    return StopSignals(on_stop, name="job", event=stop_event).install()


def restore_signals(signals: StopSignals) -> None:
    """Put back the handlers ``install_signals`` replaced: a process that embeds the job
    (a test run, a service) has its own Ctrl-C again once the job has closed."""
    signals.restore()


def _quiet_the_bridge() -> None:
    """Once a stop is asked for, the JVM may be ending too (the signal went to the whole
    process group): every call into it then fails, and Py4J and PySpark print each failure
    with its traceback. The job's own log says it stops and when it has stopped."""
    logging.getLogger().addFilter(_without_py4j_send_errors)  # Py4J logs these on the root logger
    for name in ("py4j", "py4j.clientserver", "py4j.java_gateway"):  # "exception while executing the Python Proxy"
        logging.getLogger(name).setLevel(logging.CRITICAL)
    try:  # PySpark's accumulator server prints a broken connection with socketserver's default handler
        from pyspark import SparkContext

        server = getattr(SparkContext._active_spark_context, "_accumulatorServer", None)
        if server is not None:
            server.handle_error = lambda request, address: log.debug("accumulator_connection_lost")
    except Exception:  # noqa: BLE001 - best effort: only what is printed depends on it
        log.debug("accumulator_server_not_quietened", exc_info=True)


def _without_py4j_send_errors(record: logging.LogRecord) -> bool:
    """Py4J logs a failed call into the JVM on the root logger, traceback and all."""
    return not (record.name == "root" and str(record.msg).startswith("Exception while sending command"))


NO_SPACE = "No space left on device"


def out_of_space(error: BaseException | str | None, checkpoint_dir: str) -> str | None:
    """The one line the job stops with when ``error`` (a batch's exception, or the query's
    end as Spark reports it) is a full disk; None for any other error."""
    seen: list[object] = []
    while error is not None and error not in seen:
        seen.append(error)
        if (isinstance(error, OSError) and error.errno == errno.ENOSPC) or NO_SPACE in str(error):
            return (
                f"no space left on device writing the checkpoint under {checkpoint_dir} (or Spark's scratch "
                "space): the batch was not committed; free space and start the job again on the same "
                "checkpoint, it resumes at the last committed batch"
            )
        error = error.__cause__ or error.__context__ if isinstance(error, BaseException) else None
    return None


def quiet_spark(spark: SparkSession | None) -> None:
    """Once the job knows why it stops, Spark's log and the bridge's would print the same
    failure again with its Java and Python stacks: both are silenced."""
    _quiet_the_bridge()
    _spark_log_level(spark._jvm if spark is not None else None, "OFF", ("",))
