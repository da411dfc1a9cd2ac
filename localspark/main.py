"""``isrwatch local-spark``: a real Spark standalone cluster on loopback until Ctrl-C."""

from __future__ import annotations

import sys

from isrwatch.signals import StopSignals
from localspark.cluster import LocalSpark
from localspark.settings import LocalSparkSettings

__all__ = ["main"]


def main(settings: LocalSparkSettings) -> int:
    with StopSignals(name="local-spark") as stop:
        cluster = LocalSpark(
            workers=settings.workers,
            cores_per_worker=settings.cores_per_worker,
            worker_memory_mb=settings.worker_memory_mb,
            data_dir=settings.data_dir,
        )
        print(f"starting a Spark master and {settings.workers} worker(s) on loopback ...", flush=True)
        with cluster:
            print(
                f"Spark is up: master {cluster.master_url}, {len(cluster.alive_workers())} worker(s) "
                f"of {settings.cores_per_worker} core(s) each\n"
                f"  master UI:   {cluster.master_ui}\n"
                f"  logs:        {cluster.dir}\n"
                f"  job:         isrwatch run --spark-master {cluster.master_url} --checkpoint-dir DIR ...\n"
                "Ctrl-C stops it.",
                flush=True,
            )
            try:
                while not stop.wait(1.0):
                    if cluster.master is not None and not cluster.master.running:
                        print(f"the master exited; see {cluster.dir}/master", file=sys.stderr)
                        return 1
            except KeyboardInterrupt:
                pass
        return 0
