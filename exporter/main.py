"""``isrwatch exporter``: the state topic in, ``/metrics`` out."""

from __future__ import annotations

import logging
import threading

from exporter.consumer import StateTopicConsumer
from exporter.server import MetricsServer, serve
from exporter.settings import ExporterSettings
from exporter.store import StatusStore
from exporter.webconfig import load_web_config
from isrwatch.exceptions import ConfigError
from isrwatch.logs import kv
from isrwatch.settings import kafka_config_pairs
from isrwatch.signals import StopSignals

__all__ = ["Exporter", "main"]

log = logging.getLogger(__name__)


class Exporter:
    """The consumer thread and the HTTP server over one store. ``start()``
    connects (UnreachableError if Kafka cannot be reached) and serves;
    ``close()`` stops both."""

    def __init__(self, settings: ExporterSettings) -> None:
        assert settings.bootstrap_servers
        self.settings = settings
        self.store = StatusStore(derive_isr_changes=True)
        config = {**kafka_config_pairs(settings.kafka_config), "bootstrap.servers": settings.bootstrap_servers}
        self.consumer = StateTopicConsumer(
            config,
            settings.state_topic,
            self.store,
            expire_after_ms=int(settings.expire_after_seconds * 1000),
        )
        self.server: MetricsServer | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self.consumer.run, args=(self._stop,), name="state-consumer")

    def start(self) -> Exporter:
        s = self.settings
        web_config = load_web_config(s.web_config_file) if s.web_config_file else None
        self.consumer.connect(s.startup_timeout)
        try:
            self.server = serve(
                self.store,
                s.host,
                s.port,
                default_min_isr=s.min_insync_replicas,
                replica_series=s.series.replica_series,
                replica_series_top=s.series.replica_series_top,
                partition_series=s.series.partition_series,
                process_metrics=True,
                web_config=web_config,
            )
        except OSError as e:
            self.consumer.close()
            raise ConfigError(f"--port: cannot serve /metrics on {s.host}:{s.port}: {e.strerror}") from None
        self._thread.start()
        log.info(kv(event="exporter_started", state_topic=s.state_topic, metrics=self.server.url))
        return self

    def wait(self) -> None:
        while not self._stop.wait(1.0):
            pass

    def stop(self) -> None:
        self._stop.set()

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)
        if self.server is not None:
            self.server.close()
        self.consumer.close()

    def __enter__(self) -> Exporter:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


def main(settings: ExporterSettings) -> int:
    exporter = Exporter(settings)
    with StopSignals(lambda signum: exporter.stop(), name="exporter"), exporter:
        exporter.wait()
    return 0
