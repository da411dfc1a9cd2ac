"""Telemetry version 3 (observations as columns) reads as the same observations as version 1,
and a version-3 record whose columns do not fit is one dead letter, not a crash."""

from __future__ import annotations

import dataclasses
import json
import time
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyspark.sql import functions as F

from isrwatch.telemetry import (
    COLUMNS_FROM,
    MAX_TOPIC_CHARS,
    SUPPORTED_VERSIONS,
    VERSION,
    IsrChange,
    Observation,
    TelemetryRecord,
    decode_record,
    encode_record,
)
from streaming.evaluation import parse
from streaming.sources.source_spool import RAW_SCHEMA
from tests.streaming.rare import rare_rows

pytestmark = pytest.mark.spark

RAW = RAW_SCHEMA  # the source's columns, as the job's own sources give them
NOW = int(time.time() * 1000)

offsets = st.one_of(st.none(), st.integers(0, 2**40))
observation = st.builds(
    Observation,
    topic=st.sampled_from(["orders", "pay-ments", "ü"]),
    partition=st.integers(0, 3),
    broker_id=st.integers(0, 4),
    leader_id=st.integers(0, 4),
    t_ms=st.integers(NOW - 100_000, NOW),
    leo=offsets,
    leader_leo=offsets,
    hw=offsets,
    prev_t_ms=st.one_of(st.none(), st.integers(0, NOW - 100_000)),
    prev_leo=offsets,
    prev_leader_leo=st.one_of(st.none(), st.integers(0, 10)),
    isr=st.lists(st.integers(0, 4), max_size=3).map(tuple),
    replicas=st.lists(st.integers(0, 4), max_size=3).map(tuple),
    lag_time_max_ms=st.one_of(st.none(), st.integers(1, 60_000)),
    min_isr=st.one_of(st.none(), st.integers(1, 3)),
)


def _record(groups: list[list[Observation]]) -> TelemetryRecord:
    """One record of the groups' observations, each non-empty group's first also seen on
    broker 9: observations that share a partition's fields, as a collector's round has them."""
    obs: list[Observation] = []
    for g in groups:
        obs += g
        if g:
            obs.append(dataclasses.replace(g[0], broker_id=9))
    return TelemetryRecord("c", "test", NOW, tuple(obs))


# Up to 6 records an example, every other one written as version 3: a Spark job costs the same
# for one record or six, so 5 examples read more groups (up to 120) than the 15 examples of one
# record each did (up to 60), at a third of the Spark jobs; and version 3 is read whenever an
# example has two records (with one record an example, as before, it never was).
records = st.lists(
    st.lists(st.lists(observation, min_size=1, max_size=6), min_size=1, max_size=4).map(_record), min_size=1, max_size=6
)


def _batch(spark, values):
    return spark.createDataFrame([(None, v, "spool", 0, i, None) for i, v in enumerate(values)], RAW)


def _observed(spark, values) -> list[tuple]:
    obs = parse.good_observations(parse.observations(parse.parse_records(_batch(spark, values)), 60_000))
    return sorted(tuple(r) for r in obs.collect())


def test_the_columns_are_what_isrwatch_writes_and_decode_back() -> None:
    o = Observation("t", 1, 2, 1, NOW, 5, 6, 5, NOW - 1000, 4, 5, (1, 2), (1, 2), 10_000, 2)
    record = TelemetryRecord(
        "c", "test", NOW, (o, dataclasses.replace(o, broker_id=3), dataclasses.replace(o, topic="u"))
    )
    body = json.loads(encode_record(record))
    assert body["version"] == VERSION >= COLUMNS_FROM and "observations" not in body
    assert body["topics"] == ["t", "u"] and body["followers"]["p"] == [0, 0, 1]
    assert decode_record(encode_record(record)) == record


@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(records)
def test_version_3_reads_as_the_same_observations_as_version_1(spark, recs) -> None:
    # (version 4, what isrwatch writes, is version 3 plus gone[]: every other record)
    v3 = [encode_record(dataclasses.replace(r, version=3 if i % 2 else VERSION)) for i, r in enumerate(recs)]
    v1 = [encode_record(dataclasses.replace(r, version=1)) for r in recs]
    assert all(json.loads(v)["version"] in (3, VERSION) for v in v3)
    assert _observed(spark, v3) == _observed(spark, v1)
    # the same dead letters for the same bad observations (the payload: the observation itself)
    got = [
        sorted((d["reason"], d["payload"]) for d in rare_rows(_batch(spark, v), 60_000)["deadletters"])
        for v in (v1, v3)
    ]
    assert got[0] == got[1]


def _columns(**over) -> dict:
    o = Observation("t", 1, 2, 1, NOW, 5, 6, 5, NOW - 1000, 4, 5, (1, 2), (1, 2), 10_000, 2)
    body = json.loads(encode_record(TelemetryRecord("c", "test", NOW, (o, dataclasses.replace(o, broker_id=3)))))
    for path, value in over.items():
        group, _, field = path.partition(".")
        if field:
            body[group][field] = value
        elif value is None:
            del body[group]
        else:
            body[group] = value
    return body


@pytest.mark.parametrize(
    "over",
    [
        {"followers.leo": [5]},  # one entry short
        {"partitions.hw": [5, 6]},  # one too many
        {"followers.p": [0, 1]},  # no partition 1
        {"followers.p": [0, -1]},
        {"followers.p": [0, 2**31 - 1]},  # its position + 1 overflows an int
        {"partitions.topic": [1]},  # no topic 1
        {"followers.prev_leo": None},  # an array missing
        {"followers": None},
        {"topics": None},
    ],
)
def test_columns_that_do_not_fit_are_one_dead_letter(spark, over) -> None:
    good = encode_record(TelemetryRecord("c", "test", NOW, (Observation("t", 0, 2, 1, NOW, 5, 5),)))
    bad = json.dumps(_columns(**over)).encode()
    with pytest.raises(ValueError):
        decode_record(bad)
    out = rare_rows(_batch(spark, [bad, good]), 60_000)
    assert [(d["source_offset"], d["reason"], d["payload"]) for d in out["deadletters"]] == [
        (0, "bad_columns", bad.decode())
    ]
    assert parse.REASONS["bad_columns"]
    assert [r[2] for r in _observed(spark, [bad, good])] == [0]  # only the good record's observation


def test_a_bad_observation_among_columns_is_its_own_dead_letter(spark) -> None:
    body = _columns(**{"followers.leo": [5, -1], "followers.t_ms": [NOW, NOW]})
    out = rare_rows(_batch(spark, [json.dumps(body).encode()]), 60_000)
    assert [d["reason"] for d in out["deadletters"]] == ["negative_value"]
    payload = json.loads(out["deadletters"][0]["payload"])
    assert payload["broker_id"] == 3 and payload["leo"] == -1 and payload["topic"] == "t"
    assert [r[3] for r in _observed(spark, [json.dumps(body).encode()])] == [2]  # broker 2's stays


@pytest.mark.parametrize("over", [{"followers.p": [0, None]}, {"partitions.topic": [None]}])
def test_a_null_index_leaves_its_observations_without_ids(spark, over) -> None:
    body = json.dumps(_columns(**over)).encode()
    out = rare_rows(_batch(spark, [body]), 60_000)
    lost = 1 if "followers.p" in over else 2
    assert [d["reason"] for d in out["deadletters"]] == ["missing_ids"] * lost
    assert len(_observed(spark, [body])) == 2 - lost


def test_a_version_3_record_keeps_its_isr_changes(spark) -> None:
    change = IsrChange(NOW, "t", 1, (1, 2, 3), (1, 3), leader_id=1)
    record = TelemetryRecord("c", "test", NOW, (), (change,))
    out = rare_rows(_batch(spark, [encode_record(record)]), 60_000)
    assert out["deadletters"] == []
    assert [(c["topic"], c["left"], c["leader_id"]) for c in out["isr_changes"]] == [("t", [2], 1)]


def test_a_caller_naming_one_version_reads_only_that_layout(spark) -> None:
    """``versions``: a stream read once (a benchmark's baseline) reads one layout's branch."""
    o = Observation("t", 0, 2, 1, NOW, 5, 5)
    v1 = encode_record(TelemetryRecord("c", "test", NOW, (o,), version=1))
    v3 = encode_record(TelemetryRecord("c", "test", NOW, (dataclasses.replace(o, partition=1),), version=3))
    records = parse.parse_records(_batch(spark, [v1, v3]))

    def partitions(versions) -> list[int]:
        rows = parse.good_observations(parse.observations(records, 60_000, versions=versions)).collect()
        return sorted(r["partition"] for r in rows)

    assert partitions((1, 2, 3)) == [0, 1]
    assert partitions((1,)) == [0]
    assert partitions((3,)) == [1]
    # every version from COLUMNS_FROM on (version 4: the collector's default) has the columns'
    # layout: bench.naive's and bench.stages' parse read nothing of it when it was taken for
    # the listed one (make bench-quick's naive design, 2026-12-01: 151,362 "observations"/s)
    v4 = encode_record(TelemetryRecord("c", "test", NOW, (dataclasses.replace(o, partition=4),), version=4))
    records = parse.parse_records(_batch(spark, [v1, v3, v4]))
    assert partitions((4,)) == [1, 4]  # (one branch per layout: it reads version 3's too)
    assert partitions(SUPPORTED_VERSIONS) == [0, 1, 4]


# A version-3 record's observations are checked one by one only when the compiled screen over
# whole columns (parse._columns_clean) cannot clear the record: each case below is one record,
# with the dead letters it must give (reason, broker) whichever way it is checked.
LONG = "x" * MAX_TOPIC_CHARS
# past the job's clock (rounded up to the minute) and its tolerance, however long the tests run
FUTURE = NOW + 3_600_000
SCREEN_CASES: dict[str, tuple[dict[str, Any], list[tuple[str, int | None]], bool]] = {
    "clean": ({}, [], True),
    "a topic at the longest a name may be": ({"topics": [LONG]}, [], True),
    "one follower's leader LEO below its previous": (
        {"followers.leader_leo": [6, 4]},
        [("leader_leo_backwards", 3)],
        False,
    ),
    "one follower's previous time after its time": (
        {"followers.prev_t_ms": [NOW - 1000, NOW + 5]},
        [("prev_after_t", 3)],
        False,
    ),
    # the screen's bounds across followers fail, yet each follower is in order: checked, none bad
    "followers polled at different times": (
        {"followers.t_ms": [NOW - 5000, NOW], "followers.prev_t_ms": [NOW - 6000, NOW - 1000]},
        [],
        True,
    ),
    "partitions at different leader LEOs": (
        {"followers.leader_leo": [6, 100], "followers.prev_leader_leo": [5, 50]},
        [],
        True,
    ),
    "a follower without its broker id": ({"followers.broker_id": [2, None]}, [("missing_ids", None)], False),
    "a follower without its time": ({"followers.t_ms": [NOW, None]}, [("missing_ids", 3)], False),
    "a partition without its leader": (
        {"partitions.leader_id": [None]},
        [("missing_ids", 2), ("missing_ids", 3)],
        False,
    ),
    "an empty topic name": ({"topics": [""]}, [("missing_ids", 2), ("missing_ids", 3)], False),
    "a topic name too long": (
        {"topics": [LONG + "x"]},
        [("name_too_long", 2), ("name_too_long", 3)],
        False,
    ),
    "an unreferenced topic too long": ({"topics": ["t", LONG + "x"]}, [], False),
    "a negative LEO": ({"followers.leo": [5, -1]}, [("negative_value", 3)], False),
    "a negative broker id": ({"followers.broker_id": [2, -3]}, [("negative_value", -3)], False),
    "a negative previous time": ({"followers.prev_t_ms": [NOW - 1000, -1]}, [("negative_value", 3)], False),
    "a negative high watermark": ({"partitions.hw": [-1]}, [("negative_value", 2), ("negative_value", 3)], False),
    "a time in the future": ({"followers.t_ms": [NOW, FUTURE]}, [("future_t", 3)], False),
    "previous leader LEO unknown": ({"followers.prev_leader_leo": [None, 5]}, [], True),
}


def test_the_screen_clears_only_records_whose_every_observation_is_good(spark) -> None:
    names = list(SCREEN_CASES)
    values = [json.dumps(_columns(**SCREEN_CASES[n][0])).encode() for n in names]
    out = rare_rows(_batch(spark, values), 60_000)
    got: dict[str, list] = {n: [] for n in names}
    for d in out["deadletters"]:
        got[names[d["source_offset"]]].append((d["reason"], json.loads(d["payload"]).get("broker_id")))
    assert {n: sorted(v, key=str) for n, v in got.items()} == {
        n: sorted(want, key=str) for n, (_, want, _) in SCREEN_CASES.items()
    }
    # and which of them the screen itself clears (the rest were checked observation by observation)
    records = parse.parse_records(_batch(spark, values))
    screen = parse._columns_clean(F.col("rec"), F.lit(int(time.time() * 1000)).cast("long"), 60_000)
    cleared = {names[r[0]]: r[1] for r in records.select("source_offset", screen).collect()}
    assert cleared == {n: clean for n, (_, _, clean) in SCREEN_CASES.items()}


def test_every_observation_reason_has_a_screen_case() -> None:
    """A new reason an observation can be rejected for must get its case above: the screen's
    bounds are written beside ``_observation_reason``, not derived from it."""
    whole = {"bad_isr_change", "bad_broker_counters", "bad_gone"}  # entries of their own, not observations
    observation_reasons = (set(parse.REASONS) - set(parse.RECORD_REASONS) - whole) | {"name_too_long"}
    covered = {reason for _, want, _ in SCREEN_CASES.values() for reason, _ in want}
    assert observation_reasons == covered
