"""The exporter: replica statuses from the state topic (or the streaming job
in-process) served as Prometheus metrics on ``/metrics``.

``store`` holds the latest statuses, ``collector`` turns a snapshot into metric
families on each scrape, ``server`` serves them, ``main`` is ``isrwatch
exporter`` (the state-topic consumer).
"""

from exporter.collector import StoreCollector
from exporter.server import MetricsServer, registry_for, serve
from exporter.store import PartitionView, StatusStore, StoreSnapshot

__all__ = ["StatusStore", "StoreSnapshot", "PartitionView", "StoreCollector", "MetricsServer", "serve", "registry_for"]
