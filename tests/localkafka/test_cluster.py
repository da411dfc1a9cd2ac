"""The real local cluster: start, produce/consume, faults, ISR shrink ground truth."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from localkafka import LocalKafka, LocalKafkaError

pytestmark = pytest.mark.kafka


def _produce(cluster: LocalKafka, topic: str, n: int, size: int = 10) -> None:
    p = Producer(cluster.client_config(**{"acks": "all", "linger.ms": 5}))
    for i in range(n):
        p.produce(topic, key=str(i).encode(), value=b"x" * size)
        if i % 1000 == 0:
            p.poll(0)
    assert p.flush(30) == 0


def _consume_all(cluster: LocalKafka, topic: str, partitions: int, expect: int) -> list[bytes]:
    c = Consumer(cluster.client_config(**{"group.id": f"g-{topic}", "enable.auto.commit": False}))
    c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    keys: list[bytes] = []
    deadline = time.monotonic() + 60
    while len(keys) < expect and time.monotonic() < deadline:
        m = c.poll(0.5)
        if m is not None and m.error() is None:
            keys.append(m.key())
    c.close()
    return keys


def test_produce_and_consume_with_compat_settings(kafka_cluster, unique_name):
    topic = unique_name("pc")
    kafka_cluster.create_topic(topic, partitions=3, replication_factor=3)
    _produce(kafka_cluster, topic, 300)
    keys = _consume_all(kafka_cluster, topic, 3, 300)
    assert sorted(int(k) for k in keys) == list(range(300))


def test_every_broker_serves_metadata_for_all(kafka_cluster):
    for b in kafka_cluster.broker_ids:
        assert kafka_cluster.metadata_brokers(b) == {1, 2, 3}


def test_every_broker_serves_its_mbeans_over_jmx_on_loopback(kafka_cluster):
    from collector.jmx import JmxConnection, start_jvm

    start_jvm()
    for b in kafka_cluster.broker_ids:
        assert kafka_cluster.jmx_address(b).startswith("127.0.0.1:")
        connection = JmxConnection(kafka_cluster.jmx_address(b))
        try:
            reading = connection.read()
        finally:
            connection.close()
        assert reading.broker_id == b  # the broker's own kafka.server:type=app-info,id=N
        assert reading.isr_shrinks is not None and reading.under_replicated is not None
    assert kafka_cluster.jmx_flags() == [
        a for b in kafka_cluster.broker_ids for a in ("--jmx", kafka_cluster.jmx_address(b))
    ]


def test_broker_1_is_the_controller_by_default(kafka_cluster):
    assert kafka_cluster.controller_id() == 1


def test_the_chosen_broker_wins_the_controller_election(kafka_cluster_factory):
    cluster = kafka_cluster_factory(brokers=2, controller=2)
    assert cluster.controller_id() == 2
    with pytest.raises(LocalKafkaError, match="controller=3"):
        type(cluster)(brokers=2, controller=3)


def test_create_topic_with_assignment_places_replicas(kafka_cluster, unique_name):
    from confluent_kafka.admin import AdminClient

    topic = unique_name("assign")
    kafka_cluster.create_topic(topic, assignment=[[2, 3], [3, 1]])
    md = AdminClient(kafka_cluster.client_config()).list_topics(topic, timeout=10).topics[topic]
    assert [list(md.partitions[p].replicas) for p in (0, 1)] == [[2, 3], [3, 1]]
    assert md.partitions[0].leader == 2


def test_bad_topic_is_a_clear_error(kafka_cluster):
    with pytest.raises(LocalKafkaError, match="creating topic"):
        kafka_cluster.create_topic("bad", replication_factor=7)


def test_stop_and_start_broker_and_close_kills_everything(kafka_cluster_factory, unique_name):
    cluster = kafka_cluster_factory(brokers=2, zookeeper_session_timeout_ms=10_000)
    topic = unique_name("restart")
    cluster.create_topic(topic, partitions=2, replication_factor=2)
    cluster.stop(2, graceful_s=20)
    assert not cluster.running(2)
    _produce(cluster, topic, 50)  # broker 1 leads every partition now
    cluster.start(2)
    assert cluster.running(2) and cluster.metadata_brokers(2) == {1, 2}
    pids = [pid for _, pid in cluster.processes()]
    assert len(pids) == 3
    cluster.close()
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    assert not cluster.dir.exists()


def test_paused_follower_is_shrunk_by_the_leader_and_rejoins(kafka_cluster_factory, unique_name):
    """A real SIGSTOP: the leader's own check (long ZK session) logs the shrink that isr_shrinks() reads."""
    lag_ms = 3000
    cluster = kafka_cluster_factory(replica_lag_time_max_ms=lag_ms, zookeeper_session_timeout_ms=60_000)
    topic = unique_name("pause")
    cluster.create_topic(topic, assignment=[[1, 2, 3]])
    _produce(cluster, topic, 20)
    paused_at = time.time()
    cluster.pause(3)
    # pause() returns once the broker has stopped: every thread of its JVM, as /proc says
    states = {
        t.name: (t / "stat").read_text().rpartition(")")[2].split()[0]
        for t in (Path("/proc") / str(cluster.pid(3)) / "task").iterdir()
    }
    assert states and set(states.values()) <= {"T", "t"}, states
    p = Producer(cluster.client_config(**{"acks": "1"}))
    shrinks = []
    deadline = time.monotonic() + 4 * lag_ms / 1000 + 20
    while not shrinks and time.monotonic() < deadline:
        p.produce(topic, value=b"load")
        p.poll(0.1)
        shrinks = [s for s in cluster.isr_shrinks(since=paused_at) if s.topic == topic]
    p.flush(10)
    assert shrinks, "the leader never logged a shrink for the paused follower"
    s = shrinks[0]
    assert (s.partition, s.broker_id, s.kind) == (0, 1, "shrink")
    assert 3 in s.isr_before and 3 not in s.isr_after and 1 in s.isr_after
    # KIP-16 on 0.9: out of sync after lag_ms, noticed at the next check (every lag_ms).
    assert s.time - paused_at > lag_ms / 1000 - 1.0  # lcu may be up to one fetch wait before the pause
    cluster.resume(3)
    expands: list = []
    deadline = time.monotonic() + 30
    while not expands and time.monotonic() < deadline:
        time.sleep(0.2)
        expands = [e for e in cluster.isr_expands(since=s.time) if e.topic == topic and 3 in e.isr_after]
    assert expands, "the resumed follower never rejoined the ISR"


def test_close_after_crash_of_a_paused_broker_still_cleans_up(kafka_cluster_factory):
    cluster = kafka_cluster_factory(brokers=1)
    cluster.pause(1)
    pid = cluster.pid(1)
    cluster.close()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_free_port_is_outside_the_ephemeral_range_and_not_handed_out_twice() -> None:
    import socket

    from localkafka.ports import _ephemeral_low, free_port

    ports = [free_port() for _ in range(50)]
    assert len(set(ports)) == len(ports)
    assert all(p < _ephemeral_low() for p in ports)  # an outgoing connection cannot take it meanwhile
    with socket.socket() as s:
        s.bind(("127.0.0.1", ports[0]))  # free indeed


def test_a_topic_deleted_and_a_partition_reassigned(kafka_cluster, unique_name):
    # the soak's churn (tests/e2e/test_soak.py) through Kafka's own admin commands
    from confluent_kafka.admin import AdminClient

    moved, gone = unique_name("moved"), unique_name("gone")
    kafka_cluster.create_topic(moved, assignment=[[1, 2]])
    kafka_cluster.create_topic(gone, partitions=1, replication_factor=1)
    _produce(kafka_cluster, moved, 50)
    kafka_cluster.reassign(moved, 0, [3, 1])
    kafka_cluster.delete_topic(gone)
    md = AdminClient(kafka_cluster.client_config()).list_topics(timeout=30)
    assert gone not in md.topics
    assert sorted(md.topics[moved].partitions[0].replicas) == [1, 3]
    assert len(_consume_all(kafka_cluster, moved, 1, 50)) == 50


def test_a_topic_a_client_keeps_asking_for_is_deleted_and_comes_back(kafka_cluster, unique_name):
    """Deleting a topic that a running client keeps asking for (as the job's source does for its
    telemetry topic): Kafka 0.9 creates it again at the client's next metadata request
    (auto.create.topics.enable), so it may never be seen unlisted. ``delete_topic`` returns once
    the deletion is done (ZooKeeper no longer marks it), not after its timeout."""
    import threading

    from confluent_kafka.admin import AdminClient

    topic = unique_name("asked")
    kafka_cluster.create_topic(topic, partitions=1, replication_factor=1)
    admin = AdminClient(kafka_cluster.client_config())
    stop = threading.Event()

    def ask() -> None:
        while not stop.is_set():
            admin.list_topics(topic, timeout=5)  # a metadata request naming it: creates it if gone
            time.sleep(0.05)

    asker = threading.Thread(target=ask, daemon=True)
    asker.start()
    try:
        kafka_cluster.delete_topic(topic, timeout_s=45)  # (raises LocalKafkaError at its timeout)
    finally:
        stop.set()
        asker.join(timeout=10)
    assert topic in admin.list_topics(timeout=10).topics  # created again by the asking client
