"""Where one micro-batch's time goes, stage by stage, with the job's own code.

For a fleet of N replicas and a batch of B observations (whole rounds of
``bench.load.Fleet``), each stage is timed alone on the same data:

* ``parse``: ``streaming.parse`` (from_json, validate, explode) of the raw
  records already in Spark memory, to a no-op sink; beside it
  ``plain_from_json``: one ``from_json`` and ``explode``, nothing else;
* ``aggregate``: ``streaming.state.replica_aggregates`` of the parsed rows
  (batch, no state store);
* before: the updated aggregates to the driver as dicts (``toArrow().to_pylist()``)
  evaluated there in Python (``isrwatch.status.evaluate``, the job until
  issue 5's fix), beside
* now: ``streaming.evaluate.status_columns`` (Spark evaluates) ``.toArrow()``,
  ``statuses_from_arrow`` and ``Monitor.apply_statuses`` (as ``streaming.job``
  does), profiled with cProfile; ``state_topic``: ``streaming.outputs.KafkaStates``
  writing the batch's statuses to a real Kafka topic.

``python -m bench.stages --replicas 100000 --rounds 2``
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import shutil
import time
from typing import Any

from bench import baselines
from bench import kafka as bkafka
from bench import throughput as tp
from bench.load import Fleet
from bench.machine import print_header
from bench.throughput import START_MS

__all__ = ["measure", "main"]


def _timed(fn: Any) -> tuple[float, Any]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def _evaluated_in_python(rows: list[dict[str, Any]], cfg: Any, th: Any) -> list[tuple[Any, int, int]]:
    """The aggregates' rows evaluated on the driver with ``isrwatch.status.evaluate`` (the
    job until issue 5's fix), as ``Monitor.apply_statuses`` takes them."""
    from isrwatch.status import evaluate
    from streaming.state import row_to_aggregate

    items = []
    for row in rows:
        agg = row_to_aggregate(row)
        items.append((evaluate(agg, agg.last_t_ms, cfg, th), agg.last_t_ms, int(row.get("observations") or 0)))
    return items


def _start_aggregates(raw: Any, checkpoint_dir: str, handle: Any) -> Any:
    """The aggregation query of the two-query job (before the one-pass job of issue 19):
    parse, ``streaming.state.replica_aggregates`` with Spark's state store, every
    micro-batch as fast as it comes to ``handle``."""
    from isrwatch.rule import Rule
    from streaming import parse, state

    obs = parse.good_observations(parse.observations(parse.parse_records(raw), None))
    return (
        state.replica_aggregates(obs, Rule.KIP16_REFINED)
        .writeStream.queryName("bench_aggregates")
        .outputMode("update")
        .foreachBatch(handle)
        .option("checkpointLocation", os.path.join(checkpoint_dir, "aggregates"))
        .trigger(processingTime="0.001 seconds")
        .start()
    )


def measure(spark: Any, kafka: Any | None, replicas: int, rounds: int, top: int = 12) -> dict[str, float]:
    import pyspark.sql.functions as F

    from exporter.store import StatusStore
    from isrwatch.rule import Rule, RuleConfig
    from isrwatch.status import Thresholds
    from isrwatch.telemetry import SPARK_SCHEMA_DDL
    from streaming import evaluate, parse, state
    from streaming.monitor import Monitor

    fleet = Fleet(replicas)
    records: list[bytes] = []
    for r in range(rounds):
        records += fleet.round(r, START_MS + r * 1000)
    obs_n = replicas * rounds
    import tempfile

    raw_dir = tempfile.mkdtemp(prefix="bench-stages-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    raw = baselines.raw_frame(spark, baselines.raw_parquet(records, raw_dir)).repartition(2).cache()
    raw.count()
    out: dict[str, float] = {"observations": obs_n}
    good = parse.good_observations(parse.observations(parse.parse_records(raw), None))
    good.write.format("noop").mode("overwrite").save()  # warm-up (JIT): the job runs hot
    out["parse_s"], _ = _timed(lambda: good.write.format("noop").mode("overwrite").save())
    plain = raw.select(F.from_json(F.col("value").cast("string"), SPARK_SCHEMA_DDL).alias("rec")).select(
        "rec.cluster", F.explode("rec.observations").alias("o")
    )
    plain.select("cluster", "o.*").write.format("noop").mode("overwrite").save()
    out["plain_from_json_s"], _ = _timed(
        lambda: plain.select("cluster", "o.*").write.format("noop").mode("overwrite").save()
    )
    out["from_json_in_plan"] = good._jdf.queryExecution().optimizedPlan().toString().count("from_json")
    # Proposal, measured: no Filter on the record reason before the explode
    # (predicate pushdown copies from_json into it): explode only good records' arrays.
    recs = parse.parse_records(raw)
    one = recs.select(
        F.col("rec.cluster").alias("cluster"),
        F.explode(F.when(F.col("reason").isNull(), F.col("rec.observations"))).alias("o"),
    ).select("cluster", "o.*")
    one.write.format("noop").mode("overwrite").save()
    out["parse_explode_when_s"], _ = _timed(lambda: one.write.format("noop").mode("overwrite").save())
    out["from_json_in_plan_explode_when"] = one._jdf.queryExecution().optimizedPlan().toString().count("from_json")
    rows_df = good.cache()
    rows_df.count()
    aggs = state.replica_aggregates(rows_df, Rule.KIP16_REFINED)
    aggs.write.format("noop").mode("overwrite").save()
    out["aggregate_s"], _ = _timed(lambda: aggs.write.format("noop").mode("overwrite").save())
    cached = aggs.cache()
    cached.count()
    cfg = RuleConfig(Rule.KIP16_REFINED, 10_000, 4000)
    th = Thresholds(0.5, 0.8, 3000)
    # Before: the aggregates to the driver as dicts, evaluated there in Python.
    out["to_arrow_s"], table = _timed(cached.toArrow)
    out["to_pylist_s"], rows = _timed(table.to_pylist)
    before = Monitor(cfg, th, default_min_isr=1, stale_after_s=15, store=StatusStore(), sinks=[])
    out["monitor_python_evaluation_s"], _ = _timed(
        lambda: before.apply_statuses(0, _evaluated_in_python(rows, cfg, th))
    )
    # Now (streaming.job): Spark evaluates, the driver takes statuses in.
    statuses_df = evaluate.status_columns(cached, cfg, th)
    out["evaluate_in_spark_to_arrow_s"], table = _timed(statuses_df.toArrow)
    out["statuses_from_arrow_s"], evaluated = _timed(lambda: list(evaluate.statuses_from_arrow(table)))
    cached.unpersist()
    rows_df.unpersist()
    raw.unpersist()
    shutil.rmtree(raw_dir, ignore_errors=True)

    monitor = Monitor(cfg, th, default_min_isr=1, stale_after_s=15, store=StatusStore(), sinks=[])
    prof = cProfile.Profile()
    prof.enable()
    out["monitor_s"], _ = _timed(lambda: monitor.apply_statuses(0, evaluated))
    prof.disable()
    stats = pstats.Stats(prof, stream=(buf := io.StringIO()))
    stats.sort_stats("cumulative").print_stats(top)
    out["monitor_second_batch_s"], _ = _timed(lambda: monitor.apply_statuses(1, evaluated))
    if kafka is not None:
        out.update(_without_side(spark, kafka, records, obs_n))
        from streaming.outputs import KafkaStates

        topic = bkafka.new_topic(kafka, "bench-states", partitions=1)
        states = KafkaStates(bkafka.producer(kafka), topic)
        statuses = list(monitor.statuses.values())
        t0 = time.perf_counter()
        states.write(statuses)
        states.producer.flush(60)
        out["state_topic_s"] = time.perf_counter() - t0
    print(buf.getvalue()[:6000])
    return out


def _without_side(spark: Any, kafka: Any, records: list[bytes], obs_n: int) -> dict[str, float]:
    """What-if, measured before the one-pass job: the two-query job's aggregation query and
    driver (``_start_aggregates``, ``Monitor.apply_statuses`` with the state topic) without
    its side query, beside the whole job, on the same topic."""
    import tempfile
    import threading

    from exporter.store import StatusStore
    from isrwatch.rule import Rule, RuleConfig
    from isrwatch.status import Thresholds
    from streaming import evaluate
    from streaming.monitor import Monitor
    from streaming.outputs import KafkaStates, make_producer
    from streaming.source import kafka_stream

    topic = bkafka.new_topic(kafka, "bench-whatif")
    bkafka.produce(kafka, topic, records)
    cap = max(1, len(records) // 4)
    out = {}
    whole, _b, _m, _s = tp.run_e2e(spark, kafka, topic, obs_n, cap)
    out["e2e_rate"] = whole
    ckpt = tempfile.mkdtemp(prefix="bench-whatif-")
    settings = tp.job_settings(kafka, topic, ckpt, cap, 0.001)
    producer = make_producer(settings.bootstrap_servers, settings.kafka_config)
    monitor = Monitor(
        RuleConfig(Rule.KIP16_REFINED, 10_000, 4000),
        Thresholds(0.5, 0.8, 3000),
        default_min_isr=1,
        stale_after_s=15,
        store=StatusStore(),
        sinks=[],
        state_topic=KafkaStates(producer, settings.state_topic),
    )
    ends: list[tuple[float, int]] = []
    cond = threading.Condition()

    def handle(batch: Any, batch_id: int) -> None:
        table = evaluate.status_columns(batch, monitor.cfg, monitor.thresholds).toArrow()
        report = monitor.apply_statuses(batch_id, evaluate.statuses_from_arrow(table))
        with cond:
            ends.append((time.perf_counter(), report.observations))
            cond.notify_all()

    q = _start_aggregates(kafka_stream(spark, settings, ckpt)("aggregates"), ckpt, handle)
    try:
        with cond:
            while sum(n for _, n in ends) < obs_n and q.isActive:
                cond.wait(1.0)
    finally:
        q.stop()
        producer.flush(30)
    if len(ends) >= 2:
        out["e2e_without_side_rate"] = sum(n for _, n in ends[1:]) / (ends[-1][0] - ends[0][0])
    return out


def main(argv: list[str] | None = None) -> dict[str, float]:
    ap = argparse.ArgumentParser(prog="python -m bench.stages", description=__doc__.splitlines()[0])
    ap.add_argument("--replicas", type=int, default=100_000)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--no-kafka", action="store_true", help="skip the state topic stage")
    args = ap.parse_args(argv)
    print_header("isrwatch per-stage cost of one micro-batch")
    from streaming.session import build_session

    spark = build_session("local[2]", 2, app_name="isrwatch-bench-stages")
    kafka = None if args.no_kafka else bkafka.start_cluster()
    try:
        out = measure(spark, kafka, args.replicas, args.rounds)
    finally:
        if kafka is not None:
            kafka.close()
        spark.stop()
    n = out["observations"]
    for k, v in out.items():
        if not k.endswith("_s"):
            print(f"{k}={v:,.0f}")
        if k.endswith("_s") and v:
            print(f"{k}={v:.3f} ({n / v:,.0f} obs/s alone)")
    return out


if __name__ == "__main__":
    main()
