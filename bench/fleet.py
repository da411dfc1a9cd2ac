"""``make bench-fleet``: the job against a live feed at a fleet's shape, 100k and 1M replicas.

A collector polls each replica once per round; a fleet's collectors spread their rounds, so
the telemetry topic receives a steady stream in which each replica appears about once per
20 s round (``ROUND_S``): 1M replicas give 50,000 observations a second, each replica at
most once in a 1 s batch. 0.1 % of the replicas (``NOT_OK_EVERY``) fall behind from the
second round on (they fetch at half their leader's pace: Nearing, then OutOfSync), the rest
stay caught up. The feed is built before it starts (``bench.load.Fleet``, in the
collector's telemetry version) by a separate process, which then only sends each second's
slice at its second, so the feed's own CPU is not the job's; the job (``streaming.lifecycle.job.run``,
its defaults: 1 s trigger, but ``--driver-replicas``: ``make bench-fleet`` gives ``not-ok``, the
fleet's setting) runs in this process, which is its driver.

Per fleet size, from the batches that end after the first round (the state holds the whole fleet
from then on; the first batches are the JVM's warm-up):

* ``driver_s``: the driver's own seconds per batch (median): a batch's wall time less its
  Spark part, its state-topic write and its state-table write (the job's ``batch`` line:
  ``batch_ms - spark_ms - state_topic_ms - state_ms``), i.e. the driver's Python;
* ``kept_up``: whether the job kept pace with the feed: at least two batches ended after the
  first round, no batch failed (``query_restarting``), and its telemetry lag (``telemetry_lag_s``,
  wall clock less the newest telemetry it had evaluated) did not grow from the first of them to
  the last by more than ``KEPT_UP_SLACK_S``; printed beside the sum of batch times over the
  telemetry they covered. After the feed's end the job has ``DRAIN_S`` to reach its last slice;
* ``driver_growth_mb``: the driver's resident memory at the end less before the feed.

A size whose process fails (the job's JVM out of memory, say) measures nothing and counts as
not kept up; the reason (``failure_reason``) is printed and the other runs go on.

One fleet size per process (a process's peak memory is its whole life's). The last line::

    driver_s_100k=A driver_s_1m=B driver_growth_mb_1m=C kept_up_1m_every_20s=yes|no

(issue 53's targets: B <= 1.5 x A, B < 0.5, C <= 200, yes), each the median of ``--runs``
alternated runs (100k, 1M, 100k, 1M, ...). ``python -m bench.fleet --replicas N`` runs one size.
"""

from __future__ import annotations

import argparse
import json
import logging
import multiprocessing as mp
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench import kafka as bkafka
from bench.load import Fleet, as_version
from bench.machine import load_average, median_of_measured, print_header, rss_mb
from bench.throughput import BatchLog, job_settings
from isrwatch.telemetry import SUPPORTED_VERSIONS, VERSION
from streaming.settings import DRIVER_REPLICAS

__all__ = ["run_size", "main", "failure_reason", "failed"]

ROUND_S = 20  # each replica observed once per round
SLICE_S = 1.0  # the feed sends a slice of the round every second
ROUNDS = 4  # the first: the state fills and the JVM warms; the other three are measured
NOT_OK_EVERY = 1000  # 0.1 % of the replicas fall behind
KEPT_UP_SLACK_S = 5.0
DRAIN_S = 120.0  # after the feed's end, how long the job may take to evaluate its last slice
SIZES = (100_000, 1_000_000)
LAG_TIME_MAX_MS = 10_000


def _feed(
    producer_config: dict[str, Any],
    topic: str,
    replicas: int,
    version: int,
    conn: Any,
    not_ok_every: int = NOT_OK_EVERY,
    rounds: int = ROUNDS,
) -> None:
    """The feeder process: builds every slice of every round, says when the first is due
    (``t0``), sends each slice at its second; reports how late it ran."""
    from confluent_kafka import Producer

    fleet = Fleet(replicas, interval_ms=ROUND_S * 1000, lag_time_max_ms=LAG_TIME_MAX_MS)
    slow = {i: 1 for i in range(0, replicas, not_ok_every)}
    slices = int(ROUND_S / SLICE_S)
    per_slice = -(-replicas // slices)

    def build(k: int, t0: float) -> list[bytes]:
        r, s = divmod(k, slices)
        records = fleet.round(r, int((t0 + k * SLICE_S) * 1000), slow, lo=s * per_slice, hi=(s + 1) * per_slice)
        return records if version == 1 else [as_version(x, version) for x in records]

    started = time.monotonic()
    build(0, time.time())
    per = time.monotonic() - started
    total = rounds * slices
    t0 = time.time() + per * total * 1.5 + 10  # room to build them all before the first is due
    feed = [build(k, t0) for k in range(total)]
    conn.send(
        {"t0": t0, "build_s": round(time.monotonic() - started, 1), "bytes": sum(len(x) for s in feed for x in s)}
    )
    producer = Producer(producer_config)
    late = 0.0
    for k, records in enumerate(feed):
        due = t0 + k * SLICE_S
        wait = due - time.time()
        if wait > 0:
            time.sleep(wait)
        late = max(late, time.time() - due)
        for x in records:
            producer.produce(topic, x)
        producer.poll(0)
    left = producer.flush(60)
    conn.send({"late_s": round(late, 2), "unsent": left, "slices": total})


def _reached(log: BatchLog, t: float, wall0: float) -> bool:
    """Whether a batch of the job has evaluated telemetry of time ``t`` (its newest: the batch
    line's wall clock less its ``telemetry_lag_s``)."""
    return any(wall0 + at - float(f.get("telemetry_lag_s", 0.0)) >= t - 0.5 for at, f in log.batches[-3:])


class _Restarts(logging.Handler):
    """Counts the job's ``query_restarting`` lines: a batch that failed (the ``streaming.job`` logger)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage().startswith("query_restarting"):
            self.count += 1


def run_size(
    replicas: int,
    version: int = VERSION,
    driver_replicas: str = "all",
    not_ok_every: int = NOT_OK_EVERY,
    rounds: int = ROUNDS,
    ok_refresh_batches: int = 1,
) -> dict[str, Any]:
    """One fleet size: the job against the live feed; its batches and the figures above.
    ``not_ok_every``: one replica in this many falls behind (10: an incident's 10 %);
    ``rounds``: the feed's length in rounds (an incident's replicas are not ok from the third on)."""
    from streaming.lifecycle import job
    from streaming.lifecycle.session import build_session
    from streaming.settings import JobSettings

    spark = build_session("local[2]", 2, app_name="isrwatch-bench-fleet")
    kafka = bkafka.start_cluster()
    checkpoint = tempfile.mkdtemp(prefix="bench-fleet-")
    log = BatchLog().__enter__()
    restarts = _Restarts()
    logging.getLogger("streaming.job").addHandler(restarts)
    stop = threading.Event()
    errors: list[BaseException] = []
    feeder = th = None
    try:
        topic = bkafka.new_topic(kafka, f"bench-fleet-{replicas}")
        cap = JobSettings().max_records_per_trigger  # the job as deployed: its default cap
        # lag: the feed says 10 s as well
        settings = job_settings(
            kafka, topic, checkpoint, cap, 1.0, driver_replicas=driver_replicas, ok_refresh_batches=ok_refresh_batches
        )

        def target() -> None:
            try:
                job.run(settings, spark=spark, stop_event=stop)
            except BaseException as e:
                errors.append(e)

        ctx = mp.get_context("spawn")
        ours, theirs = ctx.Pipe()
        feeder = ctx.Process(
            target=_feed, args=(bkafka.producer_config(kafka), topic, replicas, version, theirs, not_ok_every, rounds)
        )
        feeder.start()
        th = threading.Thread(target=target, name="bench-fleet-job", daemon=True)
        th.start()
        if not ours.poll(600):
            raise RuntimeError("the feeder built nothing in 600 s")
        ready = ours.recv()
        t0 = ready["t0"]
        print(
            f"fleet: replicas={replicas} every {ROUND_S}s = {replicas // ROUND_S} obs/s, not ok 1 in "
            f"{not_ok_every}; telemetry_version={version}; feed built in {ready['build_s']}s "
            f"({ready['bytes'] / 1e6:.0f} MB), starts in {t0 - time.time():.0f}s; load_average={load_average()}",
            flush=True,
        )
        time.sleep(max(0.0, t0 - time.time() - 1))
        before = rss_mb()
        wall0 = time.time() - time.perf_counter()  # perf_counter -> wall clock
        end = t0 + rounds * ROUND_S
        while time.time() < end + DRAIN_S and not errors and not _reached(log, end - SLICE_S, wall0):
            time.sleep(0.5)
        after, peak = rss_mb(), rss_mb(field="VmHWM")
        if errors:
            raise RuntimeError(f"job failed: {errors[0]}") from errors[0]
        done = ours.recv() if ours.poll(120) else {"late_s": None}
    finally:
        stop.set()
        if th is not None:
            th.join(timeout=300)
        if feeder is not None:
            feeder.join(timeout=30)
            if feeder.is_alive():
                feeder.kill()
        log.__exit__()
        logging.getLogger("streaming.job").removeHandler(restarts)
        kafka.close()
        spark.stop()
        shutil.rmtree(checkpoint, ignore_errors=True)
    batches = []
    for at, f in log.batches:
        ms = {k: int(f.get(k, 0)) for k in ("batch_ms", "spark_ms", "state_topic_ms", "state_ms", "observations")}
        batches.append(
            {
                "wall": wall0 + at,
                **ms,
                "driver_ms": ms["batch_ms"] - ms["spark_ms"] - ms["state_topic_ms"] - ms["state_ms"],
                "lag_s": float(f.get("telemetry_lag_s", 0.0)),
                "changes": int(f.get("changes", 0)),
                "states": int(f.get("states", 0)),
            }
        )
    return summarize(replicas, batches, t0, before, after, peak, done, restarts.count)


def summarize(
    replicas: int,
    batches: list[dict[str, Any]],
    t0: float,
    before: float,
    after: float,
    peak: float,
    feed: dict[str, Any],
    restarts: int = 0,
) -> dict[str, Any]:
    """The figures of one size from its batches (those that ended after the first round),
    ``restarts``: the job's query restarts (a failed batch)."""
    steady = [b for b in batches if b["wall"] >= t0 + ROUND_S + SLICE_S]

    def median(key: str, scale: float = 1.0) -> float | None:
        return statistics.median(b[key] for b in steady) / scale if steady else None

    newest = [b["wall"] - b["lag_s"] for b in steady]
    covered = newest[-1] - newest[0] if steady else 0.0
    busy = sum(b["batch_ms"] for b in steady[1:]) / 1000
    growth = steady[-1]["lag_s"] - steady[0]["lag_s"] if steady else None
    return {
        "replicas": replicas,
        "steady_batches": len(steady),
        "driver_s": median("driver_ms", 1000),
        "batch_s": median("batch_ms", 1000),
        "spark_s": median("spark_ms", 1000),
        "observations": median("observations"),
        "lag_start_s": steady[0]["lag_s"] if steady else None,
        "lag_end_s": steady[-1]["lag_s"] if steady else None,
        "busy_over_covered": round(busy / covered, 2) if covered > 0 else None,
        "query_restarts": restarts,
        # two steady batches at least, no restart, the telemetry lag flat
        "kept_up": len(steady) >= 2 and not restarts and growth is not None and growth <= KEPT_UP_SLACK_S,
        "driver_rss_before_mb": before,
        "driver_growth_mb": round(after - before, 1),
        "driver_peak_growth_mb": round(peak - before, 1),
        "feed": feed,
        "batches": batches,
    }


def _label(replicas: int) -> str:
    return f"{replicas // 1_000_000}m" if replicas % 1_000_000 == 0 else f"{replicas // 1000}k"


def _one(replicas: int, version: int, logs: Path, driver_replicas: str = "all", refresh: int = 1) -> dict[str, Any]:
    """``run_size`` in a process of its own (its driver memory is that size's alone); the job's
    log goes to a file under ``logs``."""
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        out = f.name
    logs.mkdir(parents=True, exist_ok=True)
    log_file = logs / f"fleet-{_label(replicas)}-{time.strftime('%Y%m%dT%H%M%S')}.log"
    print(f"  the job's log: {log_file}", flush=True)
    try:
        cmd = [sys.executable, "-m", "bench.fleet", "--replicas", str(replicas), "--telemetry-version", str(version)]
        cmd += ["--driver-replicas", driver_replicas, "--ok-refresh-batches", str(refresh)]
        with log_file.open("w") as err:
            run = subprocess.run([*cmd, "--json", out], stdout=subprocess.PIPE, stderr=err, text=True)
        lines = run.stdout.splitlines()
        for line in lines:  # the job's printed alerts (JSON, one a line) are counted, not shown
            if not line.startswith("{"):
                print(line, flush=True)
        if run.returncode != 0:  # e.g. the job's JVM out of memory: a size the job did not keep up with
            reason = failure_reason(log_file.read_text(errors="replace"), run.returncode)
            print(f"  replicas={replicas} failed: {reason}", flush=True)
            return failed(replicas, reason)
        result: dict[str, Any] = json.loads(Path(out).read_text())
        result["alerts_printed"] = sum(line.startswith("{") for line in lines)
        return result
    finally:
        os.unlink(out)


def failure_reason(log: str, returncode: int) -> str:
    """One line saying why a size's process ended in failure: the JVM's first
    ``OutOfMemoryError`` if there is one, else the log's last line, else the exit code."""
    lines = [line.strip() for line in log.splitlines() if line.strip()]
    oom = next((line for line in lines if "OutOfMemoryError" in line), None)
    last = oom or (lines[-1] if lines else f"exit code {returncode}")
    return last[:300]


def failed(replicas: int, reason: str) -> dict[str, Any]:
    """The result of a size whose process failed: nothing measured, not kept up."""
    return {
        "replicas": replicas,
        "steady_batches": 0,
        "driver_s": None,
        "batch_s": None,
        "spark_s": None,
        "observations": None,
        "lag_start_s": None,
        "lag_end_s": None,
        "busy_over_covered": None,
        "query_restarts": None,
        "kept_up": False,
        "driver_rss_before_mb": None,
        "driver_growth_mb": None,
        "driver_peak_growth_mb": None,
        "feed": None,
        "batches": [],
        "failed": reason,
    }


def _fmt(v: float | None, digits: int) -> str:
    return "none" if v is None else f"{v:.{digits}f}"


def _line(r: dict[str, Any]) -> str:
    return (
        f"  replicas={r['replicas']} steady_batches={r['steady_batches']} driver_s={_fmt(r['driver_s'], 3)} "
        f"batch_s={_fmt(r['batch_s'], 2)} spark_s={_fmt(r['spark_s'], 2)} obs_per_batch={_fmt(r['observations'], 0)} "
        f"telemetry_lag_s={_fmt(r['lag_start_s'], 1)}->{_fmt(r['lag_end_s'], 1)} "
        f"busy_over_covered={r['busy_over_covered']} query_restarts={r['query_restarts']} "
        f"kept_up={'yes' if r['kept_up'] else 'no'} driver_growth_mb={r['driver_growth_mb']} "
        f"(peak {r['driver_peak_growth_mb']}) feed={r['feed']}"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.fleet", description=__doc__.splitlines()[0])
    ap.add_argument("--replicas", type=int, help="one fleet size, in this process (default: 100k and 1M, each apart)")
    ap.add_argument("--runs", type=int, default=3, help="alternated runs of both sizes (medians; default 3)")
    ap.add_argument("--telemetry-version", type=int, default=VERSION, choices=sorted(SUPPORTED_VERSIONS))
    ap.add_argument("--json", help="write the result here")
    ap.add_argument("--logs", default=".cache/bench-fleet", help="where each run's job log goes")
    ap.add_argument(
        "--driver-replicas",
        default="all",
        choices=DRIVER_REPLICAS,
        help="the job's --driver-replicas (default: all, the job's default)",
    )
    ap.add_argument(
        "--not-ok-every",
        type=int,
        default=NOT_OK_EVERY,
        help=f"with --replicas: one replica in this many falls behind (default {NOT_OK_EVERY}; 10: an incident)",
    )
    ap.add_argument(
        "--keys-inline",
        type=int,
        help="with --replicas: the job's literal-set size for the held replicas' keys "
        "(streaming.evaluation.evaluate.KEYS_INLINE; a large number: always the literal set, the baseline)",
    )
    ap.add_argument(
        "--ok-refresh-batches",
        type=int,
        default=1,
        help="the job's --ok-refresh-batches (default 1, the job's default)",
    )
    ap.add_argument("--rounds", type=int, default=ROUNDS, help=f"with --replicas: the feed's rounds (default {ROUNDS})")
    args = ap.parse_args(argv)
    if args.replicas is not None:
        if args.replicas < ROUND_S:
            ap.error(f"--replicas must be at least {ROUND_S}")
        if args.not_ok_every < 1 or args.rounds < 2:
            ap.error("--not-ok-every must be at least 1, --rounds at least 2")
        if args.keys_inline is not None:
            from streaming.evaluation import evaluate

            evaluate.KEYS_INLINE = args.keys_inline  # the job runs in this process
            print(f"keys_inline={args.keys_inline}", flush=True)
        r = run_size(
            args.replicas,
            args.telemetry_version,
            args.driver_replicas,
            args.not_ok_every,
            args.rounds,
            args.ok_refresh_batches,
        )
        print(_line(r), flush=True)
        if args.json:
            Path(args.json).write_text(json.dumps(r))
        return 0
    if args.runs < 1:
        ap.error("--runs must be at least 1")
    header = print_header("isrwatch fleet: the job against a live feed")
    print(f"the job's --driver-replicas: {args.driver_replicas}", flush=True)
    print(f"the job's --ok-refresh-batches: {args.ok_refresh_batches}", flush=True)
    results: dict[int, list[dict[str, Any]]] = {n: [] for n in SIZES}
    for run in range(args.runs):
        for n in SIZES:
            print(f"run {run + 1}/{args.runs}: {_label(n)} replicas", flush=True)
            results[n].append(
                _one(n, args.telemetry_version, Path(args.logs), args.driver_replicas, args.ok_refresh_batches)
            )
    small, large = results[SIZES[0]], results[SIZES[1]]
    a = median_of_measured([r["driver_s"] for r in small])
    b = median_of_measured([r["driver_s"] for r in large])
    c = median_of_measured([r["driver_growth_mb"] for r in large])
    kept = sum(r["kept_up"] for r in large) * 2 > len(large)
    if args.json:
        Path(args.json).write_text(json.dumps({"header": header, "runs": results}, indent=1))
    print(
        f"driver_s_100k={_fmt(a, 3)} driver_s_1m={_fmt(b, 3)} driver_growth_mb_1m={_fmt(c, 0)} "
        f"kept_up_1m_every_20s={'yes' if kept else 'no'}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
