"""The collector's fetch mode against a protocol-level fake of a Kafka 4.0 cluster
(tests/support/fakebroker.py). A protocol check, not evidence about a broker's behaviour: it
shows the requests go out in versions a 4.0 broker accepts (never ListOffsets v0, which 4.0
removed) and that the answers are read; the offsets are what the fake was told to answer.
Real-broker evidence is Kafka 0.9's (tests/collector/test_collector_kafka.py)."""

from __future__ import annotations

import socket
import time

import pytest
from kafka.conn import BrokerConnection
from kafka.protocol.list_offsets import ListOffsetsRequest

from collector.probe import ClusterProbe
from collector.settings import CollectSettings
from collector.tracker import ReplicaTracker
from isrwatch.clientconfig import kafka_python_config
from isrwatch.exceptions import ConfigError
from isrwatch.kafkawire import LATEST, broker_versions, list_offsets_request, request_version
from isrwatch.settings import kafka_config_pairs
from tests.support.fakebroker import FakeKafka, sample_topics

ZERO_NINE = {"api.version.request": "false", "broker.version.fallback": "0.9.0.1"}


@pytest.fixture
def fake():
    with FakeKafka(sample_topics(("orders",))) as cluster:
        yield cluster


def _expected_leos(fake: FakeKafka) -> dict[tuple[int, str, int], int]:
    return {(b, t, p): leo for t, parts in fake.topics.items() for p, fp in parts.items() for b, leo in fp.leo.items()}


@pytest.mark.parametrize("props", [{}, ZERO_NINE], ids=["default-settings", "with-the-0.9-settings"])
def test_a_round_against_the_4_0_protocol_fake_reads_every_replicas_log_end_offset(fake, props) -> None:
    probe = ClusterProbe(kafka_python_config(fake.bootstrap, props), round_timeout_s=2.0)
    try:
        snap = probe.connect(10.0)
        second = probe.snapshot()
        assert probe.cluster_id == "fake-kafka-4.0"  # Metadata v2 on
        # every broker's ApiVersions answer is 4.0's ranges (with the 0.9 settings too, once refused)
        assert probe.kafka_version == "4.0"
    finally:
        probe.close()
    for s in (snap, second):
        assert s.unreachable == set()
        assert s.leo == _expected_leos(fake)  # replica id -2: followers' own log end offsets too
        assert s.hw == {("orders", p): fp.high_watermark for p, fp in fake.topics["orders"].items()}
    assert [(p.partition, p.leader, p.replicas, p.leader_epoch) for p in snap.partitions] == [
        (p, fp.leader, fp.replicas, fp.leader_epoch) for p, fp in sorted(fake.topics["orders"].items())
    ]
    # isrwatch's own requests: ListOffsets v5 and Metadata v7 (the leader epochs), as 4.0's ranges allow
    assert {(n, v) for _, n, v in fake.asked if n == "ListOffsets"} == {("ListOffsets", 5)}
    assert ("Metadata", 7) in {(n, v) for _, n, v in fake.asked}
    assert fake.unmodelled == []
    if props:
        # the 0.9 settings: each broker was asked one ListOffsets v0 at start-up, refused it, and
        # was then asked ApiVersions; no data request went out at a 0.9 version
        assert sorted(fake.refused) == [(b, "ListOffsets", 0) for b in fake.broker_ids]
    else:
        assert fake.refused == []


def test_the_tracker_turns_the_fakes_answers_into_observations_of_each_follower(fake) -> None:
    probe = ClusterProbe(kafka_python_config(fake.bootstrap, {}), round_timeout_s=2.0)
    tracker = ReplicaTracker(lag_time_max_ms=30_000)
    try:
        tracker.observe(probe.connect(10.0))
        result = tracker.observe(probe.snapshot())
    finally:
        probe.close()
    seen = {
        (o.partition, o.broker_id): (o.leader_id, o.leo, o.leader_leo, o.hw, o.leader_epoch)
        for o in result.observations
    }
    expected = {  # the leader epoch too: Metadata v7 gives it
        (p, b): (fp.leader, fp.leo[b], fp.leo[fp.leader], fp.high_watermark, fp.leader_epoch)
        for p, fp in fake.topics["orders"].items()
        for b in fp.replicas
        if b != fp.leader
    }
    assert seen == expected
    assert all(o.prev_leo is not None for o in result.observations)  # the first round's, carried over


def test_a_connection_pinned_by_the_0_9_settings_is_refused_list_offsets_v0_by_the_fake(fake) -> None:
    """What the probe's start-up check guards against, and what lets the tests above fail: a
    kafka-python connection pinned to 0.9 (no ApiVersions) sends ListOffsets v0, and the fake,
    as Kafka 4.0, closes the connection."""

    host, port = fake.address(1).split(":")
    conn = BrokerConnection(host, int(port), socket.AF_INET, api_version=(0, 9))
    try:
        assert conn.connect_blocking(5.0)
        version = request_version(broker_versions(conn), ListOffsetsRequest, 5)
        assert version == 0
        future = conn.send(list_offsets_request(version, -2, [("orders", 0)], LATEST))
        deadline = time.monotonic() + 5
        while not future.is_done and time.monotonic() < deadline:
            for response, answered in conn.recv():
                answered.success(response)
            time.sleep(0.01)
        assert future.failed()
    finally:
        conn.close()
    assert fake.refused == [(1, "ListOffsets", 0)]


@pytest.mark.parametrize("fallback", ["4.1.0", "5"])
def test_a_fallback_kafka_python_cannot_use_is_one_line_at_start_up(fallback) -> None:
    settings = CollectSettings(
        bootstrap_servers="k:9092", kafka_config=["api.version.request=false", f"broker.version.fallback={fallback}"]
    )
    problem = settings.validate()
    assert problem is not None and "\n" not in problem
    assert f"broker.version.fallback={fallback}" in problem and "0.8.0 to 4.0" in problem
    with pytest.raises(ConfigError, match="knows brokers 0.8.0 to 4.0"):
        kafka_python_config("k:9092", kafka_config_pairs(settings.kafka_config))


def test_a_fenced_broker_left_out_of_the_broker_list_is_not_answering_not_lagging(fake) -> None:
    """Issue 55, item 5: KRaft leaves a fenced broker out of Metadata's broker list while its
    replicas stay assigned. Its replicas read as a broker that does not answer (``leo`` None,
    the broker unreachable), not as followers whose log end offset stopped."""
    fake.fenced.add(3)
    for fp in fake.topics["orders"].values():  # as the controller leaves them: out of every ISR, leading none
        fp.isr = tuple(b for b in fp.isr if b != 3)
        if fp.leader == 3:
            fp.leader, fp.leader_epoch = fp.isr[0], fp.leader_epoch + 1
    probe = ClusterProbe(kafka_python_config(fake.bootstrap, {}), round_timeout_s=2.0)
    tracker = ReplicaTracker(lag_time_max_ms=30_000)
    try:
        tracker.observe(probe.connect(10.0))
        snap = probe.snapshot()
        result = tracker.observe(snap)
    finally:
        probe.close()
    assert snap.unreachable == {3} and sorted(snap.brokers) == [1, 2]
    assert not any(b == 3 for b, _, _ in snap.leo)  # never asked, though it still listens
    of_3 = [o for o in result.observations if o.broker_id == 3]
    assert len(of_3) == len(fake.topics["orders"]) and all(o.leo is None for o in of_3)
    assert all(o.leo is not None for o in result.observations if o.broker_id != 3)


@pytest.mark.parametrize("props", [{}, ZERO_NINE], ids=["default-settings", "with-the-0.9-settings"])
def test_a_broker_hung_at_start_up_is_unreachable_and_the_others_are_read(fake, props) -> None:
    """A broker that accepts connections and answers nothing (paused): neither the start-up's
    version questions (ApiVersions, or the 0.9 settings' check) nor a round waits on it beyond
    the round, and it is not taken for a broker that refused a version."""
    fake.hung.add(2)
    probe = ClusterProbe(kafka_python_config(fake.bootstrap, props), round_timeout_s=1.0)
    try:
        snap = probe.connect(10.0)
    finally:
        probe.close()
    assert snap.unreachable == {2}
    assert snap.leo == {k: v for k, v in _expected_leos(fake).items() if k[0] != 2}
    assert {v for _, n, v in fake.asked if n == "ListOffsets"} == {5}
