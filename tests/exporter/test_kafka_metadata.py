"""exporter.kafka_metadata: metadata from whichever bootstrap broker answers first.

A broker that hangs (SIGSTOP) still accepts TCP connections (the kernel does) and never
answers. A silent listener on loopback is that broker as a client sees it, so these tests
put one first among the bootstrap servers of the real shared cluster. The last test pauses
each real broker in turn (a few seconds each); tests/e2e/test_restart.py starts the job and
an exporter while a broker is paused.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from exporter.kafka_metadata import _cluster_metadata, bootstrap_list, direct_metadata, first_metadata


@pytest.fixture
def silent_broker() -> Iterator[str]:
    """host:port of a listener that accepts connections and never answers."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = server.accept()
                held.append(conn)
            except OSError:
                continue

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    yield f"127.0.0.1:{server.getsockname()[1]}"
    stop.set()
    t.join()
    for c in held:
        c.close()
    server.close()


def test_bootstrap_list_drops_blanks_and_repeats() -> None:
    assert bootstrap_list(" a:1, b:2,,a:1 ") == ["a:1", "b:2"]
    assert bootstrap_list("") == []


@pytest.mark.parametrize("version", [1, 2, 5])
def test_newer_metadata_answers_read_as_librdkafka_reads_them(version) -> None:
    """The real brokers here are 0.9 (Metadata v0, read in the tests below); the later
    layouts the direct question may get from a newer broker, built with kafka-python's own
    response classes."""
    from kafka.protocol.metadata import MetadataResponse

    brokers = [(1, "h1", 9092, None), (2, "h2", 9093, "rack-b")]
    parts = [(0, 0, 1, [1, 2], [1]), (5, 1, -1, [2, 1], [])]
    parts = [(*p, []) for p in parts] if version >= 5 else parts
    topics = [(0, "orders", False, parts), (3, "gone", False, [])]
    head = {1: [brokers, 2], 2: [brokers, "cid", 2], 5: [0, brokers, "cid", 2]}[version]
    md = _cluster_metadata(MetadataResponse[version](*head, topics))
    assert md.controller_id == 2 and md.cluster_id == (None if version < 2 else "cid")
    assert {b.id: (b.host, b.port) for b in md.brokers.values()} == {1: ("h1", 9092), 2: ("h2", 9093)}
    orders = md.topics["orders"]
    assert orders.error is None and sorted(orders.partitions) == [0, 1]
    p0, p1 = orders.partitions[0], orders.partitions[1]
    assert (p0.leader, p0.replicas, p0.isrs, p0.error) == (1, [1, 2], [1], None)
    assert p1.leader == -1 and p1.error.code() == KafkaError.LEADER_NOT_AVAILABLE
    assert md.topics["gone"].error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART


def test_each_broker_asked_directly_answers_for_itself_and_a_hung_one_does_not(kafka_cluster, unique_name) -> None:
    """The direct question goes to the server named and nowhere else: each real broker
    answers with what librdkafka reads, and while one is paused, asking it times out even
    though the others would answer (a librdkafka client would have asked them)."""
    from confluent_kafka.admin import AdminClient

    topic = unique_name("direct")
    kafka_cluster.create_topic(topic, partitions=2, replication_factor=2)
    config = kafka_cluster.client_config()
    seen = AdminClient(config).list_topics(topic, timeout=30).topics[topic]
    for broker in kafka_cluster.broker_ids:
        md = direct_metadata(config, kafka_cluster.address(broker), 10.0, topic)
        assert sorted(md.brokers) == sorted(kafka_cluster.broker_ids)
        got = md.topics[topic]
        assert got.error is None
        assert {p.id: (p.leader, p.replicas) for p in got.partitions.values()} == {
            p.id: (p.leader, p.replicas) for p in seen.partitions.values()
        }
    assert topic in direct_metadata(config, kafka_cluster.address(1), 10.0).topics  # every topic
    paused = kafka_cluster.broker_ids[-1]
    kafka_cluster.pause(paused)
    try:
        with pytest.raises(TimeoutError):
            direct_metadata(config, kafka_cluster.address(paused), 2.0, topic)
    finally:
        kafka_cluster.resume(paused)


def test_a_silent_broker_alone_times_out_and_first_metadata_says_so(kafka_cluster, silent_broker) -> None:
    config = {**kafka_cluster.client_config(), "bootstrap.servers": silent_broker}
    plain = Consumer({**config, "group.id": "kafka-metadata-test"})
    try:
        with pytest.raises(KafkaException):
            plain.list_topics(timeout=2.0)  # what a client that picked the hung broker gets
    finally:
        plain.close()
    with pytest.raises(KafkaException) as err:
        first_metadata(config, 2.0)
    assert err.value.args[0].code() == KafkaError._TIMED_OUT, err.value


def test_the_answering_brokers_win_over_a_silent_one_named_first(kafka_cluster, silent_broker) -> None:
    config = {
        **kafka_cluster.client_config(),
        "bootstrap.servers": f"{silent_broker},{kafka_cluster.bootstrap_servers}",
    }
    for _ in range(3):
        md = first_metadata(config, 5.0)
        assert sorted(md.brokers) == sorted(kafka_cluster.broker_ids)


def test_first_metadata_answers_while_any_broker_of_the_cluster_hangs(kafka_cluster, unique_name) -> None:
    """Each real broker paused in turn, the coordinator of the callers' consumer group among
    them. A consumer with a group id connects to its coordinator, and librdkafka sends a
    metadata request to any broker it is connected to: with consumers as its clients,
    first_metadata failed when the paused broker was the coordinator and the coordinator's
    connection came up before the question (tests/e2e/test_restart.py, 2026-11-26: a
    consumer's metadata request timed out at "GroupCoordinator/3", the job restarted during
    the pause could not start). That race did not come up here with consumers either (three
    pauses): this test holds the requirement, test_restart the scenario."""
    topic = unique_name("metadata")
    kafka_cluster.create_topic(topic, partitions=1, replication_factor=1)
    config = {**kafka_cluster.client_config(), "group.id": "isrwatch-metadata"}  # as the callers pass theirs
    found = Consumer(config)  # the group's coordinator exists (and the offsets topic) before the pauses
    try:
        found.committed([TopicPartition(topic, 0)], timeout=30)
    finally:
        found.close()
    for broker in kafka_cluster.broker_ids:
        kafka_cluster.pause(broker)
        try:
            md = first_metadata(config, 6.0, topic)
        except KafkaException as e:
            pytest.fail(f"no metadata while broker {broker} hangs: {e}")
        finally:
            kafka_cluster.resume(broker)
        assert sorted(md.brokers) == sorted(kafka_cluster.broker_ids), md.brokers
        assert topic in md.topics, sorted(md.topics)
