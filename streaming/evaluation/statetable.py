"""The replica state's versions in the checkpoint: read at the start of a micro-batch, the
next one written at its end (``streaming.evaluation.batch``), before the batch commits.

One Parquet version per micro-batch (``<checkpoint>/replicas/v<batch_id>``, the columns of
``streaming.evaluation.replicas.STATE_COLUMNS``): a batch Spark runs again after a crash reads
the version before it and rewrites its own, so a replay gives the same state.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Collection, Mapping
from typing import TYPE_CHECKING

import pyspark.sql.functions as F
from pyspark.sql import Column

from isrwatch.status import GoneKey
from streaming.evaluation import projection
from streaming.evaluation.replicas import STATE_COLUMNS
from streaming.evaluation.state import KEY_COLUMNS

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["leave_out_gone", "StateTable"]


def leave_out_gone(rows: DataFrame, gone: Collection[GoneKey]) -> DataFrame:
    """``rows`` without the replicas in ``gone`` (cluster, topic, partition, broker_id, t_ms: said
    gone by the collector, elected leader, or late telemetry of a forgotten replica) whose
    newest telemetry (``last_t_ms``) is not after that time."""
    if not gone:
        return rows
    g = rows.sparkSession.createDataFrame(
        sorted(gone), "g_cluster string, g_topic string, g_partition int, g_broker_id int, g_t_ms bigint"
    )
    said = F.col("last_t_ms") <= F.col("g_t_ms")  # not observed after it was said gone
    for c in KEY_COLUMNS:
        said = said & (F.col(c) == F.col(f"g_{c}"))
    return rows.join(F.broadcast(g), said, "left_anti")


_VERSION = re.compile(r"^v(\d+)$")


class StateTable:
    """The state's versions under ``<checkpoint>/replicas``."""

    def __init__(self, spark: SparkSession, checkpoint_dir: str) -> None:
        self.spark = spark
        self.dir = os.path.join(checkpoint_dir, "replicas")

    def versions(self) -> list[int]:
        """Complete versions (Spark's ``_SUCCESS`` marker written), oldest first."""
        try:
            names = os.listdir(self.dir)
        except FileNotFoundError:
            return []
        out = []
        for n in names:
            m = _VERSION.match(n)
            if m and os.path.exists(os.path.join(self.dir, n, "_SUCCESS")):
                out.append(int(m.group(1)))
        return sorted(out)

    def path(self, version: int) -> str:
        return os.path.join(self.dir, f"v{version}")

    def read(self, before: int, like: DataFrame) -> tuple[DataFrame, int | None]:
        """The newest version older than batch ``before``, in the schema of ``like``
        (``observation_rows``; given, not inferred from the files); none: empty, None."""
        older = [v for v in self.versions() if v < before]
        schema = projection.select(like, *STATE_COLUMNS).schema
        if not older:
            return projection.select(like, *STATE_COLUMNS).limit(0), None
        return self.spark.read.schema(schema).parquet(self.path(older[-1])), older[-1]

    def write(
        self,
        state: DataFrame,
        batch_id: int,
        forget_before: Mapping[str, int] | None = None,
        gone: Collection[GoneKey] = (),
    ) -> None:
        """Version ``batch_id``. ``forget_before``: per cluster, replicas whose newest
        telemetry (``last_t_ms``) is older than this are left out (a deleted topic, a
        moved replica: what ``Monitor.forget`` drops), so the table does not keep
        every replica ever seen. ``gone``: replicas the collector said gone and followers
        the driver found elected leader (cluster, topic, partition, broker_id, that t_ms),
        left out unless observed after that time, so a restarted job does not bring them
        back."""
        if forget_before:
            cutoff: Column | None = None  # null for a cluster not in forget_before: kept
            for cluster, ms in sorted(forget_before.items()):
                same = F.col("cluster") == cluster
                cutoff = F.when(same, F.lit(ms)) if cutoff is None else cutoff.when(same, F.lit(ms))
            assert cutoff is not None
            state = state.where(F.col("last_t_ms") >= F.coalesce(cutoff, F.col("last_t_ms")))
        state = leave_out_gone(state, gone)
        projection.select(state, *STATE_COLUMNS).write.mode("overwrite").parquet(self.path(batch_id))

    def prune(self, keep_from: int) -> None:
        """Remove versions older than ``keep_from`` and anything unfinished below it."""
        try:
            names = os.listdir(self.dir)
        except FileNotFoundError:
            return
        for n in names:
            m = _VERSION.match(n)
            if m and int(m.group(1)) < keep_from:
                shutil.rmtree(os.path.join(self.dir, n), ignore_errors=True)

    def committed(self, last_committed: int) -> DataFrame | None:
        """The state as of the last committed batch (what a restarted job resumes from)."""
        done = [v for v in self.versions() if v <= last_committed]
        if not done:
            return None
        state = self.spark.read.parquet(self.path(done[-1]))
        if "out_of_sync_episodes" not in state.columns:  # a version written before the count existed
            state = state.withColumn("out_of_sync_episodes", F.lit(0).cast("long"))
        for name, kind in (("leader_epoch", "int"), ("kafka_version", "string")):  # a version written before them
            if name not in state.select("latest.*").columns:
                state = state.withColumn("latest", F.col("latest").withField(name, F.lit(None).cast(kind)))
        return state.select(*STATE_COLUMNS)
