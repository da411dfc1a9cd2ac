"""A protocol-level fake of a Kafka 4.0 cluster: a protocol check, not evidence about a broker.

Each fake broker is a small TCP server on 127.0.0.1 that speaks Kafka's wire protocol for the
requests isrwatch sends, reading them and writing its answers with the field layouts of Kafka's
own message specifications (tests/support/fakebroker_layouts.py), never with kafka-python's
classes. It shows that isrwatch's requests are sent in versions a 4.0 broker accepts and that
its answers are read; what the answers say is what the fake is told to say, so nothing here
shows how a real broker behaves. What it is told follows Apache Kafka's source, read, not run:

* ApiVersions: the ranges kafka-python records for 4.0 (``BROKER_API_VERSIONS[(4, 0)]``), among
  them ListOffsets 1 to 10 and Metadata 0 to 13. A request in a version outside them is
  refused as a 4.0 broker refuses it: the connection is closed (and the refusal recorded);
* ListOffsets with replica id -2 (the debugging id, ``kafka.server.KafkaApis``: no isolation
  level, so the log end offset; answered by followers too) gives the broker's own log end
  offset of every replica it hosts; replica id -1 (a client) gives the leader's high
  watermark (latest) or log start (earliest), and NOT_LEADER_OR_FOLLOWER from another broker;
* DescribeConfigs: a broker resource for the broker asked gives its ``replica.lag.time.max.ms``
  (``lag_time_max_ms``; another broker's id: INVALID_REQUEST, as Kafka's ``ConfigHelper``
  answers), a topic resource the topic's ``min.insync.replicas`` (``min_isr``, else
  ``default_min_isr``: the value in effect); ``describe_configs_refused`` brokers close the
  connection on it;
* Metadata: every broker but the fenced ones (``fenced``: KRaft leaves a fenced broker out of the
  broker list, its replicas still in the partitions'), and each partition's leader, leader
  epoch (v7 on), replicas and ISR.

Versions the layouts do not write down (Metadata 9 on, ListOffsets 6 on: flexible ones isrwatch
and kafka-python 2.3 do not send) are recorded as ``unmodelled`` and the connection closed, so
a test fails on them rather than reading a guess.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
from dataclasses import dataclass, field
from typing import Any

from kafka.protocol.broker_api_versions import BROKER_API_VERSIONS

from tests.support.fakebroker_layouts import (
    API_VERSIONS,
    BY_KEY,
    DESCRIBE_CONFIGS,
    LIST_OFFSETS,
    METADATA,
    MODELLED,
    decode,
    encode,
    read_request_header,
    response_header,
)

__all__ = ["FakeKafka", "FakePartition", "KAFKA_4_0"]

KAFKA_4_0 = dict(BROKER_API_VERSIONS[(4, 0)])  # API key -> (min, max), as kafka-python records 4.0
UNSUPPORTED_VERSION = 35
UNKNOWN_TOPIC_OR_PARTITION = 3
INVALID_REQUEST = 42
BROKER_RESOURCE, TOPIC_RESOURCE = 4, 2
NOT_LEADER_OR_FOLLOWER = 6
DEBUG_REPLICA = -2
LATEST, EARLIEST = -1, -2


@dataclass
class FakePartition:
    leader: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    leader_epoch: int
    log_start: int
    high_watermark: int
    leo: dict[int, int]  # broker -> its own log end offset of this partition (leader and followers)


@dataclass
class FakeKafka:
    """A cluster of fake brokers sharing one truth (``topics``); ``start`` opens one listening
    port per broker, ``stop`` closes every socket and ends every thread it started."""

    topics: dict[str, dict[int, FakePartition]]
    broker_ids: tuple[int, ...] = (1, 2, 3)
    cluster_id: str = "fake-kafka-4.0"
    fenced: set[int] = field(default_factory=set)  # left out of Metadata's broker list; still serving
    hung: set[int] = field(default_factory=set)  # accept connections and read requests, answer none (SIGSTOP)
    versions: dict[int, tuple[int, int]] = field(default_factory=lambda: dict(KAFKA_4_0))
    lag_time_max_ms: dict[int, int] = field(default_factory=dict)  # broker -> replica.lag.time.max.ms
    min_isr: dict[str, int] = field(default_factory=dict)  # topic -> its own min.insync.replicas
    default_min_isr: int = 1  # the brokers' min.insync.replicas
    describe_configs_refused: set[int] = field(default_factory=set)  # close the connection on DescribeConfigs
    asked: list[tuple[int, str, int]] = field(default_factory=list)  # (broker, request, version)
    refused: list[tuple[int, str, int]] = field(default_factory=list)
    unmodelled: list[tuple[int, str, int]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._servers: dict[int, socket.socket] = {}
        self._ports: dict[int, int] = {}  # kept after stop, for a test's messages
        self._conns: list[socket.socket] = []
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._stopped = threading.Event()

    # -- lifecycle ----------------------------------------------------------------------------

    def start(self) -> FakeKafka:
        for b in self.broker_ids:
            server = socket.create_server(("127.0.0.1", 0))
            self._servers[b] = server
            self._ports[b] = int(server.getsockname()[1])
            self._spawn(self._accept, b, server)
        return self

    def stop(self) -> None:
        self._stopped.set()
        for s in [*self._servers.values(), *self._conns]:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()
        for t in self._threads:
            t.join(timeout=5)

    def __enter__(self) -> FakeKafka:
        return self.start()

    def __exit__(self, *_exc: object) -> None:
        self.stop()

    def address(self, broker: int) -> str:
        return f"127.0.0.1:{self._ports[broker]}"

    @property
    def bootstrap(self) -> str:
        return ",".join(self.address(b) for b in self.broker_ids)

    def requests(self, name: str) -> set[int]:
        """The versions of ``name`` (ApiVersions, Metadata, ListOffsets) any broker was asked in."""
        return {v for _, n, v in self.asked if n == name}

    # -- serving ------------------------------------------------------------------------------

    def _spawn(self, target: Any, *args: Any) -> None:
        t = threading.Thread(target=target, args=args, daemon=True, name=f"fakebroker-{args[0]}")
        self._threads.append(t)
        t.start()

    def _accept(self, broker: int, server: socket.socket) -> None:
        while not self._stopped.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with self._lock:
                self._conns.append(conn)
            self._spawn(self._serve, broker, conn)

    def _serve(self, broker: int, conn: socket.socket) -> None:
        incoming = conn.makefile("rb")
        try:
            while True:
                head = incoming.read(4)
                if len(head) < 4:
                    return  # the client closed the connection
                size = struct.unpack(">i", head)[0]
                frame = incoming.read(size)
                if broker in self.hung:
                    continue
                answer = self._answer(broker, frame)
                if answer is None:
                    return  # refused: the connection is closed, as a broker closes it
                conn.sendall(struct.pack(">i", len(answer)) + answer)
        except (OSError, ConnectionError):
            return
        finally:
            incoming.close()
            conn.close()

    def _answer(self, broker: int, frame: bytes) -> bytes | None:
        api_key, version, correlation_id, _client, body = read_request_header(frame)
        message = BY_KEY.get(api_key)
        name = message.name if message else f"api {api_key}"
        low, high = self.versions.get(api_key, (0, -1))
        if api_key == API_VERSIONS.api_key and version > high:
            # ApiVersions in a version the broker does not speak: error 35 and the ranges, in v0
            self.refused.append((broker, name, version))
            return response_header(api_key, 0, correlation_id) + self._api_versions(0, UNSUPPORTED_VERSION)
        if not low <= version <= high or (message is DESCRIBE_CONFIGS and broker in self.describe_configs_refused):
            self.refused.append((broker, name, version))
            return None
        if message is None or version not in MODELLED[api_key]:
            self.unmodelled.append((broker, name, version))
            return None
        self.asked.append((broker, name, version))
        flexible = version >= message.flexible_from
        request = decode(message.request, version, body, flexible)
        if message is API_VERSIONS:
            payload = self._api_versions(version, 0)
        elif message is DESCRIBE_CONFIGS:
            values = self._describe_configs(broker, version, request)
            payload = encode(DESCRIBE_CONFIGS.response, version, values, flexible)
        elif message is METADATA:
            payload = encode(METADATA.response, version, self._metadata(version, request["topics"]), flexible)
        else:
            payload = encode(LIST_OFFSETS.response, version, self._list_offsets(broker, version, request), flexible)
        return response_header(api_key, version, correlation_id) + payload

    def _api_versions(self, version: int, error: int) -> bytes:
        ranges = self.versions if error == 0 else {API_VERSIONS.api_key: self.versions[API_VERSIONS.api_key]}
        keys = [{"api_key": k, "min_version": lo, "max_version": hi} for k, (lo, hi) in sorted(ranges.items())]
        values = {"error_code": error, "api_keys": keys, "throttle_time_ms": 0}
        return encode(API_VERSIONS.response, version, values, version >= API_VERSIONS.flexible_from)

    def _metadata(self, version: int, asked: list[dict[str, Any]] | None) -> dict[str, Any]:
        every = asked is None or (version == 0 and not asked)
        names = sorted(self.topics) if every else [t["name"] for t in asked or []]
        topics = []
        for name in names:
            parts = self.topics.get(name)
            topics.append(
                {
                    "error_code": 0 if parts is not None else UNKNOWN_TOPIC_OR_PARTITION,
                    "name": name,
                    "is_internal": False,
                    "partitions": [
                        {
                            "error_code": 0,
                            "partition_index": p,
                            "leader_id": fp.leader,
                            "leader_epoch": fp.leader_epoch,
                            "replica_nodes": list(fp.replicas),
                            "isr_nodes": list(fp.isr),
                            "offline_replicas": [],
                        }
                        for p, fp in sorted((parts or {}).items())
                    ],
                    "topic_authorized_operations": -(2**31),
                }
            )
        brokers = [
            {"node_id": b, "host": "127.0.0.1", "port": self._ports[b], "rack": None}
            for b in self.broker_ids
            if b not in self.fenced
        ]
        return {
            "throttle_time_ms": 0,
            "brokers": brokers,
            "cluster_id": self.cluster_id,
            "controller_id": self.broker_ids[0],
            "topics": topics,
            "cluster_authorized_operations": -(2**31),
        }

    def _describe_configs(self, broker: int, version: int, request: dict[str, Any]) -> dict[str, Any]:
        results = []
        for r in request["resources"]:
            kind, name, error = r["resource_type"], r["resource_name"], 0
            configs: dict[str, str] = {}
            if kind == BROKER_RESOURCE and name == str(broker):
                configs["replica.lag.time.max.ms"] = str(self.lag_time_max_ms.get(broker, 30_000))
            elif kind == TOPIC_RESOURCE and name in self.topics:
                configs["min.insync.replicas"] = str(self.min_isr.get(name, self.default_min_isr))
            else:
                error = INVALID_REQUEST if kind == BROKER_RESOURCE else UNKNOWN_TOPIC_OR_PARTITION
            wanted = r["configuration_keys"]
            entries = [
                {
                    "name": key,
                    "value": value,
                    "read_only": kind == BROKER_RESOURCE,
                    "is_default": False,
                    "config_source": 5 if kind == BROKER_RESOURCE else 1,  # STATIC_BROKER_CONFIG, DYNAMIC_TOPIC_CONFIG
                    "is_sensitive": False,
                    "synonyms": [],
                    "config_type": 5,
                    "documentation": None,
                }
                for key, value in configs.items()
                if wanted is None or key in wanted
            ]
            results.append(
                {
                    "error_code": error,
                    "error_message": None,
                    "resource_type": kind,
                    "resource_name": name,
                    "configs": entries,
                }
            )
        return {"throttle_time_ms": 0, "results": results}

    def _list_offsets(self, broker: int, version: int, request: dict[str, Any]) -> dict[str, Any]:
        debug = request["replica_id"] == DEBUG_REPLICA
        topics = []
        for t in request["topics"]:
            answers = []
            for asked in t["partitions"]:
                p = asked["partition_index"]
                fp = self.topics.get(t["name"], {}).get(p)
                error, offset = 0, -1
                if fp is None or broker not in fp.replicas:
                    error = UNKNOWN_TOPIC_OR_PARTITION
                elif debug:
                    offset = fp.leo[broker]  # its own log end offset, leader or follower
                elif fp.leader != broker:
                    error = NOT_LEADER_OR_FOLLOWER
                else:
                    offset = fp.high_watermark if asked["timestamp"] == LATEST else fp.log_start
                answers.append(
                    {
                        "partition_index": p,
                        "error_code": error,
                        "old_style_offsets": [offset] if offset >= 0 else [],
                        "timestamp": -1,
                        "offset": offset,
                        "leader_epoch": fp.leader_epoch if fp else -1,
                    }
                )
            topics.append({"name": t["name"], "partitions": answers})
        return {"throttle_time_ms": 0, "topics": topics}


def sample_topics(
    names: tuple[str, ...], partitions: int = 3, replication: int = 3, brokers: tuple[int, ...] = (1, 2, 3)
) -> dict[str, dict[int, FakePartition]]:
    """Topics spread over ``brokers``: partition p led by ``brokers[p % n]``, leader epoch 10 + p,
    log start p, high watermark 100 + 10p (0 for a topic of one replica: nothing written yet);
    with two followers or more, the first is caught up (its log end offset the leader's, hw + 2)
    and the last behind (hw - 5 - p), every replica in the ISR."""
    out: dict[str, dict[int, FakePartition]] = {}
    for name in names:
        parts = {}
        for p in range(partitions):
            replicas = tuple(brokers[(p + i) % len(brokers)] for i in range(replication))
            hw = 100 + 10 * p if replication > 1 else 0
            leo = {b: hw + 2 for b in replicas} if replication > 1 else {replicas[0]: 0}
            if replication > 2:
                leo[replicas[-1]] = hw - 5 - p
            parts[p] = FakePartition(replicas[0], replicas, replicas, 10 + p, p if hw else 0, hw, leo)
        out[name] = parts
    return out
