"""Settings of ``isrwatch collect``."""

from __future__ import annotations

from dataclasses import dataclass

from isrwatch.settings import option, positive

__all__ = ["CollectSettings"]


@dataclass(frozen=True)
class CollectSettings:
    bootstrap_servers: str | None = option(
        None, "bootstrap servers of the cluster to watch (required)", metavar="HOSTS"
    )
    kafka_config: list[str] = option(
        [], "librdkafka property KEY=VALUE for every Kafka client (repeatable)", metavar="KEY=VALUE"
    )
    telemetry_bootstrap_servers: str | None = option(
        None, "publish telemetry to this cluster instead of the watched one", metavar="HOSTS"
    )
    telemetry_kafka_config: list[str] = option(
        [],
        "librdkafka property KEY=VALUE for the telemetry cluster's producer, over --kafka-config "
        "(with --telemetry-bootstrap-servers; repeatable)",
        metavar="KEY=VALUE",
    )
    telemetry_topic: str = option("isr.telemetry", "telemetry topic")
    interval: float = option(1.0, "seconds between polling rounds (sub-second allowed)", check=positive)
    cluster: str = option("default", "cluster name written into the telemetry")
    duration: float | None = option(None, "stop after this many seconds", check=positive, metavar="SECONDS")
    lag_time_max_ms: int | None = option(
        None,
        "the cluster's replica.lag.time.max.ms, written into the telemetry (brokers before 0.11 cannot tell it)",
        check=positive,
        metavar="MS",
    )
    min_insync_replicas: int | None = option(
        None, "the cluster's min.insync.replicas, written into the telemetry", check=positive, metavar="N"
    )
    round_timeout: float | None = option(
        None,
        "seconds a round waits for brokers' answers before it calls one unreachable (default: max(interval, 0.5))",
        check=positive,
        metavar="SECONDS",
    )
    startup_timeout: float = option(
        15.0, "seconds to reach the cluster at start-up before giving up", check=positive, metavar="SECONDS"
    )
    max_observations_per_record: int = option(
        500, "observations batched into one telemetry record", check=positive, metavar="N"
    )

    def validate(self) -> str | None:
        if not self.bootstrap_servers:
            return "--bootstrap-servers is required (for example --bootstrap-servers kafka1:9092,kafka2:9092)"
        if self.telemetry_kafka_config and not self.telemetry_bootstrap_servers:
            return "--telemetry-kafka-config needs --telemetry-bootstrap-servers (the telemetry cluster it configures)"
        return None
