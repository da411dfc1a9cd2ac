"""A/B of ``--state-writer``: the state topic's records by the executors or by the driver.

The job in Kafka mode drains the same backlog of whole rounds of ``bench.load.Fleet``
(each replica observed once per batch: the fleet's shape) with each setting in turn,
alternating, ``--runs`` times each. Per run, from the job's ``batch ...`` lines after the
first: the median batch, its Spark part, the state-topic write (``state_topic_ms``: the
executors' tasks, or the driver's produce calls), and the driver's Python (``batch_ms`` less
``spark_ms``, ``state_ms`` and ``state_topic_ms``: Arrow to statuses, the monitor, the store).
Ends with one line of the medians over the runs and their ratios.

``python -m bench.state_writer --replicas 100000 --rounds 6 --runs 3``
"""

from __future__ import annotations

import argparse
import statistics

from bench import kafka as bkafka
from bench.machine import load_average, print_header
from bench.refresh import backlog, drain

__all__ = ["main"]

WRITERS = ("driver", "executors")


def _median(batches: list[dict], field: str) -> float:
    return statistics.median(float(b.get(field, 0)) for b in batches)


def parts(batches: list[dict]) -> dict[str, float]:
    """Median milliseconds of a run's batches: whole, Spark, state-topic write, driver's Python."""
    python = [
        float(b["batch_ms"]) - float(b.get("spark_ms", 0)) - float(b.get("state_ms", 0))
        - float(b.get("state_topic_ms", 0))
        for b in batches
    ]  # fmt: skip
    return {
        "batch_ms": _median(batches, "batch_ms"),
        "spark_ms": _median(batches, "spark_ms"),
        "state_topic_ms": _median(batches, "state_topic_ms"),
        "driver_python_ms": statistics.median(python),
    }


def main(argv: list[str] | None = None) -> dict[str, dict[str, float]]:
    ap = argparse.ArgumentParser(prog="python -m bench.state_writer", description=__doc__.splitlines()[0])
    ap.add_argument("--replicas", type=int, default=100_000)
    ap.add_argument("--rounds", type=int, default=6, help="whole rounds of the fleet: one batch each")
    ap.add_argument("--runs", type=int, default=3, help="runs of each setting, alternating")
    args = ap.parse_args(argv)
    print_header("isrwatch --state-writer A/B")
    from streaming.lifecycle.session import build_session

    fleet, records = backlog(args.replicas, args.rounds)
    cap = -(-len(records) // args.rounds)  # one round a batch: each replica observed once
    spark = build_session("local[2]", 2, app_name="isrwatch-bench-state-writer")
    kafka = bkafka.start_cluster()
    runs: dict[str, list[dict[str, float]]] = {w: [] for w in WRITERS}
    try:
        for i in range(args.runs):
            for writer in WRITERS if i % 2 == 0 else WRITERS[::-1]:
                r = drain(spark, kafka, records, fleet.per_record, cap, 1, state_writer=writer)
                p = parts(r["batches"])
                runs[writer].append(p)
                seen = {b.get("state_writer") for b in r["batches"]}
                print(
                    f"run={i} state_writer={writer} wrote={','.join(sorted(map(str, seen)))} "
                    + " ".join(f"{k}={v:.0f}" for k, v in p.items())
                    + f" observations_per_second={r['rate']:.0f} load={load_average()}",
                    flush=True,
                )
    finally:
        kafka.close()
        spark.stop()
    med = {w: {k: statistics.median(p[k] for p in runs[w]) for k in runs[w][0]} for w in WRITERS}
    d, e = med["driver"], med["executors"]
    print(
        f"replicas={args.replicas} driver_python_ms_driver={d['driver_python_ms']:.0f} "
        f"driver_python_ms_executors={e['driver_python_ms']:.0f} "
        f"batch_ms_driver={d['batch_ms']:.0f} batch_ms_executors={e['batch_ms']:.0f} "
        f"state_topic_ms_driver={d['state_topic_ms']:.0f} state_topic_ms_executors={e['state_topic_ms']:.0f} "
        f"batch_ratio={e['batch_ms'] / d['batch_ms']:.2f}",
        flush=True,
    )
    return med


if __name__ == "__main__":
    main()
