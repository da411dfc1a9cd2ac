"""Where one micro-batch's time goes, stage by stage, with the job's own code.

A fleet of N replicas; two batches of R whole rounds each (``bench.load.Fleet``),
so the second batch carries the first one's state in, as every steady batch of
the job does. The raw records are held in Spark memory (Parquet on /dev/shm,
cached) and every Spark stage is timed as a *prefix* of the job's plan written
to a no-op sink (Spark is lazy, so each prefix includes those before it):

* ``parse_s``: ``parse.parse_records`` (from_json, validation) of the records;
* ``observations_s``: + ``parse.observations`` and ``good_observations`` (the explode);
* ``window_s``: + ``replicas.observation_rows``, the carried state read
  (``StateTable.read``) and ``replicas.evaluate_batch`` (the window over every
  replica's seed and observations) filtered to the changes and newest rows;
* ``spark_s``: ``batch.evaluate_records`` whole, as the job calls it: the above,
  the rows for the driver and the rare rows (dead letters, ISR changes) to Arrow;
* ``driver_s``: ``rows.split_driver_rows`` and ``Monitor.apply_statuses`` (the
  exporter store, the alert book), profiled with cProfile;
* ``state_write_s``: ``statewriter.write_batch_state`` (the state table's new version);
* ``aggregate_s``: for comparison, ``streaming.evaluation.state.replica_aggregates`` over the
  same observation rows already parsed and cached: the core of the benchmarks'
  in-memory ceiling (``bench.throughput``), in batch mode.

With a Kafka cluster, also ``source_obs_per_s``: the job's own source
(``streaming.sources.source.kafka_stream``, the isrwatch-kafka Python data source) reading
the same records from a real topic, each batch's values summed and nothing else,
beside ``input_obs_per_s``, a plain confluent-kafka consumer.

Spark stages are the median of ``--repeat`` runs, after one warm-up batch.

``--versions 1,3`` measures the same fleet's records in each telemetry version, one after
the other in the same Spark session (version 3: the observations as columns,
``bench.load.as_version``), and prints each version's stages and their ratio to the first.

``--calls``: the repeated runs of ``batch.evaluate_records`` are also timed call by call
(``bench.plan_calls``): every DataFrame call the job makes (``select``, ``persist``,
``toArrow``...), by the line that made it, per batch: where a small batch's plan
building goes; ``plan_ms`` is building and planning the batch's query, ``job_ms`` its one
Spark job (``toArrow`` less Spark's own optimisation and planning time).

``python -m bench.stages --replicas 100000 --rounds 2``
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import os
import pstats
import shutil
import statistics
import tempfile
import threading
import time
from typing import Any

from bench import baselines, plan_calls
from bench import kafka as bkafka
from bench import throughput as tp
from bench.load import Fleet, as_version
from bench.machine import print_header
from bench.throughput import START_MS

__all__ = ["measure", "noop_s", "source_alone", "main"]


def _timed(fn: Any) -> tuple[float, Any]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def noop_s(df: Any, repeat: int) -> float:
    """Median seconds of writing ``df`` to Spark's no-op sink."""
    return statistics.median(_timed(lambda: df.write.format("noop").mode("overwrite").save())[0] for _ in range(repeat))


def _raw(spark: Any, records: list[bytes], base: str, name: str) -> Any:
    raw = baselines.raw_frame(spark, baselines.raw_parquet(records, os.path.join(base, name))).repartition(2).cache()
    raw.count()
    return raw


def measure(
    spark: Any,
    kafka: Any | None,
    replicas: int,
    rounds: int,
    top: int = 12,
    repeat: int = 3,
    version: int = 1,
    calls: bool = False,
) -> dict[str, Any]:

    from exporter.store import StatusStore
    from isrwatch.rule import Rule, RuleConfig
    from isrwatch.status import Thresholds
    from streaming.driver.monitor import Monitor
    from streaming.driver.rows import split_driver_rows
    from streaming.evaluation import parse, state
    from streaming.evaluation import replicas as rep
    from streaming.evaluation.batch import evaluate_records
    from streaming.evaluation.statetable import StateTable
    from streaming.sinks.statewriter import write_batch_state

    fleet = Fleet(replicas)
    batches: list[list[bytes]] = [[], []]
    for r in range(2 * rounds):
        batches[r // rounds] += fleet.round(r, START_MS + r * fleet.interval_ms)
    if version != 1:
        batches = [[as_version(x, version) for x in b] for b in batches]
    obs_n = replicas * rounds
    cfg = RuleConfig(Rule.KIP16_REFINED, 10_000, 4000)  # what the fleet's telemetry says
    th = Thresholds(0.5, 0.8, 3000)
    max_gap = cfg.lag_time_max_ms // 2
    base = tempfile.mkdtemp(prefix="bench-stages-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    out: dict[str, Any] = {
        "version": version,
        "replicas": replicas,
        "observations": obs_n,
        "records": len(batches[1]),
        "bytes_per_obs": sum(len(x) for x in batches[1]) / obs_n,
    }
    try:
        raw0, raw1 = _raw(spark, batches[0], base, "b0"), _raw(spark, batches[1], base, "b1")
        table = StateTable(spark, os.path.join(base, "checkpoint"))
        monitor = Monitor(cfg, th, default_min_isr=1, stale_after_s=15, store=StatusStore(), sinks=[])
        # Batch 0: the warm-up (code generation, JIT) and the state batch 1 carries in.
        first = evaluate_records(raw0, 0, table, cfg, th, future_tolerance_ms=None, max_gap_ms=max_gap)
        changes, finals = split_driver_rows(first.table)
        monitor.apply_statuses(0, finals, changes)
        write_batch_state(first, table, 0)

        parsed = parse.parse_records(raw1)
        out["parse_s"] = noop_s(parsed, repeat)
        # one layout: these prefixes read the records unheld, and each branch would parse them again
        good = parse.good_observations(parse.observations(parsed, None, versions=(version,)))
        out["observations_s"] = noop_s(good, repeat)
        rows = rep.observation_rows(good, cfg, max_gap)
        carried = table.read(1, rows).rows
        window = rep.evaluate_batch(rows, carried, cfg, th, max_gap, driver_rows_only=True)
        out["window_s"] = noop_s(window, repeat)

        spark_runs: list[float] = []
        call_times = plan_calls.CallTimes() if calls else None
        for _ in range(repeat):  # batch 1 again each time: a replay reads version 0, rewrites version 1
            with plan_calls.timed(call_times) if calls else contextlib.nullcontext():
                done = evaluate_records(raw1, 1, table, cfg, th, future_tolerance_ms=None, max_gap_ms=max_gap)
            spark_runs.append(done.spark_s)
            if len(spark_runs) < repeat:
                write_batch_state(done, table, 1)
        if call_times is not None:
            print(f"-- DataFrame calls of evaluate_records, telemetry version {version}, a batch (mean of {repeat}):")
            print(call_times.table(runs=repeat, top=top))
            out["calls_ms"] = sum(r[0] for r in call_times.rows(repeat))
            out["plan_ms"] = call_times.plan_ms(repeat)
            out["job_ms"] = call_times.job_ms(repeat)
        out["spark_s"] = statistics.median(spark_runs)
        assert done.table is not None
        out["driver_rows"] = done.table.num_rows
        prof = cProfile.Profile()
        prof.enable()
        t0 = time.perf_counter()
        changes, finals = split_driver_rows(done.table)
        monitor.apply_statuses(1, finals, changes)
        out["driver_s"] = time.perf_counter() - t0
        prof.disable()
        out["state_write_s"], _ = _timed(lambda: write_batch_state(done, table, 1))

        held = good.cache()
        held.count()
        out["aggregate_s"] = noop_s(state.replica_aggregates(held, Rule.KIP16_REFINED), repeat)
        held.unpersist()
        raw0.unpersist()
        raw1.unpersist()
    finally:
        shutil.rmtree(base, ignore_errors=True)
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("cumulative").print_stats(top)
    print(buf.getvalue()[:6000])
    if kafka is not None:
        out.update(source_alone(spark, kafka, batches[0] + batches[1], fleet.per_record))
    return out


def source_alone(spark: Any, kafka: Any, records: list[bytes], per_record: int) -> dict[str, float]:
    """The job's source over a real topic of ``records``, and a plain consumer, in obs/s."""
    import pyspark.sql.functions as F

    from streaming.sources.source import kafka_stream

    topic = bkafka.new_topic(kafka, "bench-source")
    n, _ = bkafka.produce(kafka, topic, records)
    got, _, secs = bkafka.consume_all(kafka, topic, n)
    out = {"input_obs_per_s": got * per_record / secs if secs else 0.0}
    ckpt = tempfile.mkdtemp(prefix="bench-source-")
    settings = tp.job_settings(kafka, topic, ckpt, max(1, n // 4), 0.001)
    ends: list[tuple[float, int]] = []
    cond = threading.Condition()

    def handle(batch: Any, batch_id: int) -> None:
        got_n = batch.select(F.count("*"), F.sum(F.length("value"))).collect()[0][0]
        with cond:
            ends.append((time.perf_counter(), got_n))
            cond.notify_all()

    raw = kafka_stream(spark, settings, ckpt)("source")
    q = (
        raw.writeStream.queryName("bench_source")
        .foreachBatch(handle)
        .option("checkpointLocation", os.path.join(ckpt, "query"))
        .trigger(processingTime="0.001 seconds")
        .start()
    )
    try:
        with cond:
            deadline = time.monotonic() + 600
            while sum(k for _, k in ends) < n and q.isActive and time.monotonic() < deadline:
                cond.wait(1.0)
    finally:
        q.stop()
        shutil.rmtree(ckpt, ignore_errors=True)
    if len(ends) >= 2:  # from the end of the first batch (start-up) to the end of the last
        out["source_obs_per_s"] = sum(k for _, k in ends[1:]) * per_record / (ends[-1][0] - ends[0][0])
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(prog="python -m bench.stages", description=__doc__.splitlines()[0])
    ap.add_argument("--replicas", type=int, default=100_000)
    ap.add_argument("--rounds", type=int, default=2, help="polling rounds per batch")
    ap.add_argument("--repeat", type=int, default=3, help="runs of each Spark stage (the median is printed)")
    ap.add_argument("--no-kafka", action="store_true", help="skip the source's read of a real topic")
    ap.add_argument("--versions", default="1", help="telemetry versions to measure, one after the other (e.g. 1,3)")
    ap.add_argument("--calls", action="store_true", help="also time every DataFrame call of a batch by its line")
    args = ap.parse_args(argv)
    versions = [int(v) for v in args.versions.split(",")]
    print_header("isrwatch per-stage cost of one micro-batch")
    from streaming.lifecycle.session import build_session

    spark = build_session("local[2]", 2, app_name="isrwatch-bench-stages")
    kafka = None if args.no_kafka else bkafka.start_cluster()
    runs = []
    try:
        for v in versions:
            runs.append(
                measure(spark, kafka, args.replicas, args.rounds, repeat=args.repeat, version=v, calls=args.calls)
            )
    finally:
        if kafka is not None:
            kafka.close()
        spark.stop()
    for out in runs:
        n = out["observations"]
        print(f"-- telemetry version {out['version']}")
        first = out is not runs[0] and runs[0]
        for k, v in out.items():
            if k.endswith("per_s") or k == "bytes_per_obs":  # a rate (higher is better), or a size
                ratio = f" ({v / first[k]:.2f}x version {first['version']})" if first and first.get(k) else ""
                print(f"{k}={v:,.1f}{ratio}")
            elif k.endswith("_s"):  # a time: the ratio is how much faster than the first
                ratio = f", {first[k] / v:.2f}x version {first['version']}" if first and v else ""
                print(f"{k}={v:.3f} ({n / v:,.0f} obs/s{ratio})" if v else f"{k}=0")
            else:
                print(f"{k}={v:,.0f}")
    return runs[-1]


if __name__ == "__main__":
    main()
