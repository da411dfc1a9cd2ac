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
