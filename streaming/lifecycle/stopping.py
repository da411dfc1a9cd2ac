"""How the job stops: the signals that ask it to, and the query let finish what it has.

SIGTERM and Ctrl-C end in the job's one clean-up (``Job.close``), like ``--duration``.
"""

from __future__ import annotations

import errno
import logging
import threading
from typing import TYPE_CHECKING

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
    "stopped_batch",
    "BatchStopped",
    "out_of_space",
    "quiet_spark",
]

log = logging.getLogger("streaming.stopping")


def stop_query(q: StreamingQuery, drain_s: float, stopping: threading.Event | None = None) -> None:
    """Let the query finish what is already available (a stop does not cut a batch
    halfway: a restart would redo it, harmlessly but noisily), then stop it;
    ``stopping`` is set just before (``stopped_batch``)."""
    if q.isActive:
        name = q.name
        waiter = threading.Thread(target=_process_available, args=(q, name), name=f"drain-{name}", daemon=True)
        waiter.start()
        waiter.join(drain_s)
    if stopping is not None:
        stopping.set()
    q.stop()


class BatchStopped(Exception):
    """A micro-batch the job's stop of its query interrupted; it runs again at the next start."""


def stopped_batch(batch_id: int, error: BaseException) -> BatchStopped:
    """What the query's ``foreachBatch`` raises for a batch that ``stop_query`` interrupted.

    Spark reads a batch's failure during its stop as the stop itself by matching the Python
    traceback that py4j hands back (``StreamExecution.PROXY_ERROR``: "py4j.protocol.Py4JJavaError:
    An error occurred while calling", anything, then the JVM's interruption exception). That
    pattern recurses once per character it skips; the traceback of the batch's own error
    carries a Java stack trace, thousands of characters, and overflowed the stream thread's
    stack: a ``StackOverflowError`` of 1,024 frames in the log at a stop during a long batch
    (seen at the 1M-replica benchmark's end). This exception's traceback (raised ``from None``)
    is a few lines, and its text is what the pattern looks for."""
    log.info("batch_stopped %s", kv(batch_id=batch_id, error=type(error).__name__, runs_again="at the next start"))
    return BatchStopped(
        f"batch {batch_id} interrupted by the job's stop: "
        "py4j.protocol.Py4JJavaError: An error occurred while calling the batch's Spark job.\n"
        ": java.lang.InterruptedException"
    )


def _process_available(q: StreamingQuery, name: str) -> None:
    try:
        q.processAllAvailable()
    except Exception:  # the query failed meanwhile, or the JVM is gone: stop() says what matters
        log.debug("drain_failed query=%s", name, exc_info=True)  # no call into the JVM here


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
    jvm = spark._jvm if spark is not None else None
    if jvm is None:  # no session, or its JVM is gone: nothing of Spark's left to print
        log.debug("spark_log_not_quietened")
        return
    try:
        # every logger, not the root alone: streaming/lifecycle/log4j2.properties sets some of its own
        jvm.org.apache.logging.log4j.core.config.Configurator.setAllLevels("", jvm.org.apache.logging.log4j.Level.OFF)
    except Exception:  # noqa: BLE001 - best effort: only what is printed depends on it
        log.debug("spark_log_not_quietened", exc_info=True)
