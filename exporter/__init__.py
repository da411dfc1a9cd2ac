"""The exporter: replica statuses from the state topic (or the streaming job
in-process) served as Prometheus metrics on ``/metrics``, with the runbook on ``/runbook``.

``store`` holds the newest statuses, ``families`` declares the metric families,
``exposition`` writes them fast for large fleets, ``server`` serves them, ``consumer`` reads
the state topic and ``main`` is ``isrwatch exporter``; docs/architecture.md maps every module.
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
