"""Offset arithmetic and options of the Kafka source (no Spark, no Kafka)."""

from __future__ import annotations

import pytest

from streaming.sources.source_kafka import KafkaStreamReader, cap_offsets, consumer_config


def test_no_cap_or_small_backlog_returns_latest():
    start = {"t": {"0": 10, "1": 20}}
    latest = {"t": {"0": 15, "1": 25}}
    assert cap_offsets(start, latest, None) == latest
    assert cap_offsets(start, latest, 10) == latest


def test_cap_shares_in_proportion_and_sums_exactly():
    start = {"t": {"0": 0, "1": 100, "2": 5}}
    latest = {"t": {"0": 300, "1": 200, "2": 5}}
    end = cap_offsets(start, latest, 100)
    taken = {p: end["t"][p] - start["t"][p] for p in ("0", "1", "2")}
    assert sum(taken.values()) == 100
    assert taken == {"0": 75, "1": 25, "2": 0}


def test_cap_of_one_still_moves():
    end = cap_offsets({"a": {"0": 7}, "b": {"0": 7}}, {"a": {"0": 9}, "b": {"0": 9}}, 1)
    assert end["a"]["0"] + end["b"]["0"] == 15


def test_kafka_options_become_consumer_properties():
    cfg = consumer_config(
        {"kafka.bootstrap.servers": "h:9092", "kafka.security.protocol": "SASL_SSL", "subscribe": "t"}
    )
    assert cfg["bootstrap.servers"] == "h:9092" and cfg["security.protocol"] == "SASL_SSL"
    assert "subscribe" not in cfg and cfg["enable.auto.commit"] is False


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"subscribe": "t"}, "kafka.bootstrap.servers"),
        ({"kafka.bootstrap.servers": "h:1"}, "subscribe"),
        ({"kafka.bootstrap.servers": "h:1", "subscribe": "t", "startingOffsets": "middle"}, "startingOffsets"),
        ({"kafka.bootstrap.servers": "h:1", "subscribe": "t", "maxOffsetsPerTrigger": "0"}, "maxOffsetsPerTrigger"),
    ],
)
def test_bad_options_are_clear(options, message):
    with pytest.raises(ValueError, match=message):
        KafkaStreamReader(options)


def test_spool_name_of_the_cap_is_accepted():
    r = KafkaStreamReader({"kafka.bootstrap.servers": "h:1", "subscribe": "a, b", "maxRecordsPerTrigger": "7"})
    assert (r.max_offsets, r.topics, r.starting) == (7, ["a", "b"], "latest")


def test_what_a_short_read_left_counts_toward_the_next_batchs_cap(tmp_path):
    """A batch read short (its reads stopped at their start: a leader that did not answer in
    time) leaves its ranges owed; the next batch reads them too, so they count toward its cap.
    Not counted, the batch after an empty one planned twice the cap, and on a backlog of the
    collector's records of 500 observations that ran the job's 1 GiB JVM out of heap (docs/kafka.md)."""
    from streaming.sources.deferred import Deferred, plan_id
    from tests.streaming.test_source_kafka_behind import FakeMarks

    marks = FakeMarks("t")
    reader = KafkaStreamReader(
        {
            "kafka.bootstrap.servers": "127.0.0.1:1",
            "subscribe": "t",
            "startingOffsets": "earliest",
            "maxOffsetsPerTrigger": "100",
            "stateDir": str(tmp_path / "source"),
        }
    )
    reader._marks = marks  # type: ignore[assignment]
    start = reader.initialOffset()
    marks.high = 1000
    b1 = reader.latestOffset()
    assert [(r.start, r.end) for r in reader.partitions(start, b1)] == [(0, 100)]
    Deferred(str(tmp_path / "source")).decide(plan_id(start, b1), ("t", 0, 0, 100), 0)  # nothing read
    b2 = reader.latestOffset()
    reader.commit(b1)
    # the owed range fills the cap: one record more, so that Spark runs the batch at all
    assert [(r.start, r.end) for r in reader.partitions(b1, b2)] == [(0, 101)]
    b3 = reader.latestOffset()
    reader.commit(b2)
    assert [(r.start, r.end) for r in reader.partitions(b2, b3)] == [(101, 201)]
