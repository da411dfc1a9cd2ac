"""The exporter: replica statuses from the state topic (or the streaming job
in-process) served as Prometheus metrics on ``/metrics``.

``store`` holds the latest statuses, ``collector`` declares the metric
families (and yields them through prometheus_client), ``exposition`` writes
them fast for large fleets, ``server`` serves them, ``consumer`` reads the
state topic and ``main`` is ``isrwatch exporter``.
"""

from exporter.exposition import render
from exporter.families import MetricsView, StoreCollector
from exporter.server import MetricsServer, registry_for, serve
from exporter.store import PartitionView, StatusStore, StoreSnapshot

__all__ = [
    "StatusStore",
    "StoreSnapshot",
    "PartitionView",
    "StoreCollector",
    "MetricsView",
    "render",
    "MetricsServer",
    "serve",
    "registry_for",
]
