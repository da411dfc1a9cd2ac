"""``/metrics`` over HTTP from a ``StatusStore``.

Each server has its own ``CollectorRegistry`` holding only the store's
collector (plus the process collectors if asked), so a scrape reads the store
and nothing else: no Kafka I/O, no global registry state.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, GCCollector, PlatformCollector, ProcessCollector, start_http_server

from exporter.collector import StoreCollector
from exporter.store import StatusStore
from isrwatch.logs import kv

__all__ = ["MetricsServer", "serve", "registry_for"]

log = logging.getLogger(__name__)


def registry_for(
    store: StatusStore,
    *,
    default_min_isr: int = 1,
    replica_series: str = "all",
    replica_series_top: int = 0,
    process_metrics: bool = False,
) -> CollectorRegistry:
    """A fresh registry serving ``store`` (and the process/GC/platform
    collectors when ``process_metrics``)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(
        StoreCollector(
            store,
            default_min_isr=default_min_isr,
            replica_series=replica_series,
            replica_series_top=replica_series_top,
        )
    )
    if process_metrics:
        ProcessCollector(registry=registry)
        PlatformCollector(registry=registry)
        GCCollector(registry=registry)
    return registry


@dataclass
class MetricsServer:
    """A running ``/metrics`` endpoint; ``close()`` stops it."""

    host: str
    port: int
    registry: CollectorRegistry
    _httpd: WSGIServer
    _thread: threading.Thread

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/metrics"

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)
        log.info(kv(event="metrics_stopped", host=self.host, port=self.port))

    def __enter__(self) -> MetricsServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def serve(
    store: StatusStore,
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    default_min_isr: int = 1,
    replica_series: str = "all",
    replica_series_top: int = 0,
    process_metrics: bool = False,
) -> MetricsServer:
    """Serve ``store`` on ``http://host:port/metrics`` from a daemon thread;
    port 0 picks a free port (read it back from ``.port``)."""
    registry = registry_for(
        store,
        default_min_isr=default_min_isr,
        replica_series=replica_series,
        replica_series_top=replica_series_top,
        process_metrics=process_metrics,
    )
    httpd, thread = start_http_server(port, addr=host, registry=registry)
    bound = httpd.server_address[1]
    log.info(kv(event="metrics_serving", host=host, port=bound, replica_series=replica_series))
    return MetricsServer(host, bound, registry, httpd, thread)
