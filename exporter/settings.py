"""Settings of ``isrwatch exporter``."""

from __future__ import annotations

from dataclasses import dataclass

from exporter.webconfig import web_config_problem
from isrwatch.settings import group, host_ports, not_negative, option, port_number, positive, topic_name

__all__ = ["ExporterSettings", "SeriesSettings", "REPLICA_SERIES", "PARTITION_SERIES"]

# Same values as exporter.families.REPLICA_SERIES and PARTITION_SERIES (kept here so --help stays cheap).
REPLICA_SERIES = ("all", "not-ok")
PARTITION_SERIES = ("all", "at-risk")
PARTITION_SERIES_HELP = (
    "which partitions get partition series: all, or at-risk (a follower not ok, ISR below the replicas, "
    "min ISR headroom <= 0, or an ISR change in the last 10 min; isrwatch_partitions counts every partition)"
)


REPLICA_SERIES_HELP = "which replicas get per-replica series: all, or not-ok (partition/cluster gauges stay complete)"
REPLICA_SERIES_TOP_HELP = "export per-replica series for at most N replicas, highest lag ratio first (0: no cap)"


@dataclass(frozen=True)
class SeriesSettings:
    """Which series a /metrics endpoint serves (the exporter's, and the job's own)."""

    replica_series: str = option("all", REPLICA_SERIES_HELP, choices=REPLICA_SERIES)
    replica_series_top: int = option(0, REPLICA_SERIES_TOP_HELP, check=not_negative, metavar="N")
    partition_series: str = option("all", PARTITION_SERIES_HELP, choices=PARTITION_SERIES)


@dataclass(frozen=True)
class ExporterSettings:
    bootstrap_servers: str | None = option(
        None, "bootstrap servers of the state topic (required)", check=host_ports, metavar="HOSTS"
    )
    kafka_config: list[str] = option(
        [], "librdkafka property KEY=VALUE for every Kafka client (repeatable)", metavar="KEY=VALUE"
    )
    state_topic: str = option("isr.replica-state", "replica state topic", check=topic_name)
    host: str = option("0.0.0.0", "address to serve /metrics on")
    port: int = option(9743, "port to serve /metrics on (0: pick a free one)", check=port_number)
    web_config_file: str | None = option(
        None,
        "TLS and basic auth for /metrics and /runbook: a Prometheus exporter-toolkit web configuration file "
        "(tls_server_config, basic_auth_users with bcrypt hashes; docs/deploy.md)",
        check=web_config_problem,
        metavar="FILE",
    )
    startup_timeout: float = option(
        15.0, "seconds to reach Kafka at start-up before giving up", check=positive, metavar="SECONDS"
    )
    expire_after_seconds: float = option(
        300.0,
        "drop a replica whose status is this far behind its cluster's newest and not refreshed for as long",
        check=positive,
        metavar="SECONDS",
    )
    min_insync_replicas: int = option(
        1, "min.insync.replicas for the headroom gauge where the status does not say", check=positive
    )
    series: SeriesSettings = group(SeriesSettings)

    def validate(self) -> str | None:
        if not self.bootstrap_servers:
            return "--bootstrap-servers is required (the cluster holding the state topic)"
        return None
