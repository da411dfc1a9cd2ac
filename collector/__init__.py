"""The collector: polls a real Kafka cluster's brokers and publishes telemetry (``isrwatch collect``).

``probe`` (or ``jmxprobe``) reads the brokers, ``tracker`` turns rounds into observations,
``publisher`` writes them; docs/architecture.md maps every module. Public names load on
first use, so ``isrwatch --help`` does not import the Kafka clients.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = [
    "ClusterConfigs",
    "ClusterProbe",
    "Collector",
    "PartitionSettings",
    "PartitionState",
    "ReplicaTracker",
    "RoundResult",
    "Snapshot",
    "TelemetryPublisher",
    "batch_records",
]

_WHERE = {
    "ClusterProbe": "collector.probe",
    "PartitionState": "collector.probe",
    "Snapshot": "collector.probe",
    "Collector": "collector.main",
    "ClusterConfigs": "collector.main",
    "PartitionSettings": "collector.tracker",
    "ReplicaTracker": "collector.tracker",
    "RoundResult": "collector.tracker",
    "TelemetryPublisher": "collector.publisher",
    "batch_records": "collector.publisher",
}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(importlib.import_module(_WHERE[name]), name)
    raise AttributeError(f"module 'collector' has no attribute {name!r}")
