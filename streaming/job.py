"""``isrwatch run``: the streaming job, wired together.

Telemetry (embedded simulator -> spool, a ``--spool-dir``, or a Kafka topic)
-> two Spark queries (``streaming.query``): the per-replica aggregation and
the stateless side output -> the driver (``streaming.monitor``): statuses to
the in-process exporter store (and the state topic), alert transitions to
the sinks (stdout, Alertmanager, the alerts topic), dead letters to a file
or topic. A wall-clock timer raises ``IsrwatchTelemetryStale``; ``--duration``
stops everything cleanly.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import socket
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import IO, TYPE_CHECKING, Any

from isrwatch.exceptions import ConfigError, IsrwatchError
from isrwatch.logs import kv
from isrwatch.rule import Rule, RuleConfig
from isrwatch.settings import kafka_config_pairs
from isrwatch.status import Thresholds
from streaming.origin import default_checkpoint_dir
from streaming.settings import RunSettings

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["main", "run", "serve_metrics", "JobHandles", "FUTURE_TOLERANCE_MS", "DEFAULT_SCENARIO"]

log = logging.getLogger(__name__)

# Observations further than this ahead of the job's clock are dead letters.
FUTURE_TOLERANCE_MS = 300_000
# Replicas whose telemetry stopped this long (on their cluster's clock) are forgotten.
FORGET_AFTER_MS = 15 * 60_000
DEFAULT_SCENARIO = "stuck-follower"
EMBEDDED_METRICS_PORT = 9743
KAFKA_METRICS_PORT = 9744
# Seconds the job waits for the telemetry cluster at start-up.
STARTUP_TIMEOUT_S = 15.0


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


def main(settings: RunSettings) -> int:
    return run(settings)


def _rule_config(settings: RunSettings) -> tuple[RuleConfig, Thresholds]:
    embedded = not settings.bootstrap_servers
    lag = settings.lag_time_max_ms or (10_000 if embedded else 30_000)
    try:
        cfg = RuleConfig(Rule.parse(settings.rule), lag, settings.lag_max_messages)
        th = Thresholds(settings.nearing_ratio, settings.critical_ratio, settings.stall_after_ms)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    return cfg, th


def runbook_base(settings: RunSettings, metrics_port: int | None) -> str:
    """Where alerts link: ``--runbook-url``, else this job's own ``/runbook`` (served with
    its /metrics: the link works without a public site), else the project's copy."""
    if settings.runbook_url:
        return settings.runbook_url
    if not metrics_port:
        from isrwatch.alerts import RUNBOOK_BASE

        return RUNBOOK_BASE
    host = settings.metrics_host
    if host in ("", "0.0.0.0", "::"):
        host = socket.getfqdn()
    return f"http://{f'[{host}]' if ':' in host else host}:{metrics_port}/runbook"


def _sinks(settings: RunSettings, producer: Any, runbook: str) -> list[Any]:
    from streaming import notify

    sinks: list[Any] = []
    if not settings.bootstrap_servers or not settings.alertmanager_url:
        # Without an Alertmanager, alert transitions are printed, with Kafka too.
        sinks.append(notify.StdoutSink(generator_url=settings.grafana_url or "", runbook_base=runbook))
    if producer is not None:
        sinks.append(
            notify.KafkaAlertsSink(
                producer,
                settings.alerts_topic,
                generator_url=settings.grafana_url or "",
                runbook_base=runbook,
            )
        )
    if settings.alertmanager_url:
        sinks.append(
            notify.AlertmanagerSink(
                settings.alertmanager_url,
                username=settings.alertmanager_username,
                password=settings.alertmanager_password,
                ca_file=settings.alertmanager_ca_file,
                insecure=settings.alertmanager_insecure,
                resend_seconds=settings.resend_seconds,
                generator_url=settings.grafana_url or "",
                runbook_base=runbook,
            )
        )
    return sinks


class _Feeder(threading.Thread):
    """The embedded simulator, appending telemetry to the spool."""

    def __init__(self, settings: RunSettings, cfg: RuleConfig, spool: str, truth_file: IO[str] | None) -> None:
        super().__init__(name="isrwatch-simulator", daemon=True)
        self.settings = settings
        self.cfg = cfg
        self.spool = spool
        self.truth_file = truth_file
        self.stop_event = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        from simulator.run import feed_spool

        try:
            feed_spool(
                self.spool,
                self.settings.simulate or DEFAULT_SCENARIO,
                self.settings.speed,
                seed=self.settings.seed,
                lag_time_max_ms=self.cfg.lag_time_max_ms,
                cluster=self.settings.cluster,
                stop_event=self.stop_event,
                truth_file=self.truth_file,
                rule=self.cfg.rule,
                lag_max_messages=self.cfg.lag_max_messages,
            )
        except BaseException as e:  # reported by the job's loop
            self.error = e
            log.exception("simulator_failed")


def _check_checkpoint(settings: RunSettings, checkpoint_dir: str, spool_dir: str | None) -> None:
    """The checkpoint belongs to this telemetry, and its offsets still exist (streaming.origin)."""
    from streaming.origin import Origin, check_offsets, check_origin, checkpoint_offsets, kafka_origin

    if not settings.bootstrap_servers:
        origin = Origin("spool", spool_dir=os.path.abspath(spool_dir)) if spool_dir else Origin("simulator")
        check_origin(checkpoint_dir, origin)
        return
    from streaming import query
    from streaming.source_kafka import describe_topic

    options = {"kafka.bootstrap.servers": settings.bootstrap_servers, "subscribe": settings.telemetry_topic}
    options.update({f"kafka.{k}": v for k, v in kafka_config_pairs(settings.kafka_config).items()})
    cluster_id, low, high = describe_topic(options, settings.telemetry_topic, STARTUP_TIMEOUT_S)
    check_origin(checkpoint_dir, kafka_origin(settings.bootstrap_servers, settings.telemetry_topic, cluster_id))
    # The job's one query (an older checkpoint's side/ query no longer runs: its offsets do not matter).
    offsets = checkpoint_offsets(checkpoint_dir, query.AGG_DIR)
    if offsets:
        check_offsets(offsets, low, high, checkpoint_dir)


def metrics_port(settings: RunSettings) -> int:
    """``--metrics-port``, or its default: 9743 on the embedded default, 9744 with Kafka
    (where ``isrwatch exporter`` may keep 9743 on the same host)."""
    if settings.metrics_port is not None:
        return settings.metrics_port
    return KAFKA_METRICS_PORT if settings.bootstrap_servers else EMBEDDED_METRICS_PORT


def serve_metrics(store: Any, settings: RunSettings) -> Any:
    """The job's own /metrics (its current state, whichever broker stalls), with the
    exporter's cardinality controls; a port that cannot be bound is a ConfigError."""
    from exporter.server import serve

    port = metrics_port(settings)
    try:
        return serve(
            store,
            settings.metrics_host,
            port,
            default_min_isr=settings.min_insync_replicas,
            replica_series=settings.replica_series,
            replica_series_top=settings.replica_series_top,
            partition_series=settings.partition_series,
        )
    except OSError as e:
        raise ConfigError(f"--metrics-port: cannot serve on {settings.metrics_host}:{port}: {e.strerror}") from None


def run(
    settings: RunSettings,
    *,
    spark: SparkSession | None = None,
    handles: JobHandles | None = None,
    stop_event: threading.Event | None = None,
    truth_file: IO[str] | None = None,
    sinks: Sequence[Any] | None = None,
) -> int:
    """Run the job until ``--duration`` passes or ``stop_event`` is set.

    ``spark`` reuses a session (tests); ``sinks`` replaces the alert sinks;
    ``truth_file`` receives the embedded simulator's true ISR changes.
    """
    from exporter.store import StatusStore
    from streaming import query
    from streaming.batch import BatchOutput, evaluate_records, split_driver_rows
    from streaming.checkpoint import DriverCheckpoint
    from streaming.monitor import Monitor
    from streaming.outputs import DeadLetterFile, KafkaDeadLetters, KafkaStates, make_producer
    from streaming.parse import REASONS
    from streaming.producer import OutputProducer
    from streaming.replicas import StateTable
    from streaming.session import build_session
    from streaming.source import kafka_stream, spool_stream

    handles = handles or JobHandles()
    stop_event = stop_event or threading.Event()
    # From the start: a SIGTERM while Spark starts ends the job through the same clean-up.
    _install_sigterm(stop_event)
    cfg, th = _rule_config(settings)
    kafka_mode = bool(settings.bootstrap_servers)
    embedded = not kafka_mode and not settings.spool_dir
    # The embedded default's checkpoint holds simulated telemetry only: made for this run, removed at its end.
    temporary = embedded and not settings.checkpoint_dir
    checkpoint_dir = settings.checkpoint_dir or (
        default_checkpoint_dir(settings.bootstrap_servers or "", settings.telemetry_topic)
        if kafka_mode
        else tempfile.mkdtemp(prefix="isrwatch-checkpoint-")
    )
    checkpoint_dir = os.path.abspath(checkpoint_dir)
    try:
        os.makedirs(checkpoint_dir, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"--checkpoint-dir: cannot create {checkpoint_dir}: {e.strerror}") from None
    spool = settings.spool_dir or (os.path.join(checkpoint_dir, "spool") if embedded else None)
    if settings.spool_dir and not os.path.isdir(settings.spool_dir):
        raise ConfigError(f"--spool-dir: {settings.spool_dir} is not a directory")
    _check_checkpoint(settings, checkpoint_dir, spool if not embedded else None)
    future_tolerance = None if (not kafka_mode and settings.speed > 1) else FUTURE_TOLERANCE_MS
    handles.checkpoint_dir, handles.spool_dir = checkpoint_dir, spool

    own_spark = spark is None
    # Spark's own scratch space (its local directories, the native libraries RocksDB and
    # LZ4 unpack) goes into one directory of this run's, removed at the end: the JVM
    # outlives the Python process by a moment and does not always tidy up after itself.
    scratch = tempfile.mkdtemp(prefix="isrwatch-spark-") if own_spark else None
    if spark is None:
        spark = build_session(settings.spark_master, settings.shuffle_partitions, scratch_dir=scratch)
    else:
        spark.conf.set("spark.sql.shuffle.partitions", str(settings.shuffle_partitions))
        from streaming import source_spool

        source_spool.register(spark)

    cleanup: list[Any] = []
    queries: list[Any] = []
    feeder: _Feeder | None = None
    try:
        producer = (
            OutputProducer(
                make_producer(settings.bootstrap_servers or "", settings.kafka_config),
                latest_wins={settings.state_topic},
            )
            if kafka_mode
            else None
        )
        store = StatusStore()
        store.declare_deadletter_reasons(REASONS)  # the counter by reason starts at 0
        handles.store = store
        # The job serves what it computes itself, in Kafka mode too: the state topic (and the
        # exporter reading it) waits on its partitions' leaders, this does not (docs/deploy.md).
        if metrics_port(settings) != 0:
            server = serve_metrics(store, settings)
            cleanup.append(server)
            handles.metrics_port = server.port
        if kafka_mode:
            deadletters: Any = KafkaDeadLetters(producer, settings.deadletter_topic)
        else:
            handles.deadletter_file = settings.deadletter_file or os.path.join(checkpoint_dir, "deadletter.jsonl")
            deadletters = DeadLetterFile(handles.deadletter_file)
        cleanup.append(deadletters)
        all_sinks = (
            list(sinks)
            if sinks is not None
            else _sinks(settings, producer, runbook_base(settings, handles.metrics_port))
        )
        cleanup.extend(all_sinks)
        states = KafkaStates(producer, settings.state_topic) if producer is not None else None
        if states is not None:
            cleanup.append(states)
        ckpt = DriverCheckpoint(checkpoint_dir)
        monitor = Monitor(
            cfg,
            th,
            default_min_isr=settings.min_insync_replicas,
            stale_after_s=settings.stale_after_seconds,
            store=store,
            sinks=all_sinks,
            state_topic=states,
            checkpoint=ckpt,
        )
        handles.monitor = monitor
        restored = query.restore_statuses(spark, checkpoint_dir, cfg, th)
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

        if kafka_mode:
            raw = kafka_stream(spark, settings, checkpoint_dir)
        else:
            assert spool is not None
            os.makedirs(spool, exist_ok=True)
            raw = spool_stream(spark, spool, settings.max_records_per_trigger)

        table = StateTable(spark, checkpoint_dir)
        side_done = ckpt.load_side()
        max_gap_ms = settings.observation_gap_ms or cfg.lag_time_max_ms // 2

        def on_batch(raw_batch: DataFrame, batch_id: int) -> None:
            t0 = time.monotonic()
            out = evaluate_records(
                raw_batch,
                batch_id,
                table,
                cfg,
                th,
                future_tolerance_ms=future_tolerance,
                max_gap_ms=max_gap_ms,
                not_ok_keys=monitor.not_ok_keys(),
                refresh_batches=settings.ok_refresh_batches,
            )
            try:
                assert out.table is not None
                changes, finals = split_driver_rows(out.table)
                report = monitor.apply_statuses(batch_id, finals, changes)
                dead = _write_side(out, batch_id) if batch_id > side_done else {}
            finally:
                out.finish()
            elapsed = time.monotonic() - t0
            store.record_batch(elapsed, report.observations, dead)
            if producer is not None:
                store.set_outputs({t: (o.pending, o.dropped + o.failed) for t, o in producer.stats().items()})
            wall_ms = int(time.time() * 1000)
            lag_s = max(((wall_ms - t) / 1000 for t in report.clusters.values()), default=0.0)
            log.info(
                "batch %s",
                kv(
                    batch_id=batch_id,
                    observations=report.observations,
                    replicas=report.replicas,
                    states=report.statuses,
                    alerts_started=report.started,
                    alerts_resolved=report.resolved,
                    deadletters=sum(dead.values()),
                    batch_ms=round(elapsed * 1000),
                    spark_ms=round(out.spark_s * 1000),
                    **{k.replace("_s", "_ms"): round(v * 1000) for k, v in out.stages.items()},
                    telemetry_lag_s=float(lag_s),
                    changes=len(changes),
                ),
            )

        def _write_side(out: BatchOutput, batch_id: int) -> dict[str, int]:
            """Dead letters and ISR change counts of a batch not handled before; by reason."""
            try:  # the sinks log and count what they cannot write; a batch that failed here would fail again
                written = deadletters.write(out.deadletters)
            except Exception:
                written = 0
                deadletters.failed += len(out.deadletters)
                log.exception("deadletters_lost %s", kv(batch_id=batch_id, count=len(out.deadletters)))
            by_reason: dict[str, int] = {}
            for d in out.deadletters:
                by_reason[d["reason"]] = by_reason.get(d["reason"], 0) + 1
                handles.side_counts[d["reason"]] = handles.side_counts.get(d["reason"], 0) + 1
            for c in out.isr_changes:
                for change in ("shrink", "expand"):
                    if c[change]:
                        store.add_isr_changes(c["cluster"], c["topic"], int(c["partition"]), change, int(c[change]))
            ckpt.save_side(batch_id)
            if out.deadletters:
                log.warning(
                    "deadletters %s", kv(batch_id=batch_id, count=len(out.deadletters), written=written, **by_reason)
                )
            return by_reason

        queries.append(query.start_job(raw("aggregates"), checkpoint_dir, settings.trigger_seconds, on_batch))
        log.info(
            "started %s",
            kv(
                source="kafka" if kafka_mode else ("simulator" if embedded else "spool"),
                scenario=(settings.simulate or DEFAULT_SCENARIO) if embedded else None,
                checkpoint=checkpoint_dir,
                trigger_s=settings.trigger_seconds,
                metrics_port=handles.metrics_port,
                lag_time_max_ms=cfg.lag_time_max_ms,
                rule=cfg.rule.value,
            ),
        )
        if embedded:
            # The simulated cluster starts once Spark is ready to read it, so a
            # slow first start of Spark does not swallow the scenario's start.
            _wait_until_waiting_for_data(queries, timeout_s=120, stop_event=stop_event)
            feeder = _Feeder(settings, cfg, spool or "", truth_file)
            feeder.start()
        handles.ready.set()
        _loop(settings, stop_event, queries, monitor, feeder)
        return 0
    finally:
        if feeder is not None:
            feeder.stop_event.set()
            feeder.join(timeout=10)
        try:
            _drain(queries, timeout_s=max(30.0, 10 * settings.trigger_seconds))
        except Exception:  # the JVM is gone already (a signal to the whole process group)
            log.debug("drain_failed", exc_info=True)
        for q in queries:
            try:
                q.stop()
            except Exception:  # stopping a failed query
                log.debug("query_stop_failed", exc_info=True)
        if feeder is not None:
            feeder.join(timeout=10)
        for c in reversed(cleanup):
            try:
                c.close()
            except Exception:
                log.exception("close_failed what=%s", type(c).__name__)
        if own_spark:
            try:
                spark.stop()
            except Exception:  # the JVM is gone already (a signal to the whole process group)
                log.debug("spark_stop_failed", exc_info=True)
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)
        if temporary:
            shutil.rmtree(checkpoint_dir, ignore_errors=True)
            log.info("stopped %s", kv(checkpoint=checkpoint_dir, removed="temporary"))
        else:
            log.info("stopped %s", kv(checkpoint=checkpoint_dir))


def _drain(queries: list[Any], timeout_s: float) -> None:
    """Let running queries finish what is already available, so a stop does
    not interrupt a batch halfway (a restart would redo it, harmlessly, but
    noisily)."""
    waiters = []
    for q in queries:
        if not q.isActive:
            continue

        def wait(q: Any = q) -> None:
            try:
                q.processAllAvailable()
            except Exception:  # the query failed meanwhile; stop() reports nothing more
                log.debug("drain_failed query=%s", q.name, exc_info=True)

        t = threading.Thread(target=wait, name=f"drain-{q.name}", daemon=True)
        t.start()
        waiters.append(t)
    deadline = time.monotonic() + timeout_s
    for t in waiters:
        t.join(max(0.0, deadline - time.monotonic()))


def _wait_until_waiting_for_data(queries: list[Any], timeout_s: float, stop_event: threading.Event) -> None:
    """Wait until every query has planned its first trigger and found its
    source empty (Spark's own status message), a query stopped, or the job is stopped."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and not stop_event.is_set():
        if all(not q.isActive or q.status.get("message") == "Waiting for data to arrive" for q in queries):
            return
        time.sleep(0.2)
    if not stop_event.is_set():
        log.warning("spark_slow_to_start %s", kv(waited_s=timeout_s))


def _install_sigterm(stop_event: threading.Event) -> None:
    if threading.current_thread() is not threading.main_thread():
        return

    def on_term(signum: int, frame: Any) -> None:
        stop_event.set()

    signal.signal(signal.SIGTERM, on_term)


def _loop(
    settings: RunSettings, stop_event: threading.Event, queries: list[Any], monitor: Any, feeder: _Feeder | None
) -> None:
    start = time.monotonic()
    tick = min(1.0, settings.trigger_seconds)
    next_forget = start + 60
    while not stop_event.wait(tick):
        for q in queries:
            if not q.isActive:
                err = q.exception()
                raise IsrwatchError(f"query {q.name} stopped: {str(err).splitlines()[0] if err else 'no reason given'}")
        if feeder is not None and feeder.error is not None:
            raise IsrwatchError(f"embedded simulator failed: {feeder.error}")
        monitor.check_stale()
        now = time.monotonic()
        if now >= next_forget:
            monitor.forget(FORGET_AFTER_MS)
            next_forget = now + 60
        if settings.duration is not None and now - start >= settings.duration:
            log.info("duration_reached %s", kv(duration_s=settings.duration))
            break
