"""Issue 14, item 2's finding: a job killed after saving its alert book and before the alerts
topic took the batch's transitions lost them there (the restarted job skips a batch its book
says it announced). The alerts sink now stages them in the checkpoint's outbox first
(``streaming.driver.checkpoint.AlertsOutbox``) and a restarted sink sends again what the topic does
not hold, and only that.

Real Kafka 0.9; the kill is the producer's queue purged unsent (what SIGKILL does to it) and
the sink never closed. The kill campaign (tests/e2e/test_kill_campaign.py) does it for real.

A restarted job reads the topic's tail while a broker may hang (tests/e2e/test_restart.py):
there, the paused leader's partitions are left out, the others read.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer

from exporter.kafka_metadata import first_metadata
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


def test_the_tail_is_read_from_every_leader_that_answers_while_one_is_paused(
    kafka_cluster: Any, unique_name: Callable[[str], str], caplog: pytest.LogCaptureFixture
) -> None:
    """With each broker paused in turn, ``read_tail`` gives every record of the partitions the
    others lead and names exactly the paused leader's partitions unread (what was sent to them
    is sent again). Before, a restarted job during a pause found every partition unread in one
    CI run (its consumer had asked the paused broker for its metadata first), 30 s into its
    start, and sent every saved record again; measured since, a paused leader's partitions cost
    the start 5 s in all (docs/reliability.md)."""
    topic = unique_name("alerts")
    kafka_cluster.create_topic(topic, partitions=6, replication_factor=1)  # placed by Kafka
    producer = Producer(kafka_cluster.client_config())
    for p in range(6):
        producer.produce(topic, key=b"k%d" % p, value=b"v%d" % p, partition=p)
    assert producer.flush(30) == 0
    meta = first_metadata(kafka_cluster.client_config(), 10, topic).topics[topic]
    leaders = {p: m.leader for p, m in meta.partitions.items()}
    flags = kafka_cluster.kafka_config_flags()[1::2]
    assert read_tail(kafka_cluster.bootstrap_servers, flags, topic, 10) == {(b"k%d" % p, b"v%d" % p) for p in range(6)}
    for paused in kafka_cluster.broker_ids:
        caplog.clear()
        kafka_cluster.pause(paused)
        try:
            with caplog.at_level(logging.WARNING, logger="streaming.outputs"):
                seen = read_tail(kafka_cluster.bootstrap_servers, flags, topic, 10)
        finally:
            kafka_cluster.resume(paused)
        led = sorted(p for p, leader in leaders.items() if leader == paused)
        assert seen == {(b"k%d" % p, b"v%d" % p) for p in range(6) if p not in led}, paused
        unread = [r.getMessage() for r in caplog.records if "alerts_topic_partitions_unread" in r.getMessage()]
        assert unread == [f"event=alerts_topic_partitions_unread topic={topic} partitions={led}"], paused
