"""Protocol-level requests to every broker of a cluster (the collector's Kafka layer).

One :meth:`ClusterProbe.snapshot` is one polling round: a Metadata request
(leader, replicas, ISR of every partition), then, to every broker at once, a
ListOffsets request with replica id -2 for every replica it hosts (the
"debugging" replica id: followers answer it too, with their log end offset)
and, to each leader, an ordinary ListOffsets (replica id -1) for the high
watermark. Each request's version is chosen for the broker it goes to, from that
broker's ApiVersions answer (``isrwatch.kafkawire.broker_versions``; 4.x removed
ListOffsets v0). Kafka 0.9 cannot answer ApiVersions (it never replies: a question
waits out its timeout), hence the 0.9 settings (``api.version.request=false``), which
pin the versions to ``broker.version.fallback``'s. They hold only for brokers that
cannot answer: at start-up each broker is asked a ListOffsets v0 (for no partition),
and when one refuses it (Kafka 4 closes the connection) every connection asks its
broker ApiVersions from then on.
A broker that does not answer within the round's deadline is reported
unreachable; the round carries on with the others.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from kafka import errors as kerrors
from kafka.client_async import KafkaClient
from kafka.protocol.admin import DescribeConfigsRequest
from kafka.protocol.list_offsets import ListOffsetsRequest
from kafka.protocol.metadata import MetadataRequest

from isrwatch.exceptions import UnreachableError, UnsupportedBrokerError
from isrwatch.kafkawire import (
    BROKER_RESOURCE,
    DESCRIBE_CONFIGS_MAX_VERSION,
    LATEST,
    LIST_OFFSETS_MAX_VERSION,
    METADATA_MAX_VERSION,
    TOPIC_RESOURCE,
    broker_versions,
    cluster_kafka_version,
    describe_configs_answers,
    describe_configs_request,
    fallback_check,
    kept_replicas,
    list_offsets_answers,
    list_offsets_request,
    metadata_brokers,
    metadata_partitions,
    metadata_request,
    request_version,
)
from isrwatch.logs import kv
from isrwatch.telemetry import BrokerCounters

__all__ = [
    "ClusterProbe",
    "ConfigAnswers",
    "PartitionState",
    "Snapshot",
    "DEBUG_REPLICA_ID",
    "CLIENT_REPLICA_ID",
    "LAG_TIME_MAX_MS",
    "MIN_INSYNC_REPLICAS",
]

log = logging.getLogger(__name__)

DEBUG_REPLICA_ID = -2  # answered by followers too, with the log end offset
CLIENT_REPLICA_ID = -1  # an ordinary consumer: the leader answers with the high watermark
LAG_TIME_MAX_MS = "replica.lag.time.max.ms"  # a broker's setting
MIN_INSYNC_REPLICAS = "min.insync.replicas"  # a topic's (its own, else the broker's default)


@dataclass(frozen=True)
class PartitionState:
    topic: str
    partition: int
    leader: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    leader_epoch: int = -1  # -1: the broker does not say (Metadata before v7: Kafka before 2.1)


@dataclass
class Snapshot:
    """What one round saw. ``leo[(broker, topic, partition)]`` is missing when that broker did not say."""

    t_ms: int
    brokers: dict[int, str]
    partitions: list[PartitionState]
    leo: dict[tuple[int, str, int], int] = field(default_factory=dict)
    hw: dict[tuple[str, int], int] = field(default_factory=dict)
    unreachable: set[int] = field(default_factory=set)
    metadata_fresh: bool = True
    round_s: float = 0.0
    # what each broker that answered said of its own replication (JMX: IsrShrinksPerSec, IsrExpandsPerSec)
    counters: list[BrokerCounters] = field(default_factory=list)


@dataclass
class ConfigAnswers:
    """What one DescribeConfigs pass read: each broker's ``replica.lag.time.max.ms``, each
    topic's ``min.insync.replicas`` (the value in effect), and why the others were not read
    (``"broker 2"`` or ``"topic orders"`` -> the reason)."""

    lag_time_max_ms: dict[int, int] = field(default_factory=dict)
    min_isr: dict[str, int] = field(default_factory=dict)
    unread: dict[str, str] = field(default_factory=dict)


class ClusterProbe:
    """Owns one kafka-python KafkaClient; single-threaded."""

    def __init__(self, client_config: dict[str, Any], round_timeout_s: float = 1.0) -> None:
        self.config = {"request_timeout_ms": 10_000, **client_config}
        self._fallback: tuple[int, ...] | None = self.config.get("api_version")  # the 0.9 settings' version
        self.round_timeout_s = round_timeout_s
        self.client: KafkaClient | None = None
        self._partitions: list[PartitionState] = []
        self._brokers: dict[int, str] = {}
        self._versions: dict[int, dict[str, int]] = {}  # broker -> request -> version, as last logged
        self._unlisted: list[int] = []  # brokers whose replicas are kept though metadata leaves them out

    # -- connection ------------------------------------------------------------------

    def connect(self, timeout_s: float = 15.0) -> Snapshot:
        """Connect and take a first snapshot; UnreachableError with one clear line when the cluster does not answer."""
        self.open(timeout_s)
        return self.snapshot()

    def open(self, timeout_s: float = 15.0) -> list[PartitionState]:
        """Connect and read metadata once (no offsets asked); UnreachableError as :meth:`connect`."""
        servers = ",".join(self.config["bootstrap_servers"])
        try:
            self.client = KafkaClient(api_version_auto_timeout_ms=int(timeout_s * 1000), **self.config)
        except (kerrors.NoBrokersAvailable, kerrors.KafkaConnectionError) as e:
            raise UnreachableError(f"cannot reach Kafka at {servers}: {type(e).__name__}") from None
        if self._fallback is None:
            # kafka-python pins every later connection to the version its first one found; unpinned,
            # each connection asks its own broker (a cluster in a rolling upgrade mixes versions)
            self.client.config["api_version"] = None
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            md = self.metadata(min(self.round_timeout_s * 2, max(0.1, deadline - time.monotonic())))
            if md is not None:
                if self._fallback is not None:
                    self._check_fallback(deadline)
                # every broker connected (and its versions known) before the first round, when it can be
                # within a round's time (one down or hung is the rounds' to report)
                soon = min(deadline, time.monotonic() + self.round_timeout_s)
                for broker in sorted(self._ready(sorted(self._brokers), soon)):
                    self._version(broker, ListOffsetsRequest, LIST_OFFSETS_MAX_VERSION)
                return md
        self.close()
        raise UnreachableError(f"cannot reach Kafka at {servers}: no metadata answer in {timeout_s:.0f} s")

    def _check_fallback(self, deadline: float) -> None:
        """The 0.9 settings were given: ask each broker a ListOffsets v0 for no partition, which
        Kafka 0.9 answers and Kafka 4 refuses (it closes the connection). When one refuses, the
        settings do not describe this cluster: every connection asks its broker ApiVersions from
        then on (a broker that cannot answer it still gets the fallback's versions)."""
        assert self.client is not None
        # bounded as a round is: a broker that hangs (paused) must not hold the start-up, and one
        # that has not answered by then is not one that refused
        deadline = min(deadline, time.monotonic() + self.round_timeout_s)
        ready = self._ready(sorted(self._brokers), deadline)
        asked = {b: self.client.send(b, fallback_check()) for b in ready}
        self._wait(list(asked.values()), deadline)
        refused = sorted(b for b, f in asked.items() if f.failed())
        if not refused:
            return
        log.info(
            kv(
                event="api_versions_asked",
                brokers=",".join(map(str, refused)),
                reason="they refuse the versions of broker.version.fallback: api.version.request=false applies to "
                "brokers that cannot answer ApiVersions (Kafka 0.9)",
            )
        )
        self.client.config["api_version"] = None  # new connections ask ApiVersions
        for b in list(self.client._conns):  # and every connection is made anew (each keeps its settings)
            self.client.close(b)

    @property
    def brokers(self) -> dict[int, str]:
        """broker id -> host:port, from the newest metadata."""
        return dict(self._brokers)

    @property
    def partitions(self) -> list[PartitionState]:
        """Every partition of the newest metadata."""
        return list(self._partitions)

    @property
    def cluster_id(self) -> str | None:
        """The cluster id from the newest metadata (None: not connected, or a broker before
        Kafka 0.10.1, whose metadata carries none)."""
        if self.client is None:
            return None
        return getattr(self.client.cluster, "cluster_id", None)

    @property
    def kafka_version(self) -> str | None:
        """The cluster's Kafka version from the ApiVersions answers of the brokers connected now
        (``isrwatch.kafkawire.cluster_kafka_version``: the oldest's; None when none is connected,
        or one is connected with the 0.9 settings, which cannot answer ApiVersions)."""
        if self.client is None:
            return None
        answers = []
        for b in sorted(self._brokers):
            conn = self.client._conns.get(b)
            if conn is None or not conn.connected():
                continue
            pinned = getattr(conn, "_api_version", None)  # what kafka-python learnt, or was told, of the broker
            answered = pinned is not None and tuple(pinned) >= (0, 10)
            answers.append(getattr(conn, "_api_versions", None) if answered else None)
        return cluster_kafka_version(answers)

    def close(self) -> None:
        if self.client is not None:
            self.client.close()
            self.client = None

    def _version(self, broker: int, request: list[Any], highest: int) -> int:
        """The version of ``request`` to send ``broker`` (connected): from its own ApiVersions
        answer; logged when it changes. UnsupportedBrokerError when they share none."""
        assert self.client is not None
        conn = self.client._conns.get(broker)  # kafka-python keeps each broker's answer on its connection
        name = request[0].__name__.removesuffix("Request_v0")
        try:
            version = request_version(broker_versions(conn, self._fallback), request, highest)
        except UnsupportedBrokerError as e:
            raise UnsupportedBrokerError(f"broker {broker}: {e}") from None
        known = self._versions.setdefault(broker, {})
        if known.get(name) != version:
            known[name] = version
            log.info(kv(event="api_version", broker=broker, request=name, version=version))
        return version

    # -- one round -------------------------------------------------------------------

    def _wait(self, futures: list[Any], deadline: float) -> None:
        assert self.client is not None
        while time.monotonic() < deadline and not all(f.is_done for f in futures):
            self.client.poll(timeout_ms=max(1, int((deadline - time.monotonic()) * 1000)))

    def _ready(self, brokers: list[int], deadline: float) -> set[int]:
        """The brokers we can send to now, connecting to the others until ``deadline``."""
        assert self.client is not None
        ready = {b for b in brokers if self.client.ready(b, metadata_priority=False)}
        while len(ready) < len(brokers) and time.monotonic() < deadline:
            self.client.poll(timeout_ms=10)
            ready |= {b for b in brokers if b not in ready and self.client.ready(b, metadata_priority=False)}
        return ready

    def metadata(self, timeout_s: float) -> list[PartitionState] | None:
        """Fresh metadata from the least loaded broker; None when nobody answers in time."""
        assert self.client is not None
        node = self.client.least_loaded_node()
        deadline = time.monotonic() + timeout_s
        while node is not None and not self.client.ready(node, metadata_priority=False) and time.monotonic() < deadline:
            self.client.poll(timeout_ms=20)
            if not self.client.ready(node, metadata_priority=False):
                node = self.client.least_loaded_node()
        if node is None or not self.client.ready(node, metadata_priority=False):
            return None
        version = self._version(node, MetadataRequest, METADATA_MAX_VERSION)
        future = self.client.send(node, metadata_request(version))
        self._wait([future], deadline)
        if not future.is_done or future.failed():
            return None
        response = future.value
        self.client.cluster.update_metadata(response)
        self._brokers = {b: f"{host}:{port}" for b, (host, port) in metadata_brokers(response).items()}
        before = {(ps.topic, ps.partition): ps.replicas for ps in self._partitions}
        listed = metadata_partitions(response)[1]
        self._partitions = [
            PartitionState(
                m.topic,
                m.partition,
                m.leader,
                kept_replicas(before.get((m.topic, m.partition)), m.replicas, m.error, self._brokers),
                m.isr,
                m.leader_epoch,
            )
            for m in listed
        ]
        self._log_unlisted([ps for ps, m in zip(self._partitions, listed, strict=True) if m.error])
        return self._partitions

    def _log_unlisted(self, errored: list[PartitionState]) -> None:
        """One line when the set of brokers whose replicas are kept though the metadata does not
        list them (``isrwatch.kafkawire.kept_replicas``) changes. Only a partition the answer
        gave an error can keep one (``errored``): a healthy cluster costs no pass here."""
        unlisted = sorted({b for ps in errored for b in ps.replicas if b not in self._brokers})
        if unlisted != self._unlisted:
            kept = sum(b in unlisted for ps in errored for b in ps.replicas)
            log.info(kv(event="unregistered_brokers", brokers=",".join(map(str, unlisted)) or "-", replicas_kept=kept))
            self._unlisted = unlisted

    def describe_configs(self, timeout_s: float) -> ConfigAnswers:
        """Each broker's ``replica.lag.time.max.ms`` (asked of that broker: Kafka answers a broker
        resource only for itself) and every topic's ``min.insync.replicas`` (asked of the first
        broker that can answer), by DescribeConfigs, which Kafka has from 0.11 (a broker whose
        ApiVersions answer, or the 0.9 settings' table, does not list it is not asked). Answers
        wait until ``timeout_s`` at most; a broker silent by then, refusing or failing is
        ``unread`` with the reason, the others are read."""
        assert self.client is not None
        deadline = time.monotonic() + timeout_s
        out = ConfigAnswers()
        ready = self._ready(sorted(self._brokers), deadline)
        speaking: dict[int, int] = {}
        for b in sorted(self._brokers):
            versions = broker_versions(self.client._conns.get(b), self._fallback) if b in ready else {}
            if b not in ready:
                out.unread[f"broker {b}"] = f"no connection within {timeout_s:g} s"
            elif DescribeConfigsRequest[0].API_KEY not in versions:
                out.unread[f"broker {b}"] = "the broker has no DescribeConfigs (Kafka before 0.11)"
            else:
                try:
                    speaking[b] = self._version(b, DescribeConfigsRequest, DESCRIBE_CONFIGS_MAX_VERSION)
                except UnsupportedBrokerError as e:
                    out.unread[f"broker {b}"] = str(e)
        topics = sorted({ps.topic for ps in self._partitions})
        asker = min(speaking, default=None)
        sent = []
        for b, version in sorted(speaking.items()):
            resources = [(BROKER_RESOURCE, str(b), [LAG_TIME_MAX_MS])]
            if b == asker:
                resources += [(TOPIC_RESOURCE, t, [MIN_INSYNC_REPLICAS]) for t in topics]
            sent.append((b, self.client.send(b, describe_configs_request(version, resources))))
        self._wait([f for _, f in sent], deadline)
        for b, f in sent:
            if not f.is_done or f.failed():
                why = f"no answer within {timeout_s:g} s" if not f.is_done else f"{type(f.exception).__name__}"
                out.unread[f"broker {b}"] = f"DescribeConfigs: {why}"
                continue
            for kind, name, error, values in describe_configs_answers(f.value):
                key = LAG_TIME_MAX_MS if kind == BROKER_RESOURCE else MIN_INSYNC_REPLICAS
                what = f"broker {name}" if kind == BROKER_RESOURCE else f"topic {name}"
                value = values.get(key)
                if error or value is None or not value.isdigit():
                    out.unread[what] = f"DescribeConfigs: error code {error}" if error else f"{key}={value!r}"
                elif kind == BROKER_RESOURCE:
                    out.lag_time_max_ms[int(name)] = int(value)
                else:
                    out.min_isr[name] = int(value)
        for t in topics:
            if t not in out.min_isr and f"topic {t}" not in out.unread:
                out.unread[f"topic {t}"] = (
                    "no broker can answer DescribeConfigs"
                    if asker is None
                    else out.unread.get(f"broker {asker}", "not in the answer")
                )
        return out

    def answer_times(self, timeout_s: float) -> dict[int, float]:
        """The brokers (of the newest metadata) that answered a metadata request within
        ``timeout_s``, each with its answer time in seconds; all asked at once, each on
        its own connection (``isrwatch doctor``)."""
        assert self.client is not None
        deadline = time.monotonic() + timeout_s
        brokers = sorted(self._brokers)
        sent: dict[int, tuple[Any, float]] = {}
        answered: dict[int, float] = {}
        while len(answered) < len(brokers) and time.monotonic() < deadline:
            for b in brokers:
                if b not in sent and self.client.ready(b, metadata_priority=False):
                    question = metadata_request(self._version(b, MetadataRequest, METADATA_MAX_VERSION), [])
                    sent[b] = (self.client.send(b, question), time.monotonic())
            self.client.poll(timeout_ms=10)
            for b, (future, at) in sent.items():
                if b not in answered and future.is_done and not future.failed():
                    answered[b] = time.monotonic() - at
        return answered

    def _list_offsets(self, node: int, replica_id: int, parts: list[tuple[str, int]]) -> Any:
        assert self.client is not None
        version = self._version(node, ListOffsetsRequest, LIST_OFFSETS_MAX_VERSION)
        return self.client.send(node, list_offsets_request(version, replica_id, parts, LATEST))

    def snapshot(self) -> Snapshot:
        """One polling round."""
        assert self.client is not None
        started = time.monotonic()
        deadline = started + self.round_timeout_s
        fresh = self.metadata(self.round_timeout_s / 2) is not None
        partitions = self._partitions
        hosted: dict[int, list[tuple[str, int]]] = defaultdict(list)
        led: dict[int, list[tuple[str, int]]] = defaultdict(list)
        for ps in partitions:
            for b in ps.replicas:
                hosted[b].append((ps.topic, ps.partition))
            if ps.leader >= 0:
                led[ps.leader].append((ps.topic, ps.partition))
        pending: list[tuple[str, int, Any]] = []
        wanted = sorted(b for b in hosted if hosted[b])
        ready = self._ready([b for b in wanted if b in self._brokers], started + self.round_timeout_s / 2)
        unreachable = set(wanted) - ready
        for broker in sorted(ready):
            pending.append(("leo", broker, self._list_offsets(broker, DEBUG_REPLICA_ID, hosted[broker])))
            if led.get(broker):
                pending.append(("hw", broker, self._list_offsets(broker, CLIENT_REPLICA_ID, led[broker])))
        answered_at: list[float] = []
        for _, _, f in pending:
            f.add_callback(lambda _v, at=answered_at: at.append(time.time()))
        self._wait([f for _, _, f in pending], deadline)
        snap = Snapshot(
            t_ms=int((max(answered_at) if answered_at else time.time()) * 1000),
            brokers=dict(self._brokers),
            partitions=list(partitions),
            metadata_fresh=fresh,
        )
        for kind, broker, f in pending:
            if not f.is_done or f.failed():
                unreachable.add(broker)
                continue
            for topic, p, error, offset in list_offsets_answers(f.value):
                if error or offset is None:
                    continue
                if kind == "leo":
                    snap.leo[(broker, topic, p)] = offset
                else:
                    snap.hw[(topic, p)] = offset
        snap.unreachable = unreachable
        snap.round_s = time.monotonic() - started
        return snap
