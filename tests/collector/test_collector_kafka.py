"""The collector against the real local Kafka 0.9 cluster."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import time
from dataclasses import asdict

import jsonschema
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from collector.main import Collector
from collector.probe import ClusterProbe
from collector.settings import CollectSettings
from collector.tracker import ReplicaTracker
from isrwatch.clientconfig import kafka_python_config
from isrwatch.exceptions import UnreachableError
from isrwatch.telemetry import decode_record, json_schema
from localkafka import COMPAT_CONFIG, free_port

pytestmark = pytest.mark.kafka

COMPAT = [f"{k}={v}" for k, v in COMPAT_CONFIG.items()]


def read_topic(cluster, topic):
    """Every record of a one-partition topic: (key, value)."""
    c = Consumer(cluster.client_config(**{"group.id": f"read-{topic}", "enable.auto.commit": False}))
    c.assign([TopicPartition(topic, 0, 0)])
    _, high = c.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
    out = []
    deadline = time.monotonic() + 30
    while len(out) < high and time.monotonic() < deadline:
        m = c.poll(0.5)
        if m is not None and m.error() is None:
            out.append((m.key(), m.value()))
    c.close()
    return out


def test_collect_command_publishes_valid_telemetry_whose_leos_match_the_brokers(kafka_cluster, unique_name):
    topic, telemetry = unique_name("data"), unique_name("telemetry")
    kafka_cluster.create_topic(telemetry, 1, 1)
    # the watched topic, each broker leading one partition (no fault here; the telemetry
    # topic above is placed by Kafka)
    kafka_cluster.create_topic(topic, assignment=[[1, 2, 3], [2, 3, 1], [3, 1, 2]])
    counts = {0: 30, 1: 41, 2: 52}
    p = Producer(kafka_cluster.client_config(acks="all"))
    for part, n in counts.items():
        for _ in range(n):
            p.produce(topic, b"v", partition=part)
    assert p.flush(30) == 0
    done = subprocess.run(
        [sys.executable, "-m", "isrwatch", "collect", "--bootstrap-servers", kafka_cluster.bootstrap_servers,
         "--telemetry-topic", telemetry, "--cluster", "local", "--interval", "0.3", "--duration", "3",
         "--lag-time-max-ms", "10000", *[a for kv in COMPAT for a in ("--kafka-config", kv)]],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "collector_connected" in done.stderr and "partitions=" in done.stderr
    # Kafka 0.9 cannot answer ApiVersions: the version is not known, said once, and not written
    assert "event=kafka_version cluster=local version=unknown" in done.stderr
    assert done.stderr.count("event=kafka_version") == 1  # ten rounds, one line

    records = read_topic(kafka_cluster, telemetry)
    assert len(records) >= 5  # about one per 0.3 s round
    schema = json_schema()
    latest = {}
    for key, value in records:
        assert key is None  # no key: records spread over the telemetry partitions (collector.publisher)
        body = json.loads(value)
        jsonschema.validate(body, schema)
        assert "kafka_version" not in body  # (the job judges the cluster with its default variant)
        for o in map(asdict, decode_record(value).observations):  # version 3: columns
            if o["topic"] == topic:
                latest[(o["partition"], o["broker_id"])] = o
    # two followers per partition, each seen with the brokers' own offsets
    assert sorted(latest) == [(0, 2), (0, 3), (1, 1), (1, 3), (2, 1), (2, 2)]
    c = Consumer(kafka_cluster.client_config(**{"group.id": unique_name("wm")}))
    for (part, _), o in latest.items():
        _, high = c.get_watermark_offsets(TopicPartition(topic, part), timeout=10)
        assert o["leo"] == o["leader_leo"] == o["hw"] == counts[part] == high
        assert o["leader_id"] == part + 1 and o["lag_time_max_ms"] == 10000
        assert o["prev_t_ms"] is not None and o["prev_t_ms"] < o["t_ms"]
    c.close()


def test_paused_follower_is_reported_unreachable_and_the_isr_change_is_recorded(kafka_cluster_factory, unique_name):
    cluster = kafka_cluster_factory(replica_lag_time_max_ms=3000, zookeeper_session_timeout_ms=60_000)
    topic, telemetry = unique_name("data"), unique_name("telemetry")
    # The telemetry topic as a user's cluster places it (docs/deploy.md: several partitions, one
    # replica, Kafka's own assignment), so the paused broker may lead some of it too; the
    # watched topic is pinned so that broker 3 follows both partitions (the fault under test).
    cluster.create_topic(telemetry, partitions=6, replication_factor=1)
    cluster.create_topic(topic, assignment=[[1, 2, 3], [2, 1, 3]])
    settings = CollectSettings(
        bootstrap_servers=cluster.bootstrap_servers,
        kafka_config=COMPAT,
        telemetry_topic=telemetry,
        interval=0.3,
        lag_time_max_ms=3000,
    )
    collector = Collector(settings)
    producer = Producer(cluster.client_config(acks="1"))
    collector.start()
    try:
        for _ in range(3):
            collector.run_round()
        paused_at = time.time()
        cluster.pause(3)
        changes, observations = [], []
        deadline = time.monotonic() + 45
        while time.monotonic() < deadline and len({(c.partition) for c in changes}) < 2:
            for part in (0, 1):
                producer.produce(topic, b"load", partition=part)
            producer.poll(0)
            snap = collector.probe.snapshot()
            result = collector.tracker.observe(snap)
            collector.publisher.publish([])
            observations += [o for o in result.observations if o.topic == topic]
            changes += [c for c in result.isr_changes if c.topic == topic]
            time.sleep(0.3)
        cluster.resume(3)
    finally:
        collector.close()
    paused = [o for o in observations if o.broker_id == 3]
    healthy = [o for o in observations if o.broker_id != 3]
    answered = [o for o in paused if o.leo is not None]
    assert paused and not answered, (
        f"a paused broker must be reported unreachable; paused at {paused_at * 1000:.0f} ms, it answered in {answered}"
    )
    assert healthy and all(o.leo is not None and o.leader_leo is not None for o in healthy)
    assert all(o.prev_leo is None for o in paused[2:])
    # The collector saw both shrinks in metadata, after the leaders logged them.
    truth = {s.partition: s for s in cluster.isr_shrinks(since=paused_at) if s.topic == topic}
    assert sorted(truth) == [0, 1]
    for c in changes:
        t = truth[c.partition]
        assert (set(c.isr_before), set(c.isr_after)) == (set(t.isr_before), set(t.isr_after))
        assert c.t_ms / 1000 >= t.time - 0.05
    assert sorted({c.partition for c in changes}) == [0, 1]


def test_a_broker_killed_past_its_zookeeper_session_stays_observed_until_it_is_back(
    kafka_cluster_factory, unique_name, caplog
):
    """Kafka 0.9 leaves an unregistered broker out of every partition's replicas in metadata.
    The probe keeps its replicas (``isrwatch.kafkawire.kept_replicas``): each round still observes them, silent
    (``leo`` null) and out of the ISR, also in the partition whose leadership the controller
    moved away from it; once it is back they are answered again and rejoin."""
    # Kafka 0.9's own defaults: a 6 s ZooKeeper session, a 10 s lag.
    cluster = kafka_cluster_factory(replica_lag_time_max_ms=10_000, zookeeper_session_timeout_ms=6000)
    topic = unique_name("data")
    # Pinned so that the killed broker 3 follows partition 0 and leads partition 1 (the fault
    # under test); no isrwatch topic here: the probe and the tracker are read directly.
    cluster.create_topic(topic, assignment=[[1, 2, 3], [3, 1, 2]])
    probe = ClusterProbe(kafka_python_config(cluster.bootstrap_servers, COMPAT_CONFIG), round_timeout_s=0.5)
    tracker = ReplicaTracker(lag_time_max_ms=10_000)
    producer = Producer(cluster.client_config(acks="1"))

    def rounds(until, timeout_s):
        seen = []
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for part in (0, 1):
                producer.produce(topic, b"load", partition=part)
            producer.poll(0)
            snap = probe.snapshot()
            mine = {(o.partition, o.broker_id): o for o in tracker.observe(snap).observations if o.topic == topic}
            seen.append((snap, mine))
            if until(seen):
                return seen
            time.sleep(0.3)
        pytest.fail(f"timed out; last round: brokers {sorted(seen[-1][0].brokers)}, observed {sorted(seen[-1][1])}")

    caplog.set_level(logging.INFO, logger="collector.probe")
    probe.connect()
    try:
        rounds(lambda seen: len(seen) >= 3, 30)
        cluster.stop(3)  # SIGKILL: no controlled shutdown, the session expires
        # until the metadata has left broker 3 out for ten rounds
        down = rounds(lambda seen: sum(3 not in s.brokers for s, _ in seen) >= 10, 60)
        for mine in [mine for snap, mine in down if 3 not in snap.brokers]:
            for part in (0, 1):
                o = mine.get((part, 3))
                assert o is not None, f"partition {part}'s replica on broker 3 not observed once it left the metadata"
                # silent, out of the ISR, and partition 1 led elsewhere now
                assert o.leo is None and 3 not in o.isr and o.leader_id in (1, 2), o
        said = [r.getMessage() for r in caplog.records if "event=unregistered_brokers" in r.getMessage()]
        assert any("brokers=3 " in m for m in said), said
        cluster.start_broker(3)

        def rejoined(seen):
            _, mine = seen[-1]
            return all((p, 3) in mine and mine[(p, 3)].leo is not None and 3 in mine[(p, 3)].isr for p in (0, 1))

        rounds(rejoined, 90)
        # and said once the metadata lists it again
        said = [r.getMessage() for r in caplog.records if "event=unregistered_brokers" in r.getMessage()]
        assert "brokers=- " in said[-1], said
    finally:
        probe.close()
        producer.flush(10)


def test_unreachable_cluster_at_start_up_is_one_clear_line():
    port = free_port()
    done = subprocess.run(
        [sys.executable, "-m", "isrwatch", "collect", "--bootstrap-servers", f"127.0.0.1:{port}",
         "--startup-timeout", "2", "--kafka-config", "api.version.request=false",
         "--kafka-config", "broker.version.fallback=0.9.0.1"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2
    errors = [line for line in done.stderr.splitlines() if "error:" in line]
    assert errors == [f"isrwatch collect: error: cannot reach Kafka at 127.0.0.1:{port}: no metadata answer in 2 s"]
    assert "Traceback" not in done.stderr


def test_unreachable_modern_cluster_without_compat_settings():
    settings = CollectSettings(bootstrap_servers=f"127.0.0.1:{free_port()}", startup_timeout=1.0)
    with pytest.raises(UnreachableError, match="cannot reach Kafka"):
        Collector(settings).start()


def test_a_round_that_holds_back_followers_says_so_and_the_progress_counts_them(kafka_cluster, unique_name, caplog):
    """The collector's own log of the tracker's hold after a leader's silence
    (tests/collector/test_tracker.py has the rule): one line for the round, the running count
    in the progress line. The rounds are given as probe snapshots (the tracker's input, built
    by that test's ``snap``: a paused leader cannot be timed to a fetch in flight here); the
    records go to a real telemetry topic through the collector's own publisher."""
    from tests.collector.test_tracker import snap

    telemetry = unique_name("telemetry")
    kafka_cluster.create_topic(telemetry, partitions=1, replication_factor=1)
    settings = CollectSettings(
        bootstrap_servers=kafka_cluster.bootstrap_servers, kafka_config=COMPAT, telemetry_topic=telemetry
    )
    collector = Collector(settings)
    collector.start()
    caplog.set_level(logging.INFO, logger="collector.main")
    try:
        collector.run_round(snap(0, {1: 100, 2: 100, 3: 100}))
        collector.run_round(snap(500, {1: 110, 2: 100, 3: 100}))  # a batch in flight to the followers
        collector.run_round(snap(1_000, {2: 100, 3: 100}, unreachable=[1]))  # the leader silent
        assert collector.run_round(snap(1_500, {1: 150, 2: 100, 3: 100})) == 0  # back: both held
        assert collector.run_round(snap(2_000, {1: 160, 2: 160, 3: 160})) == 2
    finally:
        collector.close()
    lines = [r.getMessage() for r in caplog.records if "observations_held" in r.getMessage()]
    assert len(lines) == 1 and "followers=2 " in lines[0], lines
    assert collector.held == 2
