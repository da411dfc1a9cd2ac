"""The naive design, for comparison: the same KIP-16 rule as a Python per-key
stateful operator (``transformWithStateInPandas``).

Without the ``prev_*`` fields, a replica's ``lastCaughtUpTimeMs`` needs its
observations in order and the previous one's leader LEO: an ordered state
machine per replica, kept in Spark's state store (RocksDB) and run in Python
for every observation. It reads the same Kafka topic through the same source
and the job's own parse (``streaming.evaluation.parse``); only the operator differs, and
its output goes to a no-op sink (no driver evaluation): the comparison favours
the naive design.

Needs the RocksDB state store provider (the job's session sets it) and
``protobuf`` (pyspark's state client messages; pyspark 4.1.1 needs 6.33+).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pandas as pd
from pyspark.sql import DataFrame
from pyspark.sql.streaming import StatefulProcessor, StatefulProcessorHandle
from pyspark.sql.types import IntegerType, LongType, StringType, StructField, StructType

from isrwatch.rule import Rule, observed_caught_up_time
from streaming.evaluation import parse
from streaming.evaluation.state import KEY_COLUMNS

__all__ = ["NaiveReplicaState", "OUTPUT_SCHEMA", "naive_aggregates", "start_naive"]

_STATE = StructType(
    [
        StructField("last_caught_up_ms", LongType()),
        StructField("last_t_ms", LongType()),
        StructField("leader_leo", LongType()),
        StructField("leo", LongType()),
        StructField("observations", LongType()),
    ]
)

OUTPUT_SCHEMA = StructType(
    [
        StructField("cluster", StringType()),
        StructField("topic", StringType()),
        StructField("partition", IntegerType()),
        StructField("broker_id", IntegerType()),
        StructField("last_caught_up_ms", LongType()),
        StructField("last_t_ms", LongType()),
        StructField("leo", LongType()),
        StructField("leader_leo", LongType()),
        StructField("observations", LongType()),
    ]
)


def _int(v: Any) -> int | None:
    return None if v is None or pd.isna(v) else int(v)


class NaiveReplicaState(StatefulProcessor):
    """Per replica: apply ``isrwatch.rule.observed_caught_up_time`` to each
    observation in time order, against the previous observation the state
    remembers: what the job computes."""

    rule = Rule.KIP16_REFINED
    # The job's default --observation-gap-ms for bench.throughput's replica.lag.time.max.ms (10 s).
    max_gap_ms: int | None = 5_000

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.state = handle.getValueState("replica", _STATE)

    def handleInputRows(self, key: Any, rows: Iterator[pd.DataFrame], timerValues: Any) -> Iterator[pd.DataFrame]:
        s = self.state.get() if self.state.exists() else None
        lcu, last_t, prev_leader_leo, leo, n = (None, None, None, None, 0) if s is None else tuple(s)
        n = n or 0
        for pdf in rows:
            if len(pdf) > 1:
                pdf = pdf.sort_values("t_ms")
            for t, f, lleo in zip(pdf["t_ms"].tolist(), pdf["leo"].tolist(), pdf["leader_leo"].tolist(), strict=True):
                t, f, lleo = int(t), _int(f), _int(lleo)
                if last_t is not None and t <= last_t:
                    continue  # a replayed or out-of-order observation proves nothing new
                cu = observed_caught_up_time(self.rule, t, f, lleo, last_t, prev_leader_leo, self.max_gap_ms)
                if cu is not None and (lcu is None or cu > lcu):
                    lcu = cu
                last_t, prev_leader_leo, leo, n = t, lleo, f, n + 1
        self.state.update((lcu, last_t, prev_leader_leo, leo, n))
        yield pd.DataFrame(
            {
                "cluster": [key[0]],
                "topic": [key[1]],
                "partition": [int(key[2])],
                "broker_id": [int(key[3])],
                "last_caught_up_ms": [lcu],
                "last_t_ms": [last_t],
                "leo": [leo],
                "leader_leo": [prev_leader_leo],
                "observations": [n],
            }
        )

    def close(self) -> None:
        pass


def naive_aggregates(raw: DataFrame, version: int) -> DataFrame:
    """The naive design over ``raw``, a stream of telemetry records in ``version`` (the
    job's own parse, one layout's branch: the stream is read once)."""
    obs = parse.good_observations(parse.observations(parse.parse_records(raw), None, versions=(version,)))
    return (
        obs.select(*KEY_COLUMNS, "t_ms", "leo", "leader_leo")
        .groupBy(*KEY_COLUMNS)
        .transformWithStateInPandas(
            statefulProcessor=NaiveReplicaState(),
            outputStructType=OUTPUT_SCHEMA,
            outputMode="Update",
            timeMode="None",
        )
    )


def start_naive(raw: DataFrame, checkpoint_dir: str, version: int) -> Any:
    return (
        naive_aggregates(raw, version)
        .writeStream.queryName("bench_naive")
        .outputMode("update")
        .format("noop")
        .option("checkpointLocation", os.path.join(checkpoint_dir, "naive"))
        .trigger(processingTime="0 seconds")
        .start()
    )
