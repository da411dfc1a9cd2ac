"""What the job shows the world: its ``/metrics`` and ``/runbook`` server, and
where its alert transitions go (stdout, Alertmanager, the alerts topic)."""

from __future__ import annotations

import socket
from typing import TYPE_CHECKING

from isrwatch.exceptions import ConfigError
from streaming.settings import AlertingSettings, JobSettings

if TYPE_CHECKING:
    from exporter.server import MetricsServer
    from exporter.settings import SeriesSettings
    from exporter.store import StatusStore
    from streaming.driver.notify import AlertSink
    from streaming.sinks.producer import RecordProducer

__all__ = [
    "metrics_port",
    "serve_metrics",
    "runbook_base",
    "alert_sinks",
    "EMBEDDED_METRICS_PORT",
    "KAFKA_METRICS_PORT",
]

EMBEDDED_METRICS_PORT = 9743
KAFKA_METRICS_PORT = 9744


def metrics_port(settings: JobSettings) -> int:
    """``--metrics-port``, or its default: 9743 on the embedded default, 9744 with Kafka
    (where ``isrwatch exporter`` may keep 9743 on the same host)."""
    if settings.metrics_port is not None:
        return settings.metrics_port
    return KAFKA_METRICS_PORT if settings.bootstrap_servers else EMBEDDED_METRICS_PORT


def serve_metrics(store: StatusStore, settings: JobSettings, series: SeriesSettings) -> MetricsServer:
    """The job's own /metrics (its current state, whichever broker stalls), with the
    exporter's cardinality controls (``series``); a port that cannot be bound is a ConfigError."""
    from exporter.server import serve
    from exporter.webconfig import load_web_config

    port = metrics_port(settings)
    web_config = load_web_config(settings.web_config_file) if settings.web_config_file else None
    try:
        return serve(
            store,
            settings.metrics_host,
            port,
            default_min_isr=settings.min_insync_replicas,
            replica_series=series.replica_series,
            replica_series_top=series.replica_series_top,
            partition_series=series.partition_series,
            web_config=web_config,
        )
    except OSError as e:
        raise ConfigError(f"--metrics-port: cannot serve on {settings.metrics_host}:{port}: {e.strerror}") from None


def runbook_base(alerting: AlertingSettings, settings: JobSettings, metrics_port: int | None) -> str | None:
    """Where alerts link: ``--runbook-url`` (a wiki, or an exporter's ``/runbook``), else this
    job's own ``/runbook`` (served with its /metrics: the link works without a public site);
    None without either, and the alerts carry no runbook link rather than one to nowhere."""
    if alerting.runbook_url:
        return alerting.runbook_url
    if not metrics_port:
        return None
    host = settings.metrics_host
    if host in ("", "0.0.0.0", "::"):
        host = socket.getfqdn()
    scheme = "https" if _serves_tls(settings) else "http"
    return f"{scheme}://{f'[{host}]' if ':' in host else host}:{metrics_port}/runbook"


def _serves_tls(settings: JobSettings) -> bool:
    if not settings.web_config_file:
        return False
    from exporter.webconfig import load_web_config

    return load_web_config(settings.web_config_file).ssl_context is not None


def alert_sinks(
    settings: JobSettings,
    alerting: AlertingSettings,
    producer: RecordProducer | None,
    runbook: str | None,
    checkpoint_dir: str,
) -> list[AlertSink]:
    """The sinks ``alerting`` asks for; ``producer`` (Kafka mode) writes ``settings``' alerts topic;
    alerts-topic records not yet confirmed and resolutions an Alertmanager has not taken are
    kept under ``checkpoint_dir``."""
    from streaming.driver import notify
    from streaming.driver.checkpoint import AlertsOutbox, DeliveryBacklog
    from streaming.sinks.outputs import read_tail

    sinks: list[AlertSink] = []
    if not settings.bootstrap_servers or not alerting.alertmanager_url:
        # Without an Alertmanager, alert transitions are printed, with Kafka too.
        sinks.append(notify.StdoutSink(generator_url=alerting.grafana_url or "", runbook_base=runbook))
    if producer is not None:
        sinks.append(
            notify.KafkaAlertsSink(
                producer,
                settings.alerts_topic,
                generator_url=alerting.grafana_url or "",
                runbook_base=runbook,
                outbox=AlertsOutbox(checkpoint_dir),
                delivered_tail=lambda topic, n: read_tail(
                    settings.bootstrap_servers or "", settings.kafka_config, topic, n
                ),
            )
        )
    if alerting.alertmanager_url:
        sinks.append(
            notify.AlertmanagerSink(
                alerting.alertmanager_url,
                username=alerting.alertmanager_username,
                password=alerting.alertmanager_password,
                ca_file=alerting.alertmanager_ca_file,
                insecure=alerting.alertmanager_insecure,
                resend_seconds=alerting.resend_seconds,
                generator_url=alerting.grafana_url or "",
                runbook_base=runbook,
                backlog=DeliveryBacklog(checkpoint_dir),
            )
        )
    return sinks
