"""Where ``isrwatch simulate`` writes telemetry: a spool directory, a Kafka topic or stdout."""

from __future__ import annotations

import logging
import sys
from typing import IO, Any, Protocol

from isrwatch.exceptions import UnreachableError
from isrwatch.logs import kv
from isrwatch.spool import SpoolWriter

__all__ = ["TelemetrySink", "SpoolSink", "KafkaSink", "StreamSink"]

log = logging.getLogger(__name__)


class TelemetrySink(Protocol):
    def write(self, records: list[bytes]) -> None: ...

    def close(self) -> None: ...


class SpoolSink:
    def __init__(self, path: str) -> None:
        self.writer = SpoolWriter(path)

    def write(self, records: list[bytes]) -> None:
        self.writer.append(records)

    def close(self) -> None:
        pass


class StreamSink:
    """JSON lines, one record per line (stdout by default)."""

    def __init__(self, stream: IO[bytes] | None = None) -> None:
        self.stream = stream if stream is not None else sys.stdout.buffer

    def write(self, records: list[bytes]) -> None:
        for r in records:
            self.stream.write(r + b"\n")
        self.stream.flush()

    def close(self) -> None:
        self.stream.flush()


class KafkaSink:
    """Produces each record to the telemetry topic, keyed by the cluster name."""

    def __init__(
        self, bootstrap_servers: str, topic: str, key: str, config: dict[str, str], timeout_s: float = 15.0
    ) -> None:
        from confluent_kafka import KafkaException, Producer

        self.topic = topic
        self.key = key.encode()
        self.failed = 0
        self.producer = Producer({"bootstrap.servers": bootstrap_servers, **config})
        try:
            self.producer.list_topics(timeout=timeout_s)
        except KafkaException as e:
            raise UnreachableError(f"--bootstrap-servers: cannot reach Kafka at {bootstrap_servers}: {e}") from None

    def _delivered(self, err: Any, msg: Any) -> None:
        if err is not None:
            self.failed += 1
            if self.failed == 1 or self.failed % 100 == 0:
                log.warning("delivery failed %s", kv(topic=self.topic, failed=self.failed, error=err))

    def write(self, records: list[bytes]) -> None:
        for r in records:
            while True:
                try:
                    self.producer.produce(self.topic, value=r, key=self.key, on_delivery=self._delivered)
                    break
                except BufferError:  # local queue full: let deliveries drain
                    self.producer.poll(0.1)
        self.producer.poll(0)

    def close(self) -> None:
        left = self.producer.flush(30)
        if left:
            log.warning("undelivered at exit %s", kv(topic=self.topic, records=left))
