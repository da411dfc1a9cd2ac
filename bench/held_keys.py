"""The driver's held replicas in an incident: a literal set in the plan against a broadcast table.

With ``--driver-replicas not-ok`` (and with ``--ok-refresh-batches``) Spark sends the driver
the rows of the replicas it holds (``Monitor.held_keys``), named by their keys. When a broker
misbehaves the driver holds thousands of them. This times the driver's-rows filter, a
replica not ok or held, over ``--replicas`` ok rows of which ``--held`` sizes are held:

* ``literal``: the keys as one literal set in the plan (``Column.isin``), the baseline;
* ``table``: ``streaming.evaluation.evaluate.with_key_flag`` past its literal-set size, a
  table of the keys broadcast and joined.

Each timing is the whole call, building the plan included (the part that grows with the
keys), to a count; the two alternate, the median of ``--repeat`` of each after one warm-up
of each, and the counts are checked equal.

``python -m bench.held_keys --replicas 100000 --held 100,1000,10000,50000``
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import pyspark.sql.functions as F

from bench.machine import print_header
from isrwatch.status import State
from streaming.evaluation import evaluate

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

FLAG = "_held"


def fleet(spark: SparkSession, replicas: int) -> DataFrame:
    """``replicas`` ok followers' rows (the key columns and ``state``), held in memory."""
    rows = spark.range(replicas).select(
        F.lit("fleet").alias("cluster"),
        F.concat(F.lit("t"), (F.col("id") % 1000).cast("string")).alias("topic"),
        (F.col("id") / 1000).cast("int").alias("partition"),
        F.lit(2).alias("broker_id"),
        F.lit(State.OK.value).alias("state"),
    )
    rows = rows.cache()
    rows.count()
    return rows


def held_keys(replicas: int, held: int) -> set[str]:
    """``held`` of the fleet's keys, spread over it."""
    step = max(1, replicas // max(held, 1))
    return {f"fleet/t{i % 1000}/{i // 1000}/2" for i in range(0, replicas, step)[:held]}


def by_literal(rows: DataFrame, keys: set[str]) -> int:
    return rows.where((F.col("state") != State.OK.value) | evaluate.replica_key().isin(sorted(keys))).count()


def by_table(rows: DataFrame, keys: set[str]) -> int:
    flagged = evaluate.with_key_flag(rows, keys, FLAG, inline=0)
    return flagged.where((F.col("state") != State.OK.value) | F.col(FLAG)).count()


def measure(spark: SparkSession, replicas: int, sizes: list[int], repeat: int) -> dict[int, dict[str, float]]:
    rows = fleet(spark, replicas)
    ways: dict[str, Callable[[DataFrame, set[str]], int]] = {"literal": by_literal, "table": by_table}
    out: dict[int, dict[str, float]] = {}
    try:
        for n in sizes:
            keys = held_keys(replicas, n)
            counts = {name: way(rows, keys) for name, way in ways.items()}  # the warm-up of each
            if len(set(counts.values())) != 1 or counts["literal"] != len(keys):
                raise AssertionError(f"held={n}: the ways disagree or miss keys: {counts}, {len(keys)} keys")
            secs: dict[str, list[float]] = {name: [] for name in ways}
            for _ in range(repeat):
                for name, way in ways.items():
                    t0 = time.monotonic()
                    way(rows, keys)
                    secs[name].append(time.monotonic() - t0)
            out[n] = {name: statistics.median(s) for name, s in secs.items()}
            print(
                f"held={n} literal_s={out[n]['literal']:.3f} table_s={out[n]['table']:.3f} "
                f"literal_over_table={out[n]['literal'] / out[n]['table']:.2f}",
                flush=True,
            )
    finally:
        rows.unpersist()
    return out


def main(argv: list[str] | None = None) -> dict[int, dict[str, float]]:
    ap = argparse.ArgumentParser(prog="python -m bench.held_keys", description=__doc__.splitlines()[0])
    ap.add_argument("--replicas", type=int, default=100_000, help="rows the filter runs over")
    ap.add_argument("--held", default="100,1000,10000,50000", help="comma-separated numbers of held replicas")
    ap.add_argument("--repeat", type=int, default=3, help="timed runs of each way, alternated (median printed)")
    args = ap.parse_args(argv)
    sizes = [int(x) for x in args.held.split(",") if x.strip()]
    if not sizes or min(sizes) < 1 or max(sizes) > args.replicas or args.repeat < 1:
        ap.error("--held: numbers from 1 to --replicas; --repeat at least 1")
    print_header("isrwatch held replicas: literal set against broadcast table")
    from streaming.lifecycle.session import build_session

    spark = build_session("local[2]", 2, app_name="isrwatch-bench-held-keys")
    try:
        print(f"replicas={args.replicas:,} repeat={args.repeat} literal_set_size={evaluate.KEYS_INLINE}")
        return measure(spark, args.replicas, sizes, args.repeat)
    finally:
        spark.stop()


if __name__ == "__main__":
    main()
