"""``isrwatch collect``: poll a real cluster every interval and publish telemetry."""

from __future__ import annotations

import logging
import time

from collector.jmx import JmxConnection
from collector.jmxprobe import JmxProbe
from collector.probe import ClusterProbe, Snapshot
from collector.publisher import TelemetryPublisher, batch_records
from collector.settings import CollectSettings
from collector.tracker import ReplicaTracker
from isrwatch.clientconfig import kafka_python_config, librdkafka_config
from isrwatch.logs import kv
from isrwatch.settings import kafka_config_pairs
from isrwatch.signals import StopSignals

__all__ = ["main", "Collector"]

log = logging.getLogger(__name__)


class Collector:
    """One probe, one tracker, one publisher; :meth:`run_round` is one polling round."""

    def __init__(self, settings: CollectSettings) -> None:
        assert settings.bootstrap_servers
        self.settings = settings
        props = kafka_config_pairs(settings.kafka_config)
        round_timeout = settings.round_timeout or max(settings.interval, 0.5)
        metadata = ClusterProbe(kafka_python_config(settings.bootstrap_servers, props), round_timeout)
        self.probe: ClusterProbe | JmxProbe = metadata
        if settings.source == "jmx":
            self.probe = JmxProbe(
                metadata,
                jmx_connections(settings),
                round_timeout,
                settings.jmx_truststore,
                settings.jmx_truststore_password,
            )
        self.tracker = ReplicaTracker(settings.lag_time_max_ms, settings.min_insync_replicas)
        separate = bool(settings.telemetry_bootstrap_servers)
        telemetry_props = {**props, **kafka_config_pairs(settings.telemetry_kafka_config)} if separate else props
        self.publisher = TelemetryPublisher(
            librdkafka_config(settings.telemetry_bootstrap_servers or settings.bootstrap_servers, telemetry_props),
            settings.telemetry_topic,
            settings.cluster,
            same_cluster=not separate,
        )
        self.rounds = 0
        self._unreachable: set[int] = set()

    def start(self) -> Snapshot:
        snap = self.probe.connect(self.settings.startup_timeout)
        self.publisher.refresh_partitions(timeout_s=5.0, force=True)
        count = len(self.publisher.chooser.partitions)
        if count == 1:
            log.warning(
                kv(
                    event="telemetry_topic_single_partition",
                    topic=self.settings.telemetry_topic,
                    hint="when its leader stalls no telemetry gets through; give the topic one partition per "
                    "broker or more (docs/deploy.md)",
                )
            )
        replicated = [p.partition for p in self.publisher.chooser.partitions if len(p.replicas) > 1]
        if self.publisher.same_cluster and replicated:
            log.warning(
                kv(
                    event="telemetry_topic_replicated",
                    topic=self.settings.telemetry_topic,
                    partitions=len(replicated),
                    hint="a follower that hangs holds back the high watermark of every partition it follows, so "
                    "the job reads nothing written there until the broker drops it: the shrink it should warn of. "
                    "On the watched cluster give the topic one replica per partition, or use "
                    "--telemetry-bootstrap-servers (docs/deploy.md)",
                )
            )
        log.info(
            kv(
                event="collector_connected",
                cluster=self.settings.cluster,
                source=self.settings.source,
                brokers=",".join(str(b) for b in sorted(snap.brokers)),
                partitions=len(snap.partitions),
                telemetry_topic=self.settings.telemetry_topic,
            )
        )
        return snap

    def run_round(self, snap: Snapshot | None = None) -> int:
        """Poll (unless given a snapshot), publish; returns the number of observations."""
        snap = snap or self.probe.snapshot()
        result = self.tracker.observe(snap)
        records = batch_records(
            self.settings.cluster,
            result.observations,
            result.isr_changes,
            self.settings.max_observations_per_record,
            source=self.settings.source,
            brokers=snap.counters,
            gone=result.gone,
            version=self.settings.telemetry_version,
            cluster_id=self.probe.cluster_id,
            endpoints=snap.brokers,
        )
        self.publisher.unreachable = set(snap.unreachable)
        self.publisher.publish(records)
        self.rounds += 1
        if snap.unreachable != self._unreachable:
            log.warning(kv(event="brokers_unreachable", brokers=",".join(map(str, sorted(snap.unreachable))) or "none"))
            self._unreachable = set(snap.unreachable)
        for c in result.isr_changes:
            log.info(
                kv(event="isr_change", topic=c.topic, partition=c.partition, before=c.isr_before, after=c.isr_after)
            )
        if result.gone:
            log.info(
                kv(
                    event="replicas_gone",
                    count=len(result.gone),
                    replicas=",".join(f"{g.topic}/{g.partition}/{g.broker_id}" for g in result.gone[:20]),
                )
            )
        if self.rounds == 1 or self.rounds % max(1, int(30 / self.settings.interval)) == 0:
            log.info(
                kv(
                    event="collector_progress",
                    rounds=self.rounds,
                    brokers=len(snap.brokers),
                    partitions=len(snap.partitions),
                    observations=len(result.observations),
                    records=len(records),
                    round_s=snap.round_s,
                    delivered=self.publisher.delivered,
                    resent=self.publisher.resent,
                    pending=self.publisher.pending,
                    lost=self.publisher.failed,
                )
            )
        return len(result.observations)

    def close(self) -> None:
        left = self.publisher.flush()
        if left:
            log.warning(kv(event="telemetry_undelivered_at_exit", records=left))
        self.probe.close()


def jmx_connections(settings: CollectSettings) -> list[JmxConnection]:
    """One connection per ``--jmx`` endpoint, with the JMX remote credentials and TLS options."""
    return [
        JmxConnection(endpoint, settings.jmx_user, settings.jmx_password, settings.jmx_registry_ssl)
        for endpoint in settings.jmx
    ]


def main(settings: CollectSettings) -> int:
    with StopSignals(name="collector") as stop:
        collector = Collector(settings)
        snap: Snapshot | None = collector.start()
        ends = None if settings.duration is None else time.monotonic() + settings.duration
        try:
            next_round = time.monotonic()
            while not stop.is_set() and (ends is None or time.monotonic() < ends):
                collector.run_round(snap)
                snap = None
                next_round += settings.interval
                delay = next_round - time.monotonic()
                if delay < 0:
                    next_round = time.monotonic()  # the round overran: start the next now, do not pile up
                    delay = 0
                if stop.wait(delay):
                    break
                snap = collector.probe.snapshot()
        except KeyboardInterrupt:  # a second Ctrl-C: stop now
            pass
        finally:
            collector.close()
    return 0
