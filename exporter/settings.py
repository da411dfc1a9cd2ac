"""Settings of ``isrwatch exporter``."""

from __future__ import annotations

from dataclasses import dataclass

from isrwatch.settings import option

__all__ = ["ExporterSettings"]


@dataclass(frozen=True)
class ExporterSettings:
    bootstrap_servers: str | None = option(None, "bootstrap servers of the state topic (required)", metavar="HOSTS")
    kafka_config: list[str] = option(
        [], "librdkafka property KEY=VALUE for every Kafka client (repeatable)", metavar="KEY=VALUE"
    )
    state_topic: str = option("isr.replica-state", "replica state topic")
    host: str = option("0.0.0.0", "address to serve /metrics on")
    port: int = option(9743, "port to serve /metrics on")

    def validate(self) -> str | None:
        if not self.bootstrap_servers:
            return "--bootstrap-servers is required (the cluster holding the state topic)"
        return None
