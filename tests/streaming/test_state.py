"""The Spark aggregation computes what the Python rule computes (property test),
gaps in the evidence included (``isrwatch.rule.observed_caught_up_time``)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from isrwatch.rule import FollowerState, Rule, RuleConfig, caught_up_time, observed_caught_up_time, on_fetch
from isrwatch.telemetry import SPARK_SCHEMA_DDL
from streaming.evaluation import state

pytestmark = pytest.mark.spark

OBS_DDL = SPARK_SCHEMA_DDL.split("observations ARRAY<STRUCT<", 1)[1].split(">>, isr_changes", 1)[0]
# (the rows parse.good_observations gives: cluster, the observation, the record's Kafka version)
OBS_SCHEMA = "cluster STRING, " + OBS_DDL.replace(": ", " ") + ", kafka_version STRING"


@st.composite
def fetch_histories(draw, gaps: bool = False, unanswered: bool = False, leaders: bool = False, epochs: bool = False):
    """Several followers' fetch sequences: times rise, leader LEO never falls,
    the follower's fetch offset never passes the leader LEO it saw. ``gaps``:
    some intervals far longer than the lag window. ``unanswered``: some
    observations without the follower's or the leader's LEO (None). ``leaders``:
    the partition's leader moves between brokers 1 and 9 now and then, the
    follower is sometimes outside the ISR, and some observations come without the
    collector's ``prev_*`` fields (fetches of six fields: t, leo, leader LEO,
    leader, isr, no prev). ``epochs`` (with ``leaders``): a seventh, the leader
    epoch, which a new leader bumps and the same leader sometimes bumps too; some
    followers' histories do not know it (None throughout), some miss it now and then
    (None or -1)."""
    followers = draw(st.integers(1, 3))
    out = []
    for b in range(followers):
        n = draw(st.integers(1, 12))
        known, epoch = draw(st.booleans()), draw(st.integers(0, 3))
        t, leader, leo = 1_000_000, 100, 100
        fetches = []
        for _ in range(n):
            t += draw(st.integers(1, 60_000) if gaps and draw(st.booleans()) else st.integers(1, 4000))
            leader += draw(st.integers(0, 50))
            leo = draw(st.integers(leo, leader))
            seen_leo, seen_leader = leo, leader
            if unanswered and draw(st.integers(0, 4)) == 0:
                seen_leo, seen_leader = draw(st.sampled_from([(None, leader), (leo, None), (None, None)]))
            if leaders:
                moved = draw(st.integers(0, 3)) == 0
                leader_id = draw(st.sampled_from([1, 9])) if moved or not fetches else fetches[-1][3]
                isr = [leader_id, b + 2] if draw(st.integers(0, 5)) else [leader_id]
                forgot = draw(st.integers(0, 4)) == 0  # the collector sends no prev_* fields
                if not epochs:
                    fetches.append((t, seen_leo, seen_leader, leader_id, isr, forgot))
                    continue
                if (fetches and leader_id != fetches[-1][3]) or draw(st.integers(0, 3)) == 0:
                    epoch += 1
                seen_epoch = epoch if known else None
                if known and draw(st.integers(0, 6)) == 0:
                    seen_epoch = draw(st.sampled_from([None, -1]))
                fetches.append((t, seen_leo, seen_leader, leader_id, isr, forgot, seen_epoch))
            else:
                fetches.append((t, seen_leo, seen_leader))
        out.append((b + 2, fetches))
    return out


def _rows(history, partition: int = 0):
    rows = []
    for broker, fetches in history:
        prev = None
        for t, leo, leader, *where in fetches:
            leader_id, isr, forgot, *epoch = where if where else (1, [1, broker], False)
            replicas = [1, 9, broker] if where else [1, broker]
            if forgot:
                prev = None
            rows.append(
                {
                    "cluster": "c",
                    "topic": "t",
                    "partition": partition,
                    "broker_id": broker,
                    "leader_id": leader_id,
                    "t_ms": t,
                    "leo": leo,
                    "leader_leo": leader,
                    "hw": leader,
                    "prev_t_ms": prev[0] if prev else None,
                    "prev_leo": prev[1] if prev else None,
                    "prev_leader_leo": prev[2] if prev else None,
                    "isr": isr,
                    "replicas": replicas,
                    "lag_time_max_ms": 10_000,
                    "min_isr": 1,
                    "leader_epoch": epoch[0] if epoch else None,
                }
            )
            prev = (t, leo, leader)
    return rows


@pytest.mark.parametrize("rule", [Rule.KIP16_REFINED, Rule.KIP16])
@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(histories=st.lists(fetch_histories(), min_size=1, max_size=6))
def test_spark_aggregate_equals_python_fold(spark, rule, histories) -> None:
    """Each replica's Spark aggregate is the pure rule folded over its observations. An example
    holds up to six partitions' histories, all in one Spark job."""
    rows = [row for p, history in enumerate(histories) for row in _rows(history, partition=p)]
    df = spark.createDataFrame(rows, OBS_SCHEMA)
    aggregates = state.replica_aggregates(df, rule).collect()
    got = {(r["partition"], r["broker_id"]): r.asDict(recursive=True) for r in aggregates}
    assert len(got) == len(aggregates) == sum(len(h) for h in histories)
    cfg = RuleConfig(rule=rule, lag_time_max_ms=10_000)
    for p, broker, fetches in [(p, b, f) for p, history in enumerate(histories) for b, f in history]:
        mine = [r for r in rows if (r["partition"], r["broker_id"]) == (p, broker)]
        # The fold of the pure rule over the observations.
        seen = [
            caught_up_time(rule, r["t_ms"], r["leo"], r["leader_leo"], r["prev_t_ms"], r["prev_leader_leo"])
            for r in mine
        ]
        expected_lcu = max((s for s in seen if s is not None), default=None)
        agg = state.row_to_aggregate(got[(p, broker)])
        assert agg.last_caught_up_ms == expected_lcu
        # ...and the broker's own state machine agrees wherever it moved lcu.
        follower = FollowerState.new(0, fetches[0][1])
        for t, leo, leader in fetches:
            follower = on_fetch(follower, cfg, t, leo, leader)
        assert follower.last_caught_up_ms == max(0, expected_lcu or 0)
        assert agg.first_t_ms == fetches[0][0] and agg.last_t_ms == fetches[-1][0]
        assert (agg.leo, agg.leader_leo) == (fetches[-1][1], fetches[-1][2])
        assert agg.known_leo == fetches[-1][1]
        assert got[(p, broker)]["observations"] == len(fetches)


@pytest.mark.parametrize("max_gap_ms", [5_000, None])
@pytest.mark.parametrize("rule", list(Rule))
@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(histories=st.lists(fetch_histories(gaps=True, unanswered=True), min_size=1, max_size=6))
def test_spark_caught_up_time_equals_the_observed_rule_across_gaps(spark, rule, max_gap_ms, histories) -> None:
    """Per observation and folded: ``caught_up_time_expr(rule, max_gap_ms)`` is
    ``observed_caught_up_time``, on observations with gaps and missing answers. An example holds
    up to six partitions' histories, all in one Spark job (eight examples: about as many
    histories as 25 examples of one each, in a third of the Spark jobs)."""
    rows = [row for p, history in enumerate(histories) for row in _rows(history, partition=p)]
    df = spark.createDataFrame(rows, OBS_SCHEMA)
    expected = [
        observed_caught_up_time(
            rule, r["t_ms"], r["leo"], r["leader_leo"], r["prev_t_ms"], r["prev_leader_leo"], max_gap_ms
        )
        for r in rows
    ]
    per_row = df.select(state.caught_up_time_expr(rule, max_gap_ms).alias("cu")).collect()
    assert [r["cu"] for r in per_row] == expected
    aggregates = state.replica_aggregates(df, rule, max_gap_ms=max_gap_ms).collect()
    got = {(r["partition"], r["broker_id"]): r for r in aggregates}
    assert len(got) == len(aggregates) == sum(len(h) for h in histories)
    for p, history in enumerate(histories):
        for broker, _ in history:
            mine = [cu for r, cu in zip(rows, expected, strict=True) if (r["partition"], r["broker_id"]) == (p, broker)]
            assert got[(p, broker)]["last_caught_up_ms"] == max((cu for cu in mine if cu is not None), default=None)


def test_known_offsets_skip_unanswered_observations(spark) -> None:
    rows = _rows([(2, [(1_000_100, 120, 130), (1_000_200, 125, 140)])])
    rows.append({**rows[-1], "t_ms": 1_000_300, "leo": None, "prev_t_ms": 1_000_200})
    df = spark.createDataFrame(rows, OBS_SCHEMA)
    agg = state.row_to_aggregate(state.replica_aggregates(df, Rule.KIP16_REFINED).first().asDict(recursive=True))
    assert agg.leo is None and agg.known_leo == 125
    assert agg.last_answer_ms == 1_000_200 and agg.last_leader_answer_ms == 1_000_300
