"""The state table's deltas against a full version at every batch, at a fleet's shape.

A fleet of ``--replicas`` followers, each observed once per 20 s round, the round spread over
20 one-second batches (``bench.load.Fleet.round``'s slices): each batch observes a twentieth
of the replicas, as ``make bench-fleet``'s feed does when the job keeps up. Both layouts run
the job's own batch (``batch.evaluate_records`` with ``observed_only``, as the job runs a batch
that observes few of its replicas, then ``statewriter.write_batch_state``) on the same batches,
alternated batch by batch, each on its own state table started from the same full version:

* ``full``: a full version at every batch (``statetable.FULL_EVERY`` = 1: the job before the
  deltas, the replicas the batch did not observe written again as they were);
* ``delta``: the job as it is (a delta of the observed replicas, a full version every
  ``FULL_EVERY`` batches, the deltas since merged in).

Per layout, the medians over the batches after the first of: ``spark_s`` (the evaluation,
its read of the state included), ``state_s`` (the state table's write), ``batch_s`` (both),
and its mean ``batch_s`` over all the batches (the full versions' cost spread over the
deltas'). The last line: ``full_batch_s=A delta_batch_s=B ratio=B/A`` (means).

``python -m bench.state_deltas --replicas 200000 --batches 20``
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from typing import Any

from bench import baselines
from bench.load import Fleet
from bench.machine import print_header
from bench.throughput import START_MS

__all__ = ["main"]

ROUND_BATCHES = 20  # a round spread over this many one-second batches


def _raw(spark: Any, records: list[bytes], path: str) -> Any:
    raw = baselines.raw_frame(spark, baselines.raw_parquet(records, path)).cache()
    raw.count()
    return raw


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--replicas", type=int, default=200_000)
    ap.add_argument("--batches", type=int, default=20, help="batches after the first full round (default 20)")
    args = ap.parse_args(argv)
    if args.replicas < ROUND_BATCHES or args.batches < 2:
        ap.error(f"--replicas at least {ROUND_BATCHES}, --batches at least 2")
    print_header("isrwatch state table: deltas against a full version every batch")

    from isrwatch.rule import Rule, RuleConfig
    from isrwatch.status import Thresholds
    from streaming.evaluation import statetable
    from streaming.evaluation.batch import evaluate_records
    from streaming.lifecycle.session import build_session
    from streaming.sinks.statewriter import write_batch_state

    spark = build_session("local[2]", 2, app_name="isrwatch-bench-state-deltas")
    cfg = RuleConfig(Rule.KIP16_REFINED, 10_000, 4000)
    th = Thresholds(0.5, 0.8, 3000)
    fleet = Fleet(args.replicas)
    slice_n = -(-args.replicas // ROUND_BATCHES)
    base = tempfile.mkdtemp(prefix="bench-state-deltas-")
    full_every = statetable.FULL_EVERY
    layouts = {"full": 1, "delta": full_every}
    try:
        first = _raw(spark, fleet.round(0, START_MS), os.path.join(base, "raw0"))
        tables = {}
        for name in layouts:
            tables[name] = statetable.StateTable(spark, os.path.join(base, name))
            out = evaluate_records(first, 0, tables[name], cfg, th, future_tolerance_ms=None, max_gap_ms=5_000)
            write_batch_state(out, tables[name], 0)
        first.unpersist()
        runs: dict[str, list[tuple[float, float, bool]]] = {name: [] for name in layouts}
        for b in range(1, args.batches + 1):
            r, s = 1 + (b - 1) // ROUND_BATCHES, (b - 1) % ROUND_BATCHES
            t_ms = START_MS + r * fleet.interval_ms + s * (fleet.interval_ms // ROUND_BATCHES)
            records = fleet.round(r, t_ms, lo=s * slice_n, hi=(s + 1) * slice_n)
            raw = _raw(spark, records, os.path.join(base, f"raw{b}"))
            order = list(layouts) if b % 2 else list(reversed(layouts))
            for name in order:
                statetable.FULL_EVERY = layouts[name]
                out = evaluate_records(
                    raw, b, tables[name], cfg, th, future_tolerance_ms=None, max_gap_ms=5_000, observed_only=True
                )
                delta = out.carried is not None and out.carried.delta
                t0 = time.monotonic()
                write_batch_state(out, tables[name], b)
                runs[name].append((out.spark_s, time.monotonic() - t0, delta))
            raw.unpersist()
            print(
                f"batch {b}: observed={min(slice_n, args.replicas - s * slice_n)} "
                + " ".join(f"{n}_spark_s={runs[n][-1][0]:.2f} {n}_state_s={runs[n][-1][1]:.2f}" for n in layouts)
                + f" delta_wrote={'delta' if runs['delta'][-1][2] else 'full'}",
                flush=True,
            )
        statetable.FULL_EVERY = full_every
        means = {}
        for name, rows in runs.items():
            steady = rows[1:]
            spark_s = statistics.median(x[0] for x in steady)
            state_s = statistics.median(x[1] for x in steady)
            means[name] = statistics.mean(x[0] + x[1] for x in rows)
            kinds = "".join("d" if x[2] else "v" for x in rows)
            print(
                f"{name}: spark_s={spark_s:.3f} state_s={state_s:.3f} batch_s={spark_s + state_s:.3f} "
                f"mean_batch_s={means[name]:.3f} versions={kinds}"
            )
        print(
            f"full_batch_s={means['full']:.3f} delta_batch_s={means['delta']:.3f} "
            f"ratio={means['delta'] / means['full']:.2f}"
        )
    finally:
        statetable.FULL_EVERY = full_every
        spark.stop()
        shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
