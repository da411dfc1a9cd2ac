"""The throughput benchmark's baselines, over the same telemetry as the job.

* ``run_ceiling``: Spark's own aggregation of the observation rows already in memory
  (``streaming.evaluation.state.replica_aggregates`` as a streaming query with RocksDB state,
  reading the rows pre-parsed into Parquet on /dev/shm, to a no-op sink);
* ``run_naive``: ``bench.naive`` (transformWithStateInPandas) over the same topic;
* ``raw_parquet`` / ``raw_frame``: records as Parquet files with the Kafka source's columns.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from typing import Any

from bench import kafka as bkafka

__all__ = ["progress_of", "raw_frame", "raw_parquet", "run_ceiling", "run_naive"]


def progress_of(q: Any) -> list[dict[str, Any]]:
    return [json.loads(p.json) if hasattr(p, "json") else dict(p) for p in q.recentProgress]


def raw_parquet(records: list[bytes], path: str, files: int = 2) -> str:
    """Records as Parquet files (column ``value``) under ``path``, split in ``files``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    os.makedirs(path, exist_ok=True)
    step = -(-len(records) // files)
    for i in range(0, len(records), step):
        pq.write_table(pa.table({"value": pa.array(records[i : i + step], pa.binary())}), f"{path}/part-{i}.parquet")
    return path


def raw_frame(spark: Any, path: str) -> Any:
    """The Kafka source's columns over ``raw_parquet`` files."""
    return spark.read.parquet(path).selectExpr(
        "cast(null as binary) as key",
        "value",
        "'t' as topic",
        "0 as partition",
        "0L as offset",
        "cast(null as timestamp) as timestamp",
    )


def run_ceiling(spark: Any, records: list[bytes], cap_records: int) -> float:
    """The job's aggregation over observation rows already in memory (Parquet on /dev/shm)."""
    from isrwatch.rule import Rule
    from streaming.evaluation import parse, state

    base = tempfile.mkdtemp(prefix="bench-ceiling-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    stream_dir = os.path.join(base, "rows")
    os.makedirs(stream_dir)
    try:
        schema = None
        files_per_batch = 2
        for k in range(0, len(records), cap_records):
            # The raw records go to Spark through a file, not the driver's heap.
            raw_path = raw_parquet(records[k : k + cap_records], os.path.join(base, f"raw-{k}"))
            obs = parse.good_observations(parse.observations(parse.parse_records(raw_frame(spark, raw_path)), None))
            out = os.path.join(base, f"chunk-{k}")
            obs.repartition(files_per_batch).write.parquet(out)
            shutil.rmtree(raw_path, ignore_errors=True)
            schema = schema or obs.schema
            for i, f in enumerate(sorted(n for n in os.listdir(out) if n.endswith(".parquet"))):
                os.rename(os.path.join(out, f), os.path.join(stream_dir, f"{k:012d}-{i}.parquet"))
        rows = spark.readStream.schema(schema).option("maxFilesPerTrigger", files_per_batch).parquet(stream_dir)
        q = (
            state.replica_aggregates(rows, Rule.KIP16_REFINED)
            .writeStream.queryName("bench_ceiling")
            .outputMode("update")
            .format("noop")
            .option("checkpointLocation", os.path.join(base, "ckpt"))
            .trigger(processingTime="0 seconds")
            .start()
        )
        try:
            q.processAllAvailable()
            ps = progress_of(q)
        finally:
            q.stop()
        ps = [p for p in ps if p.get("numInputRows")][1:]
        rows_n = sum(p["numInputRows"] for p in ps)
        secs = sum(p["durationMs"]["triggerExecution"] for p in ps) / 1000
        return rows_n / secs if secs else 0.0
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _stop_quietly(spark: Any, q: Any) -> None:
    """Stop the naive query, whose budget usually ends inside a batch: Spark then logs
    the interrupted tasks' stack traces at ERROR (a hundred lines that read as a failure
    of the benchmark). They are expected here, so Spark's log is off while it stops; a
    failure of the query itself was raised above, before this."""
    from streaming.lifecycle.session import SPARK_LOG_LEVEL

    spark.sparkContext.setLogLevel("OFF")
    try:
        q.stop()
        time.sleep(1)  # the interrupted tasks log as they end, just after stop() returns
    finally:
        spark.sparkContext.setLogLevel(SPARK_LOG_LEVEL)


def run_naive(
    spark: Any, kafka: Any, topic: str, cap_records: int, per_record: int, budget_s: float, version: int
) -> tuple[float, int]:
    """``bench.naive`` over the same topic (telemetry ``version``) for about ``budget_s``;
    (obs/s, observations).

    When no batch finishes within the budget, (an upper bound of the rate, 0)."""
    from bench.naive import start_naive

    checkpoint = tempfile.mkdtemp(prefix="bench-naive-")
    q = start_naive(bkafka.job_source(spark, kafka, topic, cap_records), checkpoint, version)
    try:
        t0 = time.monotonic()
        while time.monotonic() - t0 < budget_s and q.isActive:
            time.sleep(1)
            ps = [p for p in progress_of(q) if p.get("numInputRows")]
            if len(ps) >= 3 and time.monotonic() - t0 > budget_s / 2 and q.status.get("isTriggerActive") is False:
                break
        if not q.isActive:
            raise RuntimeError(f"naive query failed: {q.exception()}")
        ps = [p for p in progress_of(q) if p.get("numInputRows")]
    finally:
        _stop_quietly(spark, q)
        shutil.rmtree(checkpoint, ignore_errors=True)
    if len(ps) > 1:
        ps = ps[1:]  # the first batch includes start-up, when there is more to time
    if not ps:
        # Not one batch in the budget: the rate is below one batch over the budget.
        bound = cap_records * per_record / budget_s
        print(f"  naive: no batch of {cap_records * per_record} observations finished in {budget_s:.0f}s", flush=True)
        return bound, 0
    if not any(op.get("numRowsUpdated", 0) > 0 for p in ps for op in p.get("stateOperators", [])):
        # The rate counts the records read: a parse that found no observation in them (a
        # layout it does not know) would time nothing and look fast.
        raise RuntimeError(f"the naive design updated no replica from {len(ps)} batches of version-{version} records")
    obs = sum(p["numInputRows"] for p in ps) * per_record
    secs = sum(p["durationMs"]["triggerExecution"] for p in ps) / 1000
    return obs / secs, obs
