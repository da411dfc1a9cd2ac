"""One micro-batch of telemetry, in one pass: what Spark computes for the driver.

The records are parsed once and held (``persist``) for the two things made
from them: the rare rows (dead letters, ISR changes, the brokers' own shrink
counts: ``parse.side_items``) and the observations, which ``streaming.replicas`` evaluates at every
observation against the state carried from the batch before. The driver
receives the changes, each observed replica's newest status and the rare rows
as one Arrow table (one Spark job); ``BatchOutput.finish`` then writes the new
state to the checkpoint (``replicas.StateTable``), before the batch commits.
Alerts do not wait for that write: a batch that crashes after its alerts is
run again by Spark, and its alerts are not repeated (``streaming.monitor``).
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypedDict, cast

import pyarrow.compute as pc
import pyspark.sql.functions as F
from pyspark import StorageLevel
from pyspark.sql import Column

from isrwatch.rule import RuleConfig
from isrwatch.status import GoneKey, ReplicaStatus, Thresholds
from streaming import evaluate, parse, projection, replicas, statewriter

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame

    from streaming.lookahead import Lookahead
    from streaming.statewriter import StateWriter

__all__ = ["BatchOutput", "IsrChange", "BrokerCount", "evaluate_records", "split_driver_rows"]

SIDE = "_side"  # a rare row (dead letter, ISR change, broker count, replica gone) as JSON, among the driver's rows


class IsrChange(TypedDict):
    """An ISR change the batch's records told (``parse.side_items``; a bad one is a dead letter)."""

    cluster: str
    topic: str
    partition: int
    shrink: int  # how many followers left the ISR
    expand: int  # how many joined it
    t_ms: int
    left: list[int]  # their broker ids
    joined: list[int]
    leader_id: int | None


class BrokerCount(TypedDict):
    """A broker's own count of the ISR shrinks it made as a leader (JMX telemetry)."""

    cluster: str
    broker_id: int
    t_ms: int
    shrinks_total: int


ISR_CHANGE_KEYS = tuple(IsrChange.__annotations__)
COUNTER_KEYS = tuple(BrokerCount.__annotations__)


@dataclass
class BatchOutput:
    deadletters: list[parse.DeadLetter] = field(default_factory=list)
    isr_changes: list[IsrChange] = field(default_factory=list)
    counters: list[BrokerCount] = field(default_factory=list)  # the brokers' own ISR shrink counts
    # replicas the collector said gone (and, added by the driver, followers elected leader)
    gone: list[GoneKey] = field(default_factory=list)
    # what collectors said of the clusters they poll: (cluster, {"cluster_id", "endpoints"})
    identities: list[tuple[str, Mapping[str, object]]] = field(default_factory=list)
    table: pa.Table | None = None  # replicas.for_the_driver's rows
    spark_s: float = 0.0
    # Writes the batch's state and releases it: call once the driver has the rows.
    finish: Callable[[], None] = lambda: None
    # Where the time went: parse and the rare rows; the state's new version; the driver's rows.
    stages: dict[str, float] = field(default_factory=dict)
    # Who wrote the batch's state-topic records ("executors" or "driver"), and how many.
    state_writer: str = ""
    state_records: int = 0


@functools.cache
def _side_column() -> tuple[Column, Column]:
    """The column of the driver's one Spark job that holds a rare row (``parse.side_items``,
    as JSON): null on a replica's row, the item's columns on a rare one."""
    return (
        F.lit(None).cast("string").alias(SIDE),
        F.to_json(F.struct(*[F.col(c) for c in parse.SIDE_COLUMNS])).alias(SIDE),
    )


def _held(records: DataFrame) -> DataFrame:
    """The parsed records as the batch's two uses need them (``parse.bad_records_kept``: the
    raw bytes and text of bad records only, big ones cut), held."""
    return parse.bad_records_kept(records).persist(StorageLevel.MEMORY_AND_DISK)


def evaluate_records(
    raw: DataFrame,
    batch_id: int,
    table: replicas.StateTable,
    cfg: RuleConfig,
    th: Thresholds,
    *,
    future_tolerance_ms: int | None,
    max_gap_ms: int | None,
    watched_keys: Collection[str] = frozenset(),
    refresh_batches: int = 1,
    lookahead: Lookahead | None = None,
    forget_before: Mapping[str, int] | None = None,
    observed_only: bool = False,
    states: StateWriter | None = None,
) -> BatchOutput:
    """Everything the driver needs from one batch of raw records (the Kafka
    source's columns); writes the batch's state version, without the replicas
    older than ``forget_before`` (``StateTable.write``). ``observed_only``: only the
    replicas the batch observes go through the window (``replicas.split_carried``),
    for a batch that observes few of the replicas held; same state, same rows. ``states``:
    the state topic, written at ``finish`` with each replica's newest row the driver took,
    less the replicas the driver forgot in the batch (``BatchOutput.gone``)."""
    t0 = time.monotonic()
    now_ms = int(time.time() * 1000)
    out = BatchOutput()
    records = _held(parse.parse_records(raw))
    evaluated = keys = None
    try:
        obs = parse.good_observations(parse.observations(records, future_tolerance_ms, now_ms))
        rows = replicas.observation_rows(obs, cfg, max_gap_ms)
        carried, version = table.read(batch_id, rows)
        observed, idle = carried, None
        if observed_only:
            # Held for the split of the state here and again for its write: made once, not parsed twice.
            keys = replicas.observed_keys(rows).persist(StorageLevel.MEMORY_AND_DISK)
            observed, idle = replicas.split_carried(carried, keys)
        # Held for the driver's rows and the state write: the changes and each observed
        # replica's newest row only (the filter runs before the full status: replicas.evaluate_batch).
        evaluated = replicas.evaluate_batch(rows, observed, cfg, th, max_gap_ms, driver_rows_only=True).persist(
            StorageLevel.MEMORY_AND_DISK
        )
        # One Spark job for everything the driver reads: the replicas' rows and the rare ones.
        driver = replicas.for_the_driver(evaluated, watched_keys, refresh_batches, lookahead)
        side = parse.side_items(records, future_tolerance_ms, now_ms)
        no_side, side_json = _side_column()
        both = projection.select(driver, "*", no_side).unionByName(
            projection.select(side, side_json), allowMissingColumns=True
        )
        rows_ = both.toArrow()
        out.stages["evaluate_s"] = time.monotonic() - t0
        is_side = pc.is_valid(rows_.column(SIDE))
        out.table = rows_.filter(pc.invert(is_side))
        for item in rows_.filter(is_side).column(SIDE).to_pylist():
            row = json.loads(item)
            if row["kind"] == "deadletter":
                out.deadletters.append(cast("parse.DeadLetter", {k: row.get(k) for k in parse.DEADLETTER_COLUMNS}))
            elif row["kind"] == "counters":
                out.counters.append(cast("BrokerCount", {k: row.get(k) for k in COUNTER_KEYS}))
            elif row["kind"] == "gone":
                out.gone.append((row["cluster"], row["topic"], row["partition"], row["broker_id"], row["t_ms"]))
            elif row["kind"] == "identity":
                out.identities.append((row["cluster"], json.loads(row["payload"])))
            else:
                out.isr_changes.append(cast("IsrChange", {k: row.get(k) for k in ISR_CHANGE_KEYS}))
    except BaseException:
        for held_df in (evaluated, keys):
            if held_df is not None:
                held_df.unpersist()
        records.unpersist()
        raise
    out.spark_s = time.monotonic() - t0
    held, held_keys = evaluated, keys

    def finish() -> None:
        """Write the batch's state records and its state version (before the batch commits),
        release the batch."""
        t1 = time.monotonic()
        try:
            if states is not None:
                finals = driver.where(F.col(replicas.LAST))
                out.state_writer, out.state_records = states.write(statewriter.state_records(finals, out.gone))
                out.stages["state_topic_s"] = time.monotonic() - t1
                t1 = time.monotonic()
            table.write(replicas.next_state(held, idle), batch_id, forget_before, out.gone)
            if version is not None:
                table.prune(version)  # the version this batch read stays until the next batch
        finally:
            held.unpersist()
            if held_keys is not None:
                held_keys.unpersist()
            records.unpersist()
        out.stages["state_s"] = time.monotonic() - t1

    out.finish = finish
    return out


def split_driver_rows(
    table: pa.Table,
) -> tuple[list[ReplicaStatus], Iterator[tuple[ReplicaStatus, int, int]]]:
    """(changes in time order, finals) of ``replicas.for_the_driver``'s rows: the
    statuses at which a replica's state changed, and each observed replica's
    newest (status, last_t_ms, observations)."""
    change = table.column(replicas.CHANGE).to_pylist()
    last = table.column(replicas.LAST).to_pylist()
    changes: list[ReplicaStatus] = []
    finals: list[tuple[ReplicaStatus, int, int]] = []
    for item, c, f in zip(evaluate.statuses_from_arrow(table), change, last, strict=True):
        if c:
            changes.append(item[0])
        if f:
            finals.append(item)
    changes.sort(key=lambda s: s.eval_ms)
    return changes, iter(finals)
