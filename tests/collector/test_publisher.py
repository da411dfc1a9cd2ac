"""The telemetry publisher: partition choice (pure) and, on the real cluster, a hung leader."""

from __future__ import annotations

import json
import time

import pytest
from confluent_kafka import Consumer, TopicPartition

from collector.publisher import PartitionChooser, TelemetryPartition, TelemetryPublisher, batch_records
from isrwatch.telemetry import BrokerEndpoint, Observation, TelemetryRecord, encode_record


def chooser(*parts: TelemetryPartition) -> PartitionChooser:
    return PartitionChooser(stuck_after_s=2.0, partitions=list(parts))


P = [TelemetryPartition(0, 1, (1,)), TelemetryPartition(1, 2, (2,)), TelemetryPartition(2, 3, (3,))]


def test_round_robin_over_every_partition_when_all_answer():
    c = chooser(*P)
    assert [c.choose(0.0) for _ in range(6)] == [0, 1, 2, 0, 1, 2]


def test_a_partition_with_a_record_unacknowledged_too_long_is_avoided_until_it_answers():
    c = chooser(*P)
    c.sent(1, seq=7, now=10.0)
    assert 1 in c.healthy(11.0)  # waiting, but not for long
    assert c.healthy(12.5) == [0, 2]
    assert {c.choose(12.5) for _ in range(10)} == {0, 2}
    c.acknowledged(1, seq=7)
    assert c.healthy(12.5) == [0, 1, 2]


def test_a_failed_partition_backs_off_doubling():
    c = chooser(*P)
    c.failed(0, seq=1, now=100.0)
    assert 0 not in c.healthy(101.0)
    assert 0 in c.healthy(102.1)
    c.failed(0, seq=2, now=200.0)
    assert 0 not in c.healthy(203.0)
    assert 0 in c.healthy(204.1)
    c.acknowledged(0, seq=3)  # an answer ends the back-off sequence
    c.failed(0, seq=4, now=300.0)
    assert 0 in c.healthy(302.1)


def test_partitions_whose_isr_holds_an_unreachable_broker_come_last():
    c = chooser(
        TelemetryPartition(0, 1, (1, 2)),
        TelemetryPartition(1, 2, (2, 3)),
        TelemetryPartition(2, 3, (3, 1)),
    )
    # broker 3 hangs: partition 2 (led by it) is out; 1 holds it in the ISR (its high
    # watermark waits for broker 3), so 0 is the one to use
    assert c.healthy(0.0, unreachable={3}) == [0]
    # every partition has a hung broker in its ISR: any whose leader answers
    c2 = chooser(TelemetryPartition(0, 1, (1, 3)), TelemetryPartition(1, 3, (3, 1)))
    assert c2.healthy(0.0, unreachable={3}) == [0]
    assert chooser().choose(0.0) is None  # no metadata yet: librdkafka's partitioner picks


def _record(i: int) -> TelemetryRecord:
    o = Observation(topic="t", partition=0, broker_id=2, leader_id=1, t_ms=1_000 + i, leo=i, leader_leo=i)
    return TelemetryRecord(cluster="c", source="collector", sent_ms=1_000 + i, observations=(o,))


def _read_all(cluster, topic: str, partitions: int) -> dict[int, list[int]]:
    """partition -> the sent_ms of every record in it."""
    c = Consumer(cluster.client_config(**{"group.id": f"read-{topic}", "enable.auto.commit": False}))
    out: dict[int, list[int]] = {}
    for p in range(partitions):
        _, high = c.get_watermark_offsets(TopicPartition(topic, p), timeout=30)
        c.assign([TopicPartition(topic, p, 0)])
        got: list[int] = []
        deadline = time.monotonic() + 30
        while len(got) < high and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is not None and m.error() is None:
                got.append(json.loads(m.value())["sent_ms"])
        out[p] = got
    c.close()
    return out


@pytest.mark.kafka
def test_records_go_around_a_hung_leader_and_none_is_lost(kafka_cluster, unique_name):
    """Three partitions placed by Kafka's own assignment (one replica each: a replicated
    partition's high watermark would also wait for the hung broker as a follower); the
    leader of one is paused for 20 s while a record is published every 0.25 s."""
    topic = unique_name("telemetry")
    kafka_cluster.create_topic(topic, partitions=3, replication_factor=1)
    pub = TelemetryPublisher(kafka_cluster.client_config(), topic, "c", same_cluster=False)
    pub.refresh_partitions(timeout_s=10, force=True)
    leaders = {p.partition: p.leader for p in pub.chooser.partitions}
    assert sorted(leaders) == [0, 1, 2]
    victim = leaders[0]
    sent = 0
    for _ in range(8):
        pub.publish([_record(sent)])
        sent += 1
        time.sleep(0.25)
    kafka_cluster.pause(victim)
    delivered_during: list[int] = []
    try:
        t_end = time.monotonic() + 20
        while time.monotonic() < t_end:
            pub.publish([_record(sent)])
            sent += 1
            time.sleep(0.25)
            delivered_during.append(pub.delivered)
    finally:
        kafka_cluster.resume(victim)
    assert pub.flush(60) == 0
    assert pub.failed == 0
    # deliveries kept coming while the leader hung: in its last 10 s, records were acknowledged
    assert delivered_during[-1] - delivered_during[len(delivered_during) // 2] >= 20
    records = _read_all(kafka_cluster, topic, 3)
    seen = {s for got in records.values() for s in got}
    assert seen == {1_000 + i for i in range(sent)}, "a record was lost"
    # after the first seconds of the pause, nothing more was sent to the hung leader's partition
    late = [s for s in records[0] if s - 1_000 >= 8 + 4 * 4]
    assert not late, f"records sent to the paused leader's partition well after it hung: {late}"


def test_the_first_record_of_a_round_says_which_cluster_the_collector_polls():
    """Issue 52: the cluster's id (where its brokers give one) and its brokers' addresses, once
    a round; an address that does not read as host:port is left out."""
    obs = [Observation("t", p, 2, 1, 1_000, 5, 5) for p in range(5)]
    brokers = {2: "kafka2:9092", 1: "[::1]:9093", 3: "nonsense"}
    first, second = batch_records("c", obs, [], 3, cluster_id="K1", endpoints=brokers)
    assert first.cluster_id == "K1"
    assert first.endpoints == (BrokerEndpoint(1, "::1", 9093), BrokerEndpoint(2, "kafka2", 9092))
    assert second.cluster_id is None and second.endpoints == ()
    body = json.loads(encode_record(first))
    assert body["cluster_id"] == "K1" and body["endpoints"][1] == {"broker_id": 2, "host": "kafka2", "port": 9092}
    # Kafka 0.9: no cluster id; version 3 has no place for either
    (old,) = batch_records("c", obs[:1], [], 3, endpoints=brokers, version=3)
    assert "endpoints" not in json.loads(encode_record(old)) and "cluster_id" not in json.loads(encode_record(old))


def test_every_record_of_a_round_states_the_clusters_kafka_version_where_known():
    """Issue 55: the job picks each record's rule variant from it, so every record carries it;
    unknown (Kafka 0.9) or version 3: the records are as before."""
    obs = [Observation("t", p, 2, 1, 1_000, 5, 5) for p in range(5)]
    records = batch_records("c", obs, [], 3, kafka_version="2.1")
    assert [json.loads(encode_record(r))["kafka_version"] for r in records] == ["2.1", "2.1"]
    for kwargs in ({}, {"kafka_version": "2.1", "version": 3}):
        unknown = batch_records("c", obs, [], 3, **kwargs)  # type: ignore[arg-type]
        assert all("kafka_version" not in json.loads(encode_record(r)) for r in unknown)
    # one send time for both: the comparison is of what the version changes, not of the clock
    assert encode_record(batch_records("c", obs, [], 9, sent_ms=7)[0]) == encode_record(
        batch_records("c", obs, [], 9, kafka_version=None, sent_ms=7)[0]
    )
