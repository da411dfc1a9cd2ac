"""A large fleet at the job's trigger: does a batch take longer than the telemetry it covers?

``replicas`` followers, each observed every ``replicas / batch_observations``
seconds (1M every 5 s = 200,000 observations a second), written to a real
local Kafka in the telemetry version the collector writes; the real job
(``bench.throughput.run_e2e``) reads it at its 1 s trigger with the source
capped to one second of telemetry per batch. Per batch: its Spark part, the
state table's new version and the driver's part (the job's ``batch`` log
line); at the end: the driver's resident memory (now and its peak), the
Spark JVM's, and the state table on disk.

The fleet's own generator is dropped before the job starts and the driver's
memory is read before and after, so the driver's growth is the job's.
One fleet size per process (a process's peak memory is its whole life's):

``python -m bench.scale --replicas 1000000 [--shuffle-partitions 2] [--ok-refresh-batches 1]``
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
from pathlib import Path
from typing import Any

from bench import kafka as bkafka
from bench.load import Fleet, as_version
from bench.machine import load_average, print_header, rss_mb
from bench.throughput import START_MS, run_e2e
from isrwatch.telemetry import SUPPORTED_VERSIONS, VERSION

__all__ = ["scale", "main"]


def scale(
    spark: Any,
    kafka: Any,
    replicas: int,
    batch_obs: int = 200_000,
    batches: int = 7,
    trigger_s: float = 1.0,
    version: int = VERSION,
    **settings: Any,
) -> dict[str, Any]:
    """``replicas`` each observed every ``replicas / batch_obs`` seconds: the job at
    its ``trigger_s`` trigger with ``batch_obs`` observations a batch (the backlog
    is cut to that by the source's cap); ``settings``: the job's (``JobSettings``).
    Batch durations and their parts, memory, state size."""
    interval_ms = max(1, round(replicas * 1000 * trigger_s / batch_obs))
    fleet = Fleet(replicas, interval_ms=interval_ms)
    per_record = fleet.per_record
    total = (batches + 1) * batch_obs
    rounds = -(-total // replicas)
    topic = bkafka.new_topic(kafka, f"bench-scale-{replicas}")
    n = size = 0
    for r in range(rounds):  # round by round: a round of 1M observations is ~100-260 MB
        records = fleet.round(r, START_MS + r * interval_ms)
        if version != 1:
            records = [as_version(x, version) for x in records]
        got, nbytes = bkafka.produce(kafka, topic, records)
        n, size = n + got, size + nbytes
    del fleet, records
    gc.collect()
    cap = max(1, batch_obs // per_record)
    before = rss_mb()
    print(
        f"scale: replicas={replicas} observed every {interval_ms / 1000:g}s = {cap * per_record} obs per "
        f"{trigger_s:g}s batch; telemetry_version={version} records={n} mbytes={size / 1e6:.1f} "
        f"settings={settings} driver_rss_before_job_mb={before} load_average={load_average()}",
        flush=True,
    )
    _rate, batches_out, memory, stages = run_e2e(
        spark, kafka, topic, total, cap, trigger_s=trigger_s, batches=batches + 1, **settings
    )
    memory["driver_python_rss_before_job_mb"] = before
    # The kernel's per-thread RSS counters are folded in lazily, so VmHWM read now can trail a
    # VmRSS read a moment ago by a few hundred KiB; the peak is at least what was measured.
    memory["driver_python_peak_rss_mb"] = max(rss_mb(field="VmHWM"), memory["driver_python_rss_mb"])
    for b in batches_out:
        print(f"  batch {b}", flush=True)
    print(f"  memory: {memory}", flush=True)
    # Steady: from the batch in which the state holds the whole fleet (the first two: JVM warm-up).
    steady = batches_out[max(2, -(-replicas // (cap * per_record))) :] or batches_out[1:]
    worst = max(b["driver_ms"] for b in steady) / 1000
    print(
        f"  replicas={replicas} steady_batch_s_max={worst:.2f} covers_s={trigger_s:g} "
        f"keeps_up={'yes' if worst <= trigger_s else 'no'} driver_rss_mb={memory['driver_python_rss_mb']} "
        f"driver_peak_rss_mb={memory['driver_python_peak_rss_mb']}",
        flush=True,
    )
    return {
        "replicas": replicas,
        "batch_obs": cap * per_record,
        "trigger_s": trigger_s,
        "telemetry_version": version,
        "settings": settings,
        "batches": batches_out,
        "memory": memory,
        "stages": stages,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.scale", description=__doc__.splitlines()[0])
    ap.add_argument("--replicas", type=int, default=1_000_000, help="fleet size (default 1,000,000)")
    ap.add_argument("--batch-observations", type=int, default=200_000, help="observations a batch (a second)")
    ap.add_argument("--batches", type=int, default=7, help="batches after the first (default 7: at 1M, 3 steady)")
    ap.add_argument("--telemetry-version", type=int, default=VERSION, choices=sorted(SUPPORTED_VERSIONS))
    ap.add_argument("--shuffle-partitions", type=int, default=2, help="the job's --shuffle-partitions")
    ap.add_argument("--ok-refresh-batches", type=int, default=1, help="the job's --ok-refresh-batches")
    ap.add_argument("--json", help="write the result here")
    args = ap.parse_args(argv)
    if args.replicas < 1 or args.batch_observations < 1 or args.batches < 2:
        ap.error("--replicas and --batch-observations must be at least 1, --batches at least 2")
    header = print_header("isrwatch at scale")
    from streaming.lifecycle.session import build_session

    spark = build_session("local[2]", args.shuffle_partitions, app_name="isrwatch-bench-scale")
    kafka = bkafka.start_cluster()
    try:
        result = scale(
            spark,
            kafka,
            args.replicas,
            batch_obs=args.batch_observations,
            batches=args.batches,
            version=args.telemetry_version,
            shuffle_partitions=args.shuffle_partitions,
            ok_refresh_batches=args.ok_refresh_batches,
        )
    finally:
        kafka.close()
        spark.stop()
    if args.json:
        Path(args.json).write_text(json.dumps({"header": header, "scale": result}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
