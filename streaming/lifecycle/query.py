"""The job's streaming query, and its state on restart.

``start_job``: one query over the telemetry source; each micro-batch's raw
records go to the driver's handler, which has Spark parse them once and
evaluate every observation (``streaming.evaluation.batch``). Checkpoint
``<dir>/aggregates`` (offsets, commits) and ``<dir>/replicas`` (the state
table, ``streaming.evaluation.replicas``).

``restore_statuses`` reads the state as of the last committed batch back
when a job restarts, evaluated (``follower_statuses``: a few brokers' followers of it, for
a driver that does not hold ok replicas); a checkpoint of the earlier two-query job
(a RocksDB aggregation, ``streaming.evaluation.state.replica_aggregates``) is migrated
from Spark's state store once.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Collection
from typing import TYPE_CHECKING

import pyspark.sql.functions as F
from pyspark.sql import Window

from isrwatch.logs import kv
from isrwatch.rule import RuleConfig
from isrwatch.status import State, Thresholds
from streaming.driver.rows import Evaluated, statuses_from_arrow
from streaming.evaluation import evaluate, replicas, statetable
from streaming.lifecycle.origin import QUERY_DIR

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import StreamingQuery

__all__ = [
    "start_job",
    "last_committed",
    "restore_state",
    "restore_aggregates",
    "restore_statuses",
    "follower_statuses",
    "AGG_DIR",
    "JOB_QUERY",
]

log = logging.getLogger("streaming.query")

AGG_DIR = QUERY_DIR
JOB_QUERY = "isrwatch"  # the job's one query (its name in Spark's UI, events and logs)

# The state store value of the aggregation, by position (the buffers of
# replica_aggregates' columns, in order; max_by keeps (value, ordering)).
_STATE_VALUE = (
    "struct<first_t_ms:bigint, last_t_ms:bigint, last_caught_up_ms:bigint, last_answer_ms:bigint, "
    "last_leader_answer_ms:bigint, last_progress_ms:bigint, "
    "latest:struct<leader_id:int, leo:bigint, leader_leo:bigint, hw:bigint, isr:array<int>, "
    "replicas:array<int>, lag_time_max_ms:bigint, min_isr:int>, latest_t:bigint, "
    "known_leo:bigint, known_leo_t:bigint, known_leader_leo:bigint, known_leader_leo_t:bigint, "
    "observations:bigint>"
)


def start_job(
    raw: DataFrame, checkpoint_dir: str, trigger_seconds: float, handle: Callable[[DataFrame, int], None]
) -> StreamingQuery:
    """The job's one query: every micro-batch of raw records to ``handle``
    (``streaming.evaluation.batch.evaluate_records`` does the Spark work). Its checkpoint is
    ``<dir>/aggregates``, the directory of the aggregation it replaced, so a job
    upgraded in place continues from its offsets (``restore_state``)."""
    return (
        raw.writeStream.queryName(JOB_QUERY)
        .foreachBatch(handle)
        .option("checkpointLocation", os.path.join(checkpoint_dir, AGG_DIR))
        .trigger(processingTime=f"{trigger_seconds} seconds")
        .start()
    )


def last_committed(checkpoint_dir: str) -> int:
    """The job query's last committed batch id (-1: none)."""
    try:
        names = os.listdir(os.path.join(checkpoint_dir, AGG_DIR, "commits"))
    except FileNotFoundError:
        return -1
    return max((int(n) for n in names if n.isdigit()), default=-1)


def restore_state(spark: SparkSession, checkpoint_dir: str) -> DataFrame | None:
    """The replicas' state as of the last committed batch (None: a new checkpoint).

    A checkpoint written by the aggregation query of earlier versions has no
    state table yet: its state store is read once and written as the table's
    first version."""
    done = last_committed(checkpoint_dir)
    if done < 0:
        return None
    table = statetable.StateTable(spark, checkpoint_dir)
    state = table.committed(done)
    if state is not None:
        return state
    old = _restored(spark, checkpoint_dir)
    if old is None:
        # committed batches and no state of any kind: the state table was removed by hand
        log.warning(
            "state_missing %s",
            kv(checkpoint=checkpoint_dir, batch_id=done, hint="the replicas' state starts empty from the next batch"),
        )
        return None
    table.write(old, done)
    log.info("state_migrated %s", kv(checkpoint=checkpoint_dir, batch_id=done, source="statestore"))
    return table.committed(done)


def restore_aggregates(spark: SparkSession, checkpoint_dir: str) -> list[dict[str, object]]:
    """The replicas' state rows as of the last committed batch (empty when none)."""
    df = restore_state(spark, checkpoint_dir)
    return [] if df is None else df.toArrow().to_pylist()


def restore_statuses(
    spark: SparkSession,
    checkpoint_dir: str,
    cfg: RuleConfig,
    th: Thresholds,
    held: tuple[int, evaluate.Reach | None] | None = None,
) -> list[Evaluated]:
    """The replicas' state as of the last committed batch, evaluated
    (``streaming.evaluation.evaluate``): what ``Monitor.restore`` takes. ``held``
    (``--driver-replicas not-ok``: the default min ISR and the lookahead): only the replicas
    ``evaluate.held`` keeps, and the newest of each cluster (its telemetry clock)."""
    df = restore_state(spark, checkpoint_dir)
    if df is None:
        return []
    statuses = evaluate.status_columns(df, cfg, th)
    if held is not None:
        default_min_isr, lookahead = held
        newest = F.row_number().over(Window.partitionBy("cluster").orderBy(F.col("last_t_ms").desc()))
        statuses = statuses.withColumn("_newest", newest)
        keep = evaluate.held(default_min_isr, lookahead) | (F.col("_newest") == 1)
        statuses = statuses.where(keep).drop("_newest")
    return list(statuses_from_arrow(statuses.toArrow()))


def follower_statuses(
    spark: SparkSession,
    checkpoint_dir: str,
    cfg: RuleConfig,
    th: Thresholds,
    brokers: Collection[tuple[str, int]],
) -> list[Evaluated]:
    """The ok, in-sync followers on ``brokers`` ((cluster, broker id) pairs) as of the last
    committed batch, evaluated as ``restore_statuses`` evaluates them: for a driver that holds
    no ok replica (``--driver-replicas not-ok``) when the job sees one of those brokers silent
    (``streaming.driver.monitor.Monitor.carry_forward``). Read-only: no migration of an old
    checkpoint (a restart did that), nothing when no batch has been committed."""
    done = last_committed(checkpoint_dir)
    if done < 0 or not brokers:
        return []
    state = statetable.StateTable(spark, checkpoint_dir).committed(done)
    if state is None:
        return []
    on = F.lit(False)
    for cluster, broker in sorted(brokers):
        on = on | ((F.col("cluster") == cluster) & (F.col("broker_id") == broker))
    statuses = evaluate.status_columns(state.where(on), cfg, th)
    statuses = statuses.where(F.col("in_isr") & (F.col("lag_state") == State.OK.value))
    return list(statuses_from_arrow(statuses.toArrow()))


def _restored(spark: SparkSession, checkpoint_dir: str) -> DataFrame | None:
    path = os.path.join(checkpoint_dir, AGG_DIR)
    if not os.path.isdir(os.path.join(path, "commits")) or not any(
        not n.startswith(".") for n in os.listdir(os.path.join(path, "commits"))
    ):
        return None
    if not os.path.isdir(os.path.join(path, "state")):  # the one query keeps no Spark state store
        return None
    # The state reader needs the driver's state store coordinator, which the
    # streaming query manager starts: make sure it exists before any query does.
    _ = spark.streams.active
    st = spark.read.format("statestore").load(path)
    value = F.col("value").cast(_STATE_VALUE)
    rows = st.select(
        "key.*",
        value["first_t_ms"].alias("first_t_ms"),
        value["last_t_ms"].alias("last_t_ms"),
        value["last_caught_up_ms"].alias("last_caught_up_ms"),
        value["last_answer_ms"].alias("last_answer_ms"),
        value["last_leader_answer_ms"].alias("last_leader_answer_ms"),
        value["last_progress_ms"].alias("last_progress_ms"),
        # (the leader epoch and the Kafka version came later: not known)
        value["latest"]
        .withField("leader_epoch", F.lit(None).cast("int"))
        .withField("kafka_version", F.lit(None).cast("string"))
        .alias("latest"),
        value["latest_t"].alias("latest_t"),
        value["known_leo"].alias("known_leo"),
        value["known_leo_t"].alias("known_leo_t"),
        value["known_leader_leo"].alias("known_leader_leo"),
        value["known_leader_leo_t"].alias("known_leader_leo_t"),
        value["observations"].alias("observations"),
        F.lit(0).cast("long").alias("out_of_sync_episodes"),  # not counted before the state table
    )
    return rows.select(*replicas.STATE_COLUMNS)
