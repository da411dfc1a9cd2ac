"""How ``streaming.sources.watermarks.Watermarks`` plans around a broker that hangs (unit: three fake
brokers on loopback speaking the Kafka 0.9 protocol, built with kafka-python's own message
classes; the real cluster with a paused leader is tests/streaming/test_watermarks.py).

A fake broker can hang: it keeps accepting connections and reading requests, and answers
nothing, as a SIGSTOPped broker whose kernel still completes the TCP handshake. The fakes
make the cases deterministic that the real cluster shows only by chance (which broker a
question goes to): the hung broker as the first bootstrap server, as the one asked for the
metadata, and a partition that moves to another leader.
"""

from __future__ import annotations

import socket
import struct
import threading
import time

import pytest
from kafka.protocol.list_offsets import ListOffsetsRequest, ListOffsetsResponse
from kafka.protocol.metadata import MetadataRequest, MetadataResponse

from streaming.sources import watermarks
from streaming.sources.watermarks import Watermarks

TOPIC = "telemetry"
NOT_LEADER = 6


class _Cluster:
    """Three brokers' shared truth: each partition's leader and (low, high) offsets."""

    def __init__(self, partitions: int = 6) -> None:
        self.brokers = [_FakeBroker(self, b) for b in (1, 2, 3)]
        self.leaders = {p: 1 + p % 3 for p in range(partitions)}
        self.offsets = {p: (0, 10 + p) for p in range(partitions)}
        self.asked: dict[int, list[str]] = {b.id: [] for b in self.brokers}

    @property
    def bootstrap(self) -> str:
        return ",".join(f"127.0.0.1:{b.port}" for b in self.brokers)

    def broker(self, broker_id: int) -> _FakeBroker:
        return self.brokers[broker_id - 1]

    def close(self) -> None:
        for b in self.brokers:
            b.close()


class _FakeBroker:
    def __init__(self, cluster: _Cluster, broker_id: int) -> None:
        self.cluster = cluster
        self.id = broker_id
        self.hung = threading.Event()
        self._server = socket.create_server(("127.0.0.1", 0))
        self.port = self._server.getsockname()[1]
        self._sockets: list[socket.socket] = []
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                sock, _ = self._server.accept()
            except OSError:
                return
            self._sockets.append(sock)
            threading.Thread(target=self._serve, args=(sock,), daemon=True).start()

    def _serve(self, sock: socket.socket) -> None:
        try:
            while True:
                size = struct.unpack(">i", _read(sock, 4))[0]
                frame = _read(sock, size)
                api_key, version, correlation_id, client_len = struct.unpack(">hhih", frame[:10])
                body = frame[10 + max(0, client_len) :]
                if self.hung.is_set():
                    continue  # read, never answered
                answer = self._answer(api_key, version, body)
                payload = struct.pack(">i", correlation_id) + answer
                sock.sendall(struct.pack(">i", len(payload)) + payload)
        except (OSError, ConnectionError):
            return

    def _answer(self, api_key: int, version: int, body: bytes) -> bytes:
        c = self.cluster
        assert version == 0, "the fakes speak Kafka 0.9's versions only"
        if api_key == MetadataRequest[0].API_KEY:
            self.cluster.asked[self.id].append("metadata")
            brokers = [(b.id, "127.0.0.1", b.port) for b in c.brokers]
            parts = [(0, p, leader, [leader], [leader]) for p, leader in sorted(c.leaders.items())]
            response = MetadataResponse[0](brokers, [(0, TOPIC, parts)])  # (encode is bound weakly: held)
            return response.encode()
        assert api_key == ListOffsetsRequest[0].API_KEY, api_key
        request = ListOffsetsRequest[0].decode(body)
        self.cluster.asked[self.id].append("offsets")
        topics = []
        for topic, parts in request.topics:
            answers = []
            for p, timestamp, _max in parts:
                if c.leaders.get(p) != self.id:
                    answers.append((p, NOT_LEADER, []))
                else:
                    low, high = c.offsets[p]
                    answers.append((p, 0, [high if timestamp == -1 else low]))
            topics.append((topic, answers))
        response = ListOffsetsResponse[0](topics)
        return response.encode()

    def close(self) -> None:
        self._closed = True
        self._server.close()
        for s in self._sockets:
            s.close()


def _read(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError("closed")
        data += chunk
    return data


@pytest.fixture
def cluster():
    c = _Cluster()
    yield c
    c.close()


@pytest.fixture(autouse=True)
def short_questions(monkeypatch):
    """A question gives up after 2 s instead of 10 (the planner waits 0.5 s either way)."""
    monkeypatch.setattr(watermarks, "_QUESTION_TIMEOUT_S", 2.0)


def _marks(bootstrap: str) -> Watermarks:
    # the fakes speak 0.9: no ApiVersions request (kafka-python is told the version)
    config = {"bootstrap.servers": bootstrap, "api.version.request": "false", "broker.version.fallback": "0.9.0.1"}
    return Watermarks(config, [TOPIC], answer_s=0.5)


def _led_by(cluster: _Cluster, broker_id: int) -> frozenset[tuple[str, int]]:
    return frozenset((TOPIC, p) for p, leader in cluster.leaders.items() if leader == broker_id)


def test_every_partition_answers_with_its_leaders_offsets(cluster) -> None:
    marks = _marks(cluster.bootstrap)
    try:
        low, high = marks.poll(5.0)
        assert high == {TOPIC: {str(p): 10 + p for p in range(6)}}
        assert low == {TOPIC: {str(p): 0 for p in range(6)}}
        assert marks.late == frozenset()
    finally:
        marks.close()


def test_a_hung_leader_makes_only_its_partitions_late_at_every_poll(cluster) -> None:
    marks = _marks(cluster.bootstrap)
    try:
        marks.poll(5.0)
        cluster.broker(2).hung.set()
        for i in range(8):  # past the questions' 2 s timeout: a question that failed is late too
            cluster.offsets = {p: (0, 20 + p + i) for p in cluster.offsets}
            _, high = marks.poll()
            assert marks.late == _led_by(cluster, 2), i
            for p, leader in cluster.leaders.items():
                expected = 10 + p if leader == 2 else 20 + p + i  # the hung one's: its last known
                assert high[TOPIC][str(p)] == expected, (i, p)
            time.sleep(0.2)
        cluster.broker(2).hung.clear()
        deadline = time.monotonic() + 10
        while marks.late and time.monotonic() < deadline:
            marks.poll()
        assert marks.late == frozenset()
    finally:
        marks.close()


@pytest.mark.parametrize("hung", [1, 2, 3])
def test_a_planner_started_while_any_broker_hangs_has_the_others_at_its_first_poll(cluster, hung) -> None:
    """Whichever broker hangs, the first bootstrap server included: the metadata comes from
    another and the healthy partitions answer at the first poll."""
    cluster.broker(hung).hung.set()
    marks = _marks(cluster.bootstrap)
    try:
        _, high = marks.poll(1.5)
        assert marks.late == _led_by(cluster, hung)
        assert sorted(high[TOPIC]) == sorted(str(p) for p, leader in cluster.leaders.items() if leader != hung)
    finally:
        marks.close()


def test_a_partition_that_moved_is_asked_of_its_new_leader(cluster) -> None:
    marks = _marks(cluster.bootstrap)
    try:
        marks.poll(5.0)
        cluster.leaders[0] = 3  # was broker 1's
        cluster.offsets[0] = (0, 99)
        deadline = time.monotonic() + 5  # (within the periodic metadata refresh's 10 s)
        high = marks.poll()[1]
        while high[TOPIC]["0"] != 99 and time.monotonic() < deadline:
            high = marks.poll()[1]
            time.sleep(0.05)
        assert high[TOPIC]["0"] == 99  # the old leader's "not the leader" asked for the metadata again
        assert marks.late == frozenset()
    finally:
        marks.close()
