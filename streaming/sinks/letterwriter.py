"""The dead-letter topic, written where the dead letters are: by the executors.

A batch's dead letters can be far more than the driver can take in its one Spark job: a
fleet's collector whose clock runs an hour ahead makes every observation one (a backlog of
2,000 such records is a million of them, ~400 MB), and the job's JVM ran out of heap
carrying them, at every start (docs/benchmarks.md). So in Kafka mode they stay in Spark
(``streaming.evaluation.batch``: ``BatchOutput.letters``; the driver learns only that there
are some, from one marker per Spark partition) and the executors' Python workers encode,
count and produce them
(``outputs.encode_deadletter``, keyed by cluster, as ``outputs.KafkaDeadLetters`` does),
with the state writer's producer (``statewriter.produce_partition``). What a task could not
deliver in time comes back to the driver, which sends it. A batch Spark runs again does not
write its dead letters again (``streaming.driver.rare``); a retried task does (a dead letter
twice, as the driver's producer could). With ``--state-writer driver``, or when the
executors cannot produce at all, the driver takes them as before; so it does while its own
producer holds dead letters a leader has not taken (``LetterWriter._driver_holds``), as the
state writer does its records.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc

from streaming.evaluation.parse import deadletter_of
from streaming.sinks.outputs import deadletter_key, encode_deadletter
from streaming.sinks.producer import OutputProducer
from streaming.sinks.statewriter import (
    FLUSH_S,
    RECORD_ARROW_SCHEMA,
    RECORD_SCHEMA,
    executors_failed,
    handed_back,
    produce_partition,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from streaming.sinks.outputs import KafkaDeadLetters

__all__ = ["LetterWriter", "letter_records"]

_SCHEMA = pa.schema([("key", pa.binary()), ("value", pa.binary())])


def letter_records(
    batches: Iterator[pa.RecordBatch], max_bytes: int, counts: dict[str, int]
) -> Iterator[pa.RecordBatch]:
    """The dead-letter topic's records (key: the cluster; value: ``encode_deadletter``) of rare
    rows as JSON (``batch.SIDE``, the one column of ``BatchOutput.letters``); ``counts``: their
    reasons counted as they pass."""
    for batch in batches:
        keys, values = [], []
        for item in batch.column(0).to_pylist():
            d = deadletter_of(json.loads(item))
            counts[d["reason"]] = counts.get(d["reason"], 0) + 1
            keys.append(deadletter_key(d))
            values.append(encode_deadletter(d, max_bytes))
        yield pa.RecordBatch.from_arrays([pa.array(keys, pa.binary()), pa.array(values, pa.binary())], schema=_SCHEMA)


def produce_letters(
    conf: Mapping[str, str], topic: str, flush_s: float, max_bytes: int
) -> Callable[[Iterable[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The executors' function for ``mapInArrow``: encode and produce a partition's dead
    letters; after ``statewriter.produce_partition``'s rows, a "reason" row per reason (the
    reason as its key, how many as ``sent``)."""
    produce = produce_partition(conf, topic, flush_s)

    def run(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        counts: dict[str, int] = {}
        yield from produce(letter_records(iter(batches), max_bytes, counts))
        if counts:
            n = len(counts)
            yield pa.RecordBatch.from_pydict(
                {"kind": ["reason"] * n, "key": [r.encode() for r in counts], "value": [None] * n,
                 "pid": [None] * n, "host": [None] * n, "sent": list(counts.values()), "error": [None] * n},
                RECORD_ARROW_SCHEMA,
            )  # fmt: skip

    return run


@dataclass
class LetterWriter:
    """A batch's dead letters to the dead-letter topic: by the executors, or by the driver
    (``sink``, the job's ``KafkaDeadLetters``) when they cannot."""

    conf: Mapping[str, str]  # the driver's producer configuration (outputs.producer_config)
    sink: KafkaDeadLetters
    flush_s: float = FLUSH_S
    by_driver: bool = False  # --state-writer driver: the executors never write
    executors_failed: str | None = None  # set when the executors cannot produce at all

    def write(self, letters: DataFrame) -> tuple[str, int, dict[str, int]]:
        """Write ``BatchOutput.letters``; -> (who wrote them: "executors" or "driver", how many
        were written, how many there were by reason)."""
        if self.by_driver or self.executors_failed or self._driver_holds():
            return self._by_driver(letters)
        run = produce_letters(self.conf, self.sink.topic, self.flush_s, self.sink.max_bytes)
        try:
            back = letters.mapInArrow(run, RECORD_SCHEMA).toArrow()
        except Exception as e:  # noqa: BLE001 - a task's Python error reaches here as a Py4J or Python error
            self.executors_failed = executors_failed(e, "deadletters_executors_failed")
            return self._by_driver(letters)
        kinds = back.column("kind")
        sent = sum(back.filter(pc.equal(kinds, "task")).column("sent").to_pylist())
        by_reason: dict[str, int] = {}
        reasons = back.filter(pc.equal(kinds, "reason"))
        for reason, n in zip(reasons.column("key").to_pylist(), reasons.column("sent").to_pylist(), strict=True):
            by_reason[reason.decode()] = by_reason.get(reason.decode(), 0) + n
        failed = handed_back(back, "deadletters_to_driver", "the dead-letter topic", "sends")
        if failed.num_rows:
            producer = self.sink.producer
            for k, v in zip(failed.column("key").to_pylist(), failed.column("value").to_pylist(), strict=True):
                producer.produce(self.sink.topic, key=k, value=v)
            producer.poll(0)
        return "executors", int(sent) + failed.num_rows, by_reason

    def _driver_holds(self) -> bool:
        """Whether the driver's producer holds dead letters not yet delivered: a leader of the
        dead-letter topic does not answer. The executors' tasks would each wait ``flush_s`` on
        it and hand their letters back, at every batch of the fault; the driver takes them at
        once instead (its producer holds what it cannot send, ``streaming.sinks.producer``)."""
        producer = self.sink.producer
        return isinstance(producer, OutputProducer) and producer.holds(self.sink.topic)

    def _by_driver(self, letters: DataFrame) -> tuple[str, int, dict[str, int]]:
        found = [deadletter_of(json.loads(item)) for item in letters.toArrow().column(0).to_pylist()]
        by_reason: dict[str, int] = {}
        for d in found:
            by_reason[d["reason"]] = by_reason.get(d["reason"], 0) + 1
        return "driver", self.sink.write(found), by_reason
