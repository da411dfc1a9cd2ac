"""The job's own look at the brokers of its telemetry cluster: which one has stopped answering.

When isrwatch's topics live on the watched cluster, a broker that hangs can take the
telemetry with it: the partitions it leads, or every partition whose high watermark it
holds back as a follower, give the job nothing new until the leaders drop it: the very
shrink isrwatch exists to warn of. The telemetry then says nothing about that broker, but
the job can still see it: ``BrokerWatch`` asks every broker of the telemetry cluster for
metadata every ``interval_s`` on a connection of its own (Kafka's Metadata request,
version 0, which every broker since 0.8 answers), with a deadline of ``timeout_s``. A broker
that has not answered for a while *while another broker answers* is silent; with its last
answer, that is evidence ``streaming.driver.lookahead.Lookahead.silent_due`` uses for the
broker's follower replicas (the telemetry cannot show it: it is frozen).

What it sees speaks of a watched cluster only when that cluster is this one by identity
(``identity``: the cluster id the job read at its start, and each broker's address;
``streaming.driver.identity`` compares them with what each collector states of its cluster): the
brokers of a separate telemetry cluster, or of another cluster numbering its brokers alike,
say nothing about a watched cluster's. A broker that answers again after a silence is
``resumed``: the job's newer evidence, which withdraws what the silence implied.

The requests are plain Kafka protocol on a TCP socket: no client library's own retries and
connection sharing between brokers stand between a broker and its answer. So the watch runs
only where the telemetry cluster takes PLAINTEXT connections (``security.protocol`` unset
or ``PLAINTEXT``); elsewhere the job says so once and works without it.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import struct
import threading
import time
from collections.abc import Callable

from isrwatch.logs import kv
from streaming.driver.identity import ClusterIdentity, address

__all__ = ["BrokerWatch", "metadata_request", "parse_metadata", "Metadata"]

log = logging.getLogger("streaming.brokerwatch")

_METADATA = 3  # the Metadata API key; version 0
_CLIENT_ID = b"isrwatch-brokerwatch"


def _string(text: str) -> bytes:
    raw = text.encode()
    return struct.pack(">h", len(raw)) + raw


def metadata_request(correlation_id: int, topics: list[str]) -> bytes:
    """A Metadata v0 request, size-prefixed. No topics: every topic."""
    body = struct.pack(">hhih", _METADATA, 0, correlation_id, len(_CLIENT_ID)) + _CLIENT_ID
    body += struct.pack(">i", len(topics)) + b"".join(_string(t) for t in topics)
    return struct.pack(">i", len(body)) + body


class Metadata:
    """A Metadata v0 response: the brokers (id -> (host, port)), every partition's replicas
    and its error code (0: none)."""

    def __init__(
        self, correlation_id: int, brokers: dict[int, tuple[str, int]], replicas: dict, errors: dict | None = None
    ) -> None:
        self.correlation_id = correlation_id
        self.brokers = brokers
        self.replicas: dict[tuple[str, int], tuple[int, ...]] = replicas
        self.errors: dict[tuple[str, int], int] = errors or {}


def parse_metadata(payload: bytes) -> Metadata:
    """A Metadata v0 response's payload (after its size); ValueError when it is not one."""
    pos = 0

    def take(fmt: str) -> tuple:
        nonlocal pos
        size = struct.calcsize(fmt)
        if pos + size > len(payload):
            raise ValueError("metadata response cut short")
        out = struct.unpack_from(fmt, payload, pos)
        pos += size
        return out

    def string() -> str:
        nonlocal pos
        (n,) = take(">h")
        if n < 0:
            return ""
        if pos + n > len(payload):
            raise ValueError("metadata response cut short")
        text = payload[pos : pos + n].decode(errors="replace")
        pos += n
        return text

    (corr,) = take(">i")
    brokers = {}
    for _ in range(take(">i")[0]):
        (node,) = take(">i")
        host = string()
        (port,) = take(">i")
        brokers[node] = (host, port)
    replicas: dict[tuple[str, int], tuple[int, ...]] = {}
    errors: dict[tuple[str, int], int] = {}
    for _ in range(take(">i")[0]):
        take(">h")
        topic = string()
        for _ in range(take(">i")[0]):
            error, partition, _ = take(">hii")
            (n,) = take(">i")
            replicas[(topic, partition)] = take(f">{n}i") if n > 0 else ()
            if error:
                errors[(topic, partition)] = error
            (n,) = take(">i")
            take(f">{n}i")  # the ISR: the telemetry has it, with its time
    return Metadata(corr, brokers, replicas, errors)


class _Connection:
    """One broker's connection; closed on any failure, opened again at the next ask."""

    def __init__(self, host: str, port: int, timeout_s: float) -> None:
        self.address = (host, port)
        self.timeout_s = timeout_s
        self.sock: socket.socket | None = None
        self.correlation = 0

    def ask(self, topics: list[str]) -> Metadata:
        deadline = time.monotonic() + self.timeout_s
        try:
            if self.sock is None:
                self.sock = socket.create_connection(self.address, timeout=self.timeout_s)
            self.correlation += 1
            self.sock.settimeout(max(0.05, deadline - time.monotonic()))
            self.sock.sendall(metadata_request(self.correlation, topics))
            (size,) = struct.unpack(">i", self._read(4, deadline))
            answer = parse_metadata(self._read(size, deadline))
            if answer.correlation_id != self.correlation:
                raise ValueError("an answer to another request")
            return answer
        except (OSError, ValueError, struct.error):
            self.close()
            raise

    def _read(self, n: int, deadline: float) -> bytes:
        assert self.sock is not None
        chunks, got = [], 0
        while got < n:
            self.sock.settimeout(max(0.05, deadline - time.monotonic()))
            chunk = self.sock.recv(min(n - got, 1 << 20))
            if not chunk:
                raise OSError("connection closed")
            chunks.append(chunk)
            got += len(chunk)
        return b"".join(chunks)

    def close(self) -> None:
        if self.sock is not None:
            with contextlib.suppress(OSError):
                self.sock.close()
            self.sock = None


class BrokerWatch:
    """Every broker of one cluster asked for metadata every ``interval_s`` (one thread, each
    broker within ``timeout_s``); ``silent``, ``resumed`` and ``identity`` read what it found.
    ``cluster_id``: the cluster's id, where its brokers give one (read at the job's start)."""

    def __init__(
        self,
        bootstrap_servers: str,
        topic: str,
        *,
        cluster_id: str | None = None,
        interval_s: float = 0.5,
        timeout_s: float = 1.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.topic = topic
        self.cluster_id = cluster_id or None
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self._clock = clock
        self._bootstrap = [_endpoint(s) for s in bootstrap_servers.split(",") if s.strip()]
        self._connections: dict[int, _Connection] = {}
        self._answered: dict[int, float] = {}  # broker -> wall time of its last answer
        # broker -> (its last answer before its newest gap, its first answer after it)
        self._gaps: dict[int, tuple[float, float]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="isrwatch-brokerwatch", daemon=True)
        self._silent_logged: set[int] = set()
        self.errors = 0  # unexpected errors its thread survived (_run)

    def start(self) -> BrokerWatch:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5 * self.timeout_s)
        for c in self._connections.values():
            c.close()

    def silent(self, now: float, after_s: float) -> dict[int, float]:
        """The brokers that have not answered for ``after_s`` seconds while another broker
        answered within that time: broker id -> the wall time of its last answer. Brokers
        never heard from are not among them (nothing says when they stopped)."""
        with self._lock:
            if not any(now - t < after_s for t in self._answered.values()):
                return {}  # none answers: the job's own network, not a broker
            return {b: t for b, t in self._answered.items() if now - t >= after_s}

    def resumed(self, after_s: float) -> dict[int, float]:
        """The brokers that answered again after not answering for ``after_s`` seconds or
        more: broker id -> the wall time of that first answer (the newest such gap)."""
        with self._lock:
            return {b: back for b, (last, back) in self._gaps.items() if back - last >= after_s}

    def identity(self) -> ClusterIdentity:
        """The cluster as the job sees it: its id (None where its brokers give none) and the
        address of every broker it has learned (a broker that left the metadata keeps its own)."""
        endpoints = {b: address(*c.address) for b, c in list(self._connections.items())}
        return ClusterIdentity(self.cluster_id, endpoints)

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                self.round()
            except Exception as e:  # noqa: BLE001 - the stall path's evidence: the thread must not end
                # What a broker's answer can do wrong is caught in round; this is anything else.
                self.errors += 1
                log.exception("brokerwatch_error %s", kv(errors=self.errors, error=type(e).__name__))
            self._stop.wait(max(0.0, self.interval_s - (time.monotonic() - started)))

    def round(self) -> None:
        """Ask every broker once (the bootstrap servers until a broker names them all)."""
        if not self._connections:
            for host, port in self._bootstrap:
                with contextlib.suppress(OSError, ValueError, struct.error):
                    answer = _Connection(host, port, self.timeout_s).ask([self.topic])
                    self._learn(answer)
                    break
            return
        learned = False
        for broker, conn in list(self._connections.items()):
            if self._stop.is_set():
                return
            try:
                answer = conn.ask([self.topic])
            except (OSError, ValueError, struct.error) as e:
                if broker not in self._silent_logged and broker in self._answered:
                    self._silent_logged.add(broker)
                    log.info("broker_not_answering %s", kv(broker_id=broker, reason=type(e).__name__))
                continue
            now = self._clock()
            with self._lock:
                last = self._answered.get(broker)
                self._answered[broker] = now
                if last is not None and now - last > 2 * self.interval_s + self.timeout_s:
                    self._gaps[broker] = (last, now)  # a round or more missed: a gap, however short
            if broker in self._silent_logged:
                self._silent_logged.discard(broker)
                log.info("broker_answering %s", kv(broker_id=broker))
            if not learned:
                self._learn(answer)
                learned = True

    def _learn(self, answer: Metadata) -> None:
        """The brokers an answer names, each with a connection of its own. A broker that left
        the metadata (Kafka 0.9: killed, or hung past its session) keeps its connection, so
        the job still sees it silent, and its address."""
        for broker, (host, port) in answer.brokers.items():
            known = self._connections.get(broker)
            if known is None or known.address != (host, port):
                if known is not None:
                    known.close()
                self._connections[broker] = _Connection(host, port, self.timeout_s)


def _endpoint(server: str) -> tuple[str, int]:
    host, _, port = server.strip().rpartition(":")
    return host.strip("[]") or "localhost", int(port or 9092)
