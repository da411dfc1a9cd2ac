"""``isrwatch collect`` (fetch mode, default settings) watching a protocol-level fake of a Kafka
4.0 cluster (tests/support/fakebroker.py), its telemetry published to the real local Kafka 0.9
cluster (the fake stores nothing). A protocol check of the watched side, not evidence about a
broker's behaviour: the command starts, asks in versions 4.0 accepts, and publishes the offsets
the fake was told to answer, for every follower."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import asdict

import pytest

from isrwatch.telemetry import decode_record
from localkafka import COMPAT_CONFIG
from tests.collector.test_collector_kafka import read_topic
from tests.support.fakebroker import FakeKafka, sample_topics

pytestmark = pytest.mark.kafka


def test_collect_watching_the_4_0_protocol_fake_publishes_each_followers_offsets(kafka_cluster, unique_name) -> None:
    telemetry = unique_name("telemetry")
    kafka_cluster.create_topic(telemetry, 1, 1)
    with FakeKafka(sample_topics(("orders",))) as fake:
        done = subprocess.run(
            [sys.executable, "-m", "isrwatch", "collect", "--bootstrap-servers", fake.bootstrap,
             "--telemetry-bootstrap-servers", kafka_cluster.bootstrap_servers, "--telemetry-topic", telemetry,
             "--cluster", "fake40", "--interval", "0.3", "--duration", "2",
             *[a for k, v in COMPAT_CONFIG.items() for a in ("--telemetry-kafka-config", f"{k}={v}")]],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        asked = {(n, v) for _, n, v in fake.asked}
        refused, unmodelled = list(fake.refused), list(fake.unmodelled)
    assert done.returncode == 0, done.stderr
    assert "collector_connected" in done.stderr
    assert done.stderr.count("event=kafka_version cluster=fake40 version=4.0") == 1
    assert refused == [] and unmodelled == []
    assert {v for n, v in asked if n == "ListOffsets"} == {5} and ("Metadata", 7) in asked
    latest = {}
    for _, value in read_topic(kafka_cluster, telemetry):
        record = decode_record(value)
        assert record.cluster == "fake40" and json.loads(value)["source"] == "fetch"
        assert record.kafka_version == "4.0"  # every record: the job picks the cluster's rule variant by it
        for o in map(asdict, record.observations):
            latest[(o["partition"], o["broker_id"])] = o
    parts = fake.topics["orders"]
    assert sorted(latest) == sorted((p, b) for p, fp in parts.items() for b in fp.replicas if b != fp.leader)
    for (p, b), o in latest.items():
        fp = parts[p]
        assert (o["leader_id"], o["leader_epoch"], o["leo"], o["leader_leo"], o["hw"]) == (
            fp.leader,
            fp.leader_epoch,
            fp.leo[b],
            fp.leo[fp.leader],
            fp.high_watermark,
        )


@pytest.mark.parametrize(
    ("flags", "min_isr"), [([], 3), (["--min-insync-replicas", "2"], 2)], ids=["cluster-settings", "flag-wins"]
)
def test_collect_writes_the_settings_the_4_0_protocol_fake_describes(
    kafka_cluster, unique_name, flags, min_isr
) -> None:
    """DescribeConfigs answered with a 10 s lag on every broker and min.insync.replicas 3 for the
    topic: the telemetry carries them with no flag; a flag given wins."""
    telemetry = unique_name("telemetry")
    kafka_cluster.create_topic(telemetry, 1, 1)
    topics = sample_topics(("orders",))
    with FakeKafka(topics, lag_time_max_ms={1: 10_000, 2: 10_000, 3: 10_000}, min_isr={"orders": 3}) as fake:
        done = subprocess.run(
            [sys.executable, "-m", "isrwatch", "collect", "--bootstrap-servers", fake.bootstrap,
             "--telemetry-bootstrap-servers", kafka_cluster.bootstrap_servers, "--telemetry-topic", telemetry,
             "--cluster", "fake40", "--interval", "0.3", "--duration", "1.5", *flags,
             *[a for k, v in COMPAT_CONFIG.items() for a in ("--telemetry-kafka-config", f"{k}={v}")]],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        asked = {(n, v) for _, n, v in fake.asked}
    assert done.returncode == 0, done.stderr
    assert ("DescribeConfigs", 2) in asked and "cluster_settings_unread" not in done.stderr
    seen = set()
    for _, value in read_topic(kafka_cluster, telemetry):
        seen |= {(o.lag_time_max_ms, o.min_isr) for o in decode_record(value).observations}
    assert seen == {(10_000, min_isr)}
