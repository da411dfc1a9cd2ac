"""``isrwatch run``: the streaming job, wired together (``Job``).

Telemetry (embedded simulator -> spool, a ``--spool-dir``, or a Kafka topic)
-> one Spark query (``streaming.query``) whose micro-batches
``streaming.handler.BatchHandler`` takes: Spark evaluates every observation
(``streaming.batch``), the driver (``streaming.monitor``) sends the statuses
to the in-process exporter store (and the state topic) and the alert
transitions to the sinks (stdout, Alertmanager, the alerts topic), dead letters
to a file or topic. Spark's own events say how the query goes
(``streaming.listener``). A wall-clock timer raises ``IsrwatchTelemetryStale``;
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
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import IO, TYPE_CHECKING, Any, NamedTuple

from isrwatch.exceptions import ConfigError, IsrwatchError
from isrwatch.logs import kv
from isrwatch.rule import Rule, RuleConfig
from isrwatch.settings import kafka_config_pairs
from isrwatch.status import Thresholds
from streaming.brokerwatch import BrokerWatch
from streaming.endpoints import alert_sinks, metrics_port, runbook_base, serve_metrics
from streaming.feeder import DEFAULT_SCENARIO, Feeder, embedded_simulator
from streaming.origin import check_checkpoint, default_checkpoint_dir
from streaming.settings import AlertingSettings, JobSettings
from streaming.stopping import (
    install_signals,
    out_of_space,
    quiet_spark,
    restore_signals,
    stop_query,
    stopped_batch,
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from exporter.settings import SeriesSettings
    from exporter.store import StatusStore
    from simulator.settings import EmbeddedSimulatorSettings
    from streaming.checkpoint import DriverCheckpoint
    from streaming.monitor import Monitor
    from streaming.outputs import KafkaStates

__all__ = ["run", "Job", "serve_metrics", "JobHandles", "FUTURE_TOLERANCE_MS", "DEFAULT_SCENARIO"]

log = logging.getLogger(__name__)

# Observations further than this ahead of the job's clock are dead letters.
FUTURE_TOLERANCE_MS = 300_000
# Replicas whose telemetry stopped this long (on their cluster's clock) are forgotten.
FORGET_AFTER_MS = 15 * 60_000
# Seconds the job waits for the telemetry cluster at start-up.
STARTUP_TIMEOUT_S = 15.0
# A query that fails is started again from its checkpoint in the same process (Spark gives a
# Python worker 10 s to connect back, which a loaded machine can miss; an executor can be
# lost): at most QUERY_RESTARTS times within QUERY_RESTART_WINDOW_S, the first after
# QUERY_RESTART_BACKOFF_S, each wait doubled. Then, or on a full disk, the job stops with why.
QUERY_RESTARTS = 5
QUERY_RESTART_WINDOW_S = 600.0
QUERY_RESTART_BACKOFF_S = 2.0
# The collector's default round (``isrwatch collect --interval``): the telemetry's granularity.
COLLECTOR_ROUND_MS = 1_000


@dataclass
class JobHandles:
    """What a running job exposes to tests and embedders."""

    store: Any = None
    monitor: Any = None
    metrics_port: int | None = None
    checkpoint_dir: str = ""
    spool_dir: str | None = None
    deadletter_file: str | None = None
    ready: threading.Event = field(default_factory=threading.Event)
    side_counts: dict[str, int] = field(default_factory=dict)


class _Outputs(NamedTuple):
    """Where a job's results go (``Job._outputs``)."""

    store: StatusStore
    deadletters: Any  # streaming.outputs.DeadLetterFile or KafkaDeadLetters
    sinks: list[Any]  # isrwatch.alerts' sinks: stdout, Alertmanager, the alerts topic
    states: KafkaStates | None  # the state topic (Kafka mode)
    checkpoint: DriverCheckpoint


def _rule_config(settings: JobSettings) -> tuple[RuleConfig, Thresholds]:
    embedded = not settings.bootstrap_servers
    lag = settings.lag_time_max_ms or (10_000 if embedded else 30_000)
    try:
        cfg = RuleConfig(Rule.parse(settings.rule), lag, settings.lag_max_messages)
        th = Thresholds(settings.nearing_ratio, settings.critical_ratio, settings.stall_after_ms)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    return cfg, th


def run(settings: JobSettings, **options: Any) -> int:
    """Run the job until ``--duration`` passes or ``stop_event`` is set: ``Job``,
    started, awaited and closed. ``options`` are ``Job``'s: the other components'
    settings (``alerting``, ``series``, ``simulator``), ``spark`` reuses a session
    (tests), ``sinks`` replaces the alert sinks, ``truth_file`` receives the
    embedded simulator's true ISR changes, ``handles``, ``stop_event``."""
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

    def __init__(
        self,
        settings: JobSettings,
        *,
        alerting: AlertingSettings | None = None,
        series: SeriesSettings | None = None,
        simulator: EmbeddedSimulatorSettings | None = None,
        spark: SparkSession | None = None,
        handles: JobHandles | None = None,
        stop_event: threading.Event | None = None,
        truth_file: IO[str] | None = None,
        sinks: Sequence[Any] | None = None,
    ) -> None:
        from exporter.settings import SeriesSettings

        self.settings = settings
        self.alerting = alerting or AlertingSettings()
        self.series = series or SeriesSettings()
        self.simulator = embedded_simulator(simulator)
        self.spark = spark
        self.handles = handles or JobHandles()
        self.stop_event = stop_event or threading.Event()
        self.signalled: int | None = None  # the signal that stopped the job
        self._resources = contextlib.ExitStack()
        # From the start: a SIGTERM while Spark starts ends the job through the same clean-up;
        # the handlers before the job's are back once everything else is released.
        self._on_close("signal handlers", restore_signals, install_signals(self))
        self.truth_file = truth_file
        self.sinks = sinks
        self.cfg, self.th = _rule_config(settings)
        self.kafka_mode = bool(settings.bootstrap_servers)
        self.embedded = not self.kafka_mode and not settings.spool_dir
        self.events: Any = None  # streaming.listener.QueryEvents
        self.query: Any = None  # pyspark's StreamingQuery
        self.monitor: Any = None
        self.fatal: str | None = None  # why a batch failed, when the job knows it better than Spark
        self._stopping_query = threading.Event()  # set just before the job stops its query
        self.feeder: Feeder | None = None
        self._start_query: Any = None  # starts the job's query (again) from its checkpoint
        self._restarts: list[float] = []  # when the query was restarted (monotonic)

    def __enter__(self) -> Job:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _broker_watch(self, settings: JobSettings) -> BrokerWatch | None:
        """The telemetry cluster's brokers as the job sees them (``streaming.brokerwatch``)."""
        off = _watch_off(settings)
        if off:
            log.info("broker_watch_off %s", kv(reason=off))
            return None
        watch = BrokerWatch(settings.bootstrap_servers or "", settings.telemetry_topic).start()
        self._on_close("broker watch", watch.stop)
        return watch

    def _on_close(self, what: str, fn: Any, *args: Any, jvm: bool = False) -> None:
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
        from streaming import query
        from streaming.handler import BatchHandler
        from streaming.listener import QueryEvents
        from streaming.replicas import StateTable
        from streaming.source import kafka_stream, spool_stream

        settings = self.settings
        checkpoint_dir, spool = self._checkpoint()
        spark = self._spark()
        outputs = self._outputs(checkpoint_dir)
        self.monitor = self.handles.monitor = self._monitor(spark, checkpoint_dir, outputs)
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
            forget_after_ms=FORGET_AFTER_MS,
            side_counts=self.handles.side_counts,
        )
        self.events = QueryEvents(query.JOB_QUERY)
        spark.streams.addListener(self.events)
        self._on_close("query listener", spark.streams.removeListener, self.events, jvm=True)
        handle = self._guard(handler)
        self._start_query = lambda: query.start_job(raw("aggregates"), checkpoint_dir, settings.trigger_seconds, handle)
        self.query = self._start_query()
        self._on_close("query", self._stop_query, max(30.0, 10 * settings.trigger_seconds), jvm=True)
        log.info(
            "started %s",
            kv(
                source="kafka" if self.kafka_mode else ("simulator" if self.embedded else "spool"),
                scenario=(self.simulator.simulate or DEFAULT_SCENARIO) if self.embedded else None,
                checkpoint=checkpoint_dir,
                trigger_s=settings.trigger_seconds,
                metrics_port=self.handles.metrics_port,
                lag_time_max_ms=self.cfg.lag_time_max_ms,
                rule=self.cfg.rule.value,
            ),
        )
        if self.embedded:
            self._start_simulator(spool or "")
        self.handles.ready.set()

    def _outputs(self, checkpoint_dir: str) -> _Outputs:
        """Where the job's results go: the exporter store (served over HTTP unless
        ``--metrics-port 0``), dead letters (a topic in Kafka mode, else a file), the alert
        sinks, the state topic (Kafka mode), and the driver's checkpoint of its alerts."""
        from exporter.store import StatusStore
        from isrwatch.outcomes import ShrinkOutcomes
        from streaming.checkpoint import DriverCheckpoint
        from streaming.outputs import DeadLetterFile, KafkaDeadLetters, KafkaStates, make_producer
        from streaming.parse import REASONS
        from streaming.producer import OutputProducer

        settings, handles = self.settings, self.handles
        producer = None
        if self.kafka_mode:
            producer = OutputProducer(
                make_producer(settings.bootstrap_servers or "", settings.kafka_config),
                latest_wins={settings.state_topic},
            )
        # the lag-time evidence's margin: one collector round (its default interval) plus the stall time
        store = StatusStore(outcomes=ShrinkOutcomes(lag_margin_ms=COLLECTOR_ROUND_MS + settings.stall_after_ms))
        store.health.declare_deadletter_reasons(REASONS)  # the counter by reason starts at 0
        if producer is not None:
            out = producer
            store.health.read_outputs_from(
                lambda: {t: (o.pending, o.dropped + o.failed) for t, o in out.stats().items()}
            )
        handles.store = store
        # The job serves what it computes itself, in Kafka mode too: the state topic (and the
        # exporter reading it) waits on its partitions' leaders, this does not (docs/deploy.md).
        if metrics_port(settings) != 0:
            server = serve_metrics(store, settings, self.series)
            self._on_close("metrics server", server.close)
            handles.metrics_port = server.port
        if producer is not None:
            deadletters: Any = KafkaDeadLetters(producer, settings.deadletter_topic)
        else:
            handles.deadletter_file = settings.deadletter_file or os.path.join(checkpoint_dir, "deadletter.jsonl")
            deadletters = DeadLetterFile(handles.deadletter_file)
        self._on_close("dead letters", deadletters.close)
        sinks = (
            list(self.sinks)
            if self.sinks is not None
            else alert_sinks(
                settings,
                self.alerting,
                producer,
                runbook_base(self.alerting, settings, handles.metrics_port),
                checkpoint_dir,
            )
        )
        for sink in sinks:
            self._on_close(type(sink).__name__, sink.close)
        states = KafkaStates(producer, settings.state_topic) if producer is not None else None
        if states is not None:
            self._on_close("state topic", states.close)
        return _Outputs(store, deadletters, sinks, states, DriverCheckpoint(checkpoint_dir))

    def _monitor(self, spark: SparkSession, checkpoint_dir: str, outputs: _Outputs) -> Monitor:
        """The driver's monitor on ``outputs``, with the lookahead and the broker watch for
        Kafka telemetry, and the statuses and alerts of the run before (the checkpoint)."""
        from streaming import query
        from streaming.lookahead import Lookahead
        from streaming.monitor import Monitor

        settings = self.settings
        # Between batches the clock runs on for Kafka telemetry, stamped as it happens; the
        # embedded simulator and spools (replays, faster than real time) wait for evidence.
        lookahead = (
            Lookahead(
                self.cfg,
                self.th,
                live_ms=int(settings.stale_after_seconds * 1000),
                horizon_ms=settings.lookahead_ms,
            )
            if self.kafka_mode and settings.lookahead_ms != 0
            else None
        )
        monitor = Monitor(
            self.cfg,
            self.th,
            default_min_isr=settings.min_insync_replicas,
            stale_after_s=settings.stale_after_seconds,
            store=outputs.store,
            sinks=outputs.sinks,
            state_topic=outputs.states,
            checkpoint=outputs.checkpoint,
            lookahead=lookahead,
            broker_watch=self._broker_watch(settings) if lookahead is not None else None,
        )
        restored = query.restore_statuses(spark, checkpoint_dir, self.cfg, self.th)
        if restored:
            monitor.restore(restored)
            log.info(
                "restored %s",
                kv(
                    checkpoint=checkpoint_dir,
                    replicas=len(restored),
                    alerts=len(monitor.book.active),
                    batch_id=monitor.handled_batch,
                ),
            )
        return monitor

    def _start_simulator(self, spool: str) -> None:
        """The embedded default's simulated cluster, writing to ``spool``. It starts once Spark
        has looked at the (empty) spool, so a slow first start of Spark does not turn the
        scenario's start into a backlog."""
        deadline = time.monotonic() + 120
        while not self.events.ready.wait(0.2) and not self.stop_event.is_set():
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
            self._on_close("temporary checkpoint", shutil.rmtree, checkpoint_dir, True)
        try:
            os.makedirs(checkpoint_dir, exist_ok=True)
        except OSError as e:
            raise ConfigError(f"--checkpoint-dir: cannot create {checkpoint_dir}: {e.strerror}") from None
        spool = settings.spool_dir or (os.path.join(checkpoint_dir, "spool") if self.embedded else None)
        if settings.spool_dir and not os.path.isdir(settings.spool_dir):
            raise ConfigError(f"--spool-dir: {settings.spool_dir} is not a directory")
        check_checkpoint(settings, checkpoint_dir, spool if not self.embedded else None, STARTUP_TIMEOUT_S)
        # Said last, once everything else is released (a refused start says only why).
        self._on_close("stopped", _stopped, checkpoint_dir, temporary)
        self.handles.checkpoint_dir, self.handles.spool_dir = checkpoint_dir, spool
        return checkpoint_dir, spool

    def _spark(self) -> SparkSession:
        """The job's session, or the one it was given (tests): then only configured."""
        from streaming import source_spool
        from streaming.session import build_session, spark_conf_pairs

        if self.spark is not None:
            self.spark.conf.set("spark.sql.shuffle.partitions", str(self.settings.shuffle_partitions))
            source_spool.register(self.spark)
            return self.spark
        # Spark's own scratch space (its local directories, the native libraries RocksDB and
        # LZ4 unpack) goes into one directory of this run's, removed at the end: the JVM
        # outlives the Python process by a moment and does not always tidy up after itself.
        scratch = tempfile.mkdtemp(prefix="isrwatch-spark-")
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
        install_signals(self)  # over PySpark's SIGINT handler (close puts back the ones before the job)
        return self.spark

    def _guard(self, handler: Any) -> Any:
        """``handler`` as the query calls it; a batch that fails on a full disk records the one
        line the job stops with (``await_stop``) and quiets Spark's repeats of it."""

        def handle(batch: Any, batch_id: int) -> None:
            try:
                handler(batch, batch_id)
            except Exception as e:
                reason = out_of_space(e, self.handles.checkpoint_dir)
                if reason is not None and self.fatal is None:
                    self.fatal = reason
                    quiet_spark(self.spark)
                if reason is None and self._stopping_query.is_set():
                    raise stopped_batch(batch_id, e) from None
                raise

        return handle

    # -- run -------------------------------------------------------------------------------

    def await_stop(self) -> None:
        """Until ``--duration`` passes, ``stop_event`` is set, or the query or the
        simulator fails (an IsrwatchError saying why). Meanwhile, once a tick: the
        stale-telemetry check, the lookahead's crossings, and once a minute forgetting
        replicas gone quiet."""
        settings = self.settings
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
            self.monitor.check_stale()
            self.monitor.carry_forward()
            now = time.monotonic()
            if now >= next_forget:
                self.monitor.forget(FORGET_AFTER_MS)
                next_forget = now + 60
            if settings.duration is not None and now - start >= settings.duration:
                log.info("duration_reached %s", kv(duration_s=settings.duration))
                return

    def _restart_query(self, failure: str) -> bool:
        """Start the failed query again from its checkpoint (its batches resume after the last
        committed one, which the monitor and the outputs have already handled); False when it
        has failed ``QUERY_RESTARTS`` times within ``QUERY_RESTART_WINDOW_S``."""
        now = time.monotonic()
        self._restarts = [t for t in self._restarts if now - t < QUERY_RESTART_WINDOW_S]
        if self._start_query is None or len(self._restarts) >= QUERY_RESTARTS:
            return False
        self._restarts.append(now)
        wait_s = QUERY_RESTART_BACKOFF_S * 2 ** (len(self._restarts) - 1)
        log.warning(
            "query_restarting %s",
            kv(reason=f'"{failure}"', attempt=len(self._restarts), of=QUERY_RESTARTS, in_s=wait_s),
        )
        if self.stop_event.wait(wait_s):
            return True  # asked to stop meanwhile: the job stops as asked
        with contextlib.suppress(Exception):
            self.query.stop()  # ended already; this only releases what Spark still holds of it
        self.events.restart()
        self.query = self._start_query()
        log.info("query_restarted %s", kv(query=self.query.name, attempt=len(self._restarts)))
        return True

    def _stop_query(self, drain_s: float) -> None:
        if self.query is not None:
            stop_query(self.query, drain_s, self._stopping_query)


def _watch_off(settings: JobSettings) -> str | None:
    """Why the job cannot watch its telemetry cluster's brokers itself; None when it can."""
    protocol = kafka_config_pairs(settings.kafka_config).get("security.protocol", "PLAINTEXT")
    if protocol.upper() != "PLAINTEXT":
        return f"security.protocol={protocol} (the watch speaks PLAINTEXT only)"
    return None


def _stopped(checkpoint_dir: str, temporary: bool) -> None:
    extra = {"removed": "temporary"} if temporary else {}
    log.info("stopped %s", kv(checkpoint=checkpoint_dir, **extra))
