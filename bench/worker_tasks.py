"""Spark Python worker tasks with and without the Spark core jar on the workers' import path.

``python -m bench.worker_tasks`` runs the same small Python tasks (one per telemetry range
in the job: a task that reads a few records) in Spark local mode, in alternating fresh
Spark sessions: ``jar-kept`` (Spark's worker import path as given, the baseline) and
``jar-dropped`` (each task's worker has loaded ``streaming.worker_path`` and dropped the
archives without Python, as a worker reading telemetry does). It prints, per run, tasks per
second as milliseconds of wall time per task, then the medians and their ratio::

    jar_kept_ms_per_task=A jar_dropped_ms_per_task=B speedup=A/B

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

MODES = ("jar-kept", "jar-dropped")


def _measure(mode: str, tasks: int) -> dict[str, float]:
    """In this process: one Spark session, a warm-up, then one job of ``tasks`` tasks;
    -> wall ms per task and the Python workers that ran them."""
    from streaming.session import build_session

    spark = build_session("local[2]", 2, app_name=f"isrwatch-bench-worker-{mode}")
    sc = spark.sparkContext
    drop = mode == "jar-dropped"

    def task(rows):  # type: ignore[no-untyped-def]
        import os

        if drop:
            from streaming.worker_path import drop_archives_without_python

            drop_archives_without_python()
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
    print_header("isrwatch Spark Python worker tasks: the core jar on the import path or not")
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
    kept, dropped = (statistics.median(results[m]) for m in MODES)
    print(f"jar_kept_ms_per_task={kept:.1f} jar_dropped_ms_per_task={dropped:.1f} speedup={kept / dropped:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
