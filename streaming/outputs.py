"""Where the job writes replica states and dead letters.

* ``DeadLetterFile``: JSON lines on the embedded default.
* ``KafkaDeadLetters``: the dead-letter topic (Kafka mode).
* ``KafkaStates``: the compacted replica state topic, keyed by
  ``isrwatch.status.status_key``, value ``status_to_json``.

Alert transitions go through ``streaming.notify`` sinks instead.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Iterable, Mapping
from typing import Any, Protocol

from isrwatch.exceptions import IsrwatchError
from isrwatch.logs import kv
from isrwatch.settings import kafka_config_pairs
from isrwatch.status import ReplicaStatus, status_key, status_to_json

__all__ = ["DeadLetterSink", "DeadLetterFile", "KafkaDeadLetters", "KafkaStates", "make_producer"]

log = logging.getLogger(__name__)


class DeadLetterSink(Protocol):
    def write(self, deadletters: Iterable[Mapping[str, Any]]) -> int: ...

    def close(self) -> None: ...


class DeadLetterFile:
    """Appends each dead letter as one JSON object per line."""

    def __init__(self, path: str) -> None:
        self.path = path
        parent = os.path.dirname(os.path.abspath(path))
        os.makedirs(parent, exist_ok=True)
        self._lock = threading.Lock()
        self._fh = open(path, "a", encoding="utf-8")  # noqa: SIM115 - closed in close()

    def write(self, deadletters: Iterable[Mapping[str, Any]]) -> int:
        n = 0
        with self._lock:
            for d in deadletters:
                self._fh.write(json.dumps(dict(d), sort_keys=True, default=str) + "\n")
                n += 1
            self._fh.flush()
        return n

    def close(self) -> None:
        with self._lock:
            self._fh.close()


class KafkaDeadLetters:
    def __init__(self, producer: Any, topic: str) -> None:
        self.producer = producer
        self.topic = topic

    def write(self, deadletters: Iterable[Mapping[str, Any]]) -> int:
        n = 0
        for d in deadletters:
            key = (d.get("cluster") or "").encode()
            self.producer.produce(self.topic, key=key, value=json.dumps(dict(d), default=str).encode())
            n += 1
            if n % 10_000 == 0:
                self.producer.poll(0)
        self.producer.poll(0)
        return n

    def close(self) -> None:
        self.producer.flush(10)


class KafkaStates:
    """Replica statuses to the state topic (the exporter's input)."""

    def __init__(self, producer: Any, topic: str) -> None:
        self.producer = producer
        self.topic = topic

    def write(self, statuses: Iterable[ReplicaStatus]) -> int:
        n = 0
        for s in statuses:
            value = json.dumps(status_to_json(s), separators=(",", ":")).encode()
            self._produce(status_key(s).encode(), value)
            n += 1
        self.producer.poll(0)
        return n

    def update(self, statuses: Iterable[ReplicaStatus]) -> int:
        """``streaming.monitor``'s status output interface (as ``exporter.store.StatusStore.update``)."""
        return self.write(statuses)

    def remove(self, keys: Iterable[str]) -> None:
        """Tombstones: forget these replicas on the compacted topic."""
        for key in keys:
            self._produce(key.encode(), None)
        self.producer.poll(0)

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


def make_producer(bootstrap_servers: str, kafka_config: list[str]) -> Any:
    """A confluent-kafka producer with the user's ``--kafka-config`` pairs."""
    try:
        from confluent_kafka import KafkaException, Producer
    except ImportError as e:  # pragma: no cover - a dependency of the package
        raise IsrwatchError(f"confluent-kafka is not installed: {e}") from None
    # socket.timeout.ms: a hung broker must not hold the job's outputs for librdkafka's default minute.
    conf = {
        "bootstrap.servers": bootstrap_servers,
        "linger.ms": "50",
        "socket.timeout.ms": "10000",
        **kafka_config_pairs(kafka_config),
    }
    try:
        return Producer(conf)
    except KafkaException as e:
        raise IsrwatchError(f"Kafka producer: {e}") from None
