"""Scale-out: the job on local[2] and on a Spark standalone cluster of 1 and 2 workers,
reading the same filled telemetry topic in the same run (docs/scaling.md).

For each placement: the real job (``bench.throughput.run_e2e``: Kafka source, one
pass per batch, state, outputs) drains the topic; printed are observations per
second, batch durations, the state's bytes per replica and the CPU seconds per
observation of every process of the placement (driver, Python workers, master,
workers, executors). On one 2-core machine more workers add JVMs, not cores: the
figures show what distribution costs and where the time goes, and docs/scaling.md
takes the per-replica costs from them for its sizing.

``python -m bench.scaling --replicas 20000 --rounds 15 --workers 1,2``
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
from bench.machine import cpu_seconds, load_average, print_header
from bench.throughput import START_MS, run_e2e

__all__ = ["main", "run_placement"]

TELEMETRY_PARTITIONS = 6


def run_placement(
    name: str, workers: int, kafka: Any, topic: str, total_obs: int, cap_records: int, replicas: int
) -> dict[str, Any]:
    """One placement: local[2] (``workers`` 0) or a standalone cluster of ``workers``."""
    from localspark import LocalSpark
    from streaming.session import build_session

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
        before = cpu_seconds(groups)
        rate, batches, memory, stages = run_e2e(spark, kafka, topic, total_obs, cap_records)
        cpu = cpu_seconds(groups) - before
    durations = [b["trigger_ms"] for b in batches[1:] if b.get("trigger_ms")]
    row = {
        "placement": name,
        "master": master,
        "observations_per_second": round(rate),
        "batches": len(batches),
        "batch_ms_median": statistics.median(durations) if durations else None,
        "batch_ms_max": max(durations) if durations else None,
        "observations_per_batch": batches[1]["observations"] if len(batches) > 1 else None,
        "cpu_s": round(cpu, 1),
        "cpu_us_per_observation": round(cpu / total_obs * 1e6, 1),
        "state_bytes_per_replica": round(memory.get("state_table_mb", 0.0) * 1024 * 1024 / replicas),
        "checkpoint_mb": memory.get("checkpoint_mb"),
        "driver_jvm_rss_mb": memory.get("driver_jvm_rss_mb"),
        "stages_s": stages,
    }
    print(
        f"  {name:<13} {row['observations_per_second']:>9,} obs/s  batch median {row['batch_ms_median']} ms "
        f"max {row['batch_ms_max']} ms  cpu {row['cpu_us_per_observation']} us/obs  "
        f"state {row['state_bytes_per_replica']} B/replica",
        flush=True,
    )
    return row


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    ap = argparse.ArgumentParser(prog="python -m bench.scaling", description=__doc__.splitlines()[0])
    ap.add_argument("--replicas", type=int, default=20_000, help="distinct replicas in the fleet")
    ap.add_argument("--rounds", type=int, default=15, help="polling rounds in the topic")
    ap.add_argument("--workers", default="1,2", help="standalone cluster sizes to run, beside local[2]")
    ap.add_argument("--batch-observations", type=int, default=100_000, help="observations per micro-batch")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args(argv)
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
            rows.append(run_placement(name, workers, kafka, topic, total, cap, args.replicas))
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
