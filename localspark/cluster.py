"""A real Spark standalone cluster on loopback: one master and N workers, started
from the pyspark package's own jars (``bin/spark-class`` with Spark's standalone
``Master`` and ``Worker`` classes), free ports, everything stopped afterwards.

The job runs on it with ``isrwatch run --spark-master <url>``; its executors are
separate JVMs under the workers, reading the telemetry topic's partitions in
parallel. On one machine every path is shared, so the checkpoint needs nothing
more than a directory (docs/scaling.md says what a real cluster uses instead).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from isrwatch.exceptions import IsrwatchError
from localkafka.ports import free_port
from localkafka.process import JvmProcess

__all__ = ["LocalSpark", "LocalSparkError", "spark_home"]

MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"


class LocalSparkError(IsrwatchError):
    """The local Spark cluster cannot start, or a worker cannot be found."""


def spark_home() -> Path:
    """The pyspark package's directory: its ``bin/spark-class`` and ``jars/`` are a Spark distribution."""
    import pyspark

    home = Path(pyspark.__file__).resolve().parent
    if not (home / "bin" / "spark-class").exists():
        raise LocalSparkError(f"{home}/bin/spark-class not found: is pyspark installed whole (make install)?")
    return home


class LocalSpark:
    """``with LocalSpark(workers=2) as spark: ... spark.master_url ...``

    Each worker offers ``cores_per_worker`` cores and ``worker_memory_mb`` of memory to
    executors; the job asks for what it needs with its Spark configuration
    (``standalone_conf``)."""

    def __init__(
        self,
        workers: int = 2,
        cores_per_worker: int = 1,
        worker_memory_mb: int = 1536,
        data_dir: str | None = None,
        start_timeout_s: float = 90.0,
    ) -> None:
        if workers < 1:
            raise LocalSparkError("a Spark cluster needs at least one worker")
        self.workers_wanted = workers
        self.cores_per_worker = cores_per_worker
        self.worker_memory_mb = worker_memory_mb
        self.start_timeout_s = start_timeout_s
        self._own_dir = data_dir is None
        self.dir = Path(data_dir or tempfile.mkdtemp(prefix="isrwatch-local-spark-"))
        self.master_port = 0
        self.master_ui_port = 0
        self.master: JvmProcess | None = None
        self.workers: list[JvmProcess] = []
        self.worker_ui_ports: list[int] = []

    # -- life cycle ----------------------------------------------------------------------

    @property
    def master_url(self) -> str:
        return f"spark://127.0.0.1:{self.master_port}"

    @property
    def master_ui(self) -> str:
        return f"http://127.0.0.1:{self.master_ui_port}"

    def _env(self, name: str) -> dict[str, str]:
        home = spark_home()
        env = dict(os.environ)
        env.update(
            SPARK_HOME=str(home),
            SPARK_LOCAL_IP="127.0.0.1",
            SPARK_LOCAL_DIRS=str(self.dir / name / "local"),
            SPARK_LOG_DIR=str(self.dir / name),
            SPARK_NO_DAEMONIZE="1",
            # a worker's executors log to its work directory; the daemons' own heap stays small
            SPARK_DAEMON_MEMORY="256m",
        )
        return env

    def _start(self, name: str, *args: str) -> JvmProcess:
        (self.dir / name / "local").mkdir(parents=True, exist_ok=True)
        cmd = [str(spark_home() / "bin" / "spark-class"), *args]
        proc = JvmProcess(name, cmd, self.dir / name / f"{name}.log", env=self._env(name))
        proc.start()
        return proc

    def start(self) -> LocalSpark:
        try:
            self.master_port, self.master_ui_port = free_port(), free_port()
            self.master = self._start(
                "master",
                MASTER_CLASS,
                "--host", "127.0.0.1",
                "--port", str(self.master_port),
                "--webui-port", str(self.master_ui_port),
            )  # fmt: skip
            self._wait(lambda: self.state() is not None, "the master to answer")
            for _ in range(self.workers_wanted):
                self.add_worker()
            self._wait(lambda: len(self.alive_workers()) == self.workers_wanted, "every worker to register")
        except BaseException:
            self.stop()
            raise
        return self

    def add_worker(self) -> int:
        """Start one more worker; its index."""
        index = len(self.workers)
        ui = free_port()
        name = f"worker-{index + 1}"
        work = self.dir / name / "work"
        work.mkdir(parents=True, exist_ok=True)
        proc = self._start(
            name,
            WORKER_CLASS,
            "--host", "127.0.0.1",
            "--port", str(free_port()),
            "--webui-port", str(ui),
            "--cores", str(self.cores_per_worker),
            "--memory", f"{self.worker_memory_mb}m",
            "--work-dir", str(work),
            self.master_url,
        )  # fmt: skip
        self.workers.append(proc)
        self.worker_ui_ports.append(ui)
        return index

    def kill_worker(self, index: int) -> None:
        """kill -9 a worker and its executors (its process group): a machine lost."""
        proc = self.workers[index]
        proc.signal(signal.SIGKILL)
        if proc.popen is not None:
            proc.popen.wait(10)

    def stop(self) -> None:
        for proc in [*self.workers, self.master]:
            if proc is not None:
                proc.stop(graceful_s=5.0)
        if self._own_dir:
            shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> LocalSpark:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- what the master says ----------------------------------------------------------

    def state(self) -> dict[str, Any] | None:
        """The master's JSON status (workers, applications), None when it does not answer."""
        try:
            with urllib.request.urlopen(f"{self.master_ui}/json/", timeout=5) as r:
                return dict(json.load(r))
        except (OSError, urllib.error.URLError, ValueError):
            return None

    def alive_workers(self) -> list[dict[str, Any]]:
        state = self.state() or {}
        return [w for w in state.get("workers", []) if w.get("state") == "ALIVE"]

    def worker_of_executor_log(self, url: str) -> int | None:
        """The index of the worker whose UI serves an executor's log ``url`` (Spark's
        REST API names executors by host:port only, the same host for every worker here)."""
        for i, port in enumerate(self.worker_ui_ports):
            if f":{port}/" in url:
                return i
        return None

    def _wait(self, predicate: Any, what: str) -> None:
        deadline = time.monotonic() + self.start_timeout_s
        while not predicate():
            if self.master is not None and not self.master.running:
                raise LocalSparkError(f"the Spark master exited: see {self.dir}/master")
            if time.monotonic() > deadline:
                raise LocalSparkError(
                    f"timed out after {self.start_timeout_s:.0f} s waiting for {what}: see {self.dir}"
                )
            time.sleep(0.5)
