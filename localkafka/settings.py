"""Settings of ``isrwatch local-kafka``."""

from __future__ import annotations

from dataclasses import dataclass

from isrwatch.settings import option, positive

__all__ = ["LocalKafkaSettings"]


@dataclass(frozen=True)
class LocalKafkaSettings:
    brokers: int = option(3, "number of brokers", check=positive)
    lag_time_max_ms: int = option(10_000, "replica.lag.time.max.ms of the brokers", check=positive)
    zookeeper_session_timeout_ms: int = option(60_000, "zookeeper.session.timeout.ms of the brokers", check=positive)
    data_dir: str | None = option(None, "where brokers keep data (default: a temporary directory)", metavar="DIR")
