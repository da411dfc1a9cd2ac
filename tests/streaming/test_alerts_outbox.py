"""Issue 14, item 2's finding: a job killed after saving its alert book and before the alerts
topic took the batch's transitions lost them there (the restarted job skips a batch its book
says it announced). The alerts sink now stages them in the checkpoint's outbox first
(``streaming.driver.checkpoint.AlertsOutbox``) and a restarted sink sends again what the topic does
not hold, and only that.

Real Kafka 0.9; the kill is the producer's queue purged unsent (what SIGKILL does to it) and
the sink never closed. The kill campaign (tests/e2e/test_kill_campaign.py) does it for real.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from confluent_kafka import Producer

from streaming.driver.checkpoint import AlertsOutbox
from streaming.driver.monitor import Monitor
from streaming.driver.notify import KafkaAlertsSink
from streaming.sinks.outputs import read_tail
from streaming.sinks.producer import OutputProducer
from tests.e2e.kafka_io import read_records
from tests.streaming.test_monitor import Clock, _apply, _monitor, _row


def _sink(cluster: Any, topic: str, checkpoint: Path, **producer_conf: Any) -> KafkaAlertsSink:
    """The job's alerts sink on a fresh producer, restored from ``checkpoint``'s outbox."""
    producer = OutputProducer(Producer(cluster.client_config(**producer_conf)))
    return KafkaAlertsSink(
        producer,
        topic,
        outbox=AlertsOutbox(checkpoint),
        delivered_tail=lambda t, n: read_tail(cluster.bootstrap_servers, cluster.kafka_config_flags()[1::2], t, n),
    )


def _killed(sink: KafkaAlertsSink, delivered: bool) -> None:
    """The job SIGKILLed: what librdkafka still queued is gone; the sink is never closed."""
    if delivered:
        sink.producer.flush(30)
    else:
        sink.producer.producer.purge()
        sink.producer.producer.flush(5)


def test_a_kill_before_the_alerts_topic_took_a_transition_neither_loses_nor_repeats_it(
    kafka_cluster: Any, unique_name: Callable[[str], str], tmp_path: Path
) -> None:
    topic = unique_name("alerts")
    kafka_cluster.create_topic(topic, partitions=2, replication_factor=1)
    clock = Clock()

    def monitor(sink: KafkaAlertsSink) -> Monitor:
        return _monitor(tmp_path, clock, sink)

    # Run 1: batch 0 fires the alert; the book says so; the records sit in librdkafka's queue
    # (a one-minute linger) when the job is killed.
    first = _sink(kafka_cluster, topic, tmp_path, **{"linger.ms": 60_000})
    assert _apply(monitor(first), 0, [_row(106_000, 100_000, 5)]).started == 1
    _killed(first, delivered=False)
    assert read_records(kafka_cluster, topic) == []

    # Run 2: batch 0 replayed (skipped: the book has it), the sink sends its record again;
    # batch 1 resolves the alert; killed once both are on the topic, before the outbox is
    # trimmed (it is at the next batch with transitions or at a clean stop). The long linger
    # keeps the resent record unacknowledged until the kill's flush: with the default one it
    # could be acknowledged before batch 1 stages, and the outbox (rightly) trimmed of it.
    second = _sink(kafka_cluster, topic, tmp_path, **{"linger.ms": 60_000})
    m = monitor(second)
    assert _apply(m, 0, [_row(106_000, 100_000, 5)]).skipped
    assert _apply(m, 1, [_row(109_000, 109_000, 3)]).resolved == 1
    _killed(second, delivered=True)
    assert len(AlertsOutbox(tmp_path).load()) == 2

    # Run 3: both already on the topic: nothing sent again; a clean stop empties the outbox.
    third = _sink(kafka_cluster, topic, tmp_path)
    assert _apply(monitor(third), 1, [_row(109_000, 109_000, 3)]).skipped
    third.close()
    assert AlertsOutbox(tmp_path).load() == []

    on_topic = [json.loads(value or b"") for *_, value in read_records(kafka_cluster, topic)]
    assert [(e["labels"]["alertname"], e["status"]) for e in on_topic] == [
        ("KafkaReplicaNearingIsrShrink", "firing"),
        ("KafkaReplicaNearingIsrShrink", "resolved"),
    ]
