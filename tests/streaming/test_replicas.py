"""streaming.evaluation.replicas: the rule at every observation, in Spark, across batches,
against the Python reference (isrwatch.episodes.state_changes)."""

from __future__ import annotations

import dataclasses

import pyspark.sql.functions as F
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from isrwatch.episodes import state_changes, walk
from isrwatch.rule import Rule, RuleConfig, chosen_rule
from isrwatch.status import State, Thresholds
from streaming.driver.rows import statuses_from_arrow
from streaming.evaluation import replicas

from .test_state import OBS_SCHEMA, _rows, fetch_histories

pytestmark = pytest.mark.spark

TH = Thresholds(nearing_ratio=0.5, critical_ratio=0.8, stall_after_ms=3000)


def _partitions(histories):
    """Each history as one partition's rows (partitions 0, 1, ...): an example of the
    property tests below holds several replicas' histories, each batch one Spark job."""
    return [row for p, history in enumerate(histories) for row in _rows(history, partition=p)]


def _batches(rows, cuts):
    """``rows`` in time order, cut at ``cuts`` (indexes): the non-empty batches."""
    rows = sorted(rows, key=lambda r: r["t_ms"])
    bounds = [0, *sorted(set(cuts)), len(rows)]
    return [rows[lo:hi] for lo, hi in zip(bounds, bounds[1:], strict=False) if lo < hi]


def _spark_changes(spark, rows, cfg, max_gap_ms, cuts, per_batch=None):
    """Feed ``rows`` in batches cut at ``cuts`` (indexes into time order), carrying
    the state from batch to batch as the job does; the changes and final rows.
    ``per_batch``: a list that gets each batch's final statuses, by replica."""
    carried = None
    changes, finals = [], {}
    for batch_rows in _batches(rows, cuts):
        obs = spark.createDataFrame(batch_rows, OBS_SCHEMA)
        batch = replicas.observation_rows(obs, cfg, max_gap_ms)
        if carried is None:
            carried = batch.limit(0)
        out = replicas.evaluate_batch(batch, carried, cfg, TH, max_gap_ms).cache()
        got = replicas.for_the_driver(out, frozenset(), 1).toArrow()
        flags = got.select([replicas.CHANGE, replicas.LAST]).to_pylist()
        batch_finals = {}
        for (s, _, n, _), f in zip(statuses_from_arrow(got), flags, strict=True):
            if f[replicas.CHANGE]:
                changes.append(s)
            if f[replicas.LAST]:
                finals[(s.cluster, s.topic, s.partition, s.broker_id)] = (s, n)
                batch_finals[(s.cluster, s.topic, s.partition, s.broker_id)] = s
        if per_batch is not None:
            per_batch.append(batch_finals)
        state = out.where(replicas.LAST).select(*replicas.STATE_COLUMNS)
        carried = spark.createDataFrame(state.collect(), state.schema)
        out.unpersist()
    changes.sort(key=lambda s: (s.eval_ms, s.cluster, s.topic, s.partition, s.broker_id))
    return changes, finals


def _sig(s):
    return (s.cluster, s.topic, s.partition, s.broker_id, s.eval_ms, s.state, s.lag_state)


# The property tests hold up to three partitions' histories an example, four examples: about
# as many histories as eight examples of one each, in half the Spark jobs (make test's time).
@pytest.mark.parametrize("rule", [Rule.KIP16_REFINED, Rule.KIP16, Rule.LEGACY_MESSAGES])
@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    histories=st.lists(fetch_histories(gaps=True, unanswered=True, leaders=True, epochs=True), min_size=1, max_size=3),
    cuts=st.lists(st.integers(0, 120), max_size=3),
)
def test_changes_at_every_observation_equal_the_reference_however_batched(spark, rule, histories, cuts) -> None:
    cfg = RuleConfig(rule, 10_000, lag_max_messages=40)
    rows = _partitions(histories)
    expected = state_changes([("c", r) for r in rows], cfg, TH, 5_000)
    got, finals = _spark_changes(spark, rows, cfg, 5_000, cuts)
    assert [_sig(s) for s in got] == [_sig(c.status) for c in expected]
    # The newest row of each replica counts every observation of it.
    assert len(finals) == sum(len(history) for history in histories)
    for p, history in enumerate(histories):
        for broker, fetches in history:
            assert finals[("c", "t", p, broker)][1] == len(fetches)


# Clusters at Kafka versions of every variant, one stating none and one stating what is no version.
CLUSTER_VERSIONS = {"v0_10_1": "0.10.1", "v1_1": "1.1", "v3_9": "3.9", "none": None, "odd": "x.y"}


@pytest.mark.parametrize(
    "cfg",
    [RuleConfig(Rule.KIP16_REFINED, 10_000, by_version=True), RuleConfig(Rule.KIP16, 10_000)],
    ids=["auto", "given-kip16"],
)
@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    history=fetch_histories(gaps=True, unanswered=True, leaders=True, epochs=True),
    cuts=st.lists(st.integers(0, 120), max_size=3),
)
def test_each_cluster_gets_its_versions_variant_as_the_reference_does_however_batched(
    spark, cfg, history, cuts
) -> None:
    """Issue 55: under --rule auto the same observations, from clusters at different Kafka
    versions, are judged per cluster with its version's variant, in Spark as in the reference
    (the check period in the shrink window too); a --rule given applies to every cluster."""
    rows = [
        {**r, "cluster": cluster, "kafka_version": version}
        for cluster, version in CLUSTER_VERSIONS.items()
        for r in _rows(history)
    ]
    expected = state_changes([(r["cluster"], r) for r in rows], cfg, TH, 5_000)
    got, finals = _spark_changes(spark, rows, cfg, 5_000, cuts)
    assert [_sig(s) for s in got] == [_sig(c.status) for c in expected]
    walked = {}
    for _, s in walk([(r["cluster"], r) for r in rows], cfg, TH, 5_000):
        walked[(s.cluster, s.topic, s.partition, s.broker_id)] = s
    for key, (s, _) in finals.items():
        # the newest status, the check period's shrink window included (the peak is the batch's)
        assert dataclasses.replace(s, peak_lag_ratio=0.0) == dataclasses.replace(walked[key], peak_lag_ratio=0.0)
        # each cluster alone, under the variant its version gives, says the same
        rule, idle, _ = chosen_rule(cfg, CLUSTER_VERSIONS[key[0]])
        alone = RuleConfig(rule, 10_000, idle_is_caught_up=idle)
        mine = [(r["cluster"], {**r, "kafka_version": None}) for r in rows if r["cluster"] == key[0]]
        assert [_sig(c.status) for c in state_changes(mine, alone, TH, 5_000)] == [
            _sig(c) for c in got if c.cluster == key[0]
        ]


def test_a_follower_one_fetch_behind_is_dropped_by_0_10_1s_rule_and_kept_from_0_10_2(spark) -> None:
    """A follower that always reaches the leader LEO of its previous fetch but never the
    current one: under --rule auto the 0.10.1 cluster pages it (kip16, checked every maxLag),
    the 0.10.2 and 2.1 clusters do not (kip16-refined, checked every maxLag / 2)."""
    cfg = RuleConfig(Rule.KIP16_REFINED, 10_000, by_version=True)
    # a fetch a second, the leader 10 messages ahead, the follower at the leader's previous LEO
    fetches = [(1_000_000 + i * 1_000, 90 + 10 * i, 100 + 10 * i) for i in range(15)]
    rows = [
        {**r, "cluster": cluster, "kafka_version": version}
        for cluster, version in (("old", "0.10.1"), ("mid", "0.10.2"), ("new", "2.1"))
        for r in _rows([(2, fetches)])
    ]
    got, finals = _spark_changes(spark, rows, cfg, 5_000, [])
    paged = {s.cluster for s in got if s.lag_state is not State.OK}
    assert paged == {"old"}
    final = {key[0]: s for key, (s, _) in finals.items()}
    assert final["old"].lag_state is State.OUT_OF_SYNC
    for cluster, period in (("old", 10_000), ("mid", 5_000), ("new", 5_000)):
        s = final[cluster]
        assert s.shrink_window_end_ms - s.shrink_window_start_ms == period, cluster
    assert [_sig(c.status) for c in state_changes([(r["cluster"], r) for r in rows], cfg, TH, 5_000)] == [
        _sig(s) for s in got
    ]


@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    histories=st.lists(fetch_histories(gaps=True, unanswered=True), min_size=1, max_size=3),
    cuts=st.lists(st.integers(0, 120), max_size=3),
)
def test_peak_ratio_and_out_of_sync_episodes_equal_the_reference_however_batched(spark, histories, cuts) -> None:
    """Each batch's newest status of a replica carries the largest lag ratio of
    the batch's observations of it and the out-of-sync episodes so far, carried
    from batch to batch (the state table's count)."""
    cfg = RuleConfig(Rule.KIP16_REFINED, 10_000)
    rows = _partitions(histories)
    # The reference's status right after each observation, and the observation's place in its walk.
    after = {id(o): (i, s) for i, (o, s) in enumerate(walk([("c", r) for r in rows], cfg, TH, 5_000))}
    per_batch = []
    _spark_changes(spark, rows, cfg, 5_000, cuts, per_batch)
    batches = _batches(rows, cuts)
    assert len(per_batch) == len(batches)
    for batch_rows, got in zip(batches, per_batch, strict=True):
        by_replica = {}
        for r in batch_rows:
            by_replica.setdefault(("c", r["topic"], r["partition"], r["broker_id"]), []).append(after[id(r)])
        assert set(got) == set(by_replica)
        for key, walked in by_replica.items():
            newest = max(walked, key=lambda w: w[0])[1]
            assert got[key].peak_lag_ratio == pytest.approx(max(s.lag_ratio for _, s in walked))
            assert got[key].out_of_sync_episodes == newest.out_of_sync_episodes


def test_a_fault_inside_one_batch_is_seen_with_its_times(spark) -> None:
    """A follower stuck for 9 s then caught up: one batch holding all of it
    still gives nearing (at lcu + 5 s), critical (at lcu + 8 s) and ok again."""
    cfg = RuleConfig(Rule.KIP16_REFINED, 10_000)
    fetches = [(1_000_000 + i * 500, 100 if 2 <= i <= 20 else 100 + i, 100 + i) for i in range(24)]
    rows = _rows([(2, fetches)])
    got, finals = _spark_changes(spark, rows, cfg, 5_000, cuts=[])
    states = [(s.eval_ms - 1_000_000, s.lag_state) for s in got]
    assert [st for _, st in states] == [State.NEARING, State.CRITICAL, State.OK]
    lcu = 1_000_500  # the last fetch at the leader LEO (i = 1)
    nearing, critical, back = got
    assert nearing.eval_ms - lcu >= 5_000 and nearing.eval_ms - lcu < 5_500
    assert critical.eval_ms - lcu >= 8_000 and critical.eval_ms - lcu < 8_500
    assert back.eval_ms == 1_000_000 + 21 * 500
    assert finals[("c", "t", 0, 2)][0].state is State.OK


@pytest.mark.parametrize("leader_after", [1, 3], ids=["same-leader-as-before", "another-leader"])
def test_a_broker_that_led_the_partition_is_not_paged_when_it_follows_again(spark, leader_after) -> None:
    """The leader-change defect (tests/e2e/test_leader_changes.py): broker 2 follows
    leader 1, leads the partition itself for 30 s (the collector does not see it as
    a follower then, and forgets it), and follows again a few messages behind (300
    msg/s), its first observation without ``prev_*`` fields. The new leader started
    its clock at the election: no alert, whether its leader is the one before
    (then only the gap against the job's own state shows it) or another, in one
    batch or cut at the change; the Python reference agrees. (Failed before the
    fix: Nearing, Imminent and OutOfSync at once, on the 30-s-old catch-up.)"""
    cfg = RuleConfig(Rule.KIP16_REFINED, 10_000)
    t0 = 1_000_000
    isr = [1, 2, 3]
    before = [(t0 + i * 1000, 100 + 300 * i, 100 + 300 * i, 1, isr, False) for i in range(5)]
    again = [(t0 + 35_000 + i * 1000, 10_000 + 300 * i, 10_004 + 300 * i, leader_after, isr, i == 0) for i in range(3)]
    caught = [(t0 + 38_000, 11_000, 11_000, leader_after, isr, False)]
    rows = _rows([(2, before + again + caught)])
    assert rows[5]["prev_t_ms"] is None and rows[6]["prev_t_ms"] == t0 + 35_000
    for cuts in ([], [5]):
        got, finals = _spark_changes(spark, rows, cfg, 5_000, cuts)
        assert got == [], [(s.eval_ms, s.lag_state) for s in got]
        assert finals[("c", "t", 0, 2)][0].state is State.OK
    assert state_changes([("c", r) for r in rows], cfg, TH, 5_000) == []


def _assert_reset_at_the_previous_observation(spark, rows, cfg, t0) -> None:
    """Broker 2, stuck since ``t0`` and observed every second, Nearing then Critical, is
    caught up again by its observation at t0 + 9 s, no later than the one before it
    (t0 + 8 s): in Spark however batched, as in the reference."""
    expected = state_changes([("c", r) for r in rows], cfg, TH, 5_000)
    for cuts in ([], [9]):
        got, finals = _spark_changes(spark, rows, cfg, 5_000, cuts)
        assert [(s.eval_ms - t0, s.lag_state) for s in got] == [
            (5_000, State.NEARING),
            (8_000, State.CRITICAL),
            (9_000, State.OK),
        ]
        assert [_sig(s) for s in got] == [_sig(c.status) for c in expected]
        final = finals[("c", "t", 0, 2)][0]
        assert final.shrink_window_start_ms - final.lag_time_max_ms == t0 + 8_000


def test_a_follower_under_a_new_leader_is_caught_up_no_later_than_its_previous_observation(spark) -> None:
    """Broker 2 follows leader 1 without catching up (Nearing, then Critical); the
    leader moves to broker 9 between two observations 1 s apart: the new leader's
    clock starts after the previous observation, so the follower's catch-up is
    taken at that observation's time (the sound bound), not the new one's. A
    follower outside the ISR gets nothing from the change (newer brokers give it
    no clock)."""
    cfg = RuleConfig(Rule.KIP16_REFINED, 10_000)
    t0 = 1_000_000
    stuck = [(t0 + i * 1000, 100, 100 + 10 * i, 1, [1, 2], False) for i in range(9)]  # caught up at t0 only
    moved = [(t0 + 9_000, 100, 190, 9, [9, 2], False), (t0 + 9_500, 100, 200, 9, [9, 2], False)]
    rows = _rows([(2, stuck + moved)])
    _assert_reset_at_the_previous_observation(spark, rows, cfg, t0)
    left_out = _rows([(2, stuck + [(t, leo, lleo, 9, [9], False) for t, leo, lleo, *_ in moved])])
    _, finals = _spark_changes(spark, left_out, cfg, 5_000, [])
    final = finals[("c", "t", 0, 2)][0]
    assert final.shrink_window_start_ms - final.lag_time_max_ms == t0


def test_a_newer_leader_epoch_under_the_same_leader_resets_like_a_new_leader_and_an_unknown_one_does_not(
    spark,
) -> None:
    """Broker 2 follows leader 1 without catching up; between two observations 1 s apart
    the leader stays but its epoch goes from 4 to 5 (an ISR change in KRaft before
    metadata.version 3.6-IV0): ``Partition.makeLeader`` started the follower's clock
    afresh, so it is caught up no later than the previous observation, as under a new
    leader. The same history without epochs (Kafka before 2.1, or -1) or with the epoch
    unchanged gives no reset (the follower goes on to OutOfSync); outside the ISR, none."""
    cfg = RuleConfig(Rule.KIP16_REFINED, 10_000)
    t0 = 1_000_000
    stuck = [(t0 + i * 1000, 100, 100 + 10 * i, 1, [1, 2], False) for i in range(9)]
    later = [(t0 + i * 1000, 100, 100 + 10 * i, 1, [1, 2], False) for i in range(9, 12)]

    def with_epochs(fetches, bump_at, before=4, after=5):
        return [(*f, before if f[0] < t0 + bump_at else after) for f in fetches]

    rows = _rows([(2, with_epochs(stuck + later, 9_000))])
    _assert_reset_at_the_previous_observation(spark, rows, cfg, t0)
    no_reset = {
        "unknown": _rows([(2, stuck + later)]),
        "-1 after": _rows([(2, with_epochs(stuck + later, 9_000, 4, -1))]),
        "-1 before": _rows([(2, with_epochs(stuck + later, 9_000, -1, 5))]),
        "same epoch": _rows([(2, with_epochs(stuck + later, 9_000, 4, 4))]),
        "older epoch": _rows([(2, with_epochs(stuck + later, 9_000, 5, 4))]),
        "out of the isr": _rows(
            [(2, with_epochs(stuck + [(t, leo, lleo, 1, [1], f) for t, leo, lleo, _, _, f in later], 9_000))]
        ),
    }
    for name, rows in no_reset.items():
        expected = state_changes([("c", r) for r in rows], cfg, TH, 5_000)
        got, finals = _spark_changes(spark, rows, cfg, 5_000, [9])
        assert [_sig(s) for s in got] == [_sig(c.status) for c in expected], name
        assert State.OUT_OF_SYNC in [s.lag_state for s in got], name
        final = finals[("c", "t", 0, 2)][0]
        assert final.shrink_window_start_ms - final.lag_time_max_ms == t0, name


@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    histories=st.lists(fetch_histories(gaps=True, unanswered=True, leaders=True, epochs=True), min_size=1, max_size=3),
    cuts=st.lists(st.integers(0, 120), max_size=3),
)
def test_the_jobs_rows_only_equal_every_row_filtered_to_the_jobs_rows(spark, histories, cuts) -> None:
    """``driver_rows_only`` (the job's path: the episodes counted and the full status
    computed after the filter) gives exactly the rows, every column, of the whole
    evaluation (replay's path) filtered to the changes and newest rows."""
    cfg = RuleConfig(Rule.KIP16_REFINED, 10_000)
    carried = None
    for batch_rows in _batches(_partitions(histories), cuts):
        batch = replicas.observation_rows(spark.createDataFrame(batch_rows, OBS_SCHEMA), cfg, 5_000)
        if carried is None:
            carried = batch.select(*replicas.STATE_COLUMNS).limit(0)
        every = replicas.evaluate_batch(batch, carried, cfg, TH, 5_000)
        only = replicas.evaluate_batch(batch, carried, cfg, TH, 5_000, driver_rows_only=True)
        assert only.columns == every.columns
        wanted = every.where(F.col(replicas.CHANGE) | F.col(replicas.LAST)).collect()
        got = only.collect()
        assert got, "every replica has a newest row"
        assert sorted(got, key=repr) == sorted(wanted, key=repr)
        state = only.where(replicas.LAST).select(*replicas.STATE_COLUMNS)
        carried = spark.createDataFrame(state.collect(), state.schema)


def test_each_driver_row_carries_the_time_of_its_replicas_observation_before(spark) -> None:
    """``evaluate.PREV_OBSERVED`` on each replica's newest row: none for its first observation
    ever, the carried state's newest for a batch of one, the one before for a batch of several,
    however the rounds are cut, and for every replica of the batch apart."""
    cfg = RuleConfig(Rule.KIP16_REFINED, 10_000)
    t0 = 1_000_000
    times = [t0 + i * 3_500 for i in range(6)]
    rows = _rows([(2, [(t, 100, 100) for t in times]), (3, [(t + 7, 100, 100) for t in times])])
    carried = None
    got = []
    for batch in _batches(rows, cuts=[2, 4, 10]):  # rounds 0 | 1 | 2, 3, 4 | 5
        obs = replicas.observation_rows(spark.createDataFrame(batch, OBS_SCHEMA), cfg, 5_000)
        carried = obs.limit(0) if carried is None else carried
        out = replicas.evaluate_batch(obs, carried, cfg, TH, 5_000).cache()
        finals = replicas.for_the_driver(out, frozenset(), 1).where(F.col(replicas.LAST)).toArrow()
        got.append(sorted((s.broker_id, s.eval_ms, prev) for s, _, _, prev in statuses_from_arrow(finals)))
        state = out.where(replicas.LAST).select(*replicas.STATE_COLUMNS)
        carried = spark.createDataFrame(state.collect(), state.schema)
        out.unpersist()
    newest = [0, 1, 4, 5]  # each batch's newest round
    before = [None, 0, 3, 4]  # and the round before it
    assert got == [
        [(2, times[n], None if p is None else times[p]), (3, times[n] + 7, None if p is None else times[p] + 7)]
        for n, p in zip(newest, before, strict=True)
    ]
