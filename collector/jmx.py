"""The JMX client of ``isrwatch collect --source jmx``: one broker's MBeans, read over JMX remote.

The client is the JDK's own ``javax.management.remote`` API (the one jconsole uses), called
in-process through JPype1: one JVM inside the collector, started once (a JVM cannot be
restarted in a process), no jar of isrwatch's own and no subprocess. JPype is a maintained
Python-Java bridge; the wrappers on PyPI that shell out to a bundled jar are not.

One :meth:`JmxConnection.read` is one broker's answer in a round: the log end offset of every
replica it hosts, leader or follower (``kafka.log:type=Log,name=LogEndOffset``), the broker's
own ISR counters (``ReplicaManager``) and its replica fetchers' lag. JMX remote has no read of
many MBeans at once: the read is one name query per pattern, then one ``getAttribute`` per
MBean, all on one open connection. A connection that fails is closed; the next read opens a
fresh one.

Secrets: the password goes into the connection's environment map and nowhere else; errors
carry the endpoint and the Java exception's class and text, which never hold it.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

from collector.settings import endpoint_problem
from isrwatch.exceptions import ConfigError, IsrwatchError
from isrwatch.logs import kv
from isrwatch.settings import Secret

__all__ = [
    "BrokerReading",
    "JmxConnection",
    "JmxError",
    "LEO_PATTERN",
    "is_replica_log",
    "service_url",
    "start_jvm",
]

log = logging.getLogger(__name__)

LEO_PATTERN = "kafka.log:type=Log,name=LogEndOffset,topic=*,partition=*"
# Logs the pattern may list that are no replica an ISR counts: KRaft's own metadata log, and a
# future log (a replica being copied to another log directory: ``is-future=true`` in its name,
# which the pattern above, without ``,*``, does not match; checked again all the same).
NOT_REPLICAS = frozenset({"__cluster_metadata"})
# The follower side: the largest lag, in messages, of the broker's replica fetchers (each
# partition's own, FetcherLagMetrics ConsumerLag, would cost a call per follower replica).
MAX_LAG = "kafka.server:type=ReplicaFetcherManager,name=MaxLag,clientId=Replica"
REPLICA_MANAGER = "kafka.server:type=ReplicaManager,name={}"
BROKER_ID_PATTERN = "kafka.server:type=app-info,id=*"

# A backstop for a call the broker never answers (SIGSTOP, a dropped network): the JDK's RMI
# client gives up waiting for an answer (or a new connection's handshake) after this long,
# which fails the read, closes its connection and frees the thread that waits. Rounds do not
# wait for it: each broker has the round's deadline (collector.jmxprobe).
RMI_TIMEOUT_MS = 5_000

_JVM_LOCK = threading.Lock()


class JmxError(IsrwatchError):
    """A broker's JMX did not answer, or answered something that is not a Kafka broker's MBeans."""


def service_url(endpoint: str) -> str:
    """``host:port`` (the RMI registry of ``com.sun.management.jmxremote.port``) as a JMX service
    URL; a ``service:jmx:...`` URL as it is. ConfigError when it is neither."""
    problem = endpoint_problem(endpoint)
    if problem:
        raise ConfigError(problem)
    text = endpoint.strip()
    if text.startswith("service:jmx:"):
        return text
    host, _, port = text.rpartition(":")
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"  # an IPv6 address
    return f"service:jmx:rmi:///jndi/rmi://{host}:{port}/jmxrmi"


def start_jvm(truststore: str | None = None, truststore_password: Secret | None = None) -> None:
    """Start the process's JVM once (later calls return at once).

    ``-Xrs``: the JVM leaves SIGTERM and SIGINT to Python (the collector stops on them).
    The truststore (for a broker whose JMX uses TLS, ``com.sun.management.jmxremote.ssl``)
    is set as the standard ``javax.net.ssl`` properties before the first connection."""
    import jpype

    with _JVM_LOCK:
        if jpype.isJVMStarted():
            return
        started = time.monotonic()
        jpype.startJVM(
            "-Xrs",
            "-Xmx64m",
            "-XX:+UseSerialGC",
            f"-Dsun.rmi.transport.tcp.responseTimeout={RMI_TIMEOUT_MS}",
            f"-Dsun.rmi.transport.tcp.handshakeTimeout={RMI_TIMEOUT_MS}",
            f"-Dsun.rmi.transport.proxy.connectTimeout={RMI_TIMEOUT_MS}",
            interrupt=False,
            convertStrings=False,
        )
        system = _jclass("java.lang.System")
        if truststore:
            system.setProperty("javax.net.ssl.trustStore", truststore)
        if truststore_password is not None:
            system.setProperty("javax.net.ssl.trustStorePassword", truststore_password.reveal())
        log.info(kv(event="jvm_started", seconds=round(time.monotonic() - started, 3)))


def _jclass(name: str) -> Any:
    """A Java class of the running JVM (jpype is imported only here and in :func:`start_jvm`:
    ``isrwatch --help`` and fetch mode never load it)."""
    import jpype

    return jpype.JClass(name)


def attach_thread() -> None:
    """Attach the calling thread to the JVM as a daemon (it never holds the JVM up at exit)."""
    _jclass("java.lang.Thread").attachAsDaemon()


def detach_thread() -> None:
    _jclass("java.lang.Thread").detach()


@dataclass(frozen=True)
class BrokerReading:
    """What one broker's MBeans said in one read. ``t_ms``: when its offsets had been read."""

    broker_id: int
    t_ms: int
    leo: dict[tuple[str, int], int]
    max_lag: int | None = None
    isr_shrinks: int | None = None
    isr_expands: int | None = None
    under_replicated: int | None = None
    read_s: float = 0.0


class JmxConnection:
    """One broker's JMX remote connection: opened by the first :meth:`read`, closed on any failure.

    Not thread-safe: one thread reads it (collector.jmxprobe gives each broker its own)."""

    def __init__(
        self,
        endpoint: str,
        user: str | None = None,
        password: Secret | None = None,
        registry_ssl: bool = False,
    ) -> None:
        self.endpoint = endpoint
        self.url = service_url(endpoint)
        self._user = user
        self._password = password
        self._registry_ssl = registry_ssl
        self._connector: Any = None
        self._mbeans: Any = None
        self.broker_id: int | None = None

    def __repr__(self) -> str:
        return f"JmxConnection({self.endpoint!r}, user={self._user!r})"

    # -- connection ----------------------------------------------------------------

    def _environment(self) -> Any:
        env = _jclass("java.util.HashMap")()
        if self._user is not None or self._password is not None:
            secret = self._password.reveal() if self._password is not None else ""
            env.put("jmx.remote.credentials", _jclass("java.lang.String[]")([self._user or "", secret]))
        if self._registry_ssl:  # com.sun.management.jmxremote.registry.ssl=true on the broker
            env.put("com.sun.jndi.rmi.factory.socket", _jclass("javax.rmi.ssl.SslRMIClientSocketFactory")())
        return env

    def _open(self) -> None:
        factory = _jclass("javax.management.remote.JMXConnectorFactory")
        url = _jclass("javax.management.remote.JMXServiceURL")(self.url)
        self._connector = factory.connect(url, self._environment())
        self._mbeans = self._connector.getMBeanServerConnection()
        self.broker_id = self._broker_id()
        log.debug(kv(event="jmx_connected", endpoint=self.endpoint, broker_id=self.broker_id))

    def close(self) -> None:
        connector, self._connector, self._mbeans = self._connector, None, None
        if connector is not None:
            with contextlib.suppress(Exception):  # a broken connection may fail to close; dropped anyway
                connector.close()

    @property
    def connected(self) -> bool:
        return self._connector is not None

    # -- reading -------------------------------------------------------------------

    def read(self) -> BrokerReading:
        """One read of the broker's MBeans (connecting first when needed); JmxError when it fails."""
        started = time.monotonic()
        try:
            if self._mbeans is None:
                self._open()
            assert self.broker_id is not None
            leo = self._values(LEO_PATTERN, "Value")
            t_ms = int(time.time() * 1000)
            return BrokerReading(
                broker_id=self.broker_id,
                t_ms=t_ms,
                leo=leo,
                max_lag=self._value(MAX_LAG, "Value"),
                isr_shrinks=self._value(REPLICA_MANAGER.format("IsrShrinksPerSec"), "Count"),
                isr_expands=self._value(REPLICA_MANAGER.format("IsrExpandsPerSec"), "Count"),
                under_replicated=self._value(REPLICA_MANAGER.format("UnderReplicatedPartitions"), "Value"),
                read_s=time.monotonic() - started,
            )
        except JmxError:
            self.close()
            raise
        except Exception as e:  # noqa: BLE001 - any Java or bridge failure: this broker did not answer
            self.close()
            raise JmxError(f"JMX at {self.endpoint}: {_reason(e)}") from None

    def _names(self, pattern: str) -> list[Any]:
        name = _jclass("javax.management.ObjectName")(pattern)
        return list(self._mbeans.queryNames(name, None))

    def _values(self, pattern: str, attribute: str) -> dict[tuple[str, int], int]:
        """``(topic, partition) -> value`` of every MBean matching ``pattern`` (one gone between
        the query and the read, a partition deleted or moved, is left out)."""
        gone = _jclass("javax.management.InstanceNotFoundException")
        out = {}
        for name in self._names(pattern):
            if not is_replica_log(_unquoted(name.getKeyProperty("topic")), name.getKeyProperty("is-future")):
                continue
            try:
                value = self._mbeans.getAttribute(name, attribute)
            except gone:
                continue
            topic = _unquoted(name.getKeyProperty("topic"))
            out[(topic, int(str(name.getKeyProperty("partition"))))] = int(value)
        return out

    def _value(self, object_name: str, attribute: str) -> int | None:
        """One MBean's attribute as a whole number; None when the broker has no such MBean."""
        try:
            value = self._mbeans.getAttribute(_jclass("javax.management.ObjectName")(object_name), attribute)
        except _jclass("javax.management.InstanceNotFoundException"):
            return None
        return int(value)

    def _broker_id(self) -> int:
        names = self._names(BROKER_ID_PATTERN)
        ids = {str(n.getKeyProperty("id")) for n in names}
        if len(ids) != 1 or not next(iter(ids)).isdigit():
            raise JmxError(
                f"JMX at {self.endpoint}: no single {BROKER_ID_PATTERN} MBean (found {sorted(ids)}): "
                "not a Kafka broker's JMX port?"
            )
        return int(next(iter(ids)))


def is_replica_log(topic: str, is_future: Any) -> bool:
    """Whether a log's ``LogEndOffset`` MBean (its ``topic`` and ``is-future`` key properties;
    None: no such key) is a partition replica's log, the ones the ISR counts."""
    return topic not in NOT_REPLICAS and (is_future is None or str(is_future).lower() != "true")


def _unquoted(value: Any) -> str:
    text = str(value)
    if text.startswith('"'):
        return str(_jclass("javax.management.ObjectName").unquote(text))
    return text


def _reason(e: BaseException) -> str:
    """The exception's class and message in one short line (a Java exception's own class name)."""
    get_class = getattr(e, "getClass", None)
    java = callable(get_class)
    text = f"{get_class().getName()}: {e.getMessage()}" if java else f"{type(e).__name__}: {e}"  # type: ignore[attr-defined, misc]
    return " ".join(text.split())[:300]
