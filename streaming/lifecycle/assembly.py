"""What a job is made of, from its settings: the rule, the outputs, the monitor.

``streaming.lifecycle.job.Job`` calls these in ``start`` and owns what they make: each resource
that must be released is handed to ``on_close`` (``Job._on_close``: released in one
place, newest first) as soon as it exists, so a start that fails half-way releases
what it made.

* ``rule_config``: the KIP-16 rule and the alert thresholds the flags ask for;
* ``make_outputs``: the exporter store (served over HTTP unless ``--metrics-port 0``),
  dead letters (a topic in Kafka mode, else a file), the alert sinks, the state topic
  (Kafka mode), the driver's checkpoint of its alerts;
* ``make_monitor``: the driver's ``streaming.driver.monitor.Monitor`` on those outputs, with the
  lookahead and the job's own watch of the brokers for Kafka telemetry, restored from
  the checkpoint of the run before.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, NamedTuple, Protocol, TypeVarTuple

from isrwatch.exceptions import ConfigError
from isrwatch.logs import kv
from isrwatch.rule import AUTO, Rule, RuleConfig
from isrwatch.settings import kafka_config_pairs
from isrwatch.status import Thresholds
from streaming.driver.brokerwatch import BrokerWatch
from streaming.driver.endpoints import alert_sinks, metrics_port, runbook_base, serve_metrics
from streaming.settings import AlertingSettings, JobSettings

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from exporter.settings import SeriesSettings
    from exporter.store import StatusStore
    from streaming.driver.checkpoint import DriverCheckpoint
    from streaming.driver.monitor import Monitor
    from streaming.driver.notify import AlertSink
    from streaming.sinks.letterwriter import LetterWriter
    from streaming.sinks.outputs import DeadLetterSink, KafkaStates
    from streaming.sinks.statewriter import StateWriter

__all__ = ["Outputs", "rule_config", "make_outputs", "make_monitor", "COLLECTOR_ROUND_MS"]

log = logging.getLogger("streaming.job")  # the job's lines, as its users read them

# The collector's default round (``isrwatch collect --interval``): the telemetry's granularity.
COLLECTOR_ROUND_MS = 1_000

Ts = TypeVarTuple("Ts")


class OnClose(Protocol):
    """``Job._on_close``: what it is (for the log), the call that releases it, its arguments."""

    def __call__(self, what: str, fn: Callable[[*Ts], object], *args: *Ts, jvm: bool = False) -> None: ...


class Outputs(NamedTuple):
    """Where a job's results go (``make_outputs``)."""

    store: StatusStore
    deadletters: DeadLetterSink  # a file (the embedded default, spools) or the dead-letter topic
    sinks: list[AlertSink]  # stdout, Alertmanager, the alerts topic
    states: KafkaStates | None  # the state topic's tombstones, from the driver (Kafka mode)
    state_writer: StateWriter | None  # its records, from the executors (Kafka mode)
    letter_writer: LetterWriter | None  # the dead letters, from the executors (Kafka mode)
    checkpoint: DriverCheckpoint
    metrics_port: int | None  # the job's own /metrics (None: not served)
    deadletter_file: str | None  # where the dead letters go on the embedded default (None: a topic)


def rule_config(settings: JobSettings) -> tuple[RuleConfig, Thresholds]:
    """The rule and thresholds of ``settings`` (ConfigError with the reason when they do not fit)."""
    embedded = not settings.bootstrap_servers
    lag = settings.lag_time_max_ms or (10_000 if embedded else 30_000)
    try:
        if settings.rule == AUTO:  # each cluster's variant from its Kafka version; the default where none
            cfg = RuleConfig(Rule.KIP16_REFINED, lag, settings.lag_max_messages, by_version=True)
        else:
            cfg = RuleConfig(Rule.parse(settings.rule), lag, settings.lag_max_messages)
        th = Thresholds(settings.nearing_ratio, settings.critical_ratio, settings.stall_after_ms)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    return cfg, th


def make_outputs(
    settings: JobSettings,
    checkpoint_dir: str,
    on_close: OnClose,
    series: SeriesSettings,
    alerting: AlertingSettings,
    sinks: Sequence[AlertSink] | None = None,
) -> Outputs:
    """The job's outputs; ``sinks`` replaces the alert sinks the settings ask for (tests)."""
    from exporter.store import StatusStore
    from isrwatch.outcomes import ShrinkOutcomes
    from streaming.driver.checkpoint import DriverCheckpoint
    from streaming.evaluation.parse import REASONS
    from streaming.sinks.letterwriter import LetterWriter
    from streaming.sinks.outputs import DeadLetterFile, KafkaDeadLetters, KafkaStates, make_producer, producer_config
    from streaming.sinks.producer import OutputProducer
    from streaming.sinks.statewriter import StateWriter

    producer = None
    if settings.bootstrap_servers:
        producer = OutputProducer(
            make_producer(settings.bootstrap_servers, settings.kafka_config),
            latest_wins={settings.state_topic},
        )
    # the lag-time evidence's margin: one collector round (its default interval) plus the stall time
    store = StatusStore(
        outcomes=ShrinkOutcomes(lag_margin_ms=COLLECTOR_ROUND_MS + settings.stall_after_ms),
        every_replica=settings.driver_replicas == "all",
    )
    store.health.declare_deadletter_reasons(REASONS)  # the counter by reason starts at 0
    if producer is not None:
        out = producer
        store.health.read_outputs_from(lambda: {t: (o.pending, o.dropped + o.failed) for t, o in out.stats().items()})
    # The job serves what it computes itself, in Kafka mode too: the state topic (and the
    # exporter reading it) waits on its partitions' leaders, this does not (docs/deploy.md).
    port = deadletter_file = None
    if metrics_port(settings) != 0:
        server = serve_metrics(store, settings, series)
        on_close("metrics server", server.close)
        port = server.port
    letters = None
    deadletters: DeadLetterSink
    if producer is not None and settings.bootstrap_servers:
        to_topic = KafkaDeadLetters(producer, settings.deadletter_topic)
        conf = producer_config(settings.bootstrap_servers, settings.kafka_config)
        deadletters, letters = to_topic, LetterWriter(conf, to_topic, by_driver=settings.state_writer == "driver")
    else:
        deadletter_file = settings.deadletter_file or os.path.join(checkpoint_dir, "deadletter.jsonl")
        deadletters = DeadLetterFile(deadletter_file)
    on_close("dead letters", deadletters.close)
    if sinks is None:
        base = runbook_base(alerting, settings, port)
        sinks = alert_sinks(settings, alerting, producer, base, checkpoint_dir)
    for sink in sinks:
        on_close(type(sink).__name__, sink.close)
    writer = None
    if producer is not None and settings.bootstrap_servers:
        conf = producer_config(settings.bootstrap_servers, settings.kafka_config)
        writer = StateWriter(conf, settings.state_topic, producer, by_driver=settings.state_writer == "driver")
    states = None
    if producer is not None:
        states = KafkaStates(producer, settings.state_topic, writer.forgotten if writer is not None else None)
        on_close("state topic", states.close)
    checkpoint = DriverCheckpoint(checkpoint_dir)
    return Outputs(store, deadletters, list(sinks), states, writer, letters, checkpoint, port, deadletter_file)


def make_monitor(
    spark: SparkSession,
    settings: JobSettings,
    rule: tuple[RuleConfig, Thresholds],
    checkpoint_dir: str,
    outputs: Outputs,
    on_close: OnClose,
    telemetry_cluster_id: str | None = None,
) -> Monitor:
    """The driver's monitor on ``outputs``, with the lookahead and the broker watch for
    Kafka telemetry (``telemetry_cluster_id``: its cluster's id, where its brokers give one),
    and the statuses and alerts of the run before (the checkpoint)."""
    from streaming.driver.identity import Identities
    from streaming.driver.lookahead import Lookahead
    from streaming.driver.monitor import Monitor
    from streaming.lifecycle import query

    cfg, th = rule
    # Between batches the clock runs on for Kafka telemetry, stamped as it happens; the
    # embedded simulator and spools (replays, faster than real time) wait for evidence.
    live = bool(settings.bootstrap_servers) and settings.lookahead_ms != 0
    lookahead = (
        Lookahead(cfg, th, live_ms=int(settings.stale_after_seconds * 1000), horizon_ms=settings.lookahead_ms)
        if live
        else None
    )
    monitor = Monitor(
        cfg,
        th,
        default_min_isr=settings.min_insync_replicas,
        stale_after_s=settings.stale_after_seconds,
        store=outputs.store,
        sinks=outputs.sinks,
        state_topic=outputs.states,
        checkpoint=outputs.checkpoint,
        lookahead=lookahead,
        broker_watch=_broker_watch(settings, on_close, telemetry_cluster_id) if live else None,
        identities=Identities(settings.telemetry_cluster),
        holds_ok=settings.driver_replicas == "all",
        # not-ok: the ok followers of a broker the job sees silent, from the state table
        followers_of=None
        if settings.driver_replicas == "all"
        else functools.partial(query.follower_statuses, spark, checkpoint_dir, cfg, th),
    )
    on_close("silent followers' read back", monitor.close)  # (before Spark stops: registered after it)
    # With --driver-replicas not-ok, only the replicas the driver would hold after a batch (and each
    # cluster's newest, its clock) leave Spark: a fleet's ok replicas never become Python objects.
    held = None if monitor.holds_ok else (settings.min_insync_replicas, lookahead)
    restored = query.restore_statuses(spark, checkpoint_dir, cfg, th, held=held)
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


def _broker_watch(settings: JobSettings, on_close: OnClose, cluster_id: str | None) -> BrokerWatch | None:
    """The telemetry cluster's brokers as the job sees them (``streaming.driver.brokerwatch``)."""
    off = _watch_off(settings)
    if off:
        log.info("broker_watch_off %s", kv(reason=off))
        return None
    watch = BrokerWatch(settings.bootstrap_servers or "", settings.telemetry_topic, cluster_id=cluster_id).start()
    on_close("broker watch", watch.stop)
    return watch


def _watch_off(settings: JobSettings) -> str | None:
    """Why the job cannot watch its telemetry cluster's brokers itself; None when it can."""
    protocol = kafka_config_pairs(settings.kafka_config).get("security.protocol", "PLAINTEXT")
    if protocol.upper() != "PLAINTEXT":
        return f"security.protocol={protocol} (the watch speaks PLAINTEXT only)"
    return None
