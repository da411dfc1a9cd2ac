"""``isrwatch exporter`` against a real Kafka cluster (LocalKafka, loopback):
state topic in, /metrics out, tombstones and start-up errors."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import pytest
import requests
from confluent_kafka import Producer
from prometheus_client.parser import text_string_to_metric_families

from exporter.main import Exporter
from exporter.settings import ExporterSettings
from isrwatch.status import ReplicaStatus, State, status_key, status_to_json
from tests.exporter.samples import replica

pytestmark = pytest.mark.integration

T0 = 1_700_000_000_000


def produce(cluster: Any, topic: str, records: list[tuple[str, ReplicaStatus | None]]) -> None:
    producer = Producer(cluster.client_config(**{"linger.ms": 0}))
    for key, status in records:
        value = None if status is None else json.dumps(status_to_json(status)).encode()
        producer.produce(topic, key=key.encode(), value=value)
    assert producer.flush(30) == 0


def samples(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = requests.get(url, timeout=5).text
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def wait_scrape(
    url: str, ready: Callable[[dict[tuple[str, tuple[tuple[str, str], ...]], float]], bool], timeout_s: float = 60
) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    deadline = time.monotonic() + timeout_s
    while True:
        got = samples(url)
        if ready(got) or time.monotonic() > deadline:
            return got
        time.sleep(0.2)


def ratio_of(got: dict, s: ReplicaStatus) -> float | None:
    labels = {
        "cluster": s.cluster,
        "topic": s.topic,
        "partition": str(s.partition),
        "broker_id": str(s.broker_id),
        "leader_id": str(s.leader_id),
    }
    return got.get(("isrwatch_replica_lag_ratio", tuple(sorted(labels.items()))))


def changes(got: dict, topic: str, change: str) -> float | None:
    labels = {"cluster": "prod", "topic": topic, "partition": "0", "change": change}
    return got.get(("isrwatch_isr_changes_total", tuple(sorted(labels.items()))))


def test_exporter_serves_the_state_topic_from_the_beginning(kafka_cluster: Any, unique_name: Callable) -> None:
    topic = unique_name("state")
    kafka_cluster.create_topic(topic, partitions=2, replication_factor=1, config={"cleanup.policy": "compact"})
    watched = unique_name("orders")[:40]
    a = replica(2, State.CRITICAL, topic=watched, ratio=0.85, eval_ms=T0)
    b = replica(3, State.OK, topic=watched, eval_ms=T0)
    # Written before the exporter starts: it must read them back from the beginning.
    produce(kafka_cluster, topic, [(status_key(a), replica(2, topic=watched, eval_ms=T0 - 1000)), (status_key(a), a)])
    produce(kafka_cluster, topic, [(status_key(b), b)])

    settings = ExporterSettings(
        bootstrap_servers=kafka_cluster.bootstrap_servers,
        kafka_config=[f"{k}={v}" for k, v in kafka_cluster.client_config().items() if k != "bootstrap.servers"],
        state_topic=topic,
        host="127.0.0.1",
        port=0,
    )
    with Exporter(settings) as exporter:
        assert exporter.server is not None
        url = exporter.server.url
        got = wait_scrape(url, lambda g: ratio_of(g, a) is not None and ratio_of(g, b) is not None)
        assert ratio_of(got, a) == pytest.approx(0.85)
        assert ratio_of(got, b) == 0
        assert got[("isrwatch_up", ())] == 1
        headroom = ("isrwatch_partition_min_isr_headroom", (("cluster", "prod"), ("leader_id", "1"), ("partition", "0"), ("topic", watched)))  # fmt: skip
        assert got[headroom] == 0  # ISR 3, one follower critical, min ISR 2

        # The follower leaves the ISR, then its topic's replica is deleted (tombstone).
        out = replica(2, State.OUT_OF_SYNC, topic=watched, ratio=1.2, in_isr=False, isr_size=2, eval_ms=T0 + 5000)
        produce(kafka_cluster, topic, [(status_key(out), out)])
        got = wait_scrape(url, lambda g: changes(g, watched, "shrink") == 1)
        assert changes(got, watched, "shrink") == 1
        assert ratio_of(got, out) == pytest.approx(1.2)

        produce(kafka_cluster, topic, [(status_key(out), None)])
        got = wait_scrape(url, lambda g: ratio_of(g, out) is None)
        assert ratio_of(got, out) is None
        assert ratio_of(got, b) == 0  # the others stay
