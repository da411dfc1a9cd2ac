"""Planning a batch never waits on a hung leader (streaming.watermarks), on the real cluster."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient

from streaming.source_kafka import consumer_config
from streaming.watermarks import Watermarks

pytestmark = pytest.mark.kafka


def test_a_paused_leader_makes_only_its_own_partitions_late(kafka_cluster, unique_name):
    topic = unique_name("telemetry")
    kafka_cluster.create_topic(topic, partitions=6, replication_factor=1)
    leaders = {
        p.id: p.leader
        for p in AdminClient(kafka_cluster.client_config())
        .list_topics(topic, timeout=30)
        .topics[topic]
        .partitions.values()
    }
    victim = leaders[0]
    options = {"kafka.bootstrap.servers": kafka_cluster.bootstrap_servers}
    options.update({f"kafka.{k}": v for k, v in kafka_cluster.client_config().items() if k != "bootstrap.servers"})
    config = consumer_config(options)
    marks = Watermarks(lambda: Consumer(dict(config)), [topic], answer_s=1.0)
    producer = Producer(kafka_cluster.client_config(acks="1"))
    try:
        _, high = marks.poll()
        assert sorted(high[topic]) == [str(p) for p in range(6)]
        kafka_cluster.pause(victim)
        paused = time.monotonic()
        try:
            # (``at``: each poll's time since the pause; past librdkafka's 10 s a question to
            # the paused leader fails rather than hangs, and must still read as late)
            took, lates, ends, at = [], [], [], []
            for i in range(6):
                for p, leader in leaders.items():
                    if leader != victim:
                        producer.produce(topic, b"x", partition=p)
                producer.flush(10)
                t0 = time.monotonic()
                at.append(round(t0 - paused, 1))
                _, high = marks.poll()
                took.append(time.monotonic() - t0)
                lates.append(set(marks.late))
                ends.append(dict(high[topic]))
                time.sleep(0.3 if i else 1.5)
        finally:
            kafka_cluster.resume(victim)
        theirs = {(topic, p) for p, leader in leaders.items() if leader == victim}
        # the paused leader's partitions are late; the others answer every time, with their new
        # ends: each poll returned (it did not wait on the paused leader) and saw every message
        # produced before it. (No bound on the poll's time: this machine's load decides it;
        # ``took`` is in the messages.)
        wrong = [(i, sorted(late - theirs), sorted(theirs - late)) for i, late in enumerate(lates) if late != theirs]
        assert not [w for w in wrong if w[0] > 0], f"(poll, late too, not late) {wrong}; took {took}, at {at}"
        for p, leader in leaders.items():
            if leader != victim:
                assert [e[str(p)] for e in ends] == [1, 2, 3, 4, 5, 6], f"partition {p}: {ends}, {took}"
    finally:
        marks.close()
