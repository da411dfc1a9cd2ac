"""A/B of ``--ok-refresh-batches``: the job drains the same backlog with 1 and with N.

The job in Kafka mode (``streaming.lifecycle.job.run``) over a backlog of whole rounds of
``bench.load.Fleet``; the rate is the backlog after the first batch over the
time from the end of the first batch to the end of the last, from the job's
``batch ...`` lines (``bench.throughput.run_e2e`` waits for the driver to
report every observation, which N > 1 defers). Runs alternate so a noisy
machine hits both settings.

``python -m bench.refresh --replicas 50000 --rounds 12 --refresh 10``
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import threading
import time

from bench import kafka as bkafka
from bench import throughput as tp
from bench.load import Fleet
from bench.machine import print_header

__all__ = ["main"]


def backlog(replicas: int, rounds: int) -> tuple[Fleet, list[bytes]]:
    """``rounds`` whole rounds of a fleet of ``replicas``: the telemetry records a job drains."""
    fleet = Fleet(replicas)
    records: list[bytes] = []
    for i in range(rounds):
        records += fleet.round(i, tp.START_MS + i * fleet.interval_ms)
    return fleet, records


def drain(spark, kafka, records: list[bytes], per_record: int, cap: int, refresh: int, **extra) -> dict:  # type: ignore[no-untyped-def]
    """The job drains ``records`` in batches of ``cap`` records; ``extra``: more of the job's settings."""
    from streaming.lifecycle import job

    expected = -(-len(records) // cap)
    topic = bkafka.new_topic(kafka, f"bench-refresh-{refresh}")
    bkafka.produce(kafka, topic, records)
    checkpoint = tempfile.mkdtemp(prefix="bench-refresh-")
    settings = tp.job_settings(kafka, topic, checkpoint, cap, 0.001, ok_refresh_batches=refresh, **extra)
    log = tp.BatchLog().__enter__()
    stop = threading.Event()
    errors: list[BaseException] = []

    def target() -> None:
        try:
            job.run(settings, spark=spark, handles=job.JobHandles(), stop_event=stop)
        except BaseException as e:  # reported below
            errors.append(e)

    th = threading.Thread(target=target, name="bench-refresh-job", daemon=True)
    th.start()
    try:
        deadline = time.monotonic() + 900
        with log.done:
            while len(log.batches) < expected and not errors and time.monotonic() < deadline:
                log.done.wait(1.0)
    finally:
        stop.set()
        th.join(300)
        log.__exit__()
        shutil.rmtree(checkpoint, ignore_errors=True)
    if errors:
        raise RuntimeError(f"job failed: {errors[0]}") from errors[0]
    if len(log.batches) < max(2, expected):
        raise RuntimeError(f"{len(log.batches)} of {expected} batches in 900 s")
    t = [x[0] for x in log.batches]
    later = [f for _, f in log.batches[1:]]
    return {
        "refresh": refresh,
        "rate": (len(records) - cap) * per_record / (t[-1] - t[0]),
        "driver_ms": [int(f["batch_ms"]) - int(f.get("spark_ms", 0)) for f in later],
        "rows": [int(f["replicas"]) for f in later],
        "batches": later,  # every later batch's log fields
    }


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(prog="python -m bench.refresh", description=__doc__.splitlines()[0])
    ap.add_argument("--replicas", type=int, default=50_000)
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--refresh", type=int, default=10, help="the N to compare with 1")
    ap.add_argument("--batch-observations", type=int, default=100_000)
    args = ap.parse_args(argv)
    print_header("isrwatch --ok-refresh-batches A/B")
    from streaming.lifecycle.session import build_session

    fleet, records = backlog(args.replicas, args.rounds)
    cap = max(1, args.batch_observations // fleet.per_record)
    spark = build_session("local[2]", 2, app_name="isrwatch-bench-refresh")
    kafka = bkafka.start_cluster()
    out = []
    try:
        for refresh in (1, args.refresh, 1, args.refresh):
            r = drain(spark, kafka, records, fleet.per_record, cap, refresh)
            out.append(r)
            print(
                f"ok_refresh_batches={refresh} observations_per_second={r['rate']:.0f} "
                f"driver_ms={r['driver_ms']} rows={r['rows']}",
                flush=True,
            )
    finally:
        kafka.close()
        spark.stop()
    return out


if __name__ == "__main__":
    main()
