"""KafkaAlertsSink writing to a real Kafka topic (LocalKafka), read back."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from confluent_kafka import Consumer, Producer

from isrwatch.alerts import AlertBook, replica_alerts
from isrwatch.status import State
from streaming.driver.notify import KafkaAlertsSink
from tests.streaming.test_notify import status


def test_transitions_land_on_the_alerts_topic(kafka_cluster: Any, unique_name: Callable[[str], str]) -> None:
    topic = unique_name("alerts")
    kafka_cluster.create_topic(topic, partitions=1, replication_factor=1)
    sink = KafkaAlertsSink(Producer(kafka_cluster.client_config()), topic, generator_url="http://grafana/d/x")
    book = AlertBook()
    sink.send(book.update(replica_alerts(status(State.CRITICAL, 1_000, 0.85)), 1_000), 1_000)
    sink.send(book.update(replica_alerts(status(State.NEARING, 2_000, 0.6)), 2_000), 2_000)
    sink.close()

    consumer = Consumer(kafka_cluster.client_config(**{"group.id": unique_name("g"), "auto.offset.reset": "earliest"}))
    consumer.subscribe([topic])
    got: list[tuple[str, dict[str, Any]]] = []
    deadline = time.monotonic() + 60
    try:
        while len(got) < 3 and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None and msg.error() is None:
                got.append((msg.key().decode(), json.loads(msg.value())))
    finally:
        consumer.close()
    assert [(e["labels"]["alertname"], e["status"]) for _, e in got] == [
        ("KafkaReplicaNearingIsrShrink", "firing"),
        ("KafkaReplicaIsrShrinkImminent", "firing"),
        ("KafkaReplicaIsrShrinkImminent", "resolved"),
    ]
    assert (
        got[1][0]
        == got[2][0]
        == ('KafkaReplicaIsrShrinkImminent{broker_id="2",cluster="prod",leader_id="1",partition="3",topic="orders"}')
    )
    assert got[2][1]["endsAt"] == "1970-01-01T00:00:02.000Z"
    assert all(e["generatorURL"] == "http://grafana/d/x" for _, e in got)
