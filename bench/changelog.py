"""A/B of RocksDB changelog checkpointing: end to end and the in-memory ceiling, off and on.

``bench.throughput.measure`` (no naive run) with
``spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled`` flipped
between runs in one process (the job sets it on; the runs here override it).

``python -m bench.changelog --replicas 50000 --rounds 12``
"""

from __future__ import annotations

import argparse

from bench import kafka as bkafka
from bench.machine import print_header
from bench.throughput import measure

__all__ = ["main"]

KEY = "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.changelog", description=__doc__.splitlines()[0])
    ap.add_argument("--replicas", type=int, default=50_000)
    ap.add_argument("--rounds", type=int, default=12)
    args = ap.parse_args(argv)
    print_header("isrwatch RocksDB changelog checkpointing A/B")
    from streaming.lifecycle.session import build_session

    spark = build_session("local[2]", 2, app_name="isrwatch-bench-changelog")
    kafka = bkafka.start_cluster()
    try:
        for on in (False, True, False, True):
            spark.conf.set(KEY, str(on).lower())
            r = measure(spark, kafka, args.replicas, args.rounds, batch_obs=100_000, naive=False)
            print(f"changelog={on} observations_per_second={r.e2e:.0f} ceiling={r.ceiling:.0f}", flush=True)
    finally:
        kafka.close()
        spark.stop()


if __name__ == "__main__":
    main()
