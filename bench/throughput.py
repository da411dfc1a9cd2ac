"""Throughput: observations per second, end to end, beside three baselines.

For each fleet size (distinct replicas) the telemetry topic on a real local
Kafka is filled with whole polling rounds (``bench.load.Fleet``), then read
in the same run by:

* ``e2e``: the real job (``streaming.lifecycle.job.run``, Kafka mode): its one query,
  the isrwatch-kafka source -> one parse -> the state carried from the last
  batch and every observation, evaluated per replica (``streaming.evaluation.batch``) ->
  the state table, the driver's changes, the state and alerts topics. Rate:
  observations the driver reports per batch, over the wall time between the
  end of the first batch (start-up) and the end of the last;
* ``ceiling``: Spark's own aggregation of the same observation rows already
  in memory: ``streaming.evaluation.state.replica_aggregates`` (the two-query job's
  aggregation) as a streaming query with RocksDB state in update mode, same
  batch size, reading the rows pre-parsed into Parquet on /dev/shm (memory),
  to a no-op sink;
* ``input``: a plain confluent-kafka consumer reading the same topic;
* ``naive``: ``bench.naive`` (transformWithStateInPandas) over the same topic.

``python -m bench.throughput --replicas 10000,100000 --rounds 60,10``
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import shutil
import statistics
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from bench import kafka as bkafka
from bench.baselines import progress_of, run_ceiling, run_naive
from bench.load import Fleet, as_version
from bench.machine import dir_mb, load_average, print_header, rss_mb
from isrwatch.telemetry import VERSION

__all__ = [
    "BatchLog",
    "Result",
    "measure",
    "run_e2e",
    "main",
    "START_MS",
]

log = logging.getLogger(__name__)

START_MS = 1_767_225_600_000  # 2026-01-01: telemetry time, not the wall clock
_KV = re.compile(r"(\w+)=(\S+)")


@dataclass
class Result:
    replicas: int
    observations: int
    records: int
    mbytes: float
    e2e: float = 0.0
    ceiling: float = 0.0
    input: float = 0.0
    naive: float = 0.0
    naive_observations: int = 0
    # The job's second pass over the same records in the same JVM (``measure(warm_pass=True)``;
    # 0: not run): its rate once the JIT has compiled the job's code, as an always-on job runs.
    warm_e2e: float = 0.0
    # ``measure(bound_runs=N)``: the job's warm passes and the bound's runs (read + parse + a
    # plain aggregation of the same records, ``bench.read_bound.bound_rate``), alternated in
    # the same Spark session; their medians give ``bound_ratio``.
    warm_runs: list[float] = field(default_factory=list)
    bound_runs: list[float] = field(default_factory=list)
    batches: list[dict[str, Any]] = field(default_factory=list)
    memory: dict[str, float] = field(default_factory=dict)
    stages: dict[str, float] = field(default_factory=dict)

    @property
    def ceiling_ratio(self) -> float:
        return self.e2e / self.ceiling if self.ceiling else 0.0

    @property
    def naive_ratio(self) -> float:
        return self.e2e / self.naive if self.naive else 0.0

    @property
    def warm_ceiling_ratio(self) -> float:
        return self.warm_e2e / self.ceiling if self.ceiling else 0.0

    @property
    def warm_naive_ratio(self) -> float:
        return self.warm_e2e / self.naive if self.naive else 0.0

    @property
    def bound_ratio(self) -> float:
        """The warm job over the bound, each the median of its alternated runs (0: not run)."""
        if not self.warm_runs or not self.bound_runs:
            return 0.0
        return statistics.median(self.warm_runs) / statistics.median(self.bound_runs)


class BatchLog(logging.Handler):
    """Collects the job's ``batch ...`` INFO lines (the ``streaming.job`` logger): for each,
    (perf_counter when logged, its key=value fields)."""

    def __init__(self) -> None:
        super().__init__()
        self.batches: list[tuple[float, dict[str, str]]] = []
        self.done = threading.Condition()

    def emit(self, record: logging.LogRecord) -> None:
        msg = record.getMessage()
        if not msg.startswith("batch "):
            return
        fields = dict(_KV.findall(msg))
        with self.done:
            self.batches.append((time.perf_counter(), fields))
            self.done.notify_all()

    def observations(self) -> int:
        return sum(int(f.get("observations", 0)) for _, f in self.batches)

    def __enter__(self) -> BatchLog:
        jlog = logging.getLogger("streaming.job")
        self._old_level = jlog.level
        jlog.setLevel(logging.INFO)
        jlog.addHandler(self)
        return self

    def __exit__(self, *exc: object) -> None:
        jlog = logging.getLogger("streaming.job")
        jlog.removeHandler(self)
        jlog.setLevel(self._old_level)


def _jvm_pid(spark: Any) -> int:
    return int(spark._jvm.java.lang.ProcessHandle.current().pid())


def job_settings(kafka: Any, topic: str, checkpoint: str, cap_records: int, trigger_s: float, **extra: Any) -> Any:
    from localkafka import COMPAT_CONFIG
    from streaming.settings import JobSettings

    # A backlog drained in long batches is not a telemetry gap: no IsrwatchTelemetryStale noise.
    extra.setdefault("stale_after_seconds", 3600.0)
    extra.setdefault("metrics_port", 0)  # the job's own /metrics is not what is measured here
    return JobSettings(
        bootstrap_servers=kafka.bootstrap_servers,
        kafka_config=[f"{k}={v}" for k, v in COMPAT_CONFIG.items()],
        telemetry_topic=topic,
        state_topic=f"{topic}-state",
        alerts_topic=f"{topic}-alerts",
        deadletter_topic=f"{topic}-deadletter",
        starting_offsets="earliest",
        max_records_per_trigger=cap_records,
        checkpoint_dir=checkpoint,
        trigger_seconds=trigger_s,
        lag_time_max_ms=10_000,
        **extra,
    )


def run_e2e(
    spark: Any,
    kafka: Any,
    topic: str,
    total_obs: int,
    cap_records: int,
    trigger_s: float = 0.001,
    timeout_s: float = 900,
    batches: int | None = None,
    **extra: Any,
) -> tuple[float, list[dict[str, Any]], dict[str, float], dict[str, float]]:
    """The real job over the filled topic, with ``extra`` settings (``JobSettings``) beside
    the benchmark's own, until the driver reports ``total_obs`` observations or, given,
    ``batches`` batches have run (with ``ok_refresh_batches`` > 1 the driver counts a
    replica's observations only when it is next refreshed). Returns (obs/s, batches,
    memory, stages)."""
    from streaming.lifecycle import job
    from streaming.lifecycle.query import JOB_QUERY

    checkpoint = tempfile.mkdtemp(prefix="bench-e2e-")
    settings = job_settings(kafka, topic, checkpoint, cap_records, trigger_s, **extra)
    handler = BatchLog().__enter__()
    stop = threading.Event()
    handles = job.JobHandles()
    errors: list[BaseException] = []

    def target() -> None:
        try:
            job.run(settings, spark=spark, handles=handles, stop_event=stop)
        except BaseException as e:
            errors.append(e)

    th = threading.Thread(target=target, name="bench-job", daemon=True)
    memory: dict[str, float] = {}
    progress: dict[str, list[dict[str, Any]]] = {}
    try:
        th.start()
        deadline = time.monotonic() + timeout_s

        def done() -> bool:
            return handler.observations() >= total_obs or (batches is not None and len(handler.batches) >= batches)

        with handler.done:
            while not done() and not errors and time.monotonic() < deadline:
                handler.done.wait(1.0)
        if errors:
            raise RuntimeError(f"job failed: {errors[0]}") from errors[0]
        if not done():
            raise RuntimeError(f"job saw {handler.observations()} of {total_obs} observations in {timeout_s}s")
        last_id = max(int(f.get("batch_id", -1)) for _, f in handler.batches)
        wait_until = time.monotonic() + 20
        while time.monotonic() < wait_until:  # a batch's progress is posted after its foreachBatch returns
            for q in spark.streams.active:
                progress[q.name] = progress_of(q)
            agg_ids = [p.get("batchId", -1) for p in progress.get(JOB_QUERY, [])]
            if agg_ids and max(agg_ids) >= last_id:
                break
            time.sleep(0.2)
        memory = {
            "driver_python_rss_mb": rss_mb(),
            "driver_jvm_rss_mb": rss_mb(_jvm_pid(spark)),
            "state_table_mb": dir_mb(os.path.join(checkpoint, "replicas")),
            "checkpoint_mb": dir_mb(checkpoint),
        }
    finally:
        stop.set()
        th.join(timeout=300)
        handler.__exit__()
        shutil.rmtree(checkpoint, ignore_errors=True)
    b = [(t, int(f.get("observations", 0)), int(f.get("batch_ms", 0))) for t, f in handler.batches]
    parts = [{k: int(f.get(k, 0)) for k in ("replicas", "spark_ms", "state_ms")} for _, f in handler.batches]
    ids = [int(f.get("batch_id", -1)) for _, f in handler.batches]
    if len(b) < 2:
        raise RuntimeError("need at least two batches to time; lower the per-batch cap")
    rate = sum(x[1] for x in b[1:]) / (b[-1][0] - b[0][0])
    agg = {p.get("batchId"): p for p in progress.get(JOB_QUERY, [])}
    batches = []
    for x, i, part in zip(b, ids, parts, strict=True):
        p = agg.get(i, {})
        d = p.get("durationMs") or {}
        batches.append(
            {
                "batch_id": i,
                "observations": x[1],
                "driver_ms": x[2],  # the whole foreachBatch: Spark part, state write, the driver's own
                "spark_ms": part["spark_ms"],
                "state_ms": part["state_ms"],
                "python_ms": x[2] - part["spark_ms"] - part["state_ms"],
                "replicas": part["replicas"],
                "trigger_ms": d.get("triggerExecution"),
                "add_batch_ms": d.get("addBatch"),
            }
        )
    stages = _stages(progress, b)
    return rate, batches, memory, stages


def _stages(progress: dict[str, list[dict[str, Any]]], b: list[tuple[float, int, int]]) -> dict[str, float]:
    """Where the time goes, summed over the batches after the first, in seconds."""
    from streaming.lifecycle.query import JOB_QUERY

    out: dict[str, float] = {"wall": b[-1][0] - b[0][0], "driver_evaluation": sum(x[2] for x in b[1:]) / 1000}
    for name, key in ((JOB_QUERY, "job"),):
        ps = progress.get(name, [])[1:]
        for d in (
            "triggerExecution",
            "addBatch",
            "latestOffset",
            "getBatch",
            "queryPlanning",
            "walCommit",
            "commitOffsets",
        ):
            out[f"{key}.{d}"] = round(sum((p.get("durationMs") or {}).get(d, 0) for p in ps) / 1000, 2)
    return out


def measure(
    spark: Any,
    kafka: Any,
    replicas: int,
    rounds: int,
    *,
    batch_obs: int = 1_000_000,
    naive_batch_obs: int = 100_000,
    naive_budget_s: float = 60.0,
    naive: bool = True,
    version: int = VERSION,
    warm_pass: bool = False,
    bound_runs: int = 0,
) -> Result:
    """The job, the ceiling and the naive design on one fleet's records in telemetry
    ``version`` (default: what the collector writes).

    The job runs first, in a JVM that has run nothing of it yet: its first batches are
    slow while the JIT compiles the job's code (docs/benchmarks.md, "The first batches"),
    and the ceiling, measured after it, runs warm. ``warm_pass``: run the job a second
    time over the same records (a new checkpoint, so the same batches), before the
    ceiling, and report that rate too (``warm_e2e``): both sides warm, as an always-on
    job runs. ``e2e`` and its ratios stay the first pass's. ``bound_runs`` N (with
    ``warm_pass``): N runs of the bound (``bench.read_bound.bound_rate``, after one to warm
    it) alternated with N warm passes of the job (``bound_ratio``)."""
    fleet = Fleet(replicas)
    records: list[bytes] = []
    for r in range(rounds):
        records += fleet.round(r, START_MS + r * fleet.interval_ms)
    if version != 1:
        records = [as_version(x, version) for x in records]
    topic = bkafka.new_topic(kafka, f"bench-{replicas}")
    n, size = bkafka.produce(kafka, topic, records)
    res = Result(replicas, replicas * rounds, n, round(size / 1e6, 1))
    per = fleet.per_record
    cap = max(1, min(batch_obs, res.observations // 3) // per)  # at least 3 batches: the first is start-up
    print(
        f"replicas={replicas} rounds={rounds} observations={res.observations} records={n} telemetry_version={version} "
        f"mbytes={res.mbytes} batch_observations={cap * per} load_average={load_average()}",
        flush=True,
    )
    got, got_bytes, secs = bkafka.consume_all(kafka, topic, n)
    res.input = got * per / secs if secs else 0.0
    print(f"  input ceiling (plain consumer): {res.input:,.0f} obs/s ({got_bytes / 1e6 / secs:,.0f} MB/s)", flush=True)
    res.e2e, res.batches, res.memory, res.stages = run_e2e(spark, kafka, topic, res.observations, cap)
    print(f"  end to end (the job):           {res.e2e:,.0f} obs/s over {len(res.batches)} batches", flush=True)
    print(f"    memory: {res.memory}", flush=True)
    print(f"    stages (s): {res.stages}", flush=True)
    print(f"    batches (s): {_batch_seconds(res.batches)}", flush=True)
    if warm_pass:
        res.warm_e2e, warm_batches, _, _ = run_e2e(spark, kafka, topic, res.observations, cap)
        print(
            f"  end to end, second pass (warm): {res.warm_e2e:,.0f} obs/s over {len(warm_batches)} batches",
            flush=True,
        )
        print(f"    batches (s): {_batch_seconds(warm_batches)}", flush=True)
        if bound_runs:
            _alternate_with_bound(res, spark, kafka, topic, cap, per, version, bound_runs)
    res.ceiling = run_ceiling(spark, records, cap)
    print(f"  in-memory aggregation ceiling:  {res.ceiling:,.0f} obs/s", flush=True)
    if naive:
        res.naive, res.naive_observations = run_naive(
            spark, kafka, topic, max(1, min(cap * per, naive_batch_obs) // per), per, naive_budget_s, version
        )
        bound = "< " if not res.naive_observations else ""
        print(
            f"  naive (transformWithStateInPandas): {bound}{res.naive:,.0f} obs/s over {res.naive_observations} "
            "observations",
            flush=True,
        )
    print(
        f"  replicas={replicas} observations_per_second={res.e2e:.0f} ceiling_ratio={res.ceiling_ratio:.2f} "
        f"naive_ratio={res.naive_ratio:.1f} input_ratio={res.e2e / res.input if res.input else 0:.2f}",
        flush=True,
    )
    if warm_pass:
        print(
            f"  replicas={replicas} warm_observations_per_second={res.warm_e2e:.0f} "
            f"warm_ceiling_ratio={res.warm_ceiling_ratio:.2f} warm_naive_ratio={res.warm_naive_ratio:.1f}",
            flush=True,
        )
    return res


def _alternate_with_bound(
    res: Result, spark: Any, kafka: Any, topic: str, cap: int, per: int, version: int, runs: int
) -> None:
    """The job's warm pass (``res.warm_e2e``, the first), then the bound, the job, the bound...
    ``runs`` of each: a slower stretch of a noisy machine falls on both alike."""
    from bench.read_bound import bound_rate

    bound_rate(spark, kafka, topic, cap, per, version)  # its first run in this JVM: not kept
    res.warm_runs = [res.warm_e2e]
    for i in range(runs):
        res.bound_runs.append(bound_rate(spark, kafka, topic, cap, per, version))
        print(f"  bound (read + parse + aggregate), run {i + 1}: {res.bound_runs[-1]:,.0f} obs/s", flush=True)
        if len(res.warm_runs) < runs:
            res.warm_runs.append(run_e2e(spark, kafka, topic, res.observations, cap)[0])
            print(f"  end to end (warm), run {len(res.warm_runs)}: {res.warm_runs[-1]:,.0f} obs/s", flush=True)
    print(
        f"  bound_ratio={res.bound_ratio:.2f} (median warm job {statistics.median(res.warm_runs):,.0f} obs/s over "
        f"median bound {statistics.median(res.bound_runs):,.0f} obs/s, {runs} alternated runs each)",
        flush=True,
    )


def _batch_seconds(batches: list[dict[str, Any]]) -> list[float]:
    """Each batch's foreachBatch time, in seconds, in order: where the warm-up shows."""
    return [round(b["driver_ms"] / 1000, 1) for b in batches]


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def main(argv: list[str] | None = None) -> list[Result]:
    ap = argparse.ArgumentParser(prog="python -m bench.throughput", description=__doc__.splitlines()[0])
    ap.add_argument("--replicas", default="10000,100000,1000000", help="fleet sizes (comma-separated)")
    ap.add_argument("--rounds", default="100,20,3", help="polling rounds per size (comma-separated)")
    ap.add_argument("--batch-observations", type=int, default=1_000_000, help="observations per micro-batch")
    ap.add_argument("--naive-batch-observations", type=int, default=100_000, help="observations per naive micro-batch")
    ap.add_argument("--naive-budget", type=float, default=180.0, help="seconds for the naive design per size")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args(argv)
    print_header("isrwatch throughput: end to end vs in-memory ceiling, input ceiling, naive design")
    from streaming.lifecycle.session import build_session

    sizes, rounds = _ints(args.replicas), _ints(args.rounds)
    results = []
    spark = build_session("local[2]", 2, app_name="isrwatch-bench")
    kafka = bkafka.start_cluster()
    try:
        for replicas, r in zip(sizes, rounds, strict=True):
            results.append(
                measure(spark, kafka, replicas, r, batch_obs=args.batch_observations, naive_budget_s=args.naive_budget)
            )
    finally:
        kafka.close()
        spark.stop()
    if args.json:
        with open(args.json, "w") as f:
            json.dump([r.__dict__ for r in results], f, indent=1, default=str)
    return results


if __name__ == "__main__":
    main()
