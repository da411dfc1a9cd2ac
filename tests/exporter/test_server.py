"""serve(): /metrics over real HTTP on a random loopback port."""

from __future__ import annotations

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from exporter.server import serve
from exporter.store import StatusStore
from isrwatch.status import State
from tests.exporter.samples import replica


def scrape(url: str) -> dict[str, list]:
    r = requests.get(url, timeout=5)
    r.raise_for_status()
    assert r.headers["Content-Type"].startswith("text/plain")
    return {f.name: f.samples for f in text_string_to_metric_families(r.text)}


def test_serve_on_a_free_port_reflects_the_store_on_each_scrape() -> None:
    store = StatusStore()
    store.update([replica(2, State.CRITICAL, ratio=0.85)])
    handle = serve(store, "127.0.0.1", 0)
    try:
        assert handle.port > 0
        families = scrape(handle.url)
        assert [s.value for s in families["isrwatch_replica_lag_ratio"]] == [0.85]
        assert [s.value for s in families["isrwatch_up"]] == [1.0]
        assert not any(name.startswith(("process_", "python_")) for name in families)  # a fresh registry

        store.update([replica(2, State.OK, ratio=0.1)])
        store.remove(["prod/orders/0/3"])
        assert [s.value for s in scrape(handle.url)["isrwatch_replica_lag_ratio"]] == [0.1]
        store.remove(["prod/orders/0/2"])
        assert scrape(handle.url)["isrwatch_replica_lag_ratio"] == []
    finally:
        handle.close()
    try:
        requests.get(handle.url, timeout=2)
        raise AssertionError("the server still answers after close()")
    except requests.ConnectionError:
        pass


def test_process_metrics_only_when_asked() -> None:
    with serve(StatusStore(), "127.0.0.1", 0, process_metrics=True, replica_series="not-ok") as handle:
        families = scrape(handle.url)
        assert "python_info" in families
        assert "isrwatch_up" in families


@pytest.mark.slow  # 20,000 replicas through the real HTTP server: seconds, not a unit test
def test_partition_series_at_risk_over_http_on_20k_replicas() -> None:
    store = StatusStore()
    # 10k partitions of 20 topics, leader 1, followers 2 and 3 ok: ISR 3, min ISR 2
    store.update([replica(b, topic=f"t{p % 20}", partition=p // 20) for p in range(10_000) for b in (2, 3)])
    hot = {("t3", 7): State.CRITICAL, ("t11", 0): State.STALLED, ("t19", 499): State.NEARING}
    store.update([replica(2, state, topic=t, partition=p, ratio=0.85) for (t, p), state in hot.items()])
    with serve(store, "127.0.0.1", 0, default_min_isr=2, partition_series="at-risk", replica_series="not-ok") as h:
        families = scrape(h.url)
    expected = {(t, str(p)) for t, p in hot}
    for name in (
        "isrwatch_partition_isr_size",
        "isrwatch_partition_predicted_isr_size",
        "isrwatch_partition_min_isr_headroom",
    ):
        assert {(s.labels["topic"], s.labels["partition"]) for s in families[name]} == expected
    assert {(s.labels["topic"], s.labels["partition"]) for s in families["isrwatch_replica_lag_ratio"]} == expected
    counts = {s.labels["state"]: s.value for s in families["isrwatch_partitions"]}
    assert counts == {"at_risk": 3, "healthy": 9_997}

    with serve(store, "127.0.0.1", 0, default_min_isr=2) as h:
        full = scrape(h.url)
    assert len(full["isrwatch_partition_min_isr_headroom"]) == 10_000
    assert {s.labels["state"]: s.value for s in full["isrwatch_partitions"]} == counts
