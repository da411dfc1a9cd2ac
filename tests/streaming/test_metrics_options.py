"""``isrwatch run``'s cardinality flags reach its in-process /metrics (a real HTTP server)."""

from __future__ import annotations

import socket

import pytest
import requests

from exporter.store import StatusStore
from isrwatch.commands import RunSettings
from isrwatch.exceptions import ConfigError
from isrwatch.settings import build
from isrwatch.status import State
from streaming.driver.endpoints import serve_metrics
from tests.exporter.samples import replica


def _scrape(options: dict, store: StatusStore) -> str:
    """/metrics of the job's server given these ``isrwatch run`` options (as the CLI composes them)."""
    settings = build(RunSettings, **options)
    server = serve_metrics(store, settings.job, settings.series)
    try:
        return requests.get(f"http://127.0.0.1:{server.port}/metrics", timeout=10).text
    finally:
        server.close()


def _series(text: str, family: str) -> set[str]:
    return {line.split("{", 1)[1].split("}", 1)[0] for line in text.splitlines() if line.startswith(family + "{")}


def _store() -> StatusStore:
    store = StatusStore()
    healthy = [replica(b, partition=p, topic="calm") for p in range(50) for b in (2, 3)]
    hot = [replica(2, State.CRITICAL, topic="hot", ratio=0.9), replica(3, topic="hot")]
    store.update(healthy + hot)
    return store


def test_defaults_expose_every_replica_and_partition() -> None:
    text = _scrape({"metrics_port": 0}, _store())
    assert len(_series(text, "isrwatch_replica_lag_ratio")) == 102
    assert len(_series(text, "isrwatch_partition_isr_size")) == 51


def test_not_ok_and_at_risk_keep_only_the_hot_partition() -> None:
    text = _scrape({"metrics_port": 0, "replica_series": "not-ok", "partition_series": "at-risk"}, _store())
    ratios = _series(text, "isrwatch_replica_lag_ratio")
    assert len(ratios) == 1 and 'topic="hot"' in next(iter(ratios)) and 'broker_id="2"' in next(iter(ratios))
    partitions = _series(text, "isrwatch_partition_isr_size")
    assert len(partitions) == 1 and 'topic="hot"' in next(iter(partitions))


def test_top_caps_the_replica_series() -> None:
    store = StatusStore()
    store.update([replica(2, State.NEARING, partition=p, ratio=0.5 + p / 100) for p in range(10)])
    text = _scrape({"metrics_port": 0, "replica_series_top": 3}, store)
    kept = _series(text, "isrwatch_replica_lag_ratio")
    assert {s.split('partition="')[1].split('"')[0] for s in kept} == {"7", "8", "9"}


def test_a_port_in_use_is_one_clear_error() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        with pytest.raises(ConfigError, match="--metrics-port: cannot serve on 127.0.0.1"):
            settings = build(RunSettings, metrics_port=s.getsockname()[1])
            serve_metrics(StatusStore(), settings.job, settings.series)
