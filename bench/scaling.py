"""Scale-out: the job on local[2] and on a Spark standalone cluster of 1 and 2 workers,
reading the same filled telemetry topic in the same run (docs/scaling.md).

For each placement: the real job (``bench.throughput.run_e2e``: Kafka source, one
pass per batch, state, outputs) drains the topic; printed are observations per
second, batch durations, the state's bytes per replica and the CPU seconds per
observation of every process of the placement (driver, Python workers, master,
workers, executors). On one 2-core machine more workers add JVMs, not cores: the
figures show what distribution costs and where the time goes, and docs/scaling.md
takes the per-replica costs from them for its sizing.

Each placement drains the topic cold once, then ``--warm-runs`` times warm in the same Spark
session; the warm drains' medians are the figures docs/scaling.md sizes with. The default shape
is a fleet's: each replica observed once a batch (100,000 replicas, 3 rounds, 100,000
observations a batch), so a cost per replica is not diluted by several observations of it.

``python -m bench.scaling --replicas 100000 --rounds 3 --workers 1,2``
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
from typing import Any

from bench import kafka as bkafka
from bench.load import Fleet
from bench.machine import cpu_seconds, load_average, median_of_measured, print_header
from bench.throughput import START_MS, run_e2e

__all__ = ["main", "run_placement"]

TELEMETRY_PARTITIONS = 6
WARM_RUNS = 2  # drains after the cold one, in the same session


def run_placement(
    name: str,
    workers: int,
    kafka: Any,
    topic: str,
    total_obs: int,
    cap_records: int,
    replicas: int,
    warm_runs: int = WARM_RUNS,
) -> dict[str, Any]:
    """One placement: local[2] (``workers`` 0) or a standalone cluster of ``workers``. The job
    drains the topic once cold (the session's first run: JVM start, code generation), then
    ``warm_runs`` more times in the same session, each from a fresh checkpoint; the CPU seconds
    of every process of the placement are counted around each drain."""
    from localspark import LocalSpark
    from streaming.lifecycle.session import build_session

    with contextlib.ExitStack() as stack:
        groups = {os.getpgrp()}
        if workers:
            cluster = stack.enter_context(LocalSpark(workers=workers))
            groups |= {p.pid for p in [cluster.master, *cluster.workers] if p is not None}
            master = cluster.master_url
        else:
            master = "local[2]"
        spark = build_session(master, 2, app_name=f"isrwatch-bench-scaling-{name}")
        stack.callback(spark.stop)
        drains = []
        for _ in range(1 + warm_runs):
            before = cpu_seconds(groups)
            rate, batches, memory, stages = run_e2e(spark, kafka, topic, total_obs, cap_records)
            drains.append((rate, batches, memory, stages, cpu_seconds(groups) - before))
    cold, warm = _drain_row(drains[0], total_obs), [_drain_row(d, total_obs) for d in drains[1:]]
    last_memory = drains[-1][2]
    row = {
        "placement": name,
        "master": master,
        "cold": cold,
        "warm": warm,
        # the warm drains' medians: what a long-running job pays
        "observations_per_second": round(median_of_measured([w["observations_per_second"] for w in warm])),
        "batch_ms_median": median_of_measured([w["batch_ms_median"] for w in warm]),
        "cpu_us_per_observation": median_of_measured([w["cpu_us_per_observation"] for w in warm]),
        "state_bytes_per_replica": round(last_memory.get("state_table_mb", 0.0) * 1024 * 1024 / replicas),
        "checkpoint_mb": last_memory.get("checkpoint_mb"),
        "driver_jvm_rss_mb": last_memory.get("driver_jvm_rss_mb"),
    }
    for label, d in [("cold", cold), *(("warm", w) for w in warm)]:
        print(
            f"  {name:<13} {label}  {d['observations_per_second']:>9,} obs/s  batch median {d['batch_ms_median']} ms "
            f"max {d['batch_ms_max']} ms  cpu {d['cpu_us_per_observation']} us/obs",
            flush=True,
        )
    print(
        f"  {name:<13} warm median  {row['observations_per_second']:>9,} obs/s  cpu {row['cpu_us_per_observation']} "
        f"us/obs  state {row['state_bytes_per_replica']} B/replica",
        flush=True,
    )
    return row


def _drain_row(drain: tuple[Any, ...], total_obs: int) -> dict[str, Any]:
    rate, batches, _memory, stages, cpu = drain
    durations = [b["trigger_ms"] for b in batches if b.get("trigger_ms")]
    return {
        "observations_per_second": round(rate),
        "batches": len(batches),
        "batch_ms_median": statistics.median(durations) if durations else None,
        "batch_ms_max": max(durations) if durations else None,
        "observations_per_batch": batches[0]["observations"] if batches else None,
        "cpu_s": round(cpu, 1),
        "cpu_us_per_observation": round(cpu / total_obs * 1e6, 1),
        "stages_s": stages,
    }


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    ap = argparse.ArgumentParser(prog="python -m bench.scaling", description=__doc__.splitlines()[0])
    # The fleet's shape: each replica observed once a batch (a round is a batch).
    ap.add_argument("--replicas", type=int, default=100_000, help="distinct replicas in the fleet")
    ap.add_argument("--rounds", type=int, default=3, help="polling rounds in the topic")
    ap.add_argument("--workers", default="1,2", help="standalone cluster sizes to run, beside local[2]")
    ap.add_argument("--batch-observations", type=int, default=100_000, help="observations per micro-batch")
    ap.add_argument("--warm-runs", type=int, default=WARM_RUNS, help="warm drains after the cold one, per placement")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args(argv)
    if min(args.replicas, args.rounds, args.batch_observations, args.warm_runs) < 1:
        ap.error("--replicas, --rounds, --batch-observations and --warm-runs must be at least 1")
    print_header("isrwatch scale-out: local[2] vs a standalone cluster, same topic")
    fleet = Fleet(args.replicas)
    kafka = bkafka.start_cluster()
    rows = []
    try:
        topic = bkafka.new_topic(kafka, f"bench-scaling-{args.replicas}", partitions=TELEMETRY_PARTITIONS)
        n = 0
        for r in range(args.rounds):
            n += bkafka.produce(kafka, topic, fleet.round(r, START_MS + r * fleet.interval_ms))[0]
        total = args.replicas * args.rounds
        cap = max(1, args.batch_observations // fleet.per_record)
        print(
            f"replicas={args.replicas} rounds={args.rounds} observations={total} records={n} "
            f"telemetry_partitions={TELEMETRY_PARTITIONS} batch_observations={cap * fleet.per_record} "
            f"load_average={load_average()}",
            flush=True,
        )
        placements = [("local[2]", 0)] + [(f"standalone-{w}w", w) for w in (int(x) for x in args.workers.split(","))]
        for name, workers in placements:
            rows.append(run_placement(name, workers, kafka, topic, total, cap, args.replicas, args.warm_runs))
    finally:
        kafka.close()
    base = rows[0]["observations_per_second"] or 1
    for row in rows:
        print(f"  ratio {row['placement']} / local[2]: {row['observations_per_second'] / base:.2f}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return rows


if __name__ == "__main__":
    main()
