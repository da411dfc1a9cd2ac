"""The whole isrwatch pipeline against a real local Kafka 0.9 cluster, for the e2e tests.

* ``Pipeline``: the isrwatch topics, laid out as docs/deploy.md tells a user
  to (``TOPIC_PARTITIONS`` partitions, one replica each, placed by Kafka's own
  assignment: every broker leads some, so every broker fault reaches isrwatch's
  own data), on the watched cluster or on a separate telemetry cluster;
  ``isrwatch collect`` and ``isrwatch run --bootstrap-servers`` as child processes. The job's stdout (alert JSON lines,
  no Alertmanager URL) is read by a thread that stamps each line with the wall
  time it arrived; its stderr (logs) goes to a file.
* ``ProduceLoad``: a producer thread (confluent-kafka, acks=1) at a given rate.
* ``until``: event-based waiting that fails with the job's log tail.
* ``write_result``: one JSON file per test in ``$ISRWATCH_VALIDATION_OUT``
  (default ``<tmp>/isrwatch-validation``); ``tools/validation_table.py`` prints them.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from isrwatch.alerts import AlertName

__all__ = [
    "Pipeline",
    "ProduceLoad",
    "AlertEvent",
    "until",
    "results_dir",
    "write_result",
    "RESULTS_ENV",
    "COLLECT_INTERVAL_S",
    "LAG_MS",
    "ZK_SESSION_MS",
    "Shrinks",
    "first_event",
    "nearing_row",
    "read_topic",
    "TOPIC_PARTITIONS",
]

RESULTS_ENV = "ISRWATCH_VALIDATION_OUT"
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

    def __init__(self, name: str, argv: list[str], workdir: Path, on_line: Callable[[str], None] | None) -> None:
        self.name = name
        self.stderr_path = workdir / f"{name}.stderr"
        stdout: Any = subprocess.PIPE if on_line else (workdir / f"{name}.stdout").open("wb")
        with self.stderr_path.open("ab") as err:
            self.proc = subprocess.Popen(
                argv, stdout=stdout, stderr=err, stdin=subprocess.DEVNULL, cwd=workdir, start_new_session=True
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
        self, cluster: Any, workdir: Path, *, job_args: Iterable[str] = (), telemetry_cluster: Any = None
    ) -> None:
        self.cluster = cluster
        # where isrwatch's own topics live: the watched cluster, or a separate one
        self.telemetry_cluster = telemetry_cluster or cluster
        self.workdir = workdir
        self.lag_time_max_ms = cluster.lag_time_max_ms
        suffix = os.urandom(3).hex()
        self.telemetry_topic = f"isr.telemetry-{suffix}"
        self.state_topic = f"isr.replica-state-{suffix}"
        self.alerts_topic = f"isr.alerts-{suffix}"
        self.deadletter_topic = f"isr.deadletter-{suffix}"
        self.checkpoint_dir = workdir / "checkpoint"
        from localkafka import free_port

        self.metrics_port = free_port()  # the job's own /metrics
        self.job_args = list(job_args)
        self.events: list[AlertEvent] = []
        self._lock = threading.Lock()
        self.collector: _Child | None = None
        self.job: _Child | None = None
        self.exporter: _Child | None = None
        self.exporter_port: int | None = None
        self.job_runs = 0
        self._old_job_logs: list[str] = []

    # -- life cycle ---------------------------------------------------------

    def create_topics(self) -> None:
        for t in self.topics():
            self.telemetry_cluster.create_topic(t, partitions=TOPIC_PARTITIONS, replication_factor=1)

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
        argv = self._base("collect", self.cluster)
        if self.telemetry_cluster is not self.cluster:
            argv += ["--telemetry-bootstrap-servers", self.telemetry_cluster.bootstrap_servers]
        argv += [
            "--cluster",
            CLUSTER,
            "--interval",
            str(COLLECT_INTERVAL_S),
            "--lag-time-max-ms",
            str(self.lag_time_max_ms),
        ]
        self.collector = _Child("collector", argv, self.workdir, None)

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
        self.job = _Child("job", argv, self.workdir, lambda line: self._on_line(line, run))

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

    def start_exporter(self) -> None:
        """``isrwatch exporter`` on the state topic, on a free loopback port (``exporter_port``)."""
        from localkafka import free_port

        self.exporter_port = free_port()
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
            str(self.exporter_port),
        ]
        self.exporter = _Child("exporter", argv, self.workdir, None)

    def children(self) -> list[_Child]:
        return [c for c in (self.collector, self.job, self.exporter) if c is not None]

    def close(self) -> None:
        for child in (self.exporter, self.job, self.collector):
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

    def batches(self) -> list[tuple[int, int, int, int]]:
        """(batch_id, observations, replicas updated, states held) of each batch line of the current job run."""
        assert self.job is not None
        return [tuple(int(x) for x in m.groups()) for m in _BATCH.finditer(self.job.log())]  # type: ignore[misc]

    def job_log(self) -> str:
        return "".join(self._old_job_logs) + (self.job.log() if self.job else "")

    def wait_watching(self, replicas: int, timeout_s: float = JOB_START_S) -> None:
        """Until the job has evaluated ``replicas`` follower replicas from fresh telemetry."""

        def ready() -> bool:
            return any(states >= replicas and obs > 0 for _, obs, _, states in self.batches())

        until(f"the job to watch {replicas} replicas", ready, timeout_s, self)
        # ... and has caught up with the telemetry published meanwhile (a batch after this instant).
        seen = len(self.batches())
        until("a fresh batch", lambda: len(self.batches()) > seen + 1, 60, self)

    def check_alive(self, what: str) -> None:
        for child in self.children():
            if not child.running():
                pytest.fail(f"{child.name} exited while waiting for {what}\n{self.tails()}")

    def tails(self) -> str:
        return "\n".join(c.tail() for c in self.children())


class ProduceLoad(threading.Thread):
    """Produces ``rate`` messages/s of ``size`` bytes round-robin over ``partitions`` until stopped."""

    def __init__(self, cluster: Any, topic: str, partitions: int, rate: float, size: int = 200) -> None:
        super().__init__(name=f"load-{topic}", daemon=True)
        from confluent_kafka import Producer

        self.producer = Producer(
            cluster.client_config(**{"acks": "1", "linger.ms": "5", "queue.buffering.max.kbytes": "65536"})
        )
        self.topic = topic
        self.partitions = partitions
        self.rate = rate
        self.payload = os.urandom(size // 2).hex().encode()[:size]
        self.stop_event = threading.Event()
        self.sent = 0

    def set_rate(self, rate: float) -> None:
        self.rate = rate

    def run(self) -> None:
        tick = 0.02
        next_t = time.monotonic()
        owed = 0.0
        while not self.stop_event.is_set():
            owed += self.rate * tick
            while owed >= 1:
                try:
                    self.producer.produce(self.topic, self.payload, partition=self.sent % self.partitions)
                except BufferError:
                    self.producer.poll(0.05)
                    continue
                self.sent += 1
                owed -= 1
            self.producer.poll(0)
            next_t += tick
            self.stop_event.wait(max(0.0, next_t - time.monotonic()))
            if next_t < time.monotonic() - 1:
                next_t, owed = time.monotonic(), 0.0  # behind by a second: do not pile up

    def burst(self, count: int) -> None:
        """``count`` messages at once, from the caller's thread."""
        for i in range(count):
            while True:
                try:
                    self.producer.produce(self.topic, self.payload, partition=i % self.partitions)
                    break
                except BufferError:
                    self.producer.poll(0.05)
        self.producer.flush(60)

    def stop(self) -> None:
        self.stop_event.set()
        self.join(10)
        self.producer.flush(30)

    def __enter__(self) -> ProduceLoad:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def read_topic(cluster: Any, topic: str, timeout_s: float = 120.0) -> list[bytes | None]:
    """Every record value of every partition of ``topic`` up to its end offsets now (fails if one is short)."""
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer(cluster.client_config(**{"group.id": f"read-{topic}", "enable.auto.commit": False}))
    out: list[bytes | None] = []
    try:
        md = c.list_topics(topic, timeout=30).topics[topic]
        deadline = time.monotonic() + timeout_s
        for p in sorted(md.partitions):
            _, high = c.get_watermark_offsets(TopicPartition(topic, p), timeout=30)
            c.assign([TopicPartition(topic, p, 0)])
            seen = 0
            while seen < high and time.monotonic() < deadline:
                m = c.poll(1.0)
                if m is not None and m.error() is None:
                    out.append(m.value())
                    seen += 1
            assert seen == high, f"read {seen} of {high} records of {topic}[{p}]"
    finally:
        c.close()
    return out


def results_dir() -> Path:
    path = Path(os.environ.get(RESULTS_ENV) or Path(tempfile.gettempdir()) / "isrwatch-validation")
    path.mkdir(parents=True, exist_ok=True)
    return path


def write_result(test: str, result: dict[str, Any]) -> Path:
    """One test's measurements as ``<results dir>/<test>.json``."""
    path = results_dir() / f"{test}.json"
    path.write_text(json.dumps({"test": test, "recorded_at": time.time(), **result}, indent=2, sort_keys=True) + "\n")
    return path


@dataclass
class Shrinks:
    """The leaders' ``Shrinking ISR`` lines for one topic, by (partition, removed broker)."""

    lines: list[Any] = field(default_factory=list)

    @classmethod
    def read(cls, cluster: Any, topic: str, since: float) -> Shrinks:
        return cls([c for c in cluster.isr_shrinks(since) if c.topic == topic])

    def first(self, partition: int, broker_id: int) -> float | None:
        times = [
            c.time
            for c in self.lines
            if c.partition == partition and broker_id in c.isr_before and broker_id not in c.isr_after
        ]
        return min(times) if times else None


def first_event(pipe: Pipeline, name: AlertName, status: str, topic: str, broker: int) -> dict[int, AlertEvent]:
    """partition -> the first ``name``/``status`` event of ``broker``'s replica."""
    out: dict[int, AlertEvent] = {}
    for e in pipe.alerts(name.value, status):
        t, p, b = e.replica
        if t == topic and b == broker and p not in out:
            out[p] = e
    return out


def nearing_row(
    scenario: str,
    topic: str,
    partition: int,
    broker_id: int,
    fault_at: float,
    e: AlertEvent | None,
    shrink: float | None,
) -> dict[str, Any]:
    """One row of the validation table (tools/validation_table.py): a follower's first
    ``KafkaReplicaNearingIsrShrink`` against the leader's logged shrink. The predicted
    crossing of lag/2 is the start of the predicted window minus lag/2."""
    window = e.window if e else None
    crossing = window[0] - LAG_MS / 2000 if window else None
    return {
        "scenario": scenario,
        "topic": topic,
        "partition": partition,
        "broker_id": broker_id,
        "alert": AlertName.NEARING.value,
        "fault_at": fault_at,
        "predicted_crossing_at": crossing,
        "predicted_window": window,
        "alert_starts_at": e.starts_at if e else None,
        "alert_arrived": e.arrived if e else None,
        "offset_lag_at_alert": e.offset_lag if e else None,
        "shrink_at": shrink,
        "lead_s": (shrink - crossing) if crossing and shrink else None,
        "arrival_lead_s": (shrink - e.arrived) if e and shrink else None,
    }
