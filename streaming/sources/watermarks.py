"""The telemetry topic's end offsets, asked for without ever waiting on one broker.

A micro-batch is planned from each partition's watermarks (its leader answers a
ListOffsets request). ``Watermarks.poll`` asks every leader at once and waits at
most ``answer_s``: a partition whose leader has not answered by then keeps its
last known offsets (so nothing new is planned from it) and is *late*; its leader
is asked again once its previous question returns. The topic's partitions and
their leaders are asked for every ``_METADATA_EVERY_S`` the same way, from every
broker at once, the first answer winning, falling back to the last one.

Each broker is asked over one connection of its own (kafka-python's
``BrokerConnection``), worked by a thread of its own, so whatever blocks on one
broker (a connection, an authentication, an answer) blocks that broker's
partitions only. A librdkafka client cannot promise that: it sends a request to
the broker it picks, and when it retires a connection it resends that
connection's requests to another (docs/reliability.md). With a librdkafka
consumer per question, a healthy partition was late at every poll while another
partition's leader was paused (tests/streaming/test_watermarks.py, about one run
in ten).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import FIRST_COMPLETED, Future, wait
from typing import TYPE_CHECKING

from isrwatch.clientconfig import kafka_python_config
from isrwatch.kafkawire import (
    EARLIEST,
    LATEST,
    LIST_OFFSETS_MAX_VERSION,
    METADATA_MAX_VERSION,
    broker_connection,
    list_offsets_answers,
    list_offsets_request,
    metadata_brokers,
    metadata_partitions,
    metadata_request,
    request_version,
)
from isrwatch.logs import kv

if TYPE_CHECKING:  # kafka-python has no type information: mypy leaves these unchecked (pyproject overrides)
    from kafka.conn import BrokerConnection
    from kafka.protocol.api import Request, Response

__all__ = ["Watermarks", "Offsets"]

log = logging.getLogger("streaming.watermarks")

Offsets = dict[str, dict[str, int]]

# How long one question may take before it is given up (the connection is then
# closed and made again for the next one; the planner never waits this long).
_QUESTION_TIMEOUT_S = 10.0
_METADATA_EVERY_S = 10.0
_CLIENT = -1  # ListOffsets as a client: a leader answers with its high watermark
# Kafka's answers that say the metadata is out of date (the partition moved or is new)
_STALE_METADATA = {3, 5, 6}  # UNKNOWN_TOPIC_OR_PARTITION, LEADER_NOT_AVAILABLE, NOT_LEADER_FOR_PARTITION

Versions = dict[int, tuple[int, int]]  # API key -> (min, max) the broker speaks
Question = Callable[[Versions], list["Request"]]  # the requests to send, given the broker's API versions


class _BrokerLine:
    """One connection to one broker and the thread that works it: questions are
    asked one after another, each within ``_QUESTION_TIMEOUT_S``."""

    def __init__(self, address: str, settings: Mapping[str, object]) -> None:
        self.address = address
        self._settings = dict(settings)
        self._questions: queue.Queue[tuple[Question, Future[list[Response]]] | None] = queue.Queue()
        self._open: Future[list[Response]] | None = None  # the question asked and not answered yet
        self._conn: BrokerConnection | None = None
        self._thread = threading.Thread(target=self._work, name=f"isrwatch-watermarks-{address}", daemon=True)
        self._thread.start()

    @property
    def busy(self) -> bool:
        return self._open is not None and not self._open.done()

    def ask(self, requests: Question) -> Future[list[Response]]:
        """The broker's answers to ``requests(its API versions)``, in order."""
        future: Future[list[Response]] = Future()
        self._open = future
        self._questions.put((requests, future))
        return future

    def close(self) -> None:
        self._questions.put(None)

    def _work(self) -> None:
        while True:
            item = self._questions.get()
            if item is None:
                break
            requests, future = item
            try:
                future.set_result(self._answer(requests))
            except Exception as e:  # noqa: BLE001 - a failed question: the planner reads it as late
                self._drop()
                future.set_exception(e)
        self._drop()

    def _drop(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def _answer(self, requests: Question) -> list[Response]:
        deadline = time.monotonic() + _QUESTION_TIMEOUT_S
        if self._conn is None or not self._conn.connected():
            self._drop()
            # (the 0.9 settings hold for a broker that cannot answer ApiVersions only)
            self._conn = broker_connection(self.address, self._settings, _QUESTION_TIMEOUT_S)
        conn = self._conn
        futures = [conn.send(r) for r in requests(conn.get_api_versions() or {})]
        while not all(f.is_done for f in futures):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.address}: no answer within {_QUESTION_TIMEOUT_S:g} s")
            for response, answered in conn.recv():  # the connection leaves the futures to its caller
                answered.success(response)
            time.sleep(0.002)
        failed = [f.exception for f in futures if f.failed()]
        if failed:
            raise ConnectionError(f"{self.address}: {failed[0]}")
        return [f.value for f in futures]


def _metadata_question(versions: Versions) -> list[Request]:
    """Every topic's metadata: naming a topic would create it on a broker of a version
    before 1.0 (Metadata v4) with ``auto.create.topics.enable``, Kafka's default."""
    from kafka.protocol.metadata import MetadataRequest

    return [metadata_request(request_version(versions, MetadataRequest, METADATA_MAX_VERSION))]


def _offsets_question(parts: list[tuple[str, int]]) -> Question:
    from kafka.protocol.list_offsets import ListOffsetsRequest

    def requests(versions: Versions) -> list[Request]:
        version = request_version(versions, ListOffsetsRequest, LIST_OFFSETS_MAX_VERSION)
        return [list_offsets_request(version, _CLIENT, parts, at) for at in (EARLIEST, LATEST)]

    return requests


class Watermarks:
    """(low, high) watermarks of the subscribed topics' partitions, from whoever answers within ``answer_s``.

    ``config``: librdkafka settings (``bootstrap.servers``, security), translated for kafka-python
    by ``isrwatch.clientconfig``."""

    def __init__(self, config: Mapping[str, object], topics: list[str], answer_s: float = 1.0) -> None:
        servers = str(config.get("bootstrap.servers", ""))
        settings = kafka_python_config(servers, config)
        settings.pop("bootstrap_servers", None)
        if "client.id" not in config:
            settings["client_id"] = "isrwatch-watermarks"
        settings["request_timeout_ms"] = int(_QUESTION_TIMEOUT_S * 1000) + 1000  # the line's deadline ends it first
        settings["api_version_auto_timeout_ms"] = int(_QUESTION_TIMEOUT_S * 1000)
        self._settings = settings
        self._bootstrap = [s.strip() for s in servers.split(",") if s.strip()]
        self.topics = topics
        self.answer_s = answer_s
        self._lines: dict[str, _BrokerLine] = {}
        self._addresses: dict[int, str] = {}  # broker id -> host:port, from the newest metadata
        self._leaders: dict[tuple[str, int], int] = {}
        self._metadata: list[Future[list[Response]]] = []  # questions asked for the newest metadata
        self._metadata_at = 0.0
        self._stale = False  # a leader said it no longer leads a partition: ask for the metadata now
        self._asking: dict[int, tuple[list[tuple[str, int]], Future[list[Response]]]] = {}  # leader -> question
        self._known: dict[tuple[str, int], tuple[int, int]] = {}
        self._late: frozenset[tuple[str, int]] = frozenset()

    def _line(self, address: str) -> _BrokerLine:
        if address not in self._lines:
            self._lines[address] = _BrokerLine(address, self._settings)
        return self._lines[address]

    def _refresh_metadata(self, deadline: float) -> None:
        """Ask every broker not busy for the topics' partitions and leaders when due; take the
        first answer. Waits for it only while no leader is known yet."""
        now = time.monotonic()
        due = self._stale or not self._leaders or now - self._metadata_at >= _METADATA_EVERY_S
        if due and not self._metadata:
            addresses = sorted(set(self._addresses.values()) | set(self._bootstrap))
            self._metadata = [self._line(a).ask(_metadata_question) for a in addresses if not self._line(a).busy]
            if self._metadata:  # (every broker still busy with a question: ask at the next poll)
                self._metadata_at = now
                self._stale = False
        while self._metadata:
            answered = [f for f in self._metadata if f.done() and f.exception() is None]
            if answered:
                self._metadata = []
                self._read_metadata(answered[0].result()[0])
                return
            if all(f.done() for f in self._metadata):  # every broker asked failed: keep the last answer
                errors = [str(f.exception()) for f in self._metadata]
                log.warning(kv(event="telemetry_metadata_failed", error=errors[0] if errors else "no broker to ask"))
                self._metadata = []
                return
            if self._leaders or time.monotonic() >= deadline:
                return  # plan with the leaders known; the answer is read at a later poll
            open_ = [f for f in self._metadata if not f.done()]
            wait(open_, timeout=max(0.0, deadline - time.monotonic()), return_when=FIRST_COMPLETED)

    def _read_metadata(self, response: Response) -> None:
        self._addresses = {b: f"{host}:{port}" for b, (host, port) in metadata_brokers(response).items()}
        errors, partitions = metadata_partitions(response)
        leaders = {(p.topic, p.partition): p.leader for p in partitions if p.topic in self.topics}
        for topic in self.topics:
            if errors.get(topic, 0) != 0 or not any(t == topic for t, _ in leaders):
                # not there (yet): keep what was known of it
                leaders.update({k: v for k, v in self._leaders.items() if k[0] == topic})
        self._leaders = leaders

    def poll(self, wait_s: float | None = None) -> tuple[Offsets, Offsets]:
        """(low, high) of every partition that has ever answered; the newest answers within
        ``wait_s`` (default ``answer_s``)."""
        deadline = time.monotonic() + (self.answer_s if wait_s is None else wait_s)
        self._refresh_metadata(deadline)
        led: dict[int, list[tuple[str, int]]] = {}
        for key, leader in sorted(self._leaders.items()):
            led.setdefault(leader, []).append(key)
        fresh = []
        for leader, parts in led.items():
            address = self._addresses.get(leader)
            if leader < 0 or address is None or leader in self._asking:
                continue
            future = self._line(address).ask(_offsets_question(parts))
            self._asking[leader] = (parts, future)
            fresh.append(future)
        # Wait only for this poll's questions: one still open from an earlier poll is
        # already known to be late, and waiting for it would slow every batch.
        wait(fresh, timeout=max(0.0, deadline - time.monotonic()))
        answered: set[tuple[str, int]] = set()
        for leader, (_parts, future) in list(self._asking.items()):
            if not future.done():
                continue
            del self._asking[leader]
            try:
                answers = future.result()
            except Exception as e:  # noqa: BLE001 - no answer this time: keep the last one
                log.debug(kv(event="watermark_failed", broker=leader, error=str(e)))
                continue
            answered |= self._read_offsets(answers)
        late = frozenset(self._leaders) - answered
        if late != self._late:
            log.warning(
                kv(
                    event="telemetry_partitions_late",
                    partitions=",".join(f"{t}[{p}]" for t, p in sorted(late)) or "none",
                    hint="planned from their last known end offsets until their leaders answer",
                )
            )
            self._late = late
        low: Offsets = {}
        high: Offsets = {}
        for (topic, p), (lo, hi) in sorted(self._known.items()):
            low.setdefault(topic, {})[str(p)] = lo
            high.setdefault(topic, {})[str(p)] = hi
        return low, high

    def _read_offsets(self, answers: list[Response]) -> set[tuple[str, int]]:
        """Record a leader's (earliest, latest) answers; the partitions it answered for."""
        earliest, latest = ({(t, p): (err, off) for t, p, err, off in list_offsets_answers(a)} for a in answers)
        answered = set()
        for key, (err, hi) in latest.items():
            lo_err, lo = earliest.get(key, (err, None))
            if err in _STALE_METADATA or lo_err in _STALE_METADATA:
                self._stale = True
            if err or lo_err or hi is None or lo is None:
                log.debug(kv(event="watermark_failed", topic=key[0], partition=key[1], error=err or lo_err))
                continue
            self._known[key] = (lo, hi)
            answered.add(key)
        return answered

    @property
    def late(self) -> frozenset[tuple[str, int]]:
        """Partitions whose leader did not answer the last poll in time."""
        return self._late

    def close(self) -> None:
        """Stop every broker's thread; a question still waiting on a hung broker ends within
        ``_QUESTION_TIMEOUT_S`` on its own thread (nothing waits for it)."""
        lines, self._lines = self._lines, {}
        for line in lines.values():
            line.close()
