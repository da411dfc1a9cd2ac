"""Planning a batch never waits on a hung leader (streaming.sources.watermarks), on the real cluster."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient

from streaming.sources.source_kafka import consumer_config
from streaming.sources.watermarks import Watermarks

pytestmark = pytest.mark.kafka


def _options(kafka_cluster) -> dict[str, str]:
    """The job's ``kafka.*`` options for the cluster."""
    options = {"kafka.bootstrap.servers": kafka_cluster.bootstrap_servers}
    options.update({f"kafka.{k}": v for k, v in kafka_cluster.client_config().items() if k != "bootstrap.servers"})
    return options


def _six_partitions(kafka_cluster, unique_name) -> tuple[str, dict[int, int]]:
    """A new topic of six partitions spread by Kafka over the brokers, and each one's leader."""
    topic = unique_name("telemetry")
    kafka_cluster.create_topic(topic, partitions=6, replication_factor=1)
    md = AdminClient(kafka_cluster.client_config()).list_topics(topic, timeout=30)
    return topic, {p.id: p.leader for p in md.topics[topic].partitions.values()}


def test_a_paused_leader_makes_only_its_own_partitions_late(kafka_cluster, unique_name):
    topic, leaders = _six_partitions(kafka_cluster, unique_name)
    victim = leaders[0]
    config = consumer_config(_options(kafka_cluster))
    marks = Watermarks(config, [topic], answer_s=1.0)
    producer = Producer(kafka_cluster.client_config(acks="1"))
    try:
        _, high = marks.poll(10.0)  # (the first also connects: set-up, not what is tested)
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


def test_a_leader_paused_before_the_first_question_makes_only_its_partitions_late(kafka_cluster, unique_name):
    """The job started while a broker hangs (``describe_topic``, the source's first batch): the
    first poll has every healthy partition, although a bootstrap server is the hung broker."""
    topic, leaders = _six_partitions(kafka_cluster, unique_name)
    victim = leaders[0]
    config = consumer_config(_options(kafka_cluster))
    kafka_cluster.pause(victim)
    try:
        marks = Watermarks(config, [topic], answer_s=1.0)
        try:
            _, high = marks.poll(5.0)
            theirs = {(topic, p) for p, leader in leaders.items() if leader == victim}
            assert set(marks.late) == theirs
            assert sorted(high[topic]) == sorted(str(p) for p, leader in leaders.items() if leader != victim)
        finally:
            marks.close()
    finally:
        kafka_cluster.resume(victim)


def test_asking_for_a_topic_that_is_not_there_does_not_create_it(kafka_cluster, unique_name):
    """The brokers here create a topic a client names in a metadata request (Kafka's default,
    ``auto.create.topics.enable``): the job waits for the collector to create its topic, with the
    user's partitions, rather than make one of the broker's default size."""
    topic = unique_name("telemetry")
    marks = Watermarks(consumer_config(_options(kafka_cluster)), [topic])
    try:
        low, high = marks.poll(5.0)
        assert (low, high) == ({}, {})
        assert marks.late == frozenset()
    finally:
        marks.close()
    time.sleep(1.0)
    assert topic not in AdminClient(kafka_cluster.client_config()).list_topics(timeout=30).topics
