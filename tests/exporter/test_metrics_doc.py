"""docs/metrics.md documents every metric family the collector serves, and only those."""

from __future__ import annotations

import re
from pathlib import Path

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import generate_latest

from exporter.families import StoreCollector
from exporter.store import StatusStore
from isrwatch.status import State
from tests.exporter.samples import replica

DOC = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"


def served_names() -> set[str]:
    store = StatusStore()
    store.update([replica(2, State.NEARING, ratio=0.6), replica(3)])
    store.add_isr_changes("prod", "orders", 0, "shrink")
    store.health.record_batch(1.0, 10, {"bad_json": 1})
    store.health.count_unreadable(0)  # what the exporter's state-topic consumer does
    reg = CollectorRegistry(auto_describe=False)
    reg.register(StoreCollector(store))
    text = generate_latest(reg).decode()
    return set(re.findall(r"^# TYPE (\S+) ", text, flags=re.M))


def test_every_served_metric_is_documented() -> None:
    documented = set(re.findall(r"^\| `(isrwatch_[a-z_]+)` \|", DOC.read_text(), flags=re.M))
    assert served_names() == documented
