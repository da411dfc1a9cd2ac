"""``isrwatch run``: the streaming job, wired together (``Job``).

Telemetry (embedded simulator -> spool, a ``--spool-dir``, or a Kafka topic)
-> one Spark query (``streaming.lifecycle.query``) whose micro-batches
``streaming.lifecycle.handler.BatchHandler`` takes: Spark evaluates every observation
(``streaming.evaluation.batch``), the driver (``streaming.driver.monitor``) sends the statuses
to the in-process exporter store (and the state topic) and the alert
transitions to the sinks (stdout, Alertmanager, the alerts topic), dead letters
to a file or topic. Spark's own events say how the query goes
(``streaming.lifecycle.listener``). A wall-clock timer raises ``IsrwatchTelemetryStale``;
``--duration``, Ctrl-C and SIGTERM stop everything cleanly.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import IO, TYPE_CHECKING, TypedDict, TypeVarTuple, Unpack

from isrwatch.exceptions import ConfigError, IsrwatchError
from isrwatch.logs import kv
from isrwatch.rule import AUTO
from streaming.evaluation.parse import payload_kept_bytes
from streaming.lifecycle import leftovers
from streaming.lifecycle.assembly import make_monitor, make_outputs, rule_config
from streaming.lifecycle.origin import check_checkpoint, default_checkpoint_dir
from streaming.lifecycle.restarts import RestartPolicy
from streaming.lifecycle.stopping import (
    BatchGate,
    install_signals,
    out_of_space,
    quiet_spark,
    restore_signals,
    stop_allowance_s,
    stop_query,
    stopped_batch,
)
from streaming.settings import AlertingSettings, JobSettings
from streaming.sources.feeder import DEFAULT_SCENARIO, Feeder, embedded_simulator

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import StreamingQuery

    from exporter.settings import SeriesSettings
    from exporter.store import StatusStore
    from simulator.settings import EmbeddedSimulatorSettings
    from streaming.driver.monitor import Monitor
    from streaming.driver.notify import AlertSink
    from streaming.lifecycle.handler import BatchHandler
    from streaming.lifecycle.listener import QueryEvents

__all__ = ["run", "Job", "JobHandles", "JobOptions", "FUTURE_TOLERANCE_MS", "DEFAULT_SCENARIO"]

log = logging.getLogger("streaming.job")

# Observations further than this ahead of the job's clock are dead letters.
FUTURE_TOLERANCE_MS = 300_000
# Replicas whose telemetry stopped this long (on their cluster's clock) are forgotten.
FORGET_AFTER_MS = 15 * 60_000
# Seconds the job waits for the telemetry cluster at start-up.
STARTUP_TIMEOUT_S = 15.0


@dataclass
class JobHandles:
    """What a running job exposes to tests and embedders."""

    store: StatusStore | None = None
    monitor: Monitor | None = None
    metrics_port: int | None = None
    checkpoint_dir: str = ""
    spool_dir: str | None = None
    deadletter_file: str | None = None
    ready: threading.Event = field(default_factory=threading.Event)
    side_counts: dict[str, int] = field(default_factory=dict)


class JobOptions(TypedDict, total=False):
    """What ``run`` and ``Job`` take besides the job's settings; each may be left out (or None)."""

    alerting: AlertingSettings | None  # the other components' settings (default: their defaults)
    series: SeriesSettings | None
    simulator: EmbeddedSimulatorSettings | None
    spark: SparkSession | None  # a session to reuse (tests); the job leaves it running
    handles: JobHandles | None  # what the job exposes while it runs (tests, embedders)
    stop_event: threading.Event | None  # set: the job stops
    truth_file: IO[str] | None  # receives the embedded simulator's true ISR changes
    sinks: Sequence[AlertSink] | None  # replaces the alert sinks the settings ask for


Ts = TypeVarTuple("Ts")


def run(settings: JobSettings, **options: Unpack[JobOptions]) -> int:
    """Run the job until ``--duration`` passes or ``stop_event`` is set: ``Job``,
    started, awaited and closed (``JobOptions``)."""
    with Job(settings, **options) as job:
        job.start()
        job.await_stop()
    return 130 if job.signalled == signal.SIGINT else 0  # Ctrl-C: the shell's convention


class Job:
    """The streaming job's life cycle: ``start`` (its resources, then the query),
    ``await_stop`` (until ``--duration``, a stop request or a failure), ``close``.

    Every resource is registered in one ``ExitStack`` as it is made, with what
    releases it; ``close`` releases them all, newest first, each failure logged
    and the rest still released: the simulator stops, the query finishes the
    batch it is in and stops, the outputs flush, the HTTP server and Spark stop,
    the run's scratch space (and the embedded default's checkpoint) go.
    """

    def __init__(self, settings: JobSettings, **options: Unpack[JobOptions]) -> None:
        from exporter.settings import SeriesSettings

        self.settings = settings
        self.alerting = options.get("alerting") or AlertingSettings()
        self.series = options.get("series") or SeriesSettings()
        self.simulator = embedded_simulator(options.get("simulator"))
        self.spark = options.get("spark")
        self.handles = options.get("handles") or JobHandles()
        self.stop_event = options.get("stop_event") or threading.Event()
        self.signalled: int | None = None  # the signal that stopped the job
        self._resources = contextlib.ExitStack()
        # From the start: a SIGTERM while Spark starts ends the job through the same clean-up;
        # the handlers before the job's are back once everything else is released.
        self._on_close("signal handlers", restore_signals, install_signals(self.stop_event, self._note_signal))
        self.truth_file = options.get("truth_file")
        self.sinks = options.get("sinks")
        self.cfg, self.th = rule_config(settings)
        self.kafka_mode = bool(settings.bootstrap_servers)
        self.embedded = not self.kafka_mode and not settings.spool_dir
        self.events: QueryEvents | None = None
        self.query: StreamingQuery | None = None
        self.monitor: Monitor | None = None
        self.telemetry_cluster_id: str | None = None  # where its brokers give one (streaming.driver.identity)
        self.fatal: str | None = None  # why a batch failed, when the job knows it better than Spark
        # closed when the job stops its query: the batch under way finishes, no other starts
        self._batches = BatchGate()
        self.feeder: Feeder | None = None
        # starts the job's query (again) from its checkpoint
        self._start_query: Callable[[], StreamingQuery] | None = None
        # A failed query is started again from its checkpoint, a bounded number of times.
        self.restarts = RestartPolicy()

    def __enter__(self) -> Job:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _note_signal(self, signum: int) -> None:
        """The signal that asked the job to stop (``stopping.install_signals``): the exit status."""
        self.signalled = signum

    def _on_close(self, what: str, fn: Callable[[*Ts], object], *args: *Ts, jvm: bool = False) -> None:
        """Release with ``fn(*args)`` on ``close``: a failure is logged, the rest still
        released. ``jvm``: a call into Spark, which fails quietly when a signal to the
        whole process group has ended the JVM already (logged at debug level)."""

        def release() -> None:
            try:
                fn(*args)
            except Exception:
                if jvm:
                    log.debug("close_failed %s", kv(what=what), exc_info=True)
                else:
                    log.exception("close_failed %s", kv(what=what))

        self._resources.callback(release)

    def close(self) -> None:
        self._resources.close()

    # -- start ---------------------------------------------------------------------------

    def start(self) -> None:
        """Make the job's resources, each registered for ``close`` as it is made, then start
        its query: the outputs (the exporter store and its HTTP server, dead letters, alert
        sinks, the state topic), the monitor (restored from the checkpoint), the source, the
        batch handler; last, for the embedded default, the simulator."""
        from streaming.evaluation.statetable import StateTable
        from streaming.lifecycle import query
        from streaming.lifecycle.handler import BatchHandler
        from streaming.lifecycle.listener import QueryEvents
        from streaming.sources.source import kafka_stream, spool_stream

        settings = self.settings
        leftovers.sweep(tempfile.gettempdir())  # what jobs killed outright left behind
        checkpoint_dir, spool = self._checkpoint()
        spark = self._spark()
        outputs = make_outputs(settings, checkpoint_dir, self._on_close, self.series, self.alerting, self.sinks)
        self.handles.store, self.handles.metrics_port = outputs.store, outputs.metrics_port
        self.handles.deadletter_file = outputs.deadletter_file
        self.monitor = make_monitor(
            spark, settings, (self.cfg, self.th), checkpoint_dir, outputs, self._on_close, self.telemetry_cluster_id
        )
        self.handles.monitor = self.monitor
        if self.kafka_mode:
            raw = kafka_stream(spark, settings, checkpoint_dir)
        else:
            assert spool is not None
            os.makedirs(spool, exist_ok=True)
            raw = spool_stream(spark, spool, settings.max_records_per_trigger)
        handler = BatchHandler(
            cfg=self.cfg,
            th=self.th,
            table=StateTable(spark, checkpoint_dir),
            monitor=self.monitor,
            store=outputs.store,
            deadletters=outputs.deadletters,
            checkpoint=outputs.checkpoint,
            future_tolerance_ms=None if (not self.kafka_mode and self.simulator.speed > 1) else FUTURE_TOLERANCE_MS,
            max_gap_ms=settings.observation_gap_ms or self.cfg.lag_time_max_ms // 2,
            refresh_batches=settings.ok_refresh_batches,
            hold_ok=settings.driver_replicas == "all",
            default_min_isr=settings.min_insync_replicas,
            payload_kept_bytes=payload_kept_bytes(settings.max_records_per_trigger),
            forget_after_ms=FORGET_AFTER_MS,
            states=outputs.state_writer,
            letters=outputs.letter_writer,
            side_counts=self.handles.side_counts,
        )
        self.events = events = QueryEvents(query.JOB_QUERY)
        spark.streams.addListener(events)
        self._on_close("query listener", spark.streams.removeListener, events, jvm=True)
        handle = self._guard(handler)
        self._start_query = lambda: query.start_job(raw("aggregates"), checkpoint_dir, settings.trigger_seconds, handle)
        self.query = self._start_query()
        self._on_close("query", self._stop_query, stop_allowance_s(settings.trigger_seconds), jvm=True)
        log.info(
            "started %s",
            kv(
                source="kafka" if self.kafka_mode else ("simulator" if self.embedded else "spool"),
                scenario=(self.simulator.simulate or DEFAULT_SCENARIO) if self.embedded else None,
                checkpoint=checkpoint_dir,
                trigger_s=settings.trigger_seconds,
                metrics_port=self.handles.metrics_port,
                lag_time_max_ms=self.cfg.lag_time_max_ms,
                rule=AUTO if self.cfg.by_version else self.cfg.rule.value,
            ),
        )
        if self.embedded:
            self._start_simulator(spool or "", events.ready)
        self.handles.ready.set()

    def _start_simulator(self, spool: str, spark_ready: threading.Event) -> None:
        """The embedded default's simulated cluster, writing to ``spool``. It starts once Spark
        has looked at the (empty) spool (``spark_ready``), so a slow first start of Spark does
        not turn the scenario's start into a backlog."""
        deadline = time.monotonic() + 120
        while not spark_ready.wait(0.2) and not self.stop_event.is_set():
            if time.monotonic() > deadline:
                log.warning("spark_slow_to_start %s", kv(waited_s=120))
                break
        self.feeder = Feeder(self.simulator, self.cfg, spool, self.truth_file)
        self.feeder.start()
        self._on_close("simulator", self.feeder.stop)

    def _checkpoint(self) -> tuple[str, str | None]:
        """The checkpoint directory (made, checked against the telemetry) and the spool."""
        settings = self.settings
        # The embedded default's checkpoint holds simulated telemetry only: made for this run, removed at its end.
        temporary = self.embedded and not settings.checkpoint_dir
        checkpoint_dir = settings.checkpoint_dir or (
            default_checkpoint_dir(settings.bootstrap_servers or "", settings.telemetry_topic)
            if self.kafka_mode
            else tempfile.mkdtemp(prefix="isrwatch-checkpoint-")
        )
        checkpoint_dir = os.path.abspath(checkpoint_dir)
        if temporary:
            leftovers.claim(checkpoint_dir)  # removed by the next job if this one is killed outright
            self._on_close("temporary checkpoint", shutil.rmtree, checkpoint_dir, True)
        try:
            os.makedirs(checkpoint_dir, exist_ok=True)
        except OSError as e:
            raise ConfigError(f"--checkpoint-dir: cannot create {checkpoint_dir}: {e.strerror}") from None
        spool = settings.spool_dir or (os.path.join(checkpoint_dir, "spool") if self.embedded else None)
        if settings.spool_dir and not os.path.isdir(settings.spool_dir):
            raise ConfigError(f"--spool-dir: {settings.spool_dir} is not a directory")
        self.telemetry_cluster_id = check_checkpoint(
            settings, checkpoint_dir, spool if not self.embedded else None, STARTUP_TIMEOUT_S
        )
        # Said last, once everything else is released (a refused start says only why).
        self._on_close("stopped", _stopped, checkpoint_dir, temporary)
        self.handles.checkpoint_dir, self.handles.spool_dir = checkpoint_dir, spool
        return checkpoint_dir, spool

    def _spark(self) -> SparkSession:
        """The job's session, or the one it was given (tests): then only configured."""
        from streaming.lifecycle.session import build_session, spark_conf_pairs

        if self.spark is not None:
            self.spark.conf.set("spark.sql.shuffle.partitions", str(self.settings.shuffle_partitions))
            from streaming.sources import source_spool

            source_spool.register(self.spark)
            return self.spark
        # Spark's own scratch space (its local directories, the native libraries RocksDB and
        # LZ4 unpack) goes into one directory of this run's, removed at the end: the JVM
        # outlives the Python process by a moment and does not always tidy up after itself.
        scratch = tempfile.mkdtemp(prefix="isrwatch-spark-")
        leftovers.claim(scratch)
        self._on_close("scratch", shutil.rmtree, scratch, True)
        from pyspark import SparkContext

        # A Spark context this process made already (an application embedding the job, not
        # passing its session): Spark's getOrCreate hands its session back. The job uses it and
        # leaves it running at its end, as it does a session it was given.
        existed = SparkContext._active_spark_context is not None
        self.spark = build_session(
            self.settings.spark_master,
            self.settings.shuffle_partitions,
            scratch_dir=scratch,
            conf=spark_conf_pairs(self.settings.spark_conf),
        )
        if existed:
            master = self.spark.sparkContext.master
            level = logging.INFO if master == self.settings.spark_master else logging.WARNING
            log.log(level, "spark_session_reused %s", kv(master=master, asked=self.settings.spark_master))
            return self.spark
        self._on_close("spark", self.spark.stop, jvm=True)
        install_signals(
            self.stop_event, self._note_signal
        )  # over PySpark's SIGINT handler (close puts back the ones before the job)
        return self.spark

    def _guard(self, handler: BatchHandler) -> Callable[[DataFrame, int], None]:
        """``handler`` as the query calls it; a batch that fails on a full disk records the one
        line the job stops with (``await_stop``) and quiets Spark's repeats of it."""

        def handle(batch: DataFrame, batch_id: int) -> None:
            if not self._batches.enter():  # the job is stopping: this batch runs at the next start
                raise self._batches.park(self.query, batch_id) from None
            try:
                handler(batch, batch_id)
            except Exception as e:
                reason = out_of_space(e, self.handles.checkpoint_dir)
                if reason is not None and self.fatal is None:
                    self.fatal = reason
                    quiet_spark(self.spark)
                if reason is None and self._batches.stopping.is_set():
                    raise stopped_batch(batch_id, e) from None
                raise
            finally:
                self._batches.leave()

        return handle

    # -- run -------------------------------------------------------------------------------

    def await_stop(self) -> None:
        """Until ``--duration`` passes, ``stop_event`` is set, or the query or the
        simulator fails (an IsrwatchError saying why). Meanwhile, once a tick: the
        stale-telemetry check, the lookahead's crossings, and once a minute forgetting
        replicas gone quiet."""
        settings = self.settings
        monitor = self.monitor
        assert monitor is not None, "Job.start first"
        start = time.monotonic()
        # A fifth of a second: the lookahead's crossings are said within a tick of their time.
        tick = min(0.2, settings.trigger_seconds)
        next_forget = start + 60
        while not self.stop_event.wait(tick):
            failure = self.events.failure() if self.events is not None else None
            if failure is None and self.query is not None and not self.query.isActive:
                # (Spark's terminated event not in yet: the query says why itself.)
                err = self.query.exception()
                failure = f"query {self.query.name} stopped: {str(err).splitlines()[0] if err else 'no reason given'}"
            if failure:
                full = self.events.error if self.events is not None else None
                fatal = self.fatal or out_of_space(full, self.handles.checkpoint_dir)
                if fatal or not self._restart_query(failure):
                    raise IsrwatchError(fatal or failure)
                continue
            if self.feeder is not None and self.feeder.error is not None:
                raise IsrwatchError(f"embedded simulator failed: {self.feeder.error}")
            monitor.check_stale()
            monitor.carry_forward()
            now = time.monotonic()
            if now >= next_forget:
                monitor.forget(FORGET_AFTER_MS)
                next_forget = now + 60
            if settings.duration is not None and now - start >= settings.duration:
                log.info("duration_reached %s", kv(duration_s=settings.duration))
                return

    def _restart_query(self, failure: str) -> bool:
        """Start the failed query again from its checkpoint (its batches resume after the last
        committed one, which the monitor and the outputs have already handled); False when
        ``self.restarts`` says it has been started again often enough (``streaming.lifecycle.restarts``)."""
        start_query = self._start_query
        wait_s = self.restarts.next_wait(time.monotonic()) if start_query is not None else None
        if start_query is None or wait_s is None:
            return False
        log.warning(
            "query_restarting %s",
            kv(reason=f'"{failure}"', attempt=self.restarts.count, of=self.restarts.attempts, in_s=wait_s),
        )
        if self.stop_event.wait(wait_s):
            return True  # asked to stop meanwhile: the job stops as asked
        if self.query is not None:
            with contextlib.suppress(Exception):
                self.query.stop()  # ended already; this only releases what Spark still holds of it
        if self.events is not None:
            self.events.restart()
        self.query = start_query()
        log.info("query_restarted %s", kv(query=self.query.name, attempt=self.restarts.count))
        return True

    def _stop_query(self, drain_s: float) -> None:
        if self.query is not None:
            stop_query(self.query, drain_s, self._batches)


def _stopped(checkpoint_dir: str, temporary: bool) -> None:
    extra = {"removed": "temporary"} if temporary else {}
    log.info("stopped %s", kv(checkpoint=checkpoint_dir, **extra))
