"""streaming.evaluation.evaluate (Spark expressions) against isrwatch.status.evaluate (the reference)."""

from __future__ import annotations

import random
from dataclasses import asdict

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from isrwatch.rule import Rule, RuleConfig
from isrwatch.status import ReplicaAggregate, State, Thresholds, evaluate
from streaming.driver.rows import statuses_from_arrow
from streaming.evaluation.evaluate import status_columns
from streaming.evaluation.state import LATEST_COLUMNS

AGG_SCHEMA = (
    "cluster string, topic string, partition int, broker_id int, first_t_ms bigint, last_t_ms bigint, "
    "last_caught_up_ms bigint, last_answer_ms bigint, last_leader_answer_ms bigint, last_progress_ms bigint, "
    "latest struct<leader_id:int, leo:bigint, leader_leo:bigint, hw:bigint, isr:array<int>, "
    "replicas:array<int>, lag_time_max_ms:bigint, min_isr:int, leader_epoch:int, kafka_version:string>, "
    "known_leo bigint, known_leader_leo bigint, observations bigint"
)

CONFIGS = [
    RuleConfig(Rule.KIP16_REFINED, 10_000),
    RuleConfig(Rule.KIP16_REFINED, 7_001, idle_is_caught_up=False),
    RuleConfig(Rule.KIP16, 10_000),
    RuleConfig(Rule.LEGACY_MESSAGES, 10_000, lag_max_messages=40),
    # --rule auto: each replica's variant from the Kafka version of its row (the default where unknown)
    RuleConfig(Rule.KIP16_REFINED, 10_000, by_version=True),
    RuleConfig(Rule.KIP16, 7_001, idle_is_caught_up=False, by_version=True),
]
# Versions of every variant, unknown ones and text that is no version (as a record may state it).
KAFKA_VERSIONS = [None, "0.9", "0.10.1", "0.10.2", "1.1", "2.0.1", "2.1", "4.0", "0.8.2", "10.0", "x", "2.1.0\n", ""]
THRESHOLDS = Thresholds(nearing_ratio=0.5, critical_ratio=0.8, stall_after_ms=3000)


def random_aggregate(rng: random.Random, i: int) -> ReplicaAggregate:
    """A row the aggregation can produce: times ordered as the max/min aggregates order them.

    Times are mostly on a 500 ms grid so differences land exactly on the
    thresholds (stall after 3 s, ratios 0.5 / 0.8 / 1.0 of 10 s).
    """
    step = rng.choice([500, 500, 1])
    first = rng.randint(0, 200) * step
    last = first + rng.choice([0, rng.randint(0, 120) * step])

    def t_or_none(lo: int, hi: int) -> int | None:
        return None if rng.random() < 0.2 else lo + rng.randint(0, (hi - lo) // step) * step

    leader_leo = None if rng.random() < 0.15 else rng.randint(0, 500)
    leo = None if rng.random() < 0.2 else rng.randint(0, 600)
    isr = rng.choice([(), (1,), (1, 2), (1, 2, 3), (1, 3)])
    return ReplicaAggregate(
        cluster=rng.choice(["a", "b"]),
        topic="t",
        partition=i,
        broker_id=rng.choice([2, 3]),
        first_t_ms=first,
        last_t_ms=last,
        last_caught_up_ms=t_or_none(max(0, first - 5_000), last),
        last_answer_ms=t_or_none(first, last),
        last_leader_answer_ms=t_or_none(first, last),
        last_progress_ms=t_or_none(first, last),
        leader_id=rng.choice([1, 2]),
        leo=leo,
        leader_leo=leader_leo,
        hw=None if leo is None else min(leo, leader_leo or 0),
        isr=isr,
        replicas=(1, 2, 3),
        lag_time_max_ms=rng.choice([None, 0, 10_000, 3_000, 30_000]),
        min_isr=rng.choice([None, 1, 2]),
        known_leo=rng.choice([None, leo, rng.randint(0, 600)]),
        known_leader_leo=rng.choice([None, leader_leo, rng.randint(0, 600)]),
        leader_epoch=rng.choice([None, 0, 7]),
        kafka_version=rng.choice(KAFKA_VERSIONS),
    )


def _row(a: ReplicaAggregate) -> dict:
    d = asdict(a)
    latest = {k: d.pop(k) for k in LATEST_COLUMNS}
    latest["isr"], latest["replicas"] = list(latest["isr"]), list(latest["replicas"])
    return {**d, "latest": latest, "observations": 7}


def _check(spark, aggs: list[ReplicaAggregate], cfg: RuleConfig) -> None:
    df = spark.createDataFrame([_row(a) for a in aggs], AGG_SCHEMA)
    got = list(statuses_from_arrow(status_columns(df, cfg, THRESHOLDS).toArrow()))
    assert len(got) == len(aggs)
    by_key = {(s.cluster, s.partition): (s, last_t, n) for s, last_t, n, _ in got}
    for a in aggs:
        status, last_t, n = by_key[(a.cluster, a.partition)]
        # Any cluster clock at or past the replica's newest telemetry gives the same status.
        expected = evaluate(a, a.last_t_ms + 12_345, cfg, THRESHOLDS)
        assert status == expected, (a, cfg)
        assert (last_t, n) == (a.last_t_ms, 7)


@pytest.mark.parametrize(
    "cfg", CONFIGS, ids=lambda c: f"{c.rule.value}-{c.lag_time_max_ms}-{c.idle_is_caught_up}-{c.by_version}"
)
def test_spark_status_equals_python_evaluate_on_random_aggregates(spark, cfg) -> None:
    rng = random.Random(hash(cfg) & 0xFFFF)
    aggs = [random_aggregate(rng, i) for i in range(3000)]
    _check(spark, aggs, cfg)
    states = {evaluate(a, a.last_t_ms, cfg, THRESHOLDS).state for a in aggs}
    assert states == set(State), "the sample must reach every state"


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**32 - 1), size=st.integers(1, 40), which=st.sampled_from(CONFIGS))
def test_spark_status_equals_python_evaluate_property(spark, seed, size, which) -> None:
    rng = random.Random(seed)
    _check(spark, [random_aggregate(rng, i) for i in range(size)], which)


def _statuses(spark, rows: list[tuple]):
    """(cluster, partition, state, last_t_ms[, observations, in the batch]) -> a frame shaped
    like evaluate_batch's newest rows (status_columns' output; one observation by default)."""
    from isrwatch.status import ReplicaStatus
    from streaming.evaluation.evaluate import EXTRA_COLUMNS, IN_BATCH, PREV_OBSERVED, STATUS_COLUMNS

    out = []
    for cluster, partition, state, last_t, *counts in rows:
        total, in_batch = counts or (1, 1)
        s = ReplicaStatus(cluster, "t", partition, 2, 1, last_t, State(state), 0.0, 0.0, 10.0, 0, True, 3, 2,
                          10_000, last_t + 10_000, last_t + 15_000)  # fmt: skip
        d = asdict(s)
        d["state"], d["lag_state"] = s.state.value, s.lag_state.value
        out.append({**d, "last_t_ms": last_t, "observations": total, PREV_OBSERVED: last_t - 1_000, IN_BATCH: in_batch})
    schema = spark.createDataFrame(out[:1]).schema
    return spark.createDataFrame(out, schema).select(*STATUS_COLUMNS, *EXTRA_COLUMNS, IN_BATCH)


def test_only_rows_the_driver_needs_pass_when_ok_replicas_refresh_slowly(spark) -> None:
    from streaming.evaluation.evaluate import for_the_driver

    always = {("a", 500), ("a", 3), ("a", 199), ("b", 0)}  # not ok, held not ok, each cluster's newest
    not_ok = {"a/t/3/2"}  # the driver holds this one as not ok: its return to ok must pass
    first = [("a", p, "ok", 1000 + p) for p in range(200)] + [("a", 500, "nearing", 900), ("b", 0, "ok", 50)]
    assert for_the_driver(_statuses(spark, first), set(), 1).count() == len(first)  # 1: everything, every batch
    # Its first observation ever brings every replica to the driver.
    assert {(r["cluster"], r["partition"]) for r in for_the_driver(_statuses(spark, first), set(), 10).collect()} == {
        (c, p) for c, p, *_ in first
    }
    # Then, each observed once a batch (its 2nd to 11th observations): each ok one once in 10 batches.
    seen: dict[int, set[tuple[str, int]]] = {}
    for batch in range(1, 11):
        rows = [(c, p, state, t + batch * 1000, batch + 1, 1) for c, p, state, t in first]
        kept = {(r["cluster"], r["partition"]) for r in for_the_driver(_statuses(spark, rows), not_ok, 10).collect()}
        assert always <= kept
        seen[batch] = kept
    everyone = {(c, p) for c, p, *_ in first}
    assert set().union(*seen.values()) == everyone  # every ok replica refreshed once in 10 batches
    ok_refreshes = [len(k - always) for k in seen.values()]
    assert sum(ok_refreshes) == len(everyone) - len(always)  # ...and only once
    assert max(ok_refreshes) < 60  # spread over the batches, not all at once


def test_a_replica_observed_in_some_batches_only_is_still_refreshed(spark) -> None:
    """A fleet polled every 5 s at a 1 s trigger: each replica is in one batch of 5. Refreshed
    every 5 batches by batch number, a replica whose turn falls in a batch it is not in would
    never reach the driver; counted in its own observations, each one does, every 5th."""
    from streaming.evaluation.evaluate import for_the_driver

    fleet, every, n = 100, 5, 5
    refreshed: dict[int, list[int]] = {p: [] for p in range(fleet)}  # partition -> its observations refreshed
    for batch in range(every * (1 + n)):  # each replica's observations 1 to 6
        rows = []
        for p in range(fleet):
            if p % every == batch % every:
                rows.append(("a", p, "ok", 1000 * batch + p, batch // every + 1, 1))
        rows.append(("a", 10_000, "ok", 10**9, batch + 1, 1))  # the cluster's newest, always kept: not counted
        for r in for_the_driver(_statuses(spark, rows), set(), n).collect():
            if r["partition"] < fleet:
                refreshed[r["partition"]].append(r["observations"])
    for p, counts in refreshed.items():
        assert counts[0] == 1, (p, counts)  # its first observation
        assert len([c for c in counts if c > 1]) == 1, (p, counts)  # and once in each n after it


def test_one_row_carries_a_clusters_clock_when_a_round_shares_its_time(spark) -> None:
    """A collector stamps a round's observations with one time: of a cluster's ok rows not due
    for a refresh, one row (not the whole round) goes to carry the cluster's clock."""
    from streaming.evaluation.evaluate import for_the_driver

    rows = [("a", p, "ok", 5000, 5, 1) for p in range(50)] + [("b", p, "ok", 7000, 5, 1) for p in range(30)]
    kept = for_the_driver(_statuses(spark, rows), set(), 10**6).collect()
    assert sorted(r["cluster"] for r in kept) == ["a", "b"]
    assert {r["last_t_ms"] for r in kept} == {5000, 7000}


@pytest.mark.parametrize("inline", [0, 10_000], ids=["broadcast-table", "literal-set"])
def test_a_rows_replica_is_flagged_the_same_from_a_literal_set_or_a_table(spark, inline: int) -> None:
    """``with_key_flag`` past its literal-set size joins a broadcast table of the keys (an
    incident's thousands of held replicas): the same flags as the literal set, no row
    repeated or lost, keys of replicas not in the batch ignored."""
    from streaming.evaluation.evaluate import with_key_flag

    rows = [("a", p, "ok", 1000 + p) for p in range(40)] + [("b", p, "ok", 2000 + p) for p in range(40)]
    keys = {f"a/t/{p}/2" for p in range(0, 40, 3)} | {"b/t/7/2", "b/t/99/2", "c/t/1/2", "a/t/1/3"}
    flagged = with_key_flag(_statuses(spark, rows), keys, "_k", inline=inline).collect()
    assert len(flagged) == len(rows)
    assert {(r["cluster"], r["partition"]) for r in flagged if r["_k"]} == {("a", p) for p in range(0, 40, 3)} | {
        ("b", 7)
    }
    assert all(r["_k"] is not None for r in flagged)  # false, never null, for the others
    assert with_key_flag(_statuses(spark, rows), set(), "_k", inline=inline).where("_k").count() == 0


def test_watched_replicas_past_the_literal_set_size_still_reach_the_driver(spark, monkeypatch) -> None:
    """``for_the_driver`` with more watched replicas than ``KEYS_INLINE`` (the broadcast table):
    each watched replica's return to ok passes, as with a few."""
    from streaming.evaluation import evaluate

    monkeypatch.setattr(evaluate, "KEYS_INLINE", 2)
    rows = [("a", p, "ok", 1000 + p, 7, 1) for p in range(30)]
    watched = {f"a/t/{p}/2" for p in (4, 9, 15, 21)}
    kept = {r["partition"] for r in evaluate.for_the_driver(_statuses(spark, rows), watched, 10**6).collect()}
    assert {4, 9, 15, 21} <= kept
    assert len(kept) <= 4 + 1  # and the cluster's newest row: no ok replica that is not due
