"""The job's state table (``streaming.evaluation.statetable.StateTable``) leaves out the replicas the
monitor forgets, so it does not keep every replica ever seen (found by reading the code after
the soak: the Parquet versions carried each deleted topic's replicas for ever), and a batch
that evaluates only the replicas it observes gives the same rows and the same state as one that
evaluates all, while writing only those replicas' rows (a delta, issue 53's item 3)."""

from __future__ import annotations

import os
import threading
import time

import pytest

from isrwatch.rule import Rule, RuleConfig
from isrwatch.spool import SpoolWriter
from isrwatch.status import Thresholds
from isrwatch.telemetry import Observation, TelemetryRecord, encode_record
from simulator.run import now_ms
from streaming.evaluation import replicas, statetable
from streaming.evaluation.batch import evaluate_records
from streaming.lifecycle.job import Job
from streaming.lifecycle.query import restore_aggregates
from streaming.settings import JobSettings
from streaming.sinks.statewriter import write_batch_state
from streaming.sources.source_spool import RAW_SCHEMA

from .test_state import OBS_SCHEMA, _rows

pytestmark = pytest.mark.spark

CFG = RuleConfig(Rule.KIP16_REFINED, 10_000)
MINUTE = 60_000


def _batch(spark, table, batch_id, rows, forget_before):
    """One batch as the job runs it: the carried version, the observations, the new version."""
    obs = replicas.observation_rows(spark.createDataFrame(rows, OBS_SCHEMA), CFG, 5_000)
    carried = table.read(batch_id, obs).rows
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
    carried = table.read(1, obs).rows
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


def _record(t_ms, followers, cluster="c"):
    """A collector record (its own encoding) of ``followers``, [(topic, broker, leo)], the
    leader at 200."""
    observations = tuple(
        Observation(topic, 0, broker, 1, t_ms, leo, 200, 200, t_ms - 5_000, leo, 200, (1, 2, 3), (1, 2, 3), 10_000, 2)
        for topic, broker, leo in followers
    )
    return encode_record(TelemetryRecord(cluster, "test", t_ms, observations))


def _telemetry(spark, t_ms, followers):
    """One raw batch (the source's columns) of one collector record (``_record``)."""
    return spark.createDataFrame([(None, _record(t_ms, followers), "isr.telemetry", 0, t_ms, None)], RAW)


def _state(table, batch_id):
    """The state as of ``batch_id`` as a restarted job reads it: its full version, or the one
    before it with the deltas since."""
    state = table.committed(batch_id)
    return sorted(state.collect()) if state is not None else []


def test_a_batch_observing_few_replicas_writes_only_their_rows_and_the_state_stays_the_same(
    spark, tmp_path, monkeypatch
) -> None:
    """Issue 53's item 3: a batch that evaluates only its observed replicas writes only their
    rows (a delta), and a full version at least every ``FULL_EVERY`` batches. The driver's rows
    are the whole window's, and so is the state read back (the full version, the deltas' newest
    rows, less the replicas the deltas left out: said gone, past the forget cutoff), batch after
    batch (two tables, the same telemetry). The last batch run again after a crash as a full
    one (a restarted job's first) gives the same state."""
    monkeypatch.setattr(statetable, "FULL_EVERY", 3)  # the merge of deltas into a full version, in a few batches
    t0 = 1_700_000_000_000
    everyone = [("a", 2, 200), ("a", 3, 120), ("b", 2, 200), ("b", 3, 200), ("d", 2, 200), ("e", 2, 200)]
    batches = [
        everyone,
        [("a", 3, 130), ("f", 2, 200)],  # one held replica, still behind, and a new one
        [("b", 2, 200), ("a", 2, 200)],  # then topic d said gone
        [("a", 3, 180), ("b", 3, 200)],
        [("a", 3, 200), ("d", 2, 200)],  # d created again (observed after it was said gone); e past the cutoff
    ]
    removals = {2: ([("c", "d", 0, 2, t0 + 2 * 6_000)], {}), 4: ([], {"c": t0 + 1})}
    tables = {only: statetable.StateTable(spark, str(tmp_path / str(only))) for only in (False, True)}

    def run(only, table, batch_id, followers):
        raw = _telemetry(spark, t0 + batch_id * 6_000, followers)
        out = evaluate_records(
            raw, batch_id, table, CFG, Thresholds(), future_tolerance_ms=None, max_gap_ms=5_000, observed_only=only
        )
        assert out.table is not None
        gone, cutoffs = removals.get(batch_id, ([], {}))
        out.gone.extend(gone)
        write_batch_state(out, table, batch_id, forget_before=cutoffs)
        return sorted(map(str, out.table.to_pylist()))

    kinds = []
    for batch_id, followers in enumerate(batches):
        rows = {only: run(only, t, batch_id, followers) for only, t in tables.items()}
        assert rows[True] == rows[False]
        assert _state(tables[True], batch_id) == _state(tables[False], batch_id), f"batch {batch_id}"
        delta = os.path.exists(os.path.join(tables[True].path(batch_id, delta=True), "_SUCCESS"))
        kinds.append("d" if delta else "v")
        if delta:  # only the batch's observed replicas' rows
            assert spark.read.parquet(tables[True].path(batch_id, delta=True)).count() == len(followers)
    assert kinds == ["v", "d", "d", "v", "d"]
    assert not any(os.path.exists(tables[False].path(b, delta=True)) for b in range(len(batches)))
    final = [(r.topic, r.broker_id) for r in _state(tables[True], len(batches) - 1)]
    assert sorted(final) == [("a", 2), ("a", 3), ("b", 2), ("b", 3), ("d", 2), ("f", 2)]  # e forgotten, d back
    # The last batch, a delta, run again as a full one (a restarted job's first): its delta goes.
    last = len(batches) - 1
    run(False, tables[True], last, batches[last])  # (its gone and cutoffs as before)
    assert not os.path.exists(tables[True].path(last, delta=True))
    assert _state(tables[True], last) == _state(tables[False], last)


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
    carried = table.read(1, obs).rows
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


def test_the_job_polling_few_replicas_a_batch_writes_deltas_and_a_restart_resumes_the_same(spark, tmp_path) -> None:
    """The job on real Spark and a spool, at a fleet's shape in small: one round of 20
    replicas, then batches that each observe two of them. After the second such batch the
    job puts only the observed replicas through the window and writes deltas; stopped and
    started again on its checkpoint, it resumes every replica with the observations and the
    telemetry time it had, and the same statuses."""
    everyone = [(f"t{i}", b) for i in range(10) for b in (2, 3)]
    t0 = now_ms() - 60_000
    spool, checkpoint = str(tmp_path / "spool"), str(tmp_path / "ck")
    writer = SpoolWriter(spool)
    writer.append([_record(t0, [(t, b, 200) for t, b in everyone], "fleet")])
    expected = {(topic, broker): (1, t0) for topic, broker in everyone}
    settings = JobSettings(spool_dir=spool, checkpoint_dir=checkpoint, metrics_port=0, trigger_seconds=0.5)

    def batches_done(job, n):
        deadline = time.monotonic() + 120
        while job.events.batches < n and time.monotonic() < deadline:
            time.sleep(0.1)
        assert job.events.batches >= n, f"{job.events.batches} batches of {n} in 120 s"

    stop = threading.Event()
    with Job(settings, spark=spark, stop_event=stop) as first:
        first.start()
        batches_done(first, 1)
        for k in range(1, 7):
            t = t0 + k * 1_000
            observed = everyone[2 * k : 2 * k + 2]
            writer.append([_record(t, [(topic, b, 200) for topic, b in observed], "fleet")])
            for key in observed:
                expected[key] = (expected[key][0] + 1, t)
            batches_done(first, k + 1)
        stop.set()
        first.await_stop()
        statuses = dict(first.monitor.statuses)
    table = statetable.StateTable(spark, checkpoint)
    deltas = [n for n in os.listdir(table.dir) if n.startswith("d") and not n.endswith(".json")]
    assert deltas, f"the job wrote no delta: {sorted(os.listdir(table.dir))}"
    state = {
        (r["topic"], r["broker_id"]): (r["observations"], r["last_t_ms"]) for r in restore_aggregates(spark, checkpoint)
    }
    assert state == expected

    again = threading.Event()
    with Job(settings, spark=spark, stop_event=again) as second:
        second.start()
        assert second.monitor.statuses == statuses
        again.set()
        second.await_stop()
