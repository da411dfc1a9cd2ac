"""The Kafka protocol requests isrwatch sends itself, and how their answers read.

Built from kafka-python's message classes (no client here): the collector's probe,
the job's watermarks and the exporter's metadata send them over their own
connections, and read the answers with these functions, whatever version the
broker spoke (v0 on Kafka 0.9; Kafka 4 removed v0 of ListOffsets).
"""

from __future__ import annotations

import socket
import time
from collections import defaultdict
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kafka.protocol.admin import DescribeConfigsRequest
from kafka.protocol.broker_api_versions import BROKER_API_VERSIONS
from kafka.protocol.list_offsets import ListOffsetsRequest
from kafka.protocol.metadata import MetadataRequest

from isrwatch.exceptions import UnsupportedBrokerError

__all__ = [
    "LATEST",
    "EARLIEST",
    "METADATA_MAX_VERSION",
    "LIST_OFFSETS_MAX_VERSION",
    "PartitionMetadata",
    "Versions",
    "kept_replicas",
    "broker_versions",
    "kafka_version",
    "cluster_kafka_version",
    "fallback_check",
    "broker_connection",
    "request_version",
    "metadata_request",
    "metadata_brokers",
    "metadata_partitions",
    "list_offsets_request",
    "list_offsets_answers",
    "DESCRIBE_CONFIGS_MAX_VERSION",
    "BROKER_RESOURCE",
    "TOPIC_RESOURCE",
    "describe_configs_request",
    "describe_configs_answers",
]

LATEST = -1  # ListOffsets timestamp: the end of the log (a leader asked by a client: the high watermark)
EARLIEST = -2  # ListOffsets timestamp: the log's start
METADATA_MAX_VERSION = 7  # v7 carries each partition's leader epoch
LIST_OFFSETS_MAX_VERSION = 5  # v6 on is a flexible version (tagged fields)

DESCRIBE_CONFIGS_MAX_VERSION = 2  # v3 adds the documentation; v4 on is flexible (kafka-python: up to 2)
TOPIC_RESOURCE = 2  # DescribeConfigs resource types (Kafka's ConfigResource.Type)
BROKER_RESOURCE = 4

Versions = dict[int, tuple[int, int]]  # a broker's ApiVersions answer: API key -> (min, max)


@dataclass(frozen=True)
class PartitionMetadata:
    """One partition of a metadata answer; ``error`` is Kafka's error code (0: none)."""

    topic: str
    partition: int
    leader: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    error: int = 0
    leader_epoch: int = -1  # -1: the answer does not say (Metadata before v7)


# Kafka's partition error codes of a metadata answer that leaves out the replicas of brokers
# that are not registered (Kafka 0.9): the leader is one of them, or another replica is.
LEADER_NOT_AVAILABLE = 5
REPLICA_NOT_AVAILABLE = 9


def kept_replicas(
    before: tuple[int, ...] | None, listed: tuple[int, ...], error: int, registered: Collection[int]
) -> tuple[int, ...]:
    """A partition's assigned replicas, as far as a metadata answer (``listed``, its
    partition ``error``, the ``registered`` brokers it names) and the partition's replicas
    before it (``before``) tell.

    Kafka 0.9 answers metadata (version 0, the only one it has) with only the replicas whose
    broker is registered, and an error on the partition: a broker that crashed, or hung past its
    ZooKeeper session, drops out of every partition it hosts as the controller drops it from
    their ISRs. Its replicas are still assigned, and out of sync until it is back; left out,
    isrwatch would keep what it last saw of them, from before the controller's shrink. So a
    replica of ``before`` whose broker is not registered is kept, in its place, while the
    answer says replicas are missing and lists none that ``before`` had not (a new replica means
    the assignment changed: the answer is taken as it is). Later versions list every assigned
    replica: nothing is added then."""
    if before is None or error not in (LEADER_NOT_AVAILABLE, REPLICA_NOT_AVAILABLE):
        return listed
    if not set(listed) <= set(before):
        return listed
    return tuple(b for b in before if b in listed or b not in registered)


def broker_versions(conn: Any, fallback: tuple[int, ...] | None = None) -> Versions:
    """What the broker at the other end of ``conn`` (a connected kafka-python
    ``BrokerConnection``) speaks: its own ApiVersions answer, or, for a broker that cannot
    answer one (before Kafka 0.10), the ranges kafka-python records for ``fallback``
    (``broker.version.fallback``), else for the version kafka-python's own probe found."""
    found = getattr(conn, "_api_version", None)  # kafka-python keeps what it learnt on the connection
    if found is not None and tuple(found) >= (0, 10):
        return dict(conn.get_api_versions() or {})
    table = fallback if fallback in BROKER_API_VERSIONS else found
    return dict(BROKER_API_VERSIONS.get(table, {})) if table is not None else {}


def kafka_version(versions: Mapping[int, tuple[int, int]]) -> tuple[int, ...] | None:
    """The Kafka version a broker's ApiVersions answer (``versions``, API key -> (min, max))
    shows: the newest in kafka-python's ``BROKER_API_VERSIONS`` (the answers of real brokers
    it records, 0.9 to 4.0) every one of whose requests the broker speaks, up to that
    version's highest; (0, 10, 0) for an answer none fits (ApiVersions itself came with
    0.10, kafka-python's own fallback); None for no answer (Kafka 0.9 cannot give one). A
    broker newer than the table reads as its newest entry."""
    if not versions:
        return None
    for known in sorted(BROKER_API_VERSIONS, reverse=True):
        table = BROKER_API_VERSIONS[known]
        if known >= (0, 10) and all(k in versions and versions[k][1] >= high for k, (_, high) in table.items()):
            return known
    return (0, 10, 0)


def cluster_kafka_version(answers: Iterable[Mapping[int, tuple[int, int]] | None]) -> str | None:
    """A cluster's Kafka version from its connected brokers' ApiVersions answers (one per
    broker; None or empty for a broker that gave none: Kafka 0.9): the oldest broker's, as
    text (``"0.10.2"``, ``"2.1"``); None when no broker answered, or one could not (a 0.9
    broker runs 0.9's rule whatever its neighbours)."""
    found = [kafka_version(a or {}) for a in answers]
    if not found or any(v is None for v in found):
        return None
    return ".".join(str(n) for n in min(v for v in found if v is not None))


def fallback_check() -> Any:
    """The question that tells a broker the 0.9 settings describe from one they do not, without
    ApiVersions (Kafka 0.9 never answers that; its question waits out its timeout): a ListOffsets
    v0 for no partition, which 0.9 answers and Kafka 4 refuses by closing the connection."""
    return list_offsets_request(0, -1, [], LATEST)


def broker_connection(address: str, settings: Mapping[str, Any], timeout_s: float) -> Any:
    """A connected kafka-python ``BrokerConnection`` to ``address`` (host:port) with ``settings``
    (``isrwatch.clientconfig.kafka_python_config``, bootstrap servers taken out); ConnectionError
    when there is none within ``timeout_s``. Settings pinned to a version (the 0.9 settings) hold
    for a broker that accepts :func:`fallback_check`; one that refuses it is connected to again,
    unpinned, and asked ApiVersions."""
    from kafka.conn import BrokerConnection

    host, _, port = address.rpartition(":")
    deadline = time.monotonic() + timeout_s
    pinned = settings.get("api_version") is not None
    for attempt in (dict(settings), {**settings, "api_version": None}) if pinned else (dict(settings),):
        conn = BrokerConnection(host.strip("[]"), int(port), socket.AF_UNSPEC, **attempt)
        if not conn.connect_blocking(max(0.0, deadline - time.monotonic())):
            conn.close()
            raise ConnectionError(f"{address}: no connection within {timeout_s:g} s")
        if attempt.get("api_version") is None or not _refuses(conn, fallback_check(), deadline):
            return conn
        conn.close()
    raise ConnectionError(f"{address}: no connection within {timeout_s:g} s")  # (not reached)


def _refuses(conn: Any, request: Any, deadline: float) -> bool:
    """Whether the broker closed ``conn`` on ``request`` before ``deadline`` (no answer by then: no)."""
    future = conn.send(request)
    while not future.is_done and time.monotonic() < deadline:
        for response, answered in conn.recv():  # the connection leaves the futures to its caller
            answered.success(response)
        time.sleep(0.002)
    return bool(future.failed())


def request_version(versions: Mapping[int, tuple[int, int]], request: Sequence[Any], highest: int) -> int:
    """The version of ``request`` (kafka-python's classes of one API, one per version) to send
    a broker: the newest that isrwatch reads (``highest``), kafka-python encodes and the broker
    speaks. ``versions``: the broker's ApiVersions answer, API key -> (min, max); a broker that
    cannot answer ApiVersions (Kafka 0.9) says nothing, and speaks version 0.
    UnsupportedBrokerError naming the request when they share no version (never one below the
    broker's minimum: Kafka 4 removed ListOffsets v0)."""
    name = request[0].__name__.removesuffix("_v0")
    low, high = versions.get(request[0].API_KEY, (0, 0))
    top = min(high, highest, len(request) - 1)
    if top < low:
        raise UnsupportedBrokerError(
            f"{name}: the broker speaks versions {low} to {high}, isrwatch up to {min(highest, len(request) - 1)}"
        )
    return top


def metadata_request(version: int, topics: list[str] | None = None) -> Any:
    """A Metadata request of ``version`` (0 to 7: the versions before the flexible ones that
    kafka-python encodes): every topic, or ``topics``; never creates one."""
    cls = MetadataRequest[version]
    wanted = cls.ALL_TOPICS if topics is None else topics
    return cls(topics=wanted) if version < 4 else cls(topics=wanted, allow_auto_topic_creation=False)


def metadata_brokers(response: Any) -> dict[int, tuple[str, int]]:
    """broker id -> (host, port) of a Metadata answer."""
    return {b[0]: (b[1], b[2]) for b in response.brokers}


def metadata_partitions(response: Any) -> tuple[dict[str, int], list[PartitionMetadata]]:
    """(topic -> its error code, every partition of the topics without one) of a Metadata
    answer, sorted by topic and partition."""
    version = response.API_VERSION
    errors: dict[str, int] = {}
    out = []
    for topic_data in response.topics:
        error, topic = topic_data[0], topic_data[1]
        parts = topic_data[2] if version == 0 else topic_data[3]
        errors[topic] = error
        if error != 0:
            continue
        for pd in parts:
            if version >= 7:
                p_error, p, leader, epoch, replicas, isr = pd[:6]
            else:
                (p_error, p, leader, replicas, isr), epoch = pd[:5], -1
            out.append(PartitionMetadata(topic, p, leader, tuple(replicas), tuple(isr), p_error, epoch))
    out.sort(key=lambda s: (s.topic, s.partition))
    return errors, out


def list_offsets_request(version: int, replica_id: int, parts: Iterable[tuple[str, int]], timestamp: int) -> Any:
    """A ListOffsets request of ``version`` for ``parts`` ((topic, partition)) at ``timestamp``
    (``LATEST`` or ``EARLIEST``), as ``replica_id`` (-1: a client; -2: the debugging id,
    which followers answer too)."""
    by_topic: dict[str, list[int]] = defaultdict(list)
    for topic, p in parts:
        by_topic[topic].append(p)
    if version == 0:
        topics: list[Any] = [(t, [(p, timestamp, 1) for p in ps]) for t, ps in by_topic.items()]
    elif version < 4:
        topics = [(t, [(p, timestamp) for p in ps]) for t, ps in by_topic.items()]
    else:
        topics = [(t, [(p, -1, timestamp) for p in ps]) for t, ps in by_topic.items()]
    cls = ListOffsetsRequest[version]
    return cls(replica_id=replica_id, topics=topics) if version < 2 else cls(replica_id, 0, topics)


def list_offsets_answers(response: Any) -> list[tuple[str, int, int, int | None]]:
    """(topic, partition, error code, offset) of every partition of a ListOffsets answer;
    the offset is None with an error, or when a v0 answer lists none."""
    out: list[tuple[str, int, int, int | None]] = []
    for topic, parts in response.topics:
        for pd in parts:
            p, error = pd[0], pd[1]
            if error != 0:
                out.append((topic, p, error, None))
            elif response.API_VERSION == 0:
                out.append((topic, p, 0, int(pd[2][0]) if pd[2] else None))
            else:
                out.append((topic, p, 0, int(pd[3])))
    return out


def describe_configs_request(version: int, resources: Iterable[tuple[int, str, Sequence[str]]]) -> Any:
    """A DescribeConfigs request of ``version`` (0 to 2) for ``resources``: (resource type,
    ``BROKER_RESOURCE`` or ``TOPIC_RESOURCE``; its name, a broker id or a topic; the config
    names wanted). No synonyms asked: each answer gives the value in effect."""
    wanted = [(kind, name, list(keys)) for kind, name, keys in resources]
    cls = DescribeConfigsRequest[version]
    return cls(resources=wanted) if version == 0 else cls(resources=wanted, include_synonyms=False)


def describe_configs_answers(response: Any) -> list[tuple[int, str, int, dict[str, str | None]]]:
    """(resource type, resource name, error code, config name -> value in effect) of every
    resource of a DescribeConfigs answer (versions 0 to 2 read alike)."""
    return [
        (kind, name, error, {entry[0]: entry[1] for entry in entries})
        for error, _message, kind, name, entries in response.resources
    ]
