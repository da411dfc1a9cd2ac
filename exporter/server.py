"""``/metrics`` over HTTP from a ``StatusStore``.

A scrape takes one store snapshot and writes it with ``exporter.exposition``
(fast for large fleets); the process/GC/platform collectors, when asked for,
live in a fresh ``CollectorRegistry`` of the server's own. A scrape reads
memory only: no Kafka I/O, no global registry state.
"""

from __future__ import annotations

import gzip
import logging
import socket
import ssl
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, GCCollector, PlatformCollector, ProcessCollector, generate_latest
from prometheus_client.exposition import ThreadingWSGIServer

from exporter.exposition import CONTENT_TYPE, render
from exporter.families import MetricsView, StoreCollector
from exporter.runbook import runbook_html
from exporter.store import StatusStore
from exporter.webconfig import WebConfig
from isrwatch.logs import kv

__all__ = ["MetricsServer", "serve", "registry_for", "metrics_app"]

log = logging.getLogger(__name__)


def registry_for(
    store: StatusStore,
    *,
    default_min_isr: int = 1,
    replica_series: str = "all",
    replica_series_top: int = 0,
    partition_series: str = "all",
    process_metrics: bool = False,
) -> CollectorRegistry:
    """A fresh registry with the store's collector (and the process
    collectors when ``process_metrics``), for code that wants the
    prometheus_client API, e.g. ``get_sample_value``."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(
        StoreCollector(
            store,
            default_min_isr=default_min_isr,
            replica_series=replica_series,
            replica_series_top=replica_series_top,
            partition_series=partition_series,
        )
    )
    if process_metrics:
        _add_process_collectors(registry)
    return registry


def _add_process_collectors(registry: CollectorRegistry) -> None:
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    GCCollector(registry=registry)


def metrics_app(store: StatusStore, view: MetricsView, extra: CollectorRegistry | None = None) -> Callable[..., Any]:
    """A WSGI app: ``/metrics`` (and ``/``) give the store's metrics, then
    ``extra``'s; ``/runbook`` the runbook the alerts link to (``exporter.runbook``)."""

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "/")
        if path == "/runbook":
            page = runbook_html()
            if page is None:
                start_response("404 Not Found", [("Content-Type", "text/plain")])
                return [b"docs/runbook.md is not installed beside isrwatch\n"]
            start_response("200 OK", [("Content-Type", "text/html; charset=utf-8"), ("Content-Length", str(len(page)))])
            return [page]
        if path not in ("/", "/metrics"):
            start_response("404 Not Found", [("Content-Type", "text/plain")])
            return [b"not found: try /metrics or /runbook\n"]
        body = render(store.snapshot(), view).encode()
        if extra is not None:
            body += generate_latest(extra)
        headers = [("Content-Type", CONTENT_TYPE)]
        if "gzip" in environ.get("HTTP_ACCEPT_ENCODING", ""):
            body = gzip.compress(body, compresslevel=1)
            headers.append(("Content-Encoding", "gzip"))
        headers.append(("Content-Length", str(len(body))))
        start_response("200 OK", headers)
        return [body]

    return app


class _ThreadingWSGIServerV6(ThreadingWSGIServer):
    address_family = socket.AF_INET6


class _QuietHandler(WSGIRequestHandler):
    timeout = 30  # a client that connects and says nothing (or no TLS handshake) gives up its thread

    def setup(self) -> None:
        super().setup()
        if isinstance(self.request, ssl.SSLSocket):  # the handshake on the request's thread, not the accept loop
            self.request.do_handshake()

    def log_message(self, format: str, *args: Any) -> None:  # scrapes are not news
        pass


def _quiet_errors(httpd: WSGIServer) -> None:
    """A failed TLS handshake (plain HTTP to an HTTPS port) or a dropped connection is the
    client's problem: logged at DEBUG, not a traceback on stderr."""

    def handle_error(request: Any, client_address: Any) -> None:
        log.debug(kv(event="metrics_request_failed", client=client_address[0]), exc_info=True)

    httpd.handle_error = handle_error  # type: ignore[method-assign]


@dataclass
class MetricsServer:
    """A running ``/metrics`` endpoint; ``close()`` stops it."""

    host: str
    port: int
    _httpd: WSGIServer
    _thread: threading.Thread
    scheme: str = "http"

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}:{self.port}/metrics"

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
    partition_series: str = "all",
    process_metrics: bool = False,
    web_config: WebConfig | None = None,
) -> MetricsServer:
    """Serve ``store`` on ``http://host:port/metrics`` from a daemon thread, or as
    ``web_config`` says (HTTPS, basic auth: ``exporter.webconfig``); port 0 picks a free
    port (read it back from ``.port``). OSError if the address cannot be bound."""
    view = MetricsView(default_min_isr, replica_series, replica_series_top, partition_series)
    extra = None
    if process_metrics:
        extra = CollectorRegistry(auto_describe=False)
        _add_process_collectors(extra)
    server_class = _ThreadingWSGIServerV6 if ":" in host else ThreadingWSGIServer
    app = metrics_app(store, view, extra)
    if web_config is not None:
        app = web_config.wrap(app)
    httpd = make_server(host, port, app, server_class, handler_class=_QuietHandler)
    _quiet_errors(httpd)
    context = web_config.ssl_context if web_config is not None else None
    if context is not None:
        httpd.socket = context.wrap_socket(httpd.socket, server_side=True, do_handshake_on_connect=False)
    thread = threading.Thread(target=httpd.serve_forever, name="metrics-http", daemon=True)
    thread.start()
    bound = httpd.server_address[1]
    log.info(
        kv(
            event="metrics_serving",
            host=host,
            port=bound,
            replica_series=replica_series,
            partition_series=partition_series,
            tls="on" if context is not None else "off",
            basic_auth="on" if web_config is not None and web_config.users else "off",
        )
    )
    return MetricsServer(host, int(bound), httpd, thread, "https" if context is not None else "http")
