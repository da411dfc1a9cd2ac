"""Validation: every bad record or observation becomes one dead letter with its reason."""

from __future__ import annotations

import dataclasses
import json
import time

import pytest

from isrwatch.telemetry import (
    BrokerCounters,
    BrokerEndpoint,
    GoneReplica,
    IsrChange,
    Observation,
    TelemetryRecord,
    encode_record,
)
from streaming.evaluation import parse
from streaming.sources.source_spool import RAW_SCHEMA
from tests.streaming.rare import rare_rows

pytestmark = pytest.mark.spark

RAW = RAW_SCHEMA  # the source's columns, as the job's own sources give them


def _obs(**over) -> dict:
    now = int(time.time() * 1000)
    o = Observation("t", 0, 2, 1, now, 100, 110, 100, now - 1000, 90, 105, (1, 2), (1, 2), 10_000, 1)
    d = json.loads(encode_record(TelemetryRecord("c", "test", now, (o,), version=1)))["observations"][0]
    d.update(over)
    return d


def _record(observations, **over) -> bytes:
    body = {"version": 1, "cluster": "c", "source": "test", "sent_ms": 1, "observations": observations, **over}
    return json.dumps(body).encode()


def test_reasons(spark) -> None:
    now = int(time.time() * 1000)
    good_change = IsrChange(now, "t", 0, (1, 2, 3), (1, 3), leader_id=1)
    counts = (BrokerCounters(1, now, 7, 5), BrokerCounters(2, now, None, None))  # broker 2: no count, no row
    values = [
        (b"not json at all", "not_json"),
        (b"[1, 2]", "not_object"),
        (_record([_obs()], version=7), "unknown_version"),
        (_record([_obs()], cluster=""), "missing_cluster"),
        # names past the bounds (every name becomes labels of the gauges and alerts)
        (_record([_obs()], cluster="c" * 256), "name_too_long"),
        (_record([_obs(topic="t" * 250)]), "name_too_long"),
        (
            encode_record(TelemetryRecord("c", "test", now, (Observation("t" * 250, 1, 2, 1, now, 5, 5),))),
            "name_too_long",
        ),
        (
            _record(
                [], isr_changes=[{"t_ms": now, "topic": "t" * 250, "partition": 0, "isr_before": [1], "isr_after": [1]}]
            ),
            "bad_isr_change",
        ),
        (_record({"a": 1}), "bad_observations"),
        (_record([_obs(broker_id=None)]), "missing_ids"),
        (_record([_obs(leo=-5)]), "negative_value"),
        (_record([_obs(prev_t_ms=now + 10)]), "prev_after_t"),
        (_record([_obs(prev_leader_leo=200)]), "leader_leo_backwards"),
        (_record([_obs(t_ms=now + 3_600_000, prev_t_ms=now)]), "future_t"),
        (_record([], isr_changes=[{"t_ms": now, "topic": "t", "partition": 0, "isr_before": [1]}]), "bad_isr_change"),
        # Spark's JSON reader would read each of these as a null field (a null leo: "did not answer")
        (_record([_obs(leo="x")]), "bad_type"),
        (_record([_obs(), _obs(leader_leo=float("nan"))]), "not_json"),  # NaN is not JSON
        (_record([_obs(hw=2**64)]), "bad_type"),
        (_record([_obs(prev_leo=1.5)]), "bad_type"),
        (_record([_obs(isr="1")]), "bad_type"),
        (_record([_obs(partition="x")]), "bad_type"),
        (_record([], gone=[{"t_ms": now, "topic": "t", "partition": 0}]), "bad_gone"),
        (_record([], gone=[{"t_ms": now, "topic": "t", "partition": 0, "broker_id": -1}]), "bad_gone"),
        (_record([], gone=[{"t_ms": now, "topic": "t" * 250, "partition": 0, "broker_id": 2}]), "bad_gone"),
    ]
    gone = (GoneReplica(now, "deleted", 4, 3),)
    endpoints = (BrokerEndpoint(1, "kafka1", 9092), BrokerEndpoint(2, "kafka2", 9092))
    good = encode_record(
        TelemetryRecord(
            "c", "test", now, (Observation("t", 1, 2, 1, now, 5, 5),), (good_change,), counts, gone,
            cluster_id="K1", endpoints=endpoints, kafka_version="2.1",
        )
    )  # fmt: skip
    rows = [(None, v, "spool", 0, i, None) for i, (v, _) in enumerate(values)]
    # One good record with one bad observation among good ones: only that one is rejected.
    mixed = _record([_obs(), _obs(partition=None), _obs(partition=3)])
    longest = _record([_obs(partition=7, topic="t" * 249)], cluster="k" * 255)  # the longest names allowed
    rows += [(None, good, "spool", 0, 100, None), (None, mixed, "spool", 0, 101, None)]
    rows += [(None, longest, "spool", 0, 102, None)]
    batch = spark.createDataFrame(rows, RAW)

    out = rare_rows(batch, future_tolerance_ms=60_000)
    by_offset: dict[int, list[str]] = {}
    for d in out["deadletters"]:
        assert set(d) == set(parse.DEADLETTER_COLUMNS)
        assert d["reason"] in parse.REASONS
        by_offset.setdefault(d["source_offset"], []).append(d["reason"])
    assert {i: [r] for i, (_, r) in enumerate(values)} == {k: v for k, v in by_offset.items() if k < 100}
    assert by_offset.get(100) is None and by_offset.get(102) is None
    too_long = next(d for d in out["deadletters"] if d["reason"] == "name_too_long" and d["detail"])
    assert too_long["cluster"] is None and too_long["detail"] == "cluster of 256 characters"
    assert by_offset[101] == ["missing_ids"]
    bad_obs = next(d for d in out["deadletters"] if d["source_offset"] == 101)
    assert json.loads(bad_obs["payload"]).get("partition") is None
    assert json.loads(bad_obs["payload"])["broker_id"] == 2
    change = {"cluster": "c", "topic": "t", "partition": 0, "shrink": 1, "expand": 0, "t_ms": now}
    assert out["isr_changes"] == [{**change, "left": [2], "joined": [], "leader_id": 1}]
    assert out["counters"] == [{"cluster": "c", "broker_id": 1, "t_ms": now, "shrinks_total": 7}]
    assert out["gone"] == [("c", "deleted", 4, 3, now)]
    # what the collector said of its cluster, from the one record that says it (streaming.driver.identity)
    # and its Kafka version (streaming.driver.variants says the rule variant the cluster gets)
    stated = {"cluster_id": "K1", "endpoints": [dataclasses.asdict(e) for e in endpoints], "kafka_version": "2.1"}
    assert out["identities"] == [("c", stated)]

    # The aggregation path sees exactly the good observations.
    obs = parse.good_observations(parse.observations(parse.parse_records(batch), 60_000)).collect()
    assert sorted((o["partition"], o["cluster"]) for o in obs) == [(0, "c"), (1, "c"), (3, "c"), (7, "k" * 255)]
    # each observation with its record's Kafka version (the rule variant per row, --rule auto)
    assert sorted((o["partition"], o["kafka_version"]) for o in obs) == [(0, None), (1, "2.1"), (3, None), (7, None)]


def test_future_check_off_for_fast_simulators(spark) -> None:
    now = int(time.time() * 1000)
    v = _record([_obs(t_ms=now + 3_600_000, prev_t_ms=now)])
    batch = spark.createDataFrame([(None, v, "spool", 0, 0, None)], RAW)
    assert rare_rows(batch, future_tolerance_ms=None)["deadletters"] == []
