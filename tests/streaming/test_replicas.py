"""streaming.replicas: the rule at every observation, in Spark, across batches,
against the Python reference (isrwatch.episodes.state_changes)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from isrwatch.episodes import state_changes, walk
from isrwatch.rule import Rule, RuleConfig
from isrwatch.status import State, Thresholds
from streaming import evaluate, replicas

from .test_state import OBS_SCHEMA, _rows, fetch_histories

pytestmark = pytest.mark.spark

TH = Thresholds(nearing_ratio=0.5, critical_ratio=0.8, stall_after_ms=3000)


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
        out = replicas.evaluate_batch(batch, carried, cfg, TH).cache()
        got = replicas.for_the_driver(out, frozenset(), 0, 1).toArrow()
        flags = got.select([replicas.CHANGE, replicas.LAST]).to_pylist()
        batch_finals = {}
        for (s, _, n), f in zip(evaluate.statuses_from_arrow(got), flags, strict=True):
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


@pytest.mark.parametrize("rule", [Rule.KIP16_REFINED, Rule.KIP16, Rule.LEGACY_MESSAGES])
@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(history=fetch_histories(gaps=True, unanswered=True), cuts=st.lists(st.integers(0, 40), max_size=3))
def test_changes_at_every_observation_equal_the_reference_however_batched(spark, rule, history, cuts) -> None:
    cfg = RuleConfig(rule, 10_000, lag_max_messages=40)
    rows = _rows(history)
    expected = state_changes([("c", r) for r in rows], cfg, TH, 5_000)
    got, finals = _spark_changes(spark, rows, cfg, 5_000, cuts)
    assert [_sig(s) for s in got] == [_sig(c.status) for c in expected]
    # The newest row of each replica counts every observation of it.
    for broker, fetches in history:
        assert finals[("c", "t", 0, broker)][1] == len(fetches)


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(history=fetch_histories(gaps=True, unanswered=True), cuts=st.lists(st.integers(0, 40), max_size=3))
def test_peak_ratio_and_out_of_sync_episodes_equal_the_reference_however_batched(spark, history, cuts) -> None:
    """Each batch's newest status of a replica carries the largest lag ratio of
    the batch's observations of it and the out-of-sync episodes so far, carried
    from batch to batch (the state table's count)."""
    cfg = RuleConfig(Rule.KIP16_REFINED, 10_000)
    rows = _rows(history)
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
