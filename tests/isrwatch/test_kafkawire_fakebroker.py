"""The job's own Kafka requests (its planner's watermarks, streaming/sources/watermarks.py, and the
start-up metadata asked directly, exporter/kafka_metadata.py) with default settings against a
protocol-level fake of a Kafka 4.0 cluster (tests/support/fakebroker.py). A protocol check, not
evidence about a broker's behaviour: the requests go out in versions 4.0 accepts and their
answers are read; the offsets are what the fake was told. Real-broker evidence is Kafka 0.9's
(tests/streaming/test_watermarks.py, tests/exporter/test_kafka_metadata.py)."""

from __future__ import annotations

import pytest

from exporter.kafka_metadata import direct_metadata
from streaming.sources.watermarks import Watermarks
from tests.support.fakebroker import FakeKafka, sample_topics


@pytest.fixture
def fake():
    with FakeKafka(sample_topics(("isr.telemetry", "orders"))) as cluster:
        yield cluster


ZERO_NINE = {"api.version.request": "false", "broker.version.fallback": "0.9.0.1"}


@pytest.mark.parametrize("props", [{}, ZERO_NINE], ids=["default-settings", "with-the-0.9-settings"])
def test_the_jobs_watermarks_are_each_leaders_log_start_and_high_watermark(fake, props) -> None:
    marks = Watermarks({"bootstrap.servers": fake.bootstrap, **props}, ["isr.telemetry"], answer_s=5.0)
    try:
        low, high = marks.poll()
        late = marks.late
    finally:
        marks.close()
    parts = fake.topics["isr.telemetry"]
    assert low == {"isr.telemetry": {str(p): fp.log_start for p, fp in parts.items()}}
    assert high == {"isr.telemetry": {str(p): fp.high_watermark for p, fp in parts.items()}}
    assert late == frozenset()
    assert fake.unmodelled == []
    # with the 0.9 settings, each connection's check (ListOffsets v0 for no partition) is refused, and
    # the connection made again asks ApiVersions: no question of the planner goes out at a 0.9 version
    assert {(n, v) for _, n, v in fake.refused} == ({("ListOffsets", 0)} if props else set())
    assert {(n, v) for _, n, v in fake.asked if n != "ApiVersions"} == {("Metadata", 7), ("ListOffsets", 5)}


def test_the_start_up_metadata_asked_directly_reads_leaders_and_replicas(fake) -> None:
    md = direct_metadata({"bootstrap.servers": fake.bootstrap}, fake.address(2), timeout_s=5.0)
    assert md.cluster_id == "fake-kafka-4.0"
    assert sorted(md.brokers) == list(fake.broker_ids)
    assert {p: (pm.leader, tuple(pm.replicas), tuple(pm.isrs)) for p, pm in md.topics["orders"].partitions.items()} == {
        p: (fp.leader, fp.replicas, fp.isr) for p, fp in fake.topics["orders"].items()
    }
    assert fake.asked[-1] == (2, "Metadata", 7) and fake.refused == []
