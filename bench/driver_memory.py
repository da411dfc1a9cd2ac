"""The driver's memory per replica tracked, and where it goes.

N ok follower replicas (the layout of ``bench.load.Fleet``) as the driver
receives them: an Arrow table of the driver's rows, read by
``streaming.driver.rows.statuses_from_arrow`` (so every value is the Python
object the job makes) into ``Monitor.apply_statuses`` with the exporter's
``StatusStore``, two batches (the second replaces every status, as a steady
batch does). Measured by ``tracemalloc`` in this process alone, no Spark: the
bytes still held after the batches, per replica, and the allocation sites
holding the most. docs/benchmarks.md, "A 1M-replica fleet on this design".

``python -m bench.driver_memory [--replicas 100000] [--top 12]``
"""

from __future__ import annotations

import argparse
import gc
import sys
import tracemalloc
from typing import Any

import pyarrow as pa

from bench.machine import print_header
from bench.throughput import START_MS

__all__ = ["measure", "main"]


def driver_rows(replicas: int, batch: int) -> pa.Table:
    """One batch of the driver's rows (``status_columns`` + ``EXTRA_COLUMNS``): every replica ok."""
    from bench.load import BROKERS, Fleet

    keys = Fleet(replicas).keys  # (topic, partition, follower) of each replica, as the benchmarks lay them out
    t = START_MS + batch * 1000
    ok = ["ok"] * replicas
    return pa.table(
        {
            "cluster": ["bench"] * replicas,
            "topic": [topic for topic, _, _ in keys],
            "partition": [partition for _, partition, _ in keys],
            "broker_id": [broker for _, _, broker in keys],
            "leader_id": [1 + (i // 2) % BROKERS for i in range(replicas)],  # Fleet's leader of the replica's partition
            "eval_ms": [t] * replicas,
            "state": ok,
            "time_since_caught_up_s": [(i % 1000) / 1000 for i in range(replicas)],
            "lag_ratio": [(i % 1000) / 10_000 for i in range(replicas)],
            "time_to_shrink_s": [10.0 - (i % 1000) / 1000 for i in range(replicas)],
            "offset_lag": [0] * replicas,
            "in_isr": [True] * replicas,
            "isr_size": [3] * replicas,
            "min_isr": [2] * replicas,
            "lag_time_max_ms": [10_000] * replicas,
            "shrink_window_start_ms": [t + 9_000 + i % 1000 for i in range(replicas)],
            "shrink_window_end_ms": [t + 10_000 + i % 1000 for i in range(replicas)],
            "lag_state": ok,
            "peak_lag_ratio": [(i % 1000) / 10_000 for i in range(replicas)],
            "out_of_sync_episodes": [0] * replicas,
            "last_t_ms": [t] * replicas,
            "observations": [batch + 1] * replicas,
            "prev_observed_ms": [None if batch == 0 else t - 1000] * replicas,
        }
    )


def measure(replicas: int, top: int = 12) -> dict[str, Any]:
    from exporter.store import StatusStore
    from isrwatch.rule import RuleConfig
    from isrwatch.status import Thresholds
    from streaming.driver.monitor import Monitor
    from streaming.driver.rows import statuses_from_arrow

    class NoSink:
        def send(self, transition: Any, now_ms: int) -> None:
            pass

    tables = [driver_rows(replicas, b) for b in range(2)]  # made before tracing: not the driver's
    monitor = Monitor(
        RuleConfig(lag_time_max_ms=10_000),
        Thresholds(),
        default_min_isr=2,
        stale_after_s=3600,
        store=StatusStore(),
        sinks=[NoSink()],
    )
    gc.collect()
    tracemalloc.start()
    for batch, table in enumerate(tables):
        monitor.apply_statuses(batch, statuses_from_arrow(table))
    gc.collect()
    snapshot = tracemalloc.take_snapshot()
    tracemalloc.stop()
    held = len(monitor.statuses)
    if held != replicas:
        raise RuntimeError(f"the monitor holds {held} of {replicas} replicas")
    stats = snapshot.statistics("lineno")
    total = sum(s.size for s in stats)
    sites = [
        (f"{'/'.join(s.traceback[0].filename.split('/')[-2:])}:{s.traceback[0].lineno}", s.size / replicas)
        for s in stats[:top]
    ]
    return {"replicas": replicas, "bytes_per_replica": total / replicas, "total_mb": total / 2**20, "sites": sites}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.driver_memory", description=__doc__.splitlines()[0])
    ap.add_argument("--replicas", type=int, default=100_000, help="ok replicas tracked (default 100,000)")
    ap.add_argument("--top", type=int, default=12, help="allocation sites to print")
    args = ap.parse_args(argv)
    if args.replicas < 2 or args.top < 1:
        ap.error("--replicas must be at least 2 and --top at least 1")
    print_header("isrwatch driver memory per replica")
    out = measure(args.replicas, args.top)
    for site, per in out["sites"]:
        print(f"  {per:8.0f} B/replica  {site}")
    print(f"replicas={out['replicas']} bytes_per_replica={out['bytes_per_replica']:.0f} total_mb={out['total_mb']:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
