"""The replica state's versions in the checkpoint: read at the start of a micro-batch, the
next one written at its end (``streaming.evaluation.batch``), before the batch commits.

Two kinds of version under ``<checkpoint>/replicas``, each one Parquet directory per
micro-batch (the columns of ``streaming.evaluation.replicas.STATE_COLUMNS``):

* ``v<batch_id>``, a *full* version: every replica's row;
* ``d<batch_id>``, a *delta*: only the rows of the replicas the batch observed, with what the
  batch left out of the state beside it (``d<batch_id>.removed.json``: the forget cutoffs and
  the replicas said gone or elected leader, ``StateTable.write``).

A batch that observes only some of the replicas held (``replicas.split_carried``: a fleet
polled every few triggers) writes a delta; a full version is written when the batch puts
every replica through the window, and at least every ``FULL_EVERY`` batches (the deltas
since the last full one merged in). So an idle replica is not written again at every batch:
a batch writes in proportion to what it observes, and the whole table once every
``FULL_EVERY`` batches.

The state as of a batch is the newest full version before it with the deltas after that, the
newest row of each replica (``_merged``), less what those deltas left out. A batch Spark runs
again after a crash reads the versions before it and rewrites its own, so a replay gives the
same state.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow.parquet as pq
import pyspark.sql.functions as F
from pyspark.sql import Column, Window

from isrwatch.status import GoneKey
from streaming.evaluation import projection
from streaming.evaluation.replicas import STATE_COLUMNS, split_carried
from streaming.evaluation.state import KEY_COLUMNS

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

__all__ = ["FULL_EVERY", "Carried", "leave_out_gone", "StateTable"]

# A full version at least every this many batches: a delta's read merges the deltas since the
# last full version, so they are kept few (docs/benchmarks.md, "The state table's deltas").
FULL_EVERY = 10

_VERSION = re.compile(r"^([vd])(\d+)$")
_REMOVED = re.compile(r"^d(\d+)\.removed\.json(\.tmp)?$")  # (a .tmp: a write a crash cut short)
_LAYER = "_layer"  # a merged row's version: the newest wins


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


def _leave_out(state: DataFrame, forget_before: Mapping[str, int] | None, gone: Collection[GoneKey]) -> DataFrame:
    """``state`` without the replicas older than their cluster's cutoff in ``forget_before``
    and those ``gone`` (``leave_out_gone``)."""
    if forget_before:
        cutoff: Column | None = None  # null for a cluster not in forget_before: kept
        for cluster, ms in sorted(forget_before.items()):
            same = F.col("cluster") == cluster
            cutoff = F.when(same, F.lit(ms)) if cutoff is None else cutoff.when(same, F.lit(ms))
        assert cutoff is not None
        state = state.where(F.col("last_t_ms") >= F.coalesce(cutoff, F.col("last_t_ms")))
    return leave_out_gone(state, gone)


@dataclass(frozen=True)
class Carried:
    """What a batch reads of the state (``StateTable.read``)."""

    rows: DataFrame  # the carried rows that go through the window: every replica's, or the observed ones'
    idle: DataFrame | None  # the others', for a full version to write again as they were (None: none to write)
    base: int | None  # the full version read (None: none yet); older versions are pruned once the batch is done
    delta: bool  # the batch's own version is a delta: its observed replicas only


class StateTable:
    """The state's versions under ``<checkpoint>/replicas``."""

    def __init__(self, spark: SparkSession, checkpoint_dir: str) -> None:
        self.spark = spark
        self.dir = os.path.join(checkpoint_dir, "replicas")
        self._rows_of: tuple[int, int] | None = None  # (full version, its rows): full_rows' last answer

    def _complete(self, kind: str) -> list[int]:
        """The batch ids of the complete versions of ``kind`` ("v" full, "d" delta: Spark's
        ``_SUCCESS`` marker written), oldest first."""
        try:
            names = os.listdir(self.dir)
        except FileNotFoundError:
            return []
        out = []
        for n in names:
            m = _VERSION.match(n)
            if m and m.group(1) == kind and os.path.exists(os.path.join(self.dir, n, "_SUCCESS")):
                out.append(int(m.group(2)))
        return sorted(out)

    def versions(self) -> list[int]:
        """Complete full versions, oldest first."""
        return self._complete("v")

    def full_rows(self) -> int:
        """The replicas in the newest complete full version (0: none yet), from its Parquet
        files' footers: the fleet's size as the state last held it, for the driver to tell a
        batch that observes few of them (``streaming.lifecycle.handler``), without a Spark job."""
        full = self.versions()
        if not full:
            return 0
        if self._rows_of is None or self._rows_of[0] != full[-1]:
            where = self.path(full[-1])
            files = [os.path.join(where, n) for n in os.listdir(where) if n.endswith(".parquet")]
            self._rows_of = (full[-1], sum(pq.ParquetFile(f).metadata.num_rows for f in files))
        return self._rows_of[1]

    def path(self, version: int, *, delta: bool = False) -> str:
        return os.path.join(self.dir, f"{'d' if delta else 'v'}{version}")

    def _removed_path(self, version: int) -> str:
        return os.path.join(self.dir, f"d{version}.removed.json")

    def _layers(self, before: int) -> tuple[int | None, list[int]]:
        """The newest full version older than batch ``before`` and the deltas after it."""
        older = [v for v in self.versions() if v < before]
        base = older[-1] if older else None
        low = -1 if base is None else base
        return base, [d for d in self._complete("d") if low < d < before]

    def _merged(self, base: int | None, deltas: list[int], schema: StructType, keys: DataFrame | None) -> DataFrame:
        """The state of ``base`` and ``deltas``: each replica's newest row, less what the deltas
        left out. ``keys``: only those replicas' rows (``replicas.observed_keys``, broadcast)."""
        frames = []
        if base is not None:
            frames.append(
                self.spark.read.schema(schema).parquet(self.path(base)).withColumn(_LAYER, F.lit(base).cast("long"))
            )
        if deltas:  # one scan for them all, each row's version from its file's directory
            rows = self.spark.read.schema(schema).parquet(*(self.path(d, delta=True) for d in deltas))
            layer = F.regexp_extract(F.col("_metadata.file_path"), r"/d(\d+)/[^/]*$", 1).cast("long")
            frames.append(rows.withColumn(_LAYER, layer))
        if keys is not None:
            frames = [frame.join(F.broadcast(keys), KEY_COLUMNS, "left_semi") for frame in frames]
        merged = frames[0] if len(frames) == 1 else frames[0].unionByName(frames[1])
        if deltas:
            newest = Window.partitionBy(*KEY_COLUMNS).orderBy(F.col(_LAYER).desc())
            merged = merged.withColumn("_rank", F.row_number().over(newest)).where(F.col("_rank") == 1)
        forget_before: dict[str, int] = {}
        gone: list[GoneKey] = []
        for d in deltas:
            cutoffs, said = self._removed(d)
            for cluster, ms in cutoffs.items():
                forget_before[cluster] = max(ms, forget_before.get(cluster, ms))
            gone += said
        return projection.select(_leave_out(merged, forget_before, gone), *STATE_COLUMNS)

    def _removed(self, version: int) -> tuple[dict[str, int], list[GoneKey]]:
        """What delta ``version`` left out: (forget cutoffs by cluster, replicas gone)."""
        with open(self._removed_path(version), encoding="utf-8") as f:
            removed = json.load(f)
        cutoffs = {str(c): int(ms) for c, ms in removed["forget_before"].items()}
        return cutoffs, [(str(c), str(t), int(p), int(b), int(at)) for c, t, p, b, at in removed["gone"]]

    def read(self, before: int, like: DataFrame, observed: DataFrame | None = None) -> Carried:
        """The state before batch ``before``, in the schema of ``like`` (``observation_rows``;
        given, not inferred from the files). ``observed``: the batch's ``replicas.observed_keys``,
        for a batch that puts only its observed replicas through the window; it writes a delta
        when a full version exists and fewer than ``FULL_EVERY - 1`` deltas follow it, else a
        full version with the others' rows as they were (``Carried.idle``)."""
        schema = projection.select(like, *STATE_COLUMNS).schema
        base, deltas = self._layers(before)
        if base is None and not deltas:
            return Carried(projection.select(like, *STATE_COLUMNS).limit(0), None, None, False)
        if observed is None:
            return Carried(self._merged(base, deltas, schema, None), None, base, False)
        if base is not None and len(deltas) < FULL_EVERY - 1:
            return Carried(self._merged(base, deltas, schema, observed), None, base, True)
        rows, idle = split_carried(self._merged(base, deltas, schema, None), observed)
        return Carried(rows, idle, base, False)

    def write(
        self,
        state: DataFrame,
        batch_id: int,
        forget_before: Mapping[str, int] | None = None,
        gone: Collection[GoneKey] = (),
        *,
        delta: bool = False,
    ) -> None:
        """Version ``batch_id``: full, or a ``delta`` (``state`` then holds only the batch's
        observed replicas). ``forget_before``: per cluster, replicas whose newest
        telemetry (``last_t_ms``) is older than this are left out (a deleted topic, a
        moved replica: what ``Monitor.forget`` drops), so the table does not keep
        every replica ever seen. ``gone``: replicas the collector said gone and followers
        the driver found elected leader (cluster, topic, partition, broker_id, that t_ms),
        left out unless observed after that time, so a restarted job does not bring them
        back. A delta keeps both beside it, for the rows of the versions before it."""
        os.makedirs(self.dir, exist_ok=True)
        # A batch run again may write the other kind: the first run's version goes first.
        other = self.path(batch_id, delta=not delta)
        shutil.rmtree(other, ignore_errors=True)
        if not delta:
            Path(self._removed_path(batch_id)).unlink(missing_ok=True)
        else:
            removed = {"forget_before": dict(forget_before or {}), "gone": [list(g) for g in sorted(gone)]}
            tmp = self._removed_path(batch_id) + ".tmp"
            with open(tmp, "w", encoding="utf-8") as f:
                json.dump(removed, f)
            os.replace(tmp, self._removed_path(batch_id))  # before the rows: a complete delta has it
        rows = _leave_out(state, forget_before, gone)
        projection.select(rows, *STATE_COLUMNS).write.mode("overwrite").parquet(self.path(batch_id, delta=delta))

    def prune(self, keep_from: int) -> None:
        """Remove versions (full and deltas) older than ``keep_from`` and anything unfinished below it."""
        try:
            names = os.listdir(self.dir)
        except FileNotFoundError:
            return
        for n in names:
            m = _VERSION.match(n)
            if m and int(m.group(2)) < keep_from:
                shutil.rmtree(os.path.join(self.dir, n), ignore_errors=True)
            r = _REMOVED.match(n)
            if r and int(r.group(1)) < keep_from:
                (Path(self.dir) / n).unlink(missing_ok=True)

    def committed(self, last_committed: int) -> DataFrame | None:
        """The state as of the last committed batch (what a restarted job resumes from)."""
        base, deltas = self._layers(last_committed + 1)
        if deltas:  # written by this version of the job, after a full version of its own: its schema
            schema = self.spark.read.parquet(self.path(deltas[-1], delta=True)).select(*STATE_COLUMNS).schema
            return self._merged(base, deltas, schema, None)
        if base is None:
            return None
        state = self.spark.read.parquet(self.path(base))
        if "out_of_sync_episodes" not in state.columns:  # a version written before the count existed
            state = state.withColumn("out_of_sync_episodes", F.lit(0).cast("long"))
        for name, kind in (("leader_epoch", "int"), ("kafka_version", "string")):  # a version written before them
            if name not in state.select("latest.*").columns:
                state = state.withColumn("latest", F.col("latest").withField(name, F.lit(None).cast(kind)))
        return state.select(*STATE_COLUMNS)
