"""One micro-batch of telemetry, in one pass: what Spark computes for the driver.

The records are parsed once and held (``persist``) for the two things made
from them: the rare rows (dead letters, ISR changes, the brokers' own shrink
counts: ``parse.side_items``) and the observations, which ``streaming.evaluation.replicas`` evaluates at every
observation against the state carried from the batch before. The driver
receives the changes, each observed replica's newest status and the rare rows
as one Arrow table (one Spark job); once it has taken them, the new state is
written (``streaming.sinks.statewriter.write_batch_state``: the state topic's records,
then the checkpoint's version, ``statetable.StateTable``), before the batch commits.
Alerts do not wait for that write: a batch that crashes after its alerts is
run again by Spark, and its alerts are not repeated (``streaming.driver.monitor``).
"""

from __future__ import annotations

import functools
import json
import logging
import time
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypedDict, cast

import pyarrow.compute as pc
import pyspark.sql.functions as F
from pyspark import StorageLevel
from pyspark.sql import Column, Observation

from isrwatch.logs import kv
from isrwatch.rule import RuleConfig
from isrwatch.status import GoneKey, Thresholds
from streaming.evaluation import parse, projection, replicas, statetable

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame

    from streaming.evaluation.evaluate import Reach

__all__ = ["BatchOutput", "BatchTotals", "IsrChange", "BrokerCount", "evaluate_records", "observed_metrics"]

log = logging.getLogger("streaming.batch")

SIDE = "_side"  # a rare row (dead letter, ISR change, broker count, replica gone) as JSON, among the driver's rows
LETTER = "_letter"  # the batch has dead letters, among the driver's rows, when the executors write them


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


@dataclass
class BatchTotals:
    """What a batch observed, counted in Spark (``replicas.totals_exprs``) when the driver
    takes only some of its replicas' rows (``--driver-replicas not-ok``)."""

    observations: int = 0
    replicas: int = 0
    clocks: dict[str, int] = field(default_factory=dict)  # cluster -> its newest telemetry time


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
    # With ``hold_ok`` off (``--driver-replicas not-ok``): the batch's counts, from Spark.
    totals: BatchTotals | None = None
    spark_s: float = 0.0
    # What the batch's state writes take once the driver has its rows
    # (``streaming.sinks.statewriter.write_batch_state``), planned here, run there: the state's
    # next version, the rows the state topic's records are the newest of (the driver's rows;
    # every observed replica's when the driver holds only some), what this batch read of the
    # state (its full version, whether the batch writes a delta), and the data held for the
    # batch (``release``).
    next_state: DataFrame | None = None
    state_rows: DataFrame | None = None
    carried: statetable.Carried | None = None
    held: list[DataFrame] = field(default_factory=list)
    # Where the time went: parse and the rare rows; the state's new version; the driver's rows.
    stages: dict[str, float] = field(default_factory=dict)
    # With the dead letters apart (``letters_apart``): their rows (one column, ``SIDE``, each a
    # rare row as JSON) for the executors to write, who count them (None: the batch has none).
    letters: DataFrame | None = None
    # Who wrote the batch's state-topic records ("executors" or "driver"), and how many.
    state_writer: str = ""
    state_records: int = 0

    def release(self) -> None:
        """Let go of what the batch held (Spark's cached blocks)."""
        while self.held:
            self.held.pop().unpersist()


@functools.cache
def _side_column() -> tuple[Column, Column]:
    """The column of the driver's one Spark job that holds a rare row (``parse.side_items``,
    as JSON): null on a replica's row, the item's columns on a rare one."""
    return F.lit(None).cast("string").alias(SIDE), _side_json().alias(SIDE)


def _side_json() -> Column:
    return F.to_json(F.struct(*[F.col(c) for c in parse.SIDE_COLUMNS]))


def _is_letter() -> Column:
    return F.col("kind") == "deadletter"


def _rare_without_letters(side: DataFrame) -> DataFrame:
    """``side``'s rows for the driver when the executors write the dead letters: the other rare
    rows whole (``SIDE``), and of the dead letters one marker per Spark partition that has any
    (``LETTER``: its first one's reason), so that the driver knows to have them written without
    taking them (a million dead letters as the driver's rows, every column null but one, were
    still ~240 MB of Arrow: nulls of fixed width take their width)."""
    letter = _is_letter()
    numbered = side.where(letter).withColumn("_n", F.monotonically_increasing_id())
    first = numbered.where(F.col("_n").bitwiseAND(F.lit((1 << 33) - 1)) == 0)  # (the id: partition << 33 | row)
    return projection.select(side.where(~letter), _side_json().alias(SIDE)).unionByName(
        projection.select(first, F.col("reason").alias(LETTER)), allowMissingColumns=True
    )


# How long the driver waits for Spark's observed metrics of a batch once its rows are taken
# (they come with the job's end, so at once): past it they are counted by a Spark job of their own.
OBSERVED_WAIT_S = 5.0


def observed_metrics(observation: Observation, wait_s: float = OBSERVED_WAIT_S) -> dict[str, object] | None:
    """``observation``'s metrics, or None when Spark has not given them within ``wait_s``.
    ``Observation.get`` waits without end, and an observation can stay unanswered: one on the
    batch's held rare rows never returned inside the job's ``foreachBatch`` (docs/streaming.md),
    which would stop the job for good, with nothing in its log."""
    jo = getattr(observation, "_jo", None)
    if jo is None:  # never attached to a DataFrame: nothing will come
        return None
    deadline = time.monotonic() + wait_s
    while not jo.future().isCompleted():  # (Spark's own timed wait, getRowOrEmpty, waits 100 ms a call)
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.005)
    return observation.get


def _batch_totals(observation: Observation, evaluated: DataFrame, known: Collection[str], batch_id: int) -> BatchTotals:
    """The batch's totals from ``observation`` (``replicas.held_for_the_driver``), or, when
    Spark does not give them (``observed_metrics``), from a Spark job over the same rows."""
    metrics = observed_metrics(observation)
    if metrics is None:
        log.warning(
            kv(
                event="observed_metrics_missing",
                batch_id=batch_id,
                wait_s=OBSERVED_WAIT_S,
                hint="the batch's totals are counted by a Spark job of their own",
            )
        )
        metrics = replicas.count_totals(evaluated, tuple(sorted(known)))
    return _totals(metrics, evaluated, known)


def _totals(metrics: Mapping[str, object], evaluated: DataFrame, known: Collection[str]) -> BatchTotals:
    """``replicas.totals_exprs``' values as ``BatchTotals``; the clock of a cluster new to
    the driver asked of Spark apart (``replicas.newest_times``: a batch that brings one)."""
    order = sorted(known)
    clocks = {c: int(cast("int", metrics[f"t_{i}"])) for i, c in enumerate(order) if metrics.get(f"t_{i}") is not None}
    new = set(cast("list[str]", metrics.get("clusters") or [])) - set(order)
    if new:
        clocks.update(replicas.newest_times(evaluated, new))
    return BatchTotals(int(cast("int", metrics["observations"])), int(cast("int", metrics["replicas"])), clocks)


def _held(records: DataFrame, kept_bytes: int) -> DataFrame:
    """The parsed records as the batch's two uses need them (``parse.bad_records_kept``: the
    raw bytes and text of bad records only, those over ``kept_bytes`` cut), held."""
    return parse.bad_records_kept(records, kept_bytes).persist(StorageLevel.MEMORY_AND_DISK)


def evaluate_records(
    raw: DataFrame,
    batch_id: int,
    table: statetable.StateTable,
    cfg: RuleConfig,
    th: Thresholds,
    *,
    future_tolerance_ms: int | None,
    max_gap_ms: int | None,
    watched_keys: Collection[str] = frozenset(),
    refresh_batches: int = 1,
    lookahead: Reach | None = None,
    observed_only: bool = False,
    hold_ok: bool = True,
    default_min_isr: int = 1,
    clusters: Collection[str] = (),
    payload_kept_bytes: int = parse.PAYLOAD_KEPT_BYTES,
    letters_apart: bool = False,
) -> BatchOutput:
    """Everything the driver needs from one batch of raw records (the Kafka
    source's columns), and what the batch's state writes take once it has them
    (``BatchOutput.next_state``, ``state_rows``: ``streaming.sinks.statewriter.write_batch_state``).
    ``observed_only``: only the replicas the batch observes go through the window
    (``replicas.split_carried``), for a batch that observes few of the replicas held, and
    its version of the state is then mostly a delta of those replicas
    (``statetable.StateTable.read``); same state, same rows. ``hold_ok`` off
    (``--driver-replicas not-ok``): the driver's rows are only those it holds
    (``replicas.held_for_the_driver``), and ``BatchOutput.totals`` carries the batch's counts
    and clocks (``clusters``: those the driver knows, whose clocks Spark gathers as the rows pass).
    ``payload_kept_bytes``: of a bad record bigger than this, its dead letter keeps only the
    first bytes (``parse.payload_kept_bytes``: the batch's dead letters bounded whatever its cap).
    ``letters_apart``: the dead letters do not come to the driver: ``BatchOutput.letters`` holds
    them for the executors to write and count (``streaming.sinks.letterwriter``); a batch of a
    fleet's telemetry stamped ahead of the job's clock is a million of them, which the
    driver's one Spark job could not carry."""
    t0 = time.monotonic()
    now_ms = int(time.time() * 1000)
    out = BatchOutput()
    records = _held(parse.parse_records(raw), payload_kept_bytes)
    out.held.append(records)
    try:
        # The records' two products, both made here: the rare rows and the good observations.
        side = parse.side_items(records, future_tolerance_ms, now_ms)
        obs = parse.good_observations(parse.observations(records, future_tolerance_ms, now_ms))
        rows = replicas.observation_rows(obs, cfg, max_gap_ms)
        keys = None
        if observed_only:
            # Held for the split of the state here and again for its write: made once, not parsed twice.
            keys = replicas.observed_keys(rows).persist(StorageLevel.MEMORY_AND_DISK)
            out.held.append(keys)
        carried = table.read(batch_id, rows, keys)
        # Held for the driver's rows and the state write: the changes and each observed
        # replica's newest row only (the filter runs before the full status: replicas.evaluate_batch).
        evaluated = replicas.evaluate_batch(rows, carried.rows, cfg, th, max_gap_ms, driver_rows_only=True).persist(
            StorageLevel.MEMORY_AND_DISK
        )
        out.held.append(evaluated)
        # One Spark job for everything the driver reads: the replicas' rows and the rare ones.
        observed = Observation() if not hold_ok else None
        if observed is None:
            driver = replicas.for_the_driver(evaluated, watched_keys, refresh_batches, lookahead)
        else:
            driver = replicas.held_for_the_driver(
                evaluated, watched_keys, default_min_isr, lookahead, observed, clusters
            )
        no_side, side_json = _side_column()
        if letters_apart:
            # held: a batch's rare rows are few, but its dead letters can be a million, read
            # once for the driver's rows and once more by the executors that write them
            side = side.persist(StorageLevel.MEMORY_AND_DISK)
            out.held.append(side)
            rare = _rare_without_letters(side)
        else:
            rare = projection.select(side, side_json)
        both = projection.select(driver, "*", no_side).unionByName(rare, allowMissingColumns=True)
        rows_ = both.toArrow()
        out.stages["evaluate_s"] = time.monotonic() - t0
        is_side = pc.is_valid(rows_.column(SIDE))
        is_replica = pc.invert(is_side)
        if letters_apart:
            has_letters = pc.is_valid(rows_.column(LETTER))
            if pc.any(has_letters).as_py():  # (none: no Spark job to write them)
                out.letters = projection.select(side.where(_is_letter()), side_json)
            is_replica = pc.and_(is_replica, pc.invert(has_letters))
        out.table = rows_.filter(is_replica)
        for item in rows_.filter(is_side).column(SIDE).to_pylist():
            row = json.loads(item)
            if row["kind"] == "deadletter":
                out.deadletters.append(parse.deadletter_of(row))
            elif row["kind"] == "counters":
                out.counters.append(cast("BrokerCount", {k: row.get(k) for k in COUNTER_KEYS}))
            elif row["kind"] == "gone":
                out.gone.append((row["cluster"], row["topic"], row["partition"], row["broker_id"], row["t_ms"]))
            elif row["kind"] == "identity":
                out.identities.append((row["cluster"], json.loads(row["payload"])))
            else:
                out.isr_changes.append(cast("IsrChange", {k: row.get(k) for k in ISR_CHANGE_KEYS}))
        # What the state writes take, planned here (Spark runs it there).
        if observed is not None:
            out.totals = _batch_totals(observed, evaluated, clusters, batch_id)
        # The state topic has every observed replica's newest row even when the driver takes
        # fewer: with not-ok, those of ok replicas at their refresh (every one with N = 1).
        state_rows = (
            driver
            if hold_ok
            else replicas.for_the_driver(evaluated, watched_keys, refresh_batches, lookahead, clocks=False)
        )
        out.next_state, out.state_rows, out.carried = replicas.next_state(evaluated, carried.idle), state_rows, carried
    except BaseException:
        out.release()
        raise
    out.spark_s = time.monotonic() - t0
    return out
