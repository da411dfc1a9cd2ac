"""The job's state table (``streaming.evaluation.statetable.StateTable``) leaves out the replicas the
monitor forgets, so it does not keep every replica ever seen (found by reading the code after
the soak: the Parquet versions carried each deleted topic's replicas for ever), and a batch
that evaluates only the replicas it observes writes the same state as one that evaluates all."""

from __future__ import annotations

import pytest

from isrwatch.rule import Rule, RuleConfig
from isrwatch.status import Thresholds
from isrwatch.telemetry import Observation, TelemetryRecord, encode_record
from streaming.evaluation import replicas, statetable
from streaming.evaluation.batch import evaluate_records
from streaming.sinks.statewriter import write_batch_state
from streaming.sources.source_spool import RAW_SCHEMA

from .test_state import OBS_SCHEMA, _rows

pytestmark = pytest.mark.spark

CFG = RuleConfig(Rule.KIP16_REFINED, 10_000)
MINUTE = 60_000


def _batch(spark, table, batch_id, rows, forget_before):
    """One batch as the job runs it: the carried version, the observations, the new version."""
    obs = replicas.observation_rows(spark.createDataFrame(rows, OBS_SCHEMA), CFG, 5_000)
    carried, _ = table.read(batch_id, obs)
    out = replicas.evaluate_batch(obs, carried, CFG, Thresholds(), 5_000)
    table.write(out.where(replicas.LAST), batch_id, forget_before)


def _replicas(spark, table, version):
    return sorted((r.cluster, r.topic, r.broker_id) for r in spark.read.parquet(table.path(version)).collect())


def _observed(cluster, topic, broker, t_ms):
    [row] = _rows([(broker, [(t_ms, 100, 100)])])
    return {**row, "cluster": cluster, "topic": topic}


def test_a_replica_silent_longer_than_the_forget_time_leaves_the_table(spark, tmp_path) -> None:
    table = statetable.StateTable(spark, str(tmp_path))
    t0 = 1_700_000_000_000
    _batch(spark, table, 0, [_observed("a", "deleted", 2, t0), _observed("a", "kept", 2, t0)], {})
    _batch(spark, table, 1, [_observed("b", "other", 2, t0)], {})
    later = t0 + 16 * MINUTE
    # Cluster a's telemetry went on 16 minutes without topic "deleted"; cluster b's did not move.
    cutoffs = {"a": later - 15 * MINUTE, "b": t0 - 15 * MINUTE}
    _batch(spark, table, 2, [_observed("a", "kept", 2, later)], cutoffs)
    assert _replicas(spark, table, 2) == [("a", "kept", 2), ("b", "other", 2)]
    # The control: without cutoffs (a job with no cluster clock yet, after a restart) nothing goes.
    _batch(spark, table, 3, [_observed("a", "deleted", 3, t0)], {})
    _batch(spark, table, 4, [_observed("a", "kept", 2, later + 1000)], {})
    assert ("a", "deleted", 3) in _replicas(spark, table, 4)


def test_a_batch_evaluates_only_the_replicas_it_observes_and_carries_the_others_unchanged(spark, tmp_path) -> None:
    """The job puts only the observed replicas' carried rows through the window
    (``split_carried``; a fleet polled every 5 s at a 1 s trigger observes one in five a
    batch) and writes the others' rows again as they were (``next_state``). The new
    version is the one the whole window gives, for replicas behind, caught up and unseen."""
    t0 = 1_700_000_000_000
    history = [(2, [(t0, 100, 100)]), (3, [(t0, 40, 100)]), (4, [(t0, 100, 100)])]
    first = replicas.observation_rows(spark.createDataFrame(_rows(history), OBS_SCHEMA), CFG, 5_000)
    table = statetable.StateTable(spark, str(tmp_path))
    table.write(
        replicas.evaluate_batch(first, first.limit(0).select(*replicas.STATE_COLUMNS), CFG, Thresholds(), 5_000).where(
            replicas.LAST
        ),
        0,
    )
    # Batch 1 observes broker 3 (still behind) and a replica never seen before; 2 and 4 are silent.
    later = [(3, [(t0 + 6_000, 60, 200)]), (5, [(t0 + 6_000, 200, 200)])]
    obs = replicas.observation_rows(spark.createDataFrame(_rows(later), OBS_SCHEMA), CFG, 5_000)
    carried, _ = table.read(1, obs)
    observed, idle = replicas.split_carried(carried, replicas.observed_keys(obs))
    assert sorted(r.broker_id for r in observed.collect()) == [3]
    assert sorted(r.broker_id for r in idle.collect()) == [2, 4]
    evaluated = replicas.evaluate_batch(obs, observed, CFG, Thresholds(), 5_000, driver_rows_only=True)
    split = replicas.next_state(evaluated, idle)
    whole = replicas.evaluate_batch(obs, carried, CFG, Thresholds(), 5_000).where(replicas.LAST)
    rows = sorted(split.collect(), key=lambda r: r.broker_id)
    assert rows == sorted(whole.select(*replicas.STATE_COLUMNS).collect(), key=lambda r: r.broker_id)
    assert [r.broker_id for r in rows] == [2, 3, 4, 5]
    assert [r.observations for r in rows] == [1, 2, 1, 1]
    before = {r.broker_id: r for r in carried.collect()}
    assert (rows[0], rows[2]) == (before[2], before[4])  # the silent replicas' rows, unchanged


RAW = RAW_SCHEMA  # the source's columns, as the job's own sources give them


def _telemetry(spark, t_ms, followers):
    """One raw batch (the source's columns) of one collector record: ``followers`` is
    [(topic, broker, leo)], the leader at 200 (the collector's own encoding)."""
    observations = tuple(
        Observation(topic, 0, broker, 1, t_ms, leo, 200, 200, t_ms - 5_000, leo, 200, (1, 2, 3), (1, 2, 3), 10_000, 2)
        for topic, broker, leo in followers
    )
    value = encode_record(TelemetryRecord("c", "test", t_ms, observations))
    return spark.createDataFrame([(None, value, "isr.telemetry", 0, t_ms, None)], RAW)


def test_the_job_gives_the_same_rows_and_state_evaluating_only_the_observed_replicas(spark, tmp_path) -> None:
    """``evaluate_records(observed_only=True)``, what the job runs when a batch observes
    few of the replicas it holds, gives the driver the same rows and writes the same state
    as the whole window, batch after batch (two tables, the same telemetry)."""
    t0 = 1_700_000_000_000
    batches = [
        [("a", 2, 200), ("a", 3, 120), ("b", 2, 200), ("b", 3, 200)],
        [("a", 3, 130), ("c", 2, 200)],  # one held replica, still behind, and a new one
        [("b", 2, 200)],
    ]
    tables = {only: statetable.StateTable(spark, str(tmp_path / str(only))) for only in (False, True)}
    for batch_id, followers in enumerate(batches):
        raw = _telemetry(spark, t0 + batch_id * 6_000, followers)
        rows = {}
        for only, table in tables.items():
            out = evaluate_records(
                raw, batch_id, table, CFG, Thresholds(), future_tolerance_ms=None, max_gap_ms=5_000, observed_only=only
            )
            assert out.table is not None
            rows[only] = sorted(map(str, out.table.to_pylist()))
            write_batch_state(out, table, batch_id)
        assert rows[True] == rows[False] and len(rows[True]) == len(followers)
        state = {only: sorted(spark.read.parquet(t.path(batch_id)).collect()) for only, t in tables.items()}
        assert state[True] == state[False]
    assert len(state[True]) == 5


def test_a_replica_said_gone_leaves_the_table_unless_observed_after(spark, tmp_path) -> None:
    """The collector's ``gone`` (a deleted topic): the next version leaves the replica out, so a
    restarted job does not bring it (and its alerts) back; one observed after that time stays
    (a topic created again under the same name)."""
    table = statetable.StateTable(spark, str(tmp_path))
    t0 = 1_700_000_000_000
    rows = [_observed("a", "deleted", 2, t0), _observed("a", "deleted", 3, t0), _observed("a", "kept", 2, t0)]
    _batch(spark, table, 0, rows, {})
    obs = replicas.observation_rows(
        spark.createDataFrame([_observed("a", "kept", 2, t0 + 1000)], OBS_SCHEMA), CFG, 5_000
    )
    carried, _ = table.read(1, obs)
    out = replicas.evaluate_batch(obs, carried, CFG, Thresholds(), 5_000)
    gone = [("a", "deleted", 0, 2, t0 + 500), ("a", "deleted", 0, 3, t0 - 1), ("b", "deleted", 0, 2, t0 + 500)]
    table.write(out.where(replicas.LAST), 1, {}, gone)
    assert _replicas(spark, table, 1) == [("a", "deleted", 3), ("a", "kept", 2)]


def test_a_version_written_before_the_epoch_and_the_kafka_version_reads_them_as_unknown(spark, tmp_path) -> None:
    """A job upgraded over an older checkpoint: its state's ``latest`` lacks the leader epoch
    and the cluster's Kafka version (issue 55); both read as null, and the state goes on."""
    import pyspark.sql.functions as F

    table = statetable.StateTable(spark, str(tmp_path))
    t0 = 1_700_000_000_000
    _batch(spark, table, 0, [_observed("a", "t", 2, t0)], {})
    old = spark.read.parquet(table.path(0))
    old = old.withColumn("latest", F.col("latest").dropFields("leader_epoch", "kafka_version"))
    old.write.mode("overwrite").parquet(str(tmp_path / "older"))
    spark.read.parquet(str(tmp_path / "older")).write.mode("overwrite").parquet(table.path(0))
    state = table.committed(0)
    assert state is not None
    [row] = state.select("latest.leader_epoch", "latest.kafka_version").collect()
    assert (row[0], row[1]) == (None, None)
    _batch(spark, table, 1, [_observed("a", "t", 2, t0 + 1000)], {})  # carried into the next batch
    assert _replicas(spark, table, 1) == [("a", "t", 2)]
