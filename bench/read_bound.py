"""How close to the in-memory ceiling any job reading the telemetry from Kafka can come.

``make bench-quick``'s ``ceiling_ratio`` compares the job with Spark's own aggregation of
observation rows already parsed and held in memory (``bench.baselines.run_ceiling``). The
job must also read the records from Kafka and parse them. This runs, in one Spark session
over the same records, side by side:

* ``ceiling``: ``run_ceiling``, as ``make bench-quick`` measures it;
* ``read``: the job's Kafka source (``isrwatch-kafka``, the options ``streaming.sources.source``
  gives it) to a no-op sink: the read alone;
* ``read_parse``: the same, parsed and exploded to observations as the job does
  (``streaming.evaluation.parse``), to a no-op sink;
* ``read_parse_aggregate``: the ceiling's own query (``streaming.evaluation.state.replica_aggregates``,
  its RocksDB state, a no-op sink) over those observations: the ceiling's work behind the
  job's read and parse, and no more.

The last one's rate over the ceiling's is the most a job reading this way can score on
``ceiling_ratio`` while its evaluation costs at least a plain aggregation (the job's
evaluation at every observation needs each replica's rows in order: more). Each query
runs twice on fresh checkpoints, the first warming the JIT; the second is printed.

    .venv/bin/python -m bench.read_bound [--replicas 20000] [--rounds 20]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass, field
from typing import Any

from bench import kafka as bkafka
from bench.baselines import progress_of, run_ceiling
from bench.load import Fleet, as_version
from bench.machine import print_header
from bench.throughput import START_MS
from isrwatch.telemetry import VERSION

__all__ = ["Bound", "Run", "bound_rate", "drain", "main", "measure"]

BATCH_OBSERVATIONS = 100_000


@dataclass
class Run:
    """One query drained: records read, their rate, the state rows it ended with."""

    records: int = 0
    records_per_s: float = 0.0
    state_rows: int = 0


def drain(frame: Any, checkpoint: str, name: str) -> Run:
    """Drain the topic through ``frame`` to a no-op sink: the records read (the source's input
    rows), their rate over the trigger time of the batches after the first, and the state's
    rows at the end (a stateful query's)."""
    q = (
        frame.writeStream.queryName(name)
        .outputMode("update")
        .format("noop")
        .option("checkpointLocation", checkpoint)
        .trigger(processingTime="0 seconds")
        .start()
    )
    try:
        q.processAllAvailable()
        ps = [p for p in progress_of(q) if p.get("numInputRows")]
    finally:
        q.stop()
    steady = ps[1:]
    secs = sum(p["durationMs"]["triggerExecution"] for p in steady) / 1000
    ops = ps[-1].get("stateOperators") if ps else None
    return Run(
        records=sum(p["numInputRows"] for p in ps),
        records_per_s=sum(p["numInputRows"] for p in steady) / secs if secs else 0.0,
        state_rows=int(ops[0]["numRowsTotal"]) if ops else 0,
    )


@dataclass
class Bound:
    """Observations per second of each query, the ceiling's, and the runs behind them."""

    per_record: int
    runs: dict[str, Run] = field(default_factory=dict)
    ceiling: float = 0.0

    def rate(self, name: str) -> float:
        return self.runs[name].records_per_s * self.per_record

    @property
    def ratio(self) -> float:
        """``read_parse_aggregate`` over the ceiling: the most ``ceiling_ratio`` a job reading
        and parsing this way can score while it does at least an aggregation's work."""
        return self.rate("read_parse_aggregate") / self.ceiling if self.ceiling else 0.0


def _queries(spark: Any, kafka: Any, topic: str, cap: int, version: int) -> dict[str, Any]:
    """The three queries over ``topic`` read ``cap`` records a batch, by name: each a function
    of its checkpoint directory."""
    from pyspark.sql import functions as F

    from isrwatch.rule import Rule
    from streaming.evaluation import parse, state

    def raw(checkpoint: str) -> Any:
        return bkafka.job_source(spark, kafka, topic, cap, os.path.join(checkpoint, "source"))

    def observations(checkpoint: str) -> Any:
        # only the version's own branch: a stream read once (each branch would read it again)
        rows = parse.observations(parse.parse_records(raw(checkpoint)), None, versions=(version,))
        return parse.good_observations(rows)

    return {
        "read": lambda c: raw(c).select(F.col("value")),
        "read_parse": observations,
        "read_parse_aggregate": lambda c: state.replica_aggregates(observations(c), Rule.KIP16_REFINED),
    }


def bound_rate(spark: Any, kafka: Any, topic: str, cap: int, per_record: int, version: int = VERSION) -> float:
    """Observations per second of ``read_parse_aggregate`` over ``topic`` (``cap`` records a
    batch, ``per_record`` observations each), one run on a fresh checkpoint: the bound
    ``make bench-quick`` sets the job against in the job's own Spark session (``bound_ratio``)."""
    base = tempfile.mkdtemp(prefix="bench-bound-")
    try:
        make = _queries(spark, kafka, topic, cap, version)["read_parse_aggregate"]
        return drain(make(base), base, "bound").records_per_s * per_record
    finally:
        shutil.rmtree(base, ignore_errors=True)


def measure(spark: Any, kafka: Any, replicas: int, rounds: int, batch_obs: int = BATCH_OBSERVATIONS) -> Bound:
    """The three queries (each twice, the second kept) and the ceiling over one fleet's
    records in the collector's telemetry version, on ``kafka``."""
    fleet = Fleet(replicas)
    records: list[bytes] = []
    for r in range(rounds):
        records += [as_version(x, VERSION) for x in fleet.round(r, START_MS + r * fleet.interval_ms)]
    per = fleet.per_record
    cap = max(1, batch_obs // per)
    base = tempfile.mkdtemp(prefix="bench-read-bound-")
    try:
        topic = bkafka.new_topic(kafka, "bound")
        n, size = bkafka.produce(kafka, topic, records)
        print(
            f"replicas={replicas} rounds={rounds} observations={replicas * rounds} records={n} "
            f"telemetry_version={VERSION} mbytes={size / 1e6:.1f} batch_observations={cap * per}",
            flush=True,
        )
        bound = Bound(per)
        for name, make in _queries(spark, kafka, topic, cap, VERSION).items():
            for attempt in (0, 1):  # the first warms the JIT
                checkpoint = os.path.join(base, f"{name}-{attempt}")
                bound.runs[name] = drain(make(checkpoint), checkpoint, f"bound_{name}")
            print(f"  {name}: {bound.rate(name):,.0f} obs/s", flush=True)
        bound.ceiling = run_ceiling(spark, records, cap)
        print(f"  ceiling (in memory, as make bench-quick): {bound.ceiling:,.0f} obs/s", flush=True)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return bound


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.read_bound", description=__doc__.splitlines()[0])
    ap.add_argument("--replicas", type=int, default=20_000)
    ap.add_argument("--rounds", type=int, default=20)
    args = ap.parse_args(argv)
    print_header("isrwatch: the in-memory ceiling against the job's own read and parse")
    from streaming.lifecycle.session import build_session

    spark = build_session("local[2]", 2, app_name="isrwatch-bench-read-bound")
    kafka = bkafka.start_cluster()
    try:
        b = measure(spark, kafka, args.replicas, args.rounds)
    finally:
        kafka.close()
        spark.stop()
    print(
        f"read_obs_per_s={b.rate('read'):.0f} read_parse_obs_per_s={b.rate('read_parse'):.0f} "
        f"read_parse_aggregate_obs_per_s={b.rate('read_parse_aggregate'):.0f} ceiling_obs_per_s={b.ceiling:.0f} "
        f"bound_ceiling_ratio={b.ratio:.2f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
