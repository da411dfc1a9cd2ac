"""``make bench-quick``: a reduced throughput comparison in under 5 minutes.

One fleet (20,000 replicas, 20 rounds: 400,000 observations) on a real local
Kafka, in the telemetry version the collector writes (``--telemetry-version N`` for
another); end to end (the job), the in-memory aggregation ceiling and the naive
design, in the same run (``bench.throughput.measure``). The job runs twice over the
same records: first in a JVM that has not run it yet (the figures as recorded since
issue 5), then again, warm, before the ceiling. The last line is::

    observations_per_second=N ceiling_ratio=R naive_ratio=Q warm_observations_per_second=W warm_ceiling_ratio=S warm_naive_ratio=V bound_ratio=B

(R: end to end over the ceiling, Q: end to end over the naive design; W, S, V: the
same for the second, warm pass; B: the warm job over the bound, the job's own Kafka read,
parse and a plain aggregation of the same records (``bench.read_bound``), each the median of
three runs alternated in the same Spark session).
"""

from __future__ import annotations

import argparse
import sys

from bench import kafka as bkafka
from bench.machine import print_header
from bench.throughput import measure
from isrwatch.telemetry import SUPPORTED_VERSIONS, VERSION

__all__ = ["main"]

REPLICAS = 20_000
ROUNDS = 20
BATCH_OBSERVATIONS = 100_000
NAIVE_BUDGET_S = 75.0
BOUND_RUNS = 3  # the warm job and the bound, alternated: medians of three each


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.quick", description=__doc__.splitlines()[0])
    ap.add_argument("--telemetry-version", type=int, default=VERSION, choices=sorted(SUPPORTED_VERSIONS))
    args = ap.parse_args(argv)
    print_header("isrwatch quick throughput comparison")
    from streaming.lifecycle.session import build_session

    spark = build_session("local[2]", 2, app_name="isrwatch-bench-quick")
    kafka = bkafka.start_cluster()
    try:
        r = measure(
            spark,
            kafka,
            REPLICAS,
            ROUNDS,
            batch_obs=BATCH_OBSERVATIONS,
            naive_batch_obs=BATCH_OBSERVATIONS,
            naive_budget_s=NAIVE_BUDGET_S,
            version=args.telemetry_version,
            warm_pass=True,
            bound_runs=BOUND_RUNS,
        )
    finally:
        kafka.close()
        spark.stop()
    sys.stdout.flush()
    print(
        f"observations_per_second={r.e2e:.0f} ceiling_ratio={r.ceiling_ratio:.2f} naive_ratio={r.naive_ratio:.1f} "
        f"warm_observations_per_second={r.warm_e2e:.0f} warm_ceiling_ratio={r.warm_ceiling_ratio:.2f} "
        f"warm_naive_ratio={r.warm_naive_ratio:.1f} bound_ratio={r.bound_ratio:.2f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
