"""The state topic, written where the rows are: each observed replica's newest status.

Its records are made in the JVM (key ``cluster/topic/partition/broker_id``, value
``to_json`` of the status in ``isrwatch.status.status_to_json``'s fields) and produced by
the executors' Python workers (``mapInArrow``), so the driver never encodes or sends a
state record: a fleet's replicas cost the executors, not the one driver (docs/scaling.md).

Order per replica is the state topic's contract (compaction keeps the last record of a
key). A batch has one record per replica; each task waits for its records' acknowledgement
(at most ``FLUSH_S``) before the batch ends, so the driver's tombstones (``Monitor``) come
after every earlier record, and a replica the driver forgets in a batch gets no record in
it (``state_records``' ``gone``). A record a task could not deliver in time goes back to
the driver, which holds and sends it (``streaming.sinks.producer``: the newest record of a key
wins); while the driver holds any, the next batches' records go through the driver too,
so nothing newer overtakes a held record. A record handed back may still have been on its
way to a leader that hangs, and land after the driver's newer one when the leader wakes
(Kafka 0.9 has no idempotent producer to fence it): once the driver's records are all
acknowledged, and ``REPAIR_AFTER_S`` later, the driver sends each such replica's newest
record (or tombstone) once more, so the last record of a key is its newest
(docs/state-topic.md). A retried task sends its records again: the same values,
harmless under compaction.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc
import pyspark.sql.functions as F

from isrwatch.logs import kv, worker_logging
from isrwatch.status import STATUS_FIELDS, GoneKey
from streaming.evaluation.evaluate import replica_key
from streaming.evaluation.replicas import LAST
from streaming.evaluation.statetable import leave_out_gone

if TYPE_CHECKING:
    from confluent_kafka import KafkaError, Message, Producer
    from pyspark.sql import DataFrame

    from streaming.evaluation.batch import BatchOutput
    from streaming.evaluation.statetable import StateTable
    from streaming.sinks.producer import OutputProducer

__all__ = [
    "StateWriter",
    "state_records",
    "write_batch_state",
    "executors_failed",
    "handed_back",
    "RECORD_SCHEMA",
    "RECORD_ARROW_SCHEMA",
]

log = logging.getLogger("streaming.statewriter")

# How long a task waits with no acknowledgement coming: a state-topic leader that hangs
# costs one batch this much once, then the driver holds the records (never blocking). At 3 s,
# tests/e2e/test_broker_pauses.py's job spent 3.3 s writing in five batches of a pause (its
# records delivered late, not lost): the next batch's alerts waited that long. It is a time
# without progress, not a deadline from the task's start: a partition of ~500,000 records takes
# its task longer than that to produce, and with a deadline most of them were handed back to
# the driver, whose JVM then ran out of heap taking them (make bench-fleet at 1M, docs/benchmarks.md).
FLUSH_S = 1.0
# How long after the driver's records were all acknowledged it sends the replicas whose
# executor records were handed back once more: a request that was on its way to a leader
# that hung is answered when the leader wakes, within its usual latency of the driver's copy.
REPAIR_AFTER_S = 5.0
# How long a task waits, once it has purged what was not delivered, for those records' reports
# (each a record handed back to the driver).
PURGED_REPORTS_S = 5.0
CLIENT_ID = "isrwatch-state-executor"
# What a task hands back: one "task" row (its process and what it delivered) and a
# "failed" row per record it could not deliver in time.
RECORD_SCHEMA = "kind string, key binary, value binary, pid int, host string, sent long, error string"
RECORD_ARROW_SCHEMA = pa.schema(
    [("kind", pa.string()), ("key", pa.binary()), ("value", pa.binary()), ("pid", pa.int32()),
     ("host", pa.string()), ("sent", pa.int64()), ("error", pa.string())]
)  # fmt: skip


def state_records(rows: DataFrame, gone: Collection[GoneKey] = ()) -> DataFrame:
    """``key``, ``value`` (binary) of the state records of ``rows`` (``evaluate.status_columns``'
    output, one row per replica), without the replicas the driver forgot in this batch (``gone``,
    ``statetable.leave_out_gone``: their tombstone is the last word)."""
    rows = leave_out_gone(rows, gone)
    fields = [F.col(c) for c in STATUS_FIELDS if c != "lag_state"]
    fields.insert(STATUS_FIELDS.index("lag_state"), F.coalesce("lag_state", "state").alias("lag_state"))
    key = replica_key()
    value = F.to_json(F.struct(*fields), {"ignoreNullFields": "false"})
    return rows.select(key.cast("binary").alias("key"), value.cast("binary").alias("value"))


_producers: dict[tuple[tuple[str, str], ...], Producer] = {}  # per Python worker


def _producer(conf: Mapping[str, str]) -> Producer:
    """One producer per Python worker, kept across its tasks (each task flushes what it sent,
    so nothing is pending between tasks); a task of another configuration (another job in the
    same Spark application, e.g. tests or benchmarks) replaces it, so a worker keeps no
    connections to a cluster it no longer writes to."""
    key = tuple(sorted(conf.items()))
    if key not in _producers:
        from confluent_kafka import Producer

        for old in _producers.values():
            old.flush(0)  # (nothing pending: each task flushed; drops the connections with it)
        _producers.clear()
        # its log through Python's (isrwatch.logs: librdkafka's configuration warnings once per process)
        _producers[key] = Producer({**conf, "client.id": CLIENT_ID}, logger=logging.getLogger("librdkafka"))
    return _producers[key]


def produce_partition(conf: Mapping[str, str], topic: str, flush_s: float) -> Callable[..., Iterator[pa.RecordBatch]]:
    """The executors' function for ``mapInArrow``: produce a partition's records, wait for
    them while acknowledgements come (at most ``flush_s`` without one), hand back those not
    delivered."""

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        worker_logging()  # an executor's Python worker
        producer = _producer(conf)
        failed: list[tuple[bytes | None, bytes | None, str]] = []
        acknowledged = [0]
        heard = [time.monotonic()]  # the last answer from a leader (or the task's start)

        def delivered(err: KafkaError | None, msg: Message) -> None:
            heard[0] = time.monotonic()
            if err is None:
                acknowledged[0] += 1
            else:
                failed.append((msg.key(), msg.value(), err.str()))

        def stalled() -> bool:
            return time.monotonic() - heard[0] >= flush_s

        for batch in batches:
            for k, v in zip(batch.column(0).to_pylist(), batch.column(1).to_pylist(), strict=True):
                while True:
                    try:
                        producer.produce(topic, key=k, value=v, on_delivery=delivered)
                        break
                    except BufferError:  # librdkafka's queue is full: let it drain while it does
                        producer.poll(0)  # the acknowledgements so far
                        if stalled():  # (then each record left fails at once, none waits)
                            failed.append((k, v, "local queue full"))
                            break
                        producer.poll(0.1)
            producer.poll(0)
        while producer.flush(0.1) and not stalled():
            pass
        if len(producer):
            producer.purge()  # not delivered in time: the driver sends them (failed, _PURGE_QUEUE)
            # The purged records' reports can come a moment later (0.3-0.5 s measured), and must
            # come in this task: one served after it ends goes to a list no one reads, its record
            # neither acknowledged nor handed back (the driver then holds nothing, and a failure
            # of it is told to no one).
            deadline = time.monotonic() + PURGED_REPORTS_S
            while len(producer) and time.monotonic() < deadline:
                producer.poll(0.05)
        unreported = len(producer)
        error = f"{unreported} records without a delivery report" if unreported else None
        host = os.uname().nodename
        summary = {"kind": ["task"], "key": [None], "value": [None], "pid": [os.getpid()], "host": [host]}
        yield pa.RecordBatch.from_pydict({**summary, "sent": [acknowledged[0]], "error": [error]}, RECORD_ARROW_SCHEMA)
        if failed:
            ks, vs, errs = zip(*failed, strict=True)
            n = len(failed)
            yield pa.RecordBatch.from_pydict(
                {"kind": ["failed"] * n, "key": list(ks), "value": list(vs), "pid": [os.getpid()] * n,
                 "host": [host] * n, "sent": [0] * n, "error": list(errs)},
                RECORD_ARROW_SCHEMA,
            )  # fmt: skip

    return run


def handed_back(back: pa.Table, event: str, topic: str, does: str) -> pa.Table:
    """The records the executors' tasks could not deliver in time (``produce_partition``'s
    "failed" rows), logged as ``event`` when there are any; a task that purged records whose
    reports never came (nothing to hand back for them) is logged as ``<event>_unreported``."""
    tasks = back.filter(pc.equal(back.column("kind"), "task"))
    unreported = [e for e in tasks.column("error").to_pylist() if e]
    if unreported:  # (a record purged whose report did not come: its fate unknown)
        log.error(kv(event=f"{event}_unreported", topic=topic, tasks=len(unreported), error=unreported[0]))
    failed = back.filter(pc.equal(back.column("kind"), "failed"))
    if failed.num_rows:
        error = failed.column("error")[0].as_py()
        hint = f"a leader of {topic} did not acknowledge in time; the driver {does} them"
        log.warning(kv(event=event, records=failed.num_rows, error=error, hint=hint))
    return failed


def executors_failed(e: BaseException, event: str) -> str | None:
    """Log the executors' failure to write a batch's records (the driver writes them); -> the
    error when it is for good (their Python cannot import the producer), None when it may pass
    (an executor lost mid-batch fails that batch's write only)."""
    text = str(e).strip()
    error = text.splitlines()[-1][:300] if text else type(e).__name__
    lasting = "ModuleNotFoundError" in text or "ImportError" in text
    log.error(
        kv(event=event, error=error, hint="the driver writes them" + (" from now on" if lasting else " this batch"))
    )
    return error if lasting else None


@dataclass
class StateWriter:
    """The state topic's records of each batch: by the executors, or by the driver while it
    holds records not yet delivered (``outputs``, the driver's producer)."""

    conf: Mapping[str, str]  # the driver's producer configuration (streaming.sinks.outputs.producer_config)
    topic: str
    outputs: OutputProducer
    flush_s: float = FLUSH_S
    by_driver: bool = False  # --state-writer driver: the executors never write
    # The processes that wrote the last batch's records: (host, pid) -> records delivered.
    writers: dict[tuple[str, int], int] | None = None
    # Set when the executors could not write at all (e.g. their Python lacks confluent-kafka):
    # the driver writes every batch's records from then on.
    executors_failed: str | None = None
    repair_after_s: float = REPAIR_AFTER_S
    # The replicas whose executor records were handed back (maybe still on their way to a
    # leader): key -> its newest record since (None: a tombstone), sent again once settled.
    _repair: dict[bytes, bytes | None] = field(default_factory=dict)
    _settled_at: float | None = None  # when the driver was first seen holding nothing since

    def write_statuses(self, rows: DataFrame, gone: Collection[GoneKey] = ()) -> tuple[str, int]:
        """Write the state records of ``rows`` (each replica's newest status) and tombstones for
        ``gone`` (``state_records``); -> as ``write``."""
        return self.write(state_records(rows, gone))

    def write(self, records: DataFrame) -> tuple[str, int]:
        """Write ``state_records``' rows; -> (who wrote them: "executors" or "driver", records)."""
        self._repair_when_settled()
        if self.by_driver or self.executors_failed or self._repair or self._driver_holds():
            return "driver", self._through_driver(records.toArrow())
        try:
            back = records.mapInArrow(produce_partition(self.conf, self.topic, self.flush_s), RECORD_SCHEMA).toArrow()
        except Exception as e:  # noqa: BLE001 - a task's Python error reaches here as a Py4J or Python error
            self.executors_failed = executors_failed(e, "state_records_executors_failed")
            return "driver", self._through_driver(records.toArrow())
        kinds = back.column("kind").to_pylist()
        writers: dict[tuple[str, int], int] = {}
        for kind, host, pid, sent in zip(
            kinds, back.column("host").to_pylist(), back.column("pid").to_pylist(), back.column("sent").to_pylist(),
            strict=True,
        ):  # fmt: skip
            if kind == "task":
                writers[(host, pid)] = writers.get((host, pid), 0) + sent
        if self.writers is None or set(writers) != set(self.writers):
            # Which processes write the records, when that changes (an operator's proof, and
            # tests/e2e/test_spark_cluster.py's: Spark's Python workers, not the driver).
            log.info(kv(event="state_writers", processes=",".join(f"{h}:{p}" for h, p in sorted(writers))))
        self.writers = writers
        failed = handed_back(back, "state_records_to_driver", "the state topic", "holds")
        if failed.num_rows:
            self._through_driver(failed)
            self._repair.update(zip(failed.column("key").to_pylist(), failed.column("value").to_pylist(), strict=True))
            self._settled_at = None
        return "executors", sum(writers.values()) + failed.num_rows

    def forgotten(self, keys: Collection[bytes]) -> None:
        """The driver's tombstones (``outputs.KafkaStates``): a replica to repair is repaired
        with its tombstone, never with an older record."""
        for key in keys:
            if key in self._repair:
                self._repair[key] = None

    def _repair_when_settled(self) -> None:
        if not self._repair:
            return
        if self._driver_holds():
            self._settled_at = None
            return
        now = time.monotonic()
        if self._settled_at is None:
            self._settled_at = now
        if now - self._settled_at < self.repair_after_s:
            return
        keys, values = list(self._repair), list(self._repair.values())
        self._repair.clear()
        self._settled_at = None
        log.info(kv(event="state_records_repaired", records=len(keys)))
        self._through_driver(pa.table({"key": pa.array(keys, pa.binary()), "value": pa.array(values, pa.binary())}))

    def _driver_holds(self) -> bool:
        return self.outputs.holds(self.topic)

    def _through_driver(self, table: pa.Table) -> int:
        keys, values = table.column("key").to_pylist(), table.column("value").to_pylist()
        for k, v in zip(keys, values, strict=True):
            if k in self._repair:
                self._repair[k] = v
            self.outputs.produce(self.topic, key=k, value=v)
        self.outputs.poll(0)
        return len(keys)


def write_batch_state(
    out: BatchOutput,
    table: StateTable,
    batch_id: int,
    *,
    forget_before: Mapping[str, int] | None = None,
    states: StateWriter | None = None,
) -> None:
    """A batch's new state, once the driver has taken its rows and before the batch commits:
    the state topic's records (``states``: each replica's newest row the driver took, less the
    replicas the driver forgot in the batch, ``BatchOutput.gone``), then the checkpoint's
    version ``batch_id`` (``StateTable.write``: full or a delta, as the batch's read said,
    without the replicas older than ``forget_before``) and the versions older than the full
    one the batch read pruned; the batch's held data released whatever happens."""
    t1 = time.monotonic()
    try:
        if states is not None and out.state_rows is not None:
            out.state_writer, out.state_records = states.write_statuses(out.state_rows.where(F.col(LAST)), out.gone)
            out.stages["state_topic_s"] = time.monotonic() - t1
            t1 = time.monotonic()
        if out.next_state is not None:
            delta = out.carried is not None and out.carried.delta
            table.write(out.next_state, batch_id, forget_before, out.gone, delta=delta)
            if out.carried is not None and out.carried.base is not None:
                table.prune(out.carried.base)  # the versions this batch read stay until the next batch
    finally:
        out.release()
    out.stages["state_s"] = time.monotonic() - t1
