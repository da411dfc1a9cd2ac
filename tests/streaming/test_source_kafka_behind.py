"""The isrwatch-kafka source's reader when a partition's end falls behind where it reads from.

A telemetry partition's log cut back (an unclean leader election) or its topic deleted and
created again leaves the partition's end offset below the job's position. The job's offsets
only move forward, so it reads that partition again once the end passes its position; until
then what is written there is not read. The reader must say so (``telemetry_offsets_behind``,
once it has lasted ``BEHIND_WARN_S``), and say when it is over. Real Kafka (the session's shared cluster: a topic of this test's own is
deleted and created again), the reader driven as Spark drives it, without Spark.
"""

from __future__ import annotations

import logging
import time

import pytest
from confluent_kafka import Producer

from localkafka import COMPAT_CONFIG
from streaming.source_kafka import BEHIND_WARN_S, KafkaStreamReader

pytestmark = [pytest.mark.kafka]


def _produce(cluster, topic: str, n: int) -> None:
    p = Producer(cluster.client_config(acks="all"))
    for i in range(n):
        p.produce(topic, value=b"v%d" % i, partition=0)
    assert p.flush(30) == 0


def _said(caplog, event: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if f"event={event} " in r.getMessage()]


def _batch(reader: KafkaStreamReader, start):
    """One micro-batch as Spark runs it: the end, the ranges, the commit. -> the end."""
    end = reader.latestOffset()
    reader.partitions(start, end)
    reader.commit(end)
    return end


def test_a_partition_whose_end_went_back_is_said_behind_until_it_passes_again(kafka_cluster, unique_name, caplog):
    topic = unique_name("behind")
    kafka_cluster.create_topic(topic, partitions=1, replication_factor=1)
    _produce(kafka_cluster, topic, 30)
    options = {"kafka.bootstrap.servers": kafka_cluster.bootstrap_servers, "subscribe": topic}
    options |= {"startingOffsets": "earliest", **{f"kafka.{k}": v for k, v in COMPAT_CONFIG.items()}}
    reader = KafkaStreamReader(options)
    try:
        end = _batch(reader, reader.initialOffset())
        assert end == {topic: {"0": 30}}
        kafka_cluster.delete_topic(topic)
        kafka_cluster.create_topic(topic, partitions=1, replication_factor=1)
        _produce(kafka_cluster, topic, 10)
        with caplog.at_level(logging.INFO, logger="streaming.source_kafka"):
            # (the new partition's leader may answer the reader's first questions late: a late
            # partition keeps its last known end, and is not judged)
            deadline = time.monotonic() + BEHIND_WARN_S + 30
            while not _said(caplog, "telemetry_offsets_behind") and time.monotonic() < deadline:
                end = _batch(reader, end)
                time.sleep(0.2)
            end = _batch(reader, end)  # said once, not at every batch
            behind = _said(caplog, "telemetry_offsets_behind")
            assert end == {topic: {"0": 30}}, "the job's offsets never go back"
            _produce(kafka_cluster, topic, 25)  # the end passes 30 again
            end = _batch(reader, end)
            caught_up = _said(caplog, "telemetry_offsets_caught_up")
    finally:
        reader.stop()
    assert len(behind) == 1, behind
    assert f"topic={topic} partition=0 reading_from=30 end=10" in behind[0]
    assert end == {topic: {"0": 35}}
    assert len(caught_up) == 1, caught_up
