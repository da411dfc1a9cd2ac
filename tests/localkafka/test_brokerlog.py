"""Parsing the broker's ISR change lines (no Kafka needed)."""

from __future__ import annotations

from datetime import UTC, datetime

from localkafka.brokerlog import parse_isr_change, read_isr_changes

SHRINK = (
    "[2025-11-21 11:20:03,412] INFO Partition [orders.v2,7] on broker 1: "
    "Shrinking ISR for partition [orders.v2,7] from 1,2,3 to 1,3 (kafka.cluster.Partition)"
)
EXPAND = (
    "[2025-11-21 11:20:05,001] INFO Partition [orders.v2,7] on broker 1: "
    "Expanding ISR for partition [orders.v2,7] from 1,3 to 1,3,2 (kafka.cluster.Partition)"
)


def test_shrink_line_parses_time_topic_partition_and_isrs():
    c = parse_isr_change(SHRINK, broker_id=1)
    assert c is not None
    assert c.time == datetime(2025, 11, 21, 11, 20, 3, 412000, tzinfo=UTC).timestamp()
    assert (c.topic, c.partition, c.isr_before, c.isr_after) == ("orders.v2", 7, (1, 2, 3), (1, 3))
    assert (c.kind, c.broker_id) == ("shrink", 1)


def test_expand_line_and_other_lines():
    c = parse_isr_change(EXPAND)
    assert c is not None and c.kind == "expand" and c.isr_after == (1, 3, 2)
    assert (
        parse_isr_change("[2025-11-21 11:20:05,001] INFO [Kafka Server 1], started (kafka.server.KafkaServer)") is None
    )


def test_read_filters_by_time(tmp_path):
    log = tmp_path / "server.log"
    log.write_text("noise\n" + SHRINK + "\n" + EXPAND + "\n")
    everything = read_isr_changes(log, broker_id=1)
    assert [c.kind for c in everything] == ["shrink", "expand"]
    later = read_isr_changes(log, since=everything[0].time + 0.5)
    assert [c.kind for c in later] == ["expand"]
    assert read_isr_changes(tmp_path / "missing.log") == []


def test_missing_jars_is_one_clear_error(monkeypatch, tmp_path):
    import pytest

    import localkafka.cluster as lc
    import localkafka.process as lp

    monkeypatch.setenv("ISRWATCH_KAFKA_LIBS", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(lp, "__file__", str(tmp_path / "x" / "process.py"))
    with pytest.raises(lc.LocalKafkaError, match="make install"):
        lc.LocalKafka()
