"""Spark Python worker tasks with and without ``streaming.sources.worker_path.quiet_zip_invalidation``.

``python -m bench.worker_tasks`` runs the same small Python tasks (one per telemetry range
in the job: a task that reads a few records) in Spark local mode, in alternating fresh
Spark sessions: ``as-given`` (the baseline: every task's start re-reads the directories of
the zips on the workers' path) and ``quiet`` (each worker has installed the stat-guarded
invalidation, as a worker reading telemetry does when it loads the sources' module). It
prints, per run, milliseconds of wall time per task, then the medians and their ratio::

    as_given_ms_per_task=A quiet_ms_per_task=B speedup=A/B

``--tasks`` (default 400) and ``--rounds`` (default 2) set the size. Numbers are noisy on a
shared 2-core machine: compare the ratio inside one run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

from bench.machine import print_header

__all__ = ["main"]

MODES = ("as-given", "quiet")


def _measure(mode: str, tasks: int) -> dict[str, float]:
    """In this process: one Spark session, a warm-up, then one job of ``tasks`` tasks;
    -> wall ms per task and the Python workers that ran them."""
    from streaming.lifecycle.session import build_session

    spark = build_session("local[2]", 2, app_name=f"isrwatch-bench-worker-{mode}")
    sc = spark.sparkContext
    quiet = mode == "quiet"

    def task(rows):  # type: ignore[no-untyped-def]
        import os

        if quiet:
            from streaming.sources.worker_path import quiet_zip_invalidation

            quiet_zip_invalidation()
        n = sum(1 for _ in rows)
        return [(n, os.getpid())]

    try:
        sc.parallelize(range(2 * 8), 8).mapPartitions(task).collect()  # workers started, modules loaded
        started = time.perf_counter()
        out = sc.parallelize(range(tasks * 10), tasks).mapPartitions(task).collect()
        wall_s = time.perf_counter() - started
    finally:
        spark.stop()
    return {
        "wall_ms_per_task": 1000 * wall_s / tasks,
        "workers": len({pid for _, pid in out}),
        "tasks": tasks,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.worker_tasks", description=__doc__.split("\n")[0])
    p.add_argument("--tasks", type=int, default=400)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--one", choices=MODES, help=argparse.SUPPRESS)  # a child run
    args = p.parse_args(argv)
    if args.one:
        print(json.dumps(_measure(args.one, args.tasks)))
        return 0
    print_header("isrwatch Spark Python worker tasks: zip directories re-read at every task's start or not")
    results: dict[str, list[float]] = {m: [] for m in MODES}
    for r in range(args.rounds):
        for mode in MODES if r % 2 == 0 else reversed(MODES):
            proc = subprocess.run(
                [sys.executable, "-m", "bench.worker_tasks", "--one", mode, "--tasks", str(args.tasks)],
                capture_output=True,
                text=True,
                check=False,
            )
            if proc.returncode != 0:
                print(proc.stderr[-2000:], file=sys.stderr)
                return 1
            got = json.loads(proc.stdout.strip().splitlines()[-1])
            results[mode].append(got["wall_ms_per_task"])
            print(
                f"round={r + 1} mode={mode} tasks={got['tasks']} workers={got['workers']}"
                f" wall_ms_per_task={got['wall_ms_per_task']:.1f}",
                flush=True,
            )
    given, quiet = (statistics.median(results[m]) for m in MODES)
    print(f"as_given_ms_per_task={given:.1f} quiet_ms_per_task={quiet:.1f} speedup={given / quiet:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
