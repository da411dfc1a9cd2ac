"""Where the job writes replica states and dead letters.

* ``DeadLetterFile``: JSON lines on the embedded default.
* ``KafkaDeadLetters``: the dead-letter topic (Kafka mode).
* ``KafkaStates``: the compacted replica state topic's tombstones (its records:
  ``streaming.sinks.statewriter``, from the executors).

Alert transitions go through ``streaming.driver.notify`` sinks instead; ``read_tail`` gives the alerts
sink what a topic already holds after a restart.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Collection, Iterable, Mapping
from typing import TYPE_CHECKING, Protocol, cast

from exporter.kafka_metadata import first_answer
from isrwatch.exceptions import IsrwatchError
from isrwatch.logs import kv
from isrwatch.settings import kafka_config_pairs
from streaming.evaluation.parse import BASE64

if TYPE_CHECKING:
    from confluent_kafka import Producer

    from streaming.evaluation.parse import DeadLetter
    from streaming.sinks.producer import RecordProducer

__all__ = [
    "DeadLetterSink",
    "DeadLetterFile",
    "KafkaDeadLetters",
    "KafkaStates",
    "MAX_DEADLETTER_BYTES",
    "deadletter_key",
    "encode_deadletter",
    "payload_bytes",
    "make_producer",
    "producer_config",
    "read_tail",
]

log = logging.getLogger("streaming.outputs")


class DeadLetterSink(Protocol):
    """``write`` returns how many dead letters it wrote and never raises for a
    letter or a destination that fails: those are logged and counted in ``failed``."""

    failed: int

    def write(self, deadletters: Iterable[DeadLetter]) -> int: ...

    def close(self) -> None: ...


def payload_bytes(d: Mapping[str, object]) -> bytes | None:
    """The rejected bytes a dead letter carries (its ``payload`` decoded by ``payload_encoding``),
    as the job writes it (``DeadLetter``) or as it is read back (JSON, perhaps truncated)."""
    payload = d.get("payload")
    if payload is None:
        return None
    if d.get("payload_encoding") == BASE64:
        return base64.b64decode(cast(str, payload), validate=True)  # cast: a base64 payload is text
    return str(payload).encode("utf-8", "surrogatepass")


def deadletter_key(d: DeadLetter) -> bytes:
    """A dead letter's key on the dead-letter topic: its cluster (empty when unknown)."""
    return str(d.get("cluster") or "").encode("utf-8", "surrogatepass")


def encode_deadletter(d: DeadLetter, max_bytes: int | None = None, sort_keys: bool = False) -> bytes:
    """One dead letter as a JSON object (ASCII bytes). When it would exceed
    ``max_bytes``, the payload becomes the base64 of the longest prefix of the
    rejected bytes that fits, with ``payload_truncated`` true, ``payload_bytes``
    (the whole size) and ``payload_sha256`` (of the whole); ValueError when
    even that does not fit."""
    body: dict[str, object] = dict(d)
    whole_bytes, whole_sha256 = body.pop("payload_bytes", None), body.pop("payload_sha256", None)
    if whole_sha256 is not None:  # the job kept only the first bytes (parse.PAYLOAD_KEPT_BYTES)
        body.update(payload_truncated=True, payload_bytes=whole_bytes, payload_sha256=whole_sha256)
    out = json.dumps(body, default=str, sort_keys=sort_keys).encode("ascii")
    if max_bytes is None or len(out) <= max_bytes:
        return out
    raw = payload_bytes(body) or b""
    body.update(
        payload="",
        payload_encoding=BASE64,
        payload_truncated=True,
        payload_bytes=whole_bytes if whole_sha256 is not None else len(raw),
        payload_sha256=whole_sha256 if whole_sha256 is not None else hashlib.sha256(raw).hexdigest(),
    )
    room = max_bytes - len(json.dumps(body, default=str, sort_keys=sort_keys))
    if room < 0:
        raise ValueError(f"a dead letter without its payload is still over {max_bytes} bytes")
    body["payload"] = base64.b64encode(raw[: room // 4 * 3]).decode("ascii")
    return json.dumps(body, default=str, sort_keys=sort_keys).encode("ascii")


class DeadLetterFile:
    """Appends each dead letter as one JSON object per line (payloads as the job kept them:
    whole up to ``parse.payload_kept_bytes``)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.failed = 0
        parent = os.path.dirname(os.path.abspath(path))
        os.makedirs(parent, exist_ok=True)
        self._lock = threading.Lock()
        # Unbuffered: a write that failed (disk full) leaves nothing behind to fail again at close.
        self._fh = open(path, "ab", buffering=0)  # noqa: SIM115 - closed in close()

    def write(self, deadletters: Iterable[DeadLetter]) -> int:
        lines: list[bytes] = []
        failed, error = 0, ""
        for d in deadletters:
            try:
                lines.append(encode_deadletter(d, sort_keys=True) + b"\n")
            except Exception as e:  # one letter that cannot be encoded: counted, the rest go on
                failed, error = failed + 1, f"{type(e).__name__}: {e}"
        with self._lock:
            try:
                data = memoryview(b"".join(lines))
                while data:
                    n = self._fh.write(data)
                    if not n:
                        raise OSError(f"wrote nothing of {len(data)} bytes")
                    data = data[n:]
            except OSError as e:  # disk full, file gone: counted, the job goes on
                failed, error = failed + len(lines), f"{type(e).__name__}: {e.strerror or e}"
                lines = []
            self.failed += failed
        if failed:
            log.error(
                kv(event="deadletters_lost", path=self.path, count=failed, failed_total=self.failed, error=error[:200])
            )
        return len(lines)

    def close(self) -> None:
        with self._lock:
            self._fh.close()


# A dead letter on the topic stays under this many bytes (librdkafka's
# message.max.bytes defaults to 1,000,000, a topic's max.message.bytes to about
# 1 MB): a bigger one keeps a prefix of the rejected bytes, their size and hash.
MAX_DEADLETTER_BYTES = 900_000


class KafkaDeadLetters:
    """Dead letters to the dead-letter topic, keyed by cluster, through the
    job's ``streaming.sinks.producer.OutputProducer`` (which holds what does not fit
    and counts what is never delivered). A letter the producer refuses (too
    big for it, a closed producer) is logged and counted in ``failed``."""

    def __init__(self, producer: RecordProducer, topic: str, max_bytes: int = MAX_DEADLETTER_BYTES) -> None:
        self.producer = producer
        self.topic = topic
        self.max_bytes = max_bytes
        self.failed = 0

    def write(self, deadletters: Iterable[DeadLetter]) -> int:
        n = failed = 0
        error = ""
        for d in deadletters:
            try:
                self.producer.produce(self.topic, key=deadletter_key(d), value=encode_deadletter(d, self.max_bytes))
            except Exception as e:  # too big, producer closed: counted, the rest go on
                failed, error = failed + 1, f"{type(e).__name__}: {e}"
                continue
            n += 1
            if n % 10_000 == 0:
                self.producer.poll(0)
        self.producer.poll(0)
        if failed:
            self.failed += failed
            log.error(
                kv(
                    event="deadletters_lost",
                    topic=self.topic,
                    count=failed,
                    failed_total=self.failed,
                    error=error[:200],
                )
            )
        return n

    def close(self) -> None:
        left = self.producer.flush(10)
        if left:
            log.warning(kv(event="deadletter_flush_incomplete", topic=self.topic, left=left))


class KafkaStates:
    """The state topic's tombstones, from the driver: the replicas the monitor forgets. Their
    records come from ``streaming.sinks.statewriter`` (the executors), which hears of each tombstone
    (``removed``: ``StateWriter.forgotten``)."""

    def __init__(
        self, producer: RecordProducer, topic: str, removed: Callable[[Collection[bytes]], None] | None = None
    ) -> None:
        self.producer = producer
        self.topic = topic
        self.removed = removed

    def remove(self, keys: Iterable[str]) -> None:
        """Tombstones: forget these replicas on the compacted topic."""
        encoded = [key.encode() for key in keys]
        for key in encoded:
            self._produce(key, None)
        self.producer.poll(0)
        if self.removed is not None:
            self.removed(encoded)

    def _produce(self, key: bytes, value: bytes | None) -> None:
        try:
            self.producer.produce(self.topic, key=key, value=value)
        except BufferError:  # local queue full: let librdkafka drain it, then retry once
            self.producer.poll(1.0)
            self.producer.produce(self.topic, key=key, value=value)

    def close(self) -> None:
        left = self.producer.flush(10)
        if left:
            log.warning(kv(event="state_flush_incomplete", topic=self.topic, left=left))


def producer_config(bootstrap_servers: str, kafka_config: list[str]) -> dict[str, str]:
    """The job's producers' librdkafka configuration, the user's ``--kafka-config`` pairs last:
    the driver's (``make_producer``) and the executors' (``streaming.sinks.statewriter``)."""
    # socket.timeout.ms: a hung broker must not hold the job's outputs for librdkafka's default minute.
    # One request in flight per broker: a request that times out against a hung leader is sent
    # again, and with several in flight a retried older state record could land after a newer
    # one of the same replica, which compaction would then keep (Kafka 0.9 has no idempotent
    # producer to order them).
    return {
        "bootstrap.servers": bootstrap_servers,
        "linger.ms": "50",
        "socket.timeout.ms": "10000",
        "max.in.flight.requests.per.connection": "1",
        **kafka_config_pairs(kafka_config),
    }


def make_producer(bootstrap_servers: str, kafka_config: list[str]) -> Producer:
    """A confluent-kafka producer with the user's ``--kafka-config`` pairs."""
    try:
        from confluent_kafka import KafkaException, Producer
    except ImportError as e:  # pragma: no cover - a dependency of the package
        raise IsrwatchError(f"confluent-kafka is not installed: {e}") from None
    conf = producer_config(bootstrap_servers, kafka_config)
    try:
        return Producer(conf, logger=logging.getLogger("librdkafka"))
    except KafkaException as e:
        raise IsrwatchError(f"Kafka producer: {e}") from None


# A restarted job checks this many records at least at the end of each alerts-topic partition
# (more when it has more to send again): other jobs may share the topic.
_TAIL_RECORDS = 1000
# How long a restarted job waits for the alerts topic's partition leaders to tell their offsets
# (all asked at once).
_TAIL_ANSWER_S = 5.0
# At most this many leaders asked at once.
_TAIL_ASKED_AT_ONCE = 32


def read_tail(
    bootstrap_servers: str, kafka_config: list[str], topic: str, records: int, timeout_s: float = 30.0
) -> set[tuple[bytes, bytes]] | None:
    """The (key, value) pairs among the last ``max(records, 1000)`` records of each partition
    of ``topic`` whose leader answers; None when the topic cannot be read in ``timeout_s``.

    A partition whose leader does not tell its offsets within ``_TAIL_ANSWER_S`` (a broker
    that hangs) is left out and named in a warning: what was sent to it is sent again,
    rather than the job's start waiting out the hang while a broker is misbehaving. The
    leaders are asked at once, and the consumer starts on the bootstrap server that gave
    the topic's metadata, so that a hung broker costs the start ``_TAIL_ANSWER_S`` once, not
    once a partition, nor a request timeout for the consumer's own metadata first."""
    from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

    conf = {
        "bootstrap.servers": bootstrap_servers,
        "group.id": "isrwatch-alerts-outbox",  # never joins nor commits: partitions are assigned
        "enable.auto.commit": False,
        "enable.partition.eof": True,
        "socket.timeout.ms": "10000",
        **kafka_config_pairs(kafka_config),
    }
    n = max(records, _TAIL_RECORDS)
    try:
        md, answered = first_answer(conf, timeout_s, topic)  # not held by one hung broker
    except KafkaException as e:
        log.warning(kv(event="alerts_topic_unreadable", topic=topic, error=str(e)[:200]))
        return None
    meta = md.topics.get(topic)
    if meta is None or meta.error is not None:
        return None
    # the consumers start on the server that just answered, not on one that may hang
    conf["bootstrap.servers"] = answered or conf["bootstrap.servers"]
    leaders = {p: m.leader for p, m in meta.partitions.items()}
    told = _watermarks(conf, topic, leaders, min(timeout_s, _TAIL_ANSWER_S))
    consumer = Consumer(conf, logger=logging.getLogger("librdkafka"))
    try:
        ends: dict[int, int] = {}
        start = []
        silent = []
        for p, offsets in told.items():
            if offsets is None:
                silent.append(p)
                continue
            low, high = offsets
            if high > low:
                ends[p] = high
                start.append(TopicPartition(topic, p, max(low, high - n)))
        if silent:
            log.warning(kv(event="alerts_topic_partitions_unread", topic=topic, partitions=silent))
        consumer.assign(start)
        seen: set[tuple[bytes, bytes]] = set()
        deadline = time.monotonic() + timeout_s
        while ends and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            err, part, offset = msg.error(), msg.partition() or 0, msg.offset() or 0
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    ends.pop(part, None)
                    continue
                raise KafkaException(err)
            seen.add((msg.key() or b"", msg.value() or b""))
            if offset >= ends.get(part, 0) - 1:
                ends.pop(part, None)
        return None if ends else seen
    except KafkaException as e:
        log.warning(kv(event="alerts_topic_unreadable", topic=topic, error=str(e)[:200]))
        return None
    finally:
        consumer.close()


def _watermarks(
    conf: Mapping[str, object], topic: str, leaders: Mapping[int, int], timeout_s: float
) -> dict[int, tuple[int, int] | None]:
    """Each partition's (low, high) offsets, ``leaders``: partition -> its leader's id; None
    for a partition whose leader did not tell them within ``timeout_s``.

    Each leader is asked by a consumer of its own (``conf``), all at once: one consumer's
    questions wait on each other (measured: with one leader paused, a partition of another
    was told only after the paused leader's question had timed out). Once one of a leader's
    partitions goes unanswered, its others are not asked."""
    from concurrent.futures import ThreadPoolExecutor

    from confluent_kafka import Consumer, KafkaException, TopicPartition

    deadline = time.monotonic() + timeout_s
    told: dict[int, tuple[int, int] | None] = {p: None for p in leaders}

    def ask(partitions: list[int]) -> None:
        consumer = Consumer(dict(conf), logger=logging.getLogger("librdkafka"))
        try:
            for p in partitions:
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=left)
                told[p] = (int(low), int(high))
        except KafkaException:
            return  # its leader does not answer: its other partitions are left out too
        finally:
            consumer.close()

    by_leader: dict[int, list[int]] = {}
    for p, leader in sorted(leaders.items()):
        if leader >= 0:  # a partition without a leader cannot be read
            by_leader.setdefault(leader, []).append(p)
    if by_leader:
        with ThreadPoolExecutor(min(len(by_leader), _TAIL_ASKED_AT_ONCE), thread_name_prefix="alerts-tail") as pool:
            list(pool.map(ask, by_leader.values()))
    return told
