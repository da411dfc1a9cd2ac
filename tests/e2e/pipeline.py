"""The whole isrwatch pipeline against a real local Kafka 0.9 cluster, for the e2e tests.

* ``Pipeline``: the isrwatch topics, laid out as docs/deploy.md tells a user
  to (``TOPIC_PARTITIONS`` partitions, one replica each, placed by Kafka's own
  assignment: every broker leads some, so every broker fault reaches isrwatch's
  own data), on the watched cluster or on a separate telemetry cluster;
  ``isrwatch collect`` and ``isrwatch run --bootstrap-servers`` as child processes. The job's stdout (alert JSON lines,
  no Alertmanager URL) is read by a thread that stamps each line with the wall
  time it arrived; its stderr (logs) goes to a file.
* ``until``: event-based waiting that fails with the job's log tail.

Produce load and reading topics back: ``tests.e2e.kafka_io``; the brokers' truth and
the validation results: ``tests.e2e.results``.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

__all__ = [
    "Pipeline",
    "AlertEvent",
    "until",
    "COLLECT_INTERVAL_S",
    "LAG_MS",
    "ZK_SESSION_MS",
    "TOPIC_PARTITIONS",
]

COLLECT_INTERVAL_S = 0.5
# replica.lag.time.max.ms of the fault tests. Measured on the shared 2-core machine
# (load average up to 19), the job's telemetry-to-stdout latency reached 10 s: with
# 8 s, a Nearing alert (due at lag/2) could not be printed before the shrink (due
# from lag on). 20 s keeps the alert's delivery inside the window on a loaded
# machine; the ZooKeeper session outlives the longest pause (up to 2 x lag).
LAG_MS = 20_000
ZK_SESSION_MS = 120_000
CLUSTER = "e2e"
# isrwatch's topics: several partitions, one replica each (docs/deploy.md: a replicated
# telemetry partition's high watermark waits for every follower in its ISR, so a hung
# follower would hide the telemetry of its own fault until the broker drops it).
TOPIC_PARTITIONS = 6
# Spark's start and first micro-batch take up to a minute on a loaded 2-core machine.
JOB_START_S = 240.0
_WINDOW = re.compile(r"window (\S+) \.\. (\S+)\)")
_BEHIND = re.compile(r"(\d+) messages behind")
_BATCH = re.compile(r"\bbatch batch_id=(\d+) observations=(\d+) replicas=(\d+) states=(\d+)")
_TELEMETRY_LAG = re.compile(r"\bbatch batch_id=\d+ .*\btelemetry_lag_s=([\d.]+)")


@dataclass(frozen=True)
class AlertEvent:
    """One alert JSON line of the job, with the wall time the test read it."""

    arrived: float  # epoch seconds
    body: dict[str, Any]
    run: int = 0  # which start of the job printed it

    @property
    def name(self) -> str:
        return str(self.body["labels"]["alertname"])

    @property
    def status(self) -> str:
        return str(self.body["status"])

    @property
    def labels(self) -> dict[str, str]:
        return dict(self.body["labels"])

    @property
    def replica(self) -> tuple[str, int, int]:
        """(topic, partition, broker_id) of a replica alert; -1 / "" where an alert has no such label."""
        lab = self.body["labels"]
        return (lab.get("topic", ""), int(lab.get("partition", -1)), int(lab.get("broker_id", -1)))

    @property
    def starts_at(self) -> float:
        return _parse_iso(self.body["startsAt"])

    @property
    def window(self) -> tuple[float, float] | None:
        """The predicted removal window of a lag alert (from its description), epoch seconds."""
        m = _WINDOW.search(self.body["annotations"]["description"])
        return (_parse_iso(m[1]), _parse_iso(m[2])) if m else None

    @property
    def offset_lag(self) -> int | None:
        """Messages behind the leader, from a lag alert's description."""
        m = _BEHIND.search(self.body["annotations"]["description"])
        return int(m[1]) if m else None

    @property
    def identity(self) -> tuple[str, tuple[tuple[str, str], ...]]:
        return (self.name, tuple(sorted(self.body["labels"].items())))


def _parse_iso(text: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def until(what: str, predicate: Callable[[], bool], timeout_s: float, pipeline: Pipeline | None = None) -> None:
    """Poll ``predicate`` until it holds; fail (with the logs) on timeout or a dead child."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if pipeline is not None:
            pipeline.check_alive(what)
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout_s:.0f}s waiting for {what}\n{pipeline.tails() if pipeline else ''}")
        time.sleep(0.25)


class _Child:
    """A child process in its own process group; stdout read line by line when ``on_line`` is given."""

    def __init__(
        self,
        name: str,
        argv: list[str],
        workdir: Path,
        on_line: Callable[[str], None] | None,
        env: dict[str, str] | None = None,
    ) -> None:
        self.name = name
        self.stderr_path = workdir / f"{name}.stderr"
        stdout: Any = subprocess.PIPE if on_line else (workdir / f"{name}.stdout").open("wb")
        with self.stderr_path.open("ab") as err:
            self.proc = subprocess.Popen(
                argv,
                stdout=stdout,
                stderr=err,
                stdin=subprocess.DEVNULL,
                cwd=workdir,
                env=env,
                start_new_session=True,
            )
        if not on_line:
            stdout.close()
        self.reader: threading.Thread | None = None
        if on_line:
            self.reader = threading.Thread(target=self._read, args=(on_line,), name=f"{name}-stdout", daemon=True)
            self.reader.start()

    def _read(self, on_line: Callable[[str], None]) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            on_line(raw.decode(errors="replace"))

    def running(self) -> bool:
        return self.proc.poll() is None

    def log(self) -> str:
        return self.stderr_path.read_text(errors="replace") if self.stderr_path.exists() else ""

    def tail(self, chars: int = 3000) -> str:
        return f"--- {self.name} (exit {self.proc.poll()}) ---\n{self.log()[-chars:]}"

    def kill(self) -> int:
        """SIGKILL the whole process group (the job's Spark JVM too): a crash."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        rc = self.proc.wait(30)
        if self.reader is not None:
            self.reader.join(10)
        return rc

    def stop(self, timeout_s: float = 90.0) -> int:
        """SIGTERM (a clean stop), then SIGKILL the group if it does not exit in time."""
        if self.running():
            self.proc.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout_s)
        rc = self.proc.poll()
        self.kill()
        return rc if rc is not None else -9


class Pipeline:
    """Collector and job on one LocalKafka cluster, each as a real ``isrwatch`` process."""

    def __init__(
        self,
        cluster: Any,
        workdir: Path,
        *,
        job_args: Iterable[str] = (),
        telemetry_cluster: Any = None,
        state_topic_config: dict[str, Any] | None = None,
        collector_wrapper: Iterable[str] = (),
        collector_source: str = "fetch",
        own_topics: str = "created",
        lag_time_max_ms: int | None = None,
    ) -> None:
        self.cluster = cluster
        # how the collectors read the log end offsets: fetch requests, or every broker's JMX
        self.collector_source = collector_source
        # isrwatch's topics created as docs/deploy.md says ("created"), or left to the brokers'
        # defaults ("broker-defaults": created when first used, num.partitions=1, one replica)
        self.own_topics = own_topics
        # a command the collectors run under (a clock fault: tests/support/skewed_clock.py)
        self.collector_wrapper = list(collector_wrapper)
        # where isrwatch's own topics live: the watched cluster, or a separate one
        self.telemetry_cluster = telemetry_cluster or cluster
        self.workdir = workdir
        # the replica.lag.time.max.ms isrwatch is given (the collector's and the job's flag): the
        # watched brokers' own, unless a test gives it wrong, as a user may
        self.lag_time_max_ms = lag_time_max_ms or cluster.lag_time_max_ms
        suffix = os.urandom(3).hex()
        self.telemetry_topic = f"isr.telemetry-{suffix}"
        self.state_topic = f"isr.replica-state-{suffix}"
        self.alerts_topic = f"isr.alerts-{suffix}"
        self.deadletter_topic = f"isr.deadletter-{suffix}"
        self.checkpoint_dir = workdir / "checkpoint"
        # the job's temp directory (TMPDIR): Spark's scratch space, what a killed job leaves there
        self.job_tmp = workdir / "tmp"
        from localkafka import free_port

        self.metrics_port = free_port()  # the job's own /metrics
        self.job_args = list(job_args)
        # compacted, as docs/deploy.md tells a user to create it
        self.state_topic_config = {"cleanup.policy": "compact", **(state_topic_config or {})}
        self.events: list[AlertEvent] = []
        self._lock = threading.Lock()
        self.collector: _Child | None = None
        self.more_collectors: list[_Child] = []  # of more watched clusters
        self.job: _Child | None = None
        self.exporters: list[_Child] = []
        self.exporter_port: int | None = None  # the first exporter's
        self.job_runs = 0
        self._old_job_logs: list[str] = []

    # -- life cycle ---------------------------------------------------------

    def create_topics(self) -> None:
        if self.own_topics == "broker-defaults":
            return
        for t in self.topics():
            config = self.state_topic_config if t == self.state_topic else None
            self.telemetry_cluster.create_topic(t, partitions=TOPIC_PARTITIONS, replication_factor=1, config=config)

    def topics(self) -> tuple[str, ...]:
        return (self.telemetry_topic, self.state_topic, self.alerts_topic, self.deadletter_topic)

    def _base(self, command: str, cluster: Any) -> list[str]:
        return [
            sys.executable,
            "-m",
            "isrwatch",
            command,
            "--bootstrap-servers",
            cluster.bootstrap_servers,
            *cluster.kafka_config_flags(),
            "--telemetry-topic",
            self.telemetry_topic,
        ]

    def start_collector(self) -> None:
        self.collector = self._collector("collector", self.cluster, CLUSTER)

    def add_watched_cluster(self, watched: Any, name: str, interval_s: float = COLLECT_INTERVAL_S) -> None:
        """One more watched cluster: its own collector (``--cluster name``, polling every
        ``interval_s``) publishing to the same telemetry topic, read by the same job (issue 12)."""
        self.more_collectors.append(self._collector(f"collector-{name}", watched, name, interval_s))

    def _collector(self, child: str, watched: Any, name: str, interval_s: float = COLLECT_INTERVAL_S) -> _Child:
        argv = self._base("collect", watched)
        if self.telemetry_cluster is not watched:
            argv += ["--telemetry-bootstrap-servers", self.telemetry_cluster.bootstrap_servers]
        argv += [
            "--cluster",
            name,
            "--interval",
            str(interval_s),
            "--lag-time-max-ms",
            str(self.lag_time_max_ms if watched is self.cluster else watched.lag_time_max_ms),
        ]
        if self.collector_source == "jmx":
            argv += ["--source", "jmx", *watched.jmx_flags()]
        return _Child(child, [*self.collector_wrapper, *argv], self.workdir, None)

    def start_job(self) -> None:
        argv = self._base("run", self.telemetry_cluster) + [
            "--state-topic",
            self.state_topic,
            "--alerts-topic",
            self.alerts_topic,
            "--deadletter-topic",
            self.deadletter_topic,
            "--checkpoint-dir",
            str(self.checkpoint_dir),
            "--starting-offsets",
            "earliest",
            "--lag-time-max-ms",
            str(self.lag_time_max_ms),
            "--trigger-seconds",
            "1",
            "--metrics-port",
            str(self.metrics_port),
            *self.job_args,
        ]
        if self.job is not None:
            self._old_job_logs.append(self.job.log())
            self.job.stderr_path.write_text("")
        self.job_runs += 1
        run = self.job_runs
        self.job_tmp.mkdir(exist_ok=True)
        env = dict(os.environ, TMPDIR=str(self.job_tmp))
        self.job = _Child("job", argv, self.workdir, lambda line: self._on_line(line, run), env)

    def _on_line(self, line: str, run: int) -> None:
        arrived = time.time()
        line = line.strip()
        if not line.startswith("{"):
            return
        event = AlertEvent(arrived, json.loads(line), run)
        with self._lock:
            self.events.append(event)

    def start(self) -> Pipeline:
        self.create_topics()
        self.start_collector()
        self.start_job()
        return self

    def start_exporter(self) -> int:
        """``isrwatch exporter`` on the state topic, on a free loopback port, returned (the
        first one's is ``exporter_port``); each one reads the topic from its beginning."""
        from localkafka import free_port

        port = free_port()
        if self.exporter_port is None:
            self.exporter_port = port
        argv = [
            sys.executable,
            "-m",
            "isrwatch",
            "exporter",
            "--bootstrap-servers",
            self.telemetry_cluster.bootstrap_servers,
            *self.telemetry_cluster.kafka_config_flags(),
            "--state-topic",
            self.state_topic,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ]
        name = "exporter" if not self.exporters else f"exporter-{len(self.exporters) + 1}"
        self.exporters.append(_Child(name, argv, self.workdir, None))
        return port

    def restart_exporter(self, index: int = 0) -> None:
        """SIGKILL exporter ``index`` and start it again with the same command line (its port too)."""
        old = self.exporters[index]
        old.kill()
        self.exporters[index] = _Child(old.name, list(old.proc.args), self.workdir, None)  # type: ignore[arg-type]

    def children(self) -> list[_Child]:
        return [c for c in (self.collector, *self.more_collectors, self.job, *self.exporters) if c is not None]

    def close(self) -> None:
        for child in (*reversed(self.exporters), self.job, self.collector, *self.more_collectors):
            if child is not None:
                child.stop()

    def __enter__(self) -> Pipeline:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- what the job says --------------------------------------------------

    def alerts(self, name: str | None = None, status: str | None = None) -> list[AlertEvent]:
        with self._lock:
            return [
                e for e in self.events if (name is None or e.name == name) and (status is None or e.status == status)
            ]

    def newest_alerts(
        self, topic: str | None = None, broker: int | None = None, since: float = 0.0
    ) -> dict[Any, AlertEvent]:
        """Each alert's newest event (by identity) among those that arrived at or after
        ``since``, of ``topic``'s and ``broker``'s replicas where given."""
        newest: dict[Any, AlertEvent] = {}
        for e in self.alerts():
            t, _, b = e.replica
            if (topic is None or t == topic) and (broker is None or b == broker) and e.arrived >= since:
                newest[e.identity] = e
        return newest

    def firing(self, topic: str | None = None, broker: int | None = None) -> set[Any]:
        """The identities of the alerts (of ``topic``'s and ``broker``'s replicas where given)
        whose newest event is firing."""
        return {k for k, e in self.newest_alerts(topic, broker).items() if e.status == "firing"}

    def batches(self) -> list[tuple[int, int, int, int]]:
        """(batch_id, observations, replicas updated, states held) of each batch line of the current job run."""
        assert self.job is not None
        return [tuple(int(x) for x in m.groups()) for m in _BATCH.finditer(self.job.log())]  # type: ignore[misc]

    def job_log(self) -> str:
        return "".join(self._old_job_logs) + (self.job.log() if self.job else "")

    def wait_watching(self, replicas: int, timeout_s: float = JOB_START_S) -> None:
        """Until the job has evaluated ``replicas`` follower replicas from fresh telemetry: held
        (``states=``), or observed in one batch (``replicas=``: a job with ``--driver-replicas
        not-ok`` holds only the replicas not ok)."""

        def ready() -> bool:
            return any(max(states, seen) >= replicas and obs > 0 for _, obs, seen, states in self.batches())

        until(f"the job to watch {replicas} replicas", ready, timeout_s, self)
        # ... and has caught up with the telemetry published meanwhile (a batch after this instant).
        seen = len(self.batches())
        until("a fresh batch", lambda: len(self.batches()) > seen + 1, 60, self)

    def wait_steady(self, batches: int = 3, lag_s: float = 5.0, timeout_s: float = 120.0) -> bool:
        """Until the job's last ``batches`` batches each held telemetry at most ``lag_s`` old:
        a job in service, past Spark's warm-up (its first batches take 10-30 s on this
        machine), which is when a fault finds a user's job. Best effort: False when the
        machine is too loaded for that within ``timeout_s`` (the caller goes on)."""

        def steady() -> bool:
            assert self.job is not None
            lags = [float(x) for x in _TELEMETRY_LAG.findall(self.job.log())][-batches:]
            return len(lags) == batches and max(lags) <= lag_s

        deadline = time.monotonic() + timeout_s
        while not steady():
            self.check_alive("the job to run steadily")
            if time.monotonic() > deadline:
                return False
            time.sleep(0.25)
        return True

    def check_alive(self, what: str) -> None:
        for child in self.children():
            if not child.running():
                pytest.fail(f"{child.name} exited while waiting for {what}\n{self.tails()}")

    def tails(self) -> str:
        return "\n".join(c.tail() for c in self.children())
