"""``isrwatch collect``: poll a real cluster every interval and publish telemetry.

The cluster's own settings the telemetry carries, each broker's ``replica.lag.time.max.ms`` and
each topic's ``min.insync.replicas``, are read by DescribeConfigs (Kafka 0.11 on) at start-up and
every ``CONFIG_REFRESH_S`` (:class:`ClusterConfigs`). A flag the user gave (``--lag-time-max-ms``,
``--min-insync-replicas``) wins: with both given nothing is asked. A value once read is kept
through a later read that cannot get it. What was never read falls back to the flag, else to
nothing in the telemetry (the job's own setting, else its default), and one line says which value
is used and why, logged again only when that changes (Kafka 0.9 has no DescribeConfigs: one line
at start-up).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from collector.jmx import JmxConnection
from collector.jmxprobe import JmxProbe
from collector.probe import ClusterProbe, Snapshot
from collector.publisher import TelemetryPublisher, batch_records
from collector.settings import CollectSettings
from collector.tracker import PartitionSettings, ReplicaTracker
from isrwatch.clientconfig import kafka_python_config, librdkafka_config
from isrwatch.logs import kv
from isrwatch.settings import kafka_config_pairs
from isrwatch.signals import StopSignals

__all__ = ["main", "Collector", "ClusterConfigs", "CONFIG_REFRESH_S"]

log = logging.getLogger(__name__)

CONFIG_REFRESH_S = 300.0  # seconds between two reads of the cluster's settings


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
        self.cluster_probe = metadata  # its DescribeConfigs reads the cluster's settings (ClusterConfigs, below)
        self.round_timeout = round_timeout
        self.configs = ClusterConfigs(PartitionSettings(settings.lag_time_max_ms, settings.min_insync_replicas))
        self.tracker = ReplicaTracker(settings=self.configs.settings)
        separate = bool(settings.telemetry_bootstrap_servers)
        telemetry_props = {**props, **kafka_config_pairs(settings.telemetry_kafka_config)} if separate else props
        self.publisher = TelemetryPublisher(
            librdkafka_config(settings.telemetry_bootstrap_servers or settings.bootstrap_servers, telemetry_props),
            settings.telemetry_topic,
            settings.cluster,
            same_cluster=not separate,
        )
        self.rounds = 0
        self.held = 0  # followers' observations left out after their leader's silence (tracker)
        self._unreachable: set[int] = set()
        self._version_logged: tuple[str | None] | None = None

    def start(self) -> Snapshot:
        snap = self.probe.connect(self.settings.startup_timeout)
        self.configs.refresh(self.cluster_probe, self.round_timeout)
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

    def _kafka_version(self) -> str | None:
        """The cluster's Kafka version for this round's records (the probe's), logged when it
        changes: the job picks the rule's variant of the cluster from it (docs/rule.md)."""
        version = self.probe.kafka_version
        if self._version_logged != (version,):
            self._version_logged = (version,)
            log.info(
                kv(
                    event="kafka_version",
                    cluster=self.settings.cluster,
                    version=version or "unknown",
                    reason="the oldest broker's ApiVersions answer"
                    if version
                    else "no broker answered ApiVersions (Kafka 0.9, or none connected): not written",
                )
            )
        return version

    def run_round(self, snap: Snapshot | None = None) -> int:
        """Poll (unless given a snapshot), publish; returns the number of observations."""
        snap = snap or self.probe.snapshot()
        self.configs.refresh(self.cluster_probe, self.round_timeout)  # when due (every CONFIG_REFRESH_S)
        result = self.tracker.observe(snap)
        if result.held:
            self.held += result.held
            log.info(
                kv(
                    event="observations_held",
                    followers=result.held,
                    reason="their leader answers again after a silence, they are still below its LEO of before it",
                    hint="each is observed at the next round (docs/rule.md)",
                )
            )
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
            kafka_version=self._kafka_version(),
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
                    held=self.held,
                )
            )
        return len(result.observations)

    def close(self) -> None:
        left = self.publisher.flush()
        if left:
            log.warning(kv(event="telemetry_undelivered_at_exit", records=left))
        self.probe.close()


class ClusterConfigs:
    """Reads the cluster's settings into ``settings`` (what the tracker writes into each
    partition's observations) when due: at the first :meth:`refresh`, then every ``refresh_s``."""

    def __init__(
        self,
        settings: PartitionSettings,
        refresh_s: float = CONFIG_REFRESH_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings
        self.refresh_s = refresh_s
        self._clock = clock
        self.reads = 0
        self._read_at: float | None = None
        self._logged: tuple[object, ...] | None = None

    def due(self) -> bool:
        if self.settings.flags_given:
            return False  # both given: the flags win, nothing to read
        return self._read_at is None or self._clock() - self._read_at >= self.refresh_s

    def refresh(self, probe: ClusterProbe, timeout_s: float) -> None:
        """One read when due (bounded by ``timeout_s``); never raises for the cluster's answers."""
        if not self.due():
            return
        self._read_at = self._clock()
        s = self.settings
        answers = probe.describe_configs(timeout_s)
        self.reads += 1
        s.lag_time_max_ms.update(answers.lag_time_max_ms)
        s.min_isr.update(answers.min_isr)
        unread = {
            what: why
            for what, why in answers.unread.items()
            if (
                what.startswith("broker ") and s.flag_lag_time_max_ms is None and int(what[7:]) not in s.lag_time_max_ms
            )
            or (what.startswith("topic ") and s.flag_min_isr is None and what[6:] not in s.min_isr)
        }
        self._log(unread)

    def _log(self, unread: dict[str, str]) -> None:
        s = self.settings
        lag = sorted(s.lag_time_max_ms.items())
        state = (tuple(lag), tuple(sorted(s.min_isr.items())), tuple(sorted(unread.items())))
        if state == self._logged:
            return
        self._logged = state
        if lag or s.min_isr:
            log.info(
                kv(
                    event="cluster_settings_read",
                    lag_time_max_ms=",".join(f"{b}:{ms}" for b, ms in lag) or "-",
                    min_isr_topics=len(s.min_isr),
                    min_isr=",".join(sorted({str(v) for v in s.min_isr.values()})) or "-",
                )
            )
        if not unread:
            return
        lag_used = (
            f"{s.flag_lag_time_max_ms} (--lag-time-max-ms)"
            if s.flag_lag_time_max_ms is not None
            else "none in the telemetry (the job's --lag-time-max-ms, else 30000)"
        )
        min_isr_used = (
            f"{s.flag_min_isr} (--min-insync-replicas)"
            if s.flag_min_isr is not None
            else "none in the telemetry (the job's --min-insync-replicas, else 1)"
        )
        reasons = sorted(set(unread.values()))
        log.warning(
            kv(
                event="cluster_settings_unread",
                unread=",".join(sorted(unread)[:20]) + (",..." if len(unread) > 20 else ""),
                reason="; ".join(reasons[:3]),
                lag_time_max_ms=lag_used if any(w.startswith("broker ") for w in unread) else "as read",
                min_isr=min_isr_used if any(w.startswith("topic ") for w in unread) else "as read",
            )
        )


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
